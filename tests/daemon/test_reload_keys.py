"""The schema's ``restart`` flag is the only rule for what a reload changes: on a running daemon, a reload of each key
the schema does not mark takes effect at once (in the component that reads it), and a reload of each key it marks
is reported "at next restart" while the components keep its value of the start.

One in-process daemon on a simulated node (mode observe, Slurm on with no Slurm to reach, so its component is there
too); each key in turn gets another valid value in the file, the daemon reloads it, and the test reads what the
component that uses the key now holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexmig.config import Config, HostPort, iter_keys, load_config
from flexmig.config.render import render_toml
from flexmig.config.schema import toml_name
from flexmig.daemon import Daemon
from flexmig.errors import ConfigError
from flexmig.jobspec import JobPolicy
from flexmig.service.planning import planner_settings
from flexmig.service.slurm_rounds import SlurmRounds
from flexmig.slurm.config_settings import slurm_settings
from flexmig.wiring import detect_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MIG_PARTED = Path(__file__).resolve().parents[1] / "data" / "mig-parted" / "config-default.yaml"

#: Keys that cannot change alone (TLS off leaves no place for TLS files): what changes with them.
COMPANIONS: dict[str, dict[str, Any]] = {
    "mqtt.tls": {"mqtt.tls_ca": None, "mqtt.tls_cert": None, "mqtt.tls_key": None},
    "slurm.slurmd_control": {"slurm.slurmd_hook": ("/bin/true",)},
    "slurm.node_per_gpu": {  # each GPU node needs its own files and unit
        "slurm.slurmd_pid_file": Path("/run/slurmd-{node}.pid"),
        "slurm.slurmd_env": Path("/run/flexmig/slurm/slurmd-{node}.env"),
        "slurm.gres_map": Path("/run/flexmig/slurm/gres-map-{node}.json"),
        "slurm.slurmd_unit": "slurmd@{node}.service",
        "slurm.layout": "auto",  # the base is the whole-node layout, which these switches contradict
    },
}
COMPANIONS["slurm.node_per_instance"] = COMPANIONS["slurm.node_per_gpu"]  # the same rule
COMPANIONS["slurm.slurmd_conf_per_slice"] = {**COMPANIONS["slurm.node_per_gpu"], "slurm.node_per_instance": True}
COMPANIONS["slurm.instance_nodes"] = COMPANIONS["slurm.slurmd_conf_per_slice"]
#: Keys whose other values the generic candidates cannot guess.
OTHER_VALUES: dict[str, list[Any]] = {
    "baseline.mig_parted_config": ["all-enabled"],
    "slurm.slurmd_control": ["hook"],
    "slurm.instance_nodes": ["static"],
    "slurm.layout": ["auto", "instance"],
    "prometheus.detail": ["full"],
}

#: Keys no component reads today: neither "at once" nor "at next restart" is true of them (left for a decision).
READ_BY_NOTHING = {"jobs.directory"}

Probe = Callable[[Daemon, Config], tuple[Any, Any]]
"""(what the running daemon holds for a key, what the configuration says it should)."""


def _actuator(d: Daemon) -> Any:
    act = d.components.actuator.runtime.act
    assert act is not None, "the actuator runs"
    return act


def _policy(d: Daemon, c: Config) -> tuple[Any, Any]:
    policy = JobPolicy(tuple(c.jobs.allowed_dirs), default_ack_timeout_s=c.jobs.ack_timeout_s)
    act = _actuator(d)
    return (act.jobs.policy, act.executor.policy), (policy, policy)


def _slurm_rounds(d: Daemon) -> SlurmRounds:
    slurm = d.components.slurm
    assert slurm is not None and slurm.rounds is not None, "the Slurm part is built with the actuator"
    return slurm.rounds


def _slurm(d: Daemon, c: Config) -> tuple[Any, Any]:
    slurm = d.components.slurm
    assert slurm is not None and slurm.rounds is not None and slurm.agent is not None, "the Slurm agent is attached"
    cost = slurm.agent.cost
    return (slurm.agent.settings, cost.fixed_s, cost.min_interval_s, slurm.rounds.config.slurm.interval_s), (
        slurm_settings(c.slurm),
        c.slurm.reregister_s,
        c.slurm.min_interval_s,
        c.slurm.interval_s,
    )


#: Where each key that a reload applies takes effect (longest prefix wins).
PROBES: dict[str, Probe] = {
    "mode": lambda d, c: ((d.components.actuator.runtime.mode, _actuator(d).executor.mode), (c.mode, c.mode)),
    "sampling.interval_s": lambda d, c: (d.sampler.interval_s if d.sampler else None, c.sampling.interval_s),
    "detect.": lambda d, c: (d.components.detector.settings, detect_settings(c.detect)),
    "planner.": lambda d, c: (_actuator(d).jobs.settings, planner_settings(c.planner)),
    "planner.interval_s": lambda d, c: (d.components.actuator.runtime.config.planner.interval_s, c.planner.interval_s),
    "jobs.ack_timeout_s": _policy,
    "jobs.allowed_dirs": _policy,
    "jobs.shutdown_grace_s": lambda d, c: (
        d.components.actuator.runtime.config.jobs.shutdown_grace_s,
        c.jobs.shutdown_grace_s,
    ),
    "jobs.max_pending": lambda d, c: (_actuator(d).jobs.max_pending, c.jobs.max_pending),
    "jobs.rank_log_max_bytes": lambda d, c: (
        _actuator(d).supervisor.rank_logs.max_bytes,
        c.jobs.rank_log_max_bytes,
    ),
    "jobs.rank_log_keep": lambda d, c: (_actuator(d).supervisor.rank_logs.keep, c.jobs.rank_log_keep),
    "control.max_wait_s": lambda d, c: (
        d.components.actuator.runtime.dispatcher.max_wait_s if d.components.actuator.runtime.dispatcher else None,
        c.control.max_wait_s,
    ),
    "baseline.": lambda d, c: (d.components.actuator.runtime.config.baseline, c.baseline),
    "slurm.": _slurm,
    "slurm.cluster_reads_per_s": lambda d, c: (
        _slurm_rounds(d).config.slurm.cluster_reads_per_s,
        c.slurm.cluster_reads_per_s,
    ),
    "slurm.cluster_job_lock_share": lambda d, c: (
        _slurm_rounds(d).config.slurm.cluster_job_lock_share,
        c.slurm.cluster_job_lock_share,
    ),
}


def probe_for(key: str) -> Probe | None:
    matches = [p for p in PROBES if key == p or (p.endswith(".") and key.startswith(p))]
    return PROBES[max(matches, key=len)] if matches else None


# ------------------------------------------------------------------------------------------------ other values
def value_of(cfg: Config, key: str) -> Any:
    return next(v for k, v, _ in iter_keys(cfg) if k == key)


def with_key(cfg: Any, dotted: str, value: Any) -> Any:
    """``cfg`` with the key ``dotted`` (TOML names) set to ``value``."""
    head, _, rest = dotted.partition(".")
    field = next(f for f in dataclasses.fields(cfg) if toml_name(f) == head)
    if not rest:
        return dataclasses.replace(cfg, **{field.name: value})
    return dataclasses.replace(cfg, **{field.name: with_key(getattr(cfg, field.name), rest, value)})


def candidates(key: str, value: Any, meta: Any, tmp: Path) -> list[Any]:
    """Values to try for ``key`` instead of ``value`` (the first the loader accepts is used)."""
    if isinstance(value, bool):
        return [not value]
    if meta.get("octal"):
        return [0o660, 0o640]
    if key in OTHER_VALUES:
        return OTHER_VALUES[key]
    if isinstance(value, int | float):
        lo, hi = meta.get("lo"), meta.get("hi")
        numbers = [value * 2, value / 2, value + 1, value - 1, lo, hi]
        if isinstance(value, int):
            numbers = [int(n) for n in numbers if n is not None]
        return [n for n in numbers if n is not None]
    if isinstance(value, HostPort):
        return [HostPort(value.host, value.port + 1)]
    if isinstance(value, tuple):
        return [(tmp / "other",), ("debug",)]
    if isinstance(value, Path) or (value is None and str(meta.get("example") or "").startswith("/")):
        name = Path(str(value or meta.get("example"))).name
        file, directory = tmp / "files" / name, tmp / "dirs" / name
        file.parent.mkdir(mode=0o700, exist_ok=True)
        file.write_text(MIG_PARTED.read_text() if key == "baseline.mig_parted_file" else "secret\n")
        file.chmod(0o600)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return [file, directory, tmp / "absent" / name]
    if key == "mode":
        return ["advise"]
    return [meta.get("example"), "other-1", "x", f"{value}/x", "USR2", "debug"]


def another_value(base: Config, key: str, value: Any, meta: Any, tmp: Path) -> Config:
    """``base`` with ``key`` changed to some other value the loader accepts (fails naming the key if none is)."""
    path = tmp / "probe.toml"
    for candidate in candidates(key, value, meta, tmp):
        if candidate is None or candidate == value:
            continue
        try:
            changed = with_key(base, key, candidate)
            for other, companion in COMPANIONS.get(key, {}).items():
                changed = with_key(changed, other, companion)
            path.write_text(render_toml(changed, header=False))
            loaded = load_config(path)
        except (ConfigError, TypeError, ValueError):
            continue
        if {k: v for k, v, _ in iter_keys(loaded)}[key] != value:
            return loaded
    raise AssertionError(f"{key}: no other value found to reload with; add one to candidates()")


# ------------------------------------------------------------------------------------------------ the test
def test_a_reload_applies_each_key_at_once_or_names_it_for_the_next_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = base_config(tmp_path)
    keys = [(k, v, m) for k, v, m in iter_keys(base) if k not in READ_BY_NOTHING]
    variants = {k: another_value(base, k, v, m, tmp_path) for k, v, m in keys}
    path = tmp_path / "flexmig.toml"
    path.write_text(render_toml(base, header=False))
    daemon = Daemon(base, sim_spec="h200:1g.18gb@0", sim_workload=False, config_path=path)

    async def scenario() -> tuple[list[str], list[str]]:
        stop = asyncio.Event()
        task = asyncio.create_task(daemon.run(stop))
        wrong: list[str] = []
        unreported: list[str] = []
        try:
            await asyncio.wait_for(daemon.started(), 60)
            for key, _, meta in keys:
                new = variants[key]
                probe = probe_for(key)
                if probe is not None and not meta.get("restart"):
                    held, wanted = probe(daemon, new)
                    assert held != wanted, f"{key}: its probe does not see it change"
                path.write_text(render_toml(new, header=False))
                caplog.clear()
                assert daemon.reload(), f"{key}: reload refused"
                line = next(r.getMessage() for r in caplog.records if "configuration reloaded" in r.getMessage())
                later = line.partition("(at next restart: ")[2].rstrip(")").split(", ")
                if meta.get("restart"):
                    if key not in later:
                        unreported.append(f"{key}: {line}")
                    held = value_of(daemon.components.actuator.runtime.config, key)
                    if held != value_of(base, key):
                        wrong.append(f"{key}: a restart key, yet the components hold the new {held!r}")
                else:
                    held, wanted = probe(daemon, new) if probe else (None, "no probe")
                    if probe is None or held != wanted or key in later:
                        wrong.append(f"{key}: holds {held!r}, the file says {wanted!r}")
                path.write_text(render_toml(base, header=False))
                assert daemon.reload()
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)
        return wrong, unreported

    with caplog.at_level(logging.INFO, logger="flexmig.daemon"):
        wrong, unreported = asyncio.run(scenario())
    assert wrong == [], "keys a reload applies wrongly (at once, it should not; or not, it should):\n" + (
        "\n".join(wrong)
    )
    assert unreported == [], "restart keys a reload did not name:\n" + "\n".join(unreported)


def test_every_key_a_reload_applies_has_a_probe_saying_where() -> None:
    applied = [k for k, _, m in iter_keys(Config.default()) if not m.get("restart") and k not in READ_BY_NOTHING]
    assert [k for k in applied if probe_for(k) is None] == []


def base_config(tmp: Path) -> Config:
    """A simulated node's daemon with every key set where another key depends on it (TLS files, credentials, a
    baseline file), Slurm on with no Slurm to reach (its round fails at once, nothing changes)."""
    (tmp / "bin").mkdir()
    (tmp / "jobs").mkdir()
    for name, text in (("ca.pem", "x"), ("cert.pem", "x"), ("key.pem", "x"), ("password", "pw"), ("mig.yaml", "")):
        (tmp / name).write_text(text or MIG_PARTED.read_text())
        (tmp / name).chmod(0o600)
    path = tmp / "base.toml"
    path.write_text(
        "[sampling]\ninterval_s = 0.05\n[prometheus]\nenabled = false\n[control]\nenabled = false\n"
        f'[jobs]\nallowed_dirs = ["{tmp / "jobs"}"]\n'
        f'[mqtt]\ntls = true\ntls_ca = "{tmp / "ca.pem"}"\ntls_cert = "{tmp / "cert.pem"}"\n'
        f'tls_key = "{tmp / "key.pem"}"\nusername = "node"\npassword_file = "{tmp / "password"}"\n'
        f'[baseline]\nmig_parted_file = "{tmp / "mig.yaml"}"\nmig_parted_config = "all-disabled"\n'
        f'[slurm]\nenabled = true\nbin_dir = "{tmp / "bin"}"\ncommand_timeout_s = 1\ninterval_s = 3600\n'
        'layout = "node"\n'  # the whole-node agent, whose settings a reload changes
    )
    return load_config(path)
