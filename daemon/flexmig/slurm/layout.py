"""Which Slurm nodes a host is (``[slurm] layout``), chosen once at start.

``auto``, the default, is the mode that serves jobs best on every figure: one Slurm node per MIG instance. It
takes the form the node's Slurm supports: the static ``State=FUTURE`` instance nodes slurm.conf declares for this
host where it declares any (any Slurm from 22.05), else dynamic instance nodes from Slurm 23.11 (a dynamic node's
own ``Port=``). Where neither can work (Slurm before 23.11 and no instance nodes in slurm.conf) it refuses with one
line naming the lines to add and the command that prints them, and nothing is changed. ``instance``, ``gpu`` and
``node`` (and the older switches ``node_per_gpu``, ``node_per_instance``) are explicit choices, taken as they are.

:func:`choose_layout` and :func:`with_layout` are pure; what they need (slurmd's version as ``slurmd -V`` prints it,
which needs no slurmctld, and slurm.conf) is read by the daemon's Slurm part, without blocking its event loop.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from flexmig.config import SlurmConfig
from flexmig.errors import SlurmError
from flexmig.slurm.hostlist import expand_hostlist
from flexmig.slurm.settings import NODE_FIELD
from flexmig.slurm.sitecheck import PER_GPU_SINCE, slurm_version

__all__ = [
    "DEFAULT_SLURM_CONF",
    "SlurmLayout",
    "choose_layout",
    "configured_layout",
    "declared_instance_nodes",
    "with_layout",
]

DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
"""Where Slurm's commands look for slurm.conf when neither ``[slurm] conf`` nor ``SLURM_CONF`` says."""

_DEFAULT = SlurmConfig()

_PER_NODE_DEFAULTS = {
    "slurmd_pid_file": (_DEFAULT.slurmd_pid_file, Path("/run/slurmd-{node}.pid")),
    "slurmd_env": (_DEFAULT.slurmd_env, Path("/run/flexmig/slurm/slurmd-{node}.env")),
    "gres_map": (_DEFAULT.gres_map, Path("/run/flexmig/slurm/gres-map-{node}.json")),
}
"""The paths each node of a host needs its own of: the whole-node default, and the per-node one it becomes (what
``flexmig slurm conf --node-per-instance`` prints: ``SlurmdPidFile=/run/slurmd-%n.pid``, the TaskProlog's map)."""


@dataclass(frozen=True, slots=True)
class SlurmLayout:
    """The chosen mode: ``kind`` ``instance`` (``static``: slurm.conf's State=FUTURE nodes), ``gpu`` or ``node``,
    and ``line``, what the start-up log says about it."""

    kind: str
    static: bool = False
    line: str = ""


def configured_layout(cfg: SlurmConfig) -> str:
    """The layout the ``[slurm]`` table asks for: ``node_per_gpu`` and ``node_per_instance`` are explicit choices
    (the configuration's checks refuse a ``layout`` that contradicts them), else ``layout``."""
    if cfg.node_per_gpu:
        return "gpu"
    if cfg.node_per_instance:
        return "instance"
    return cfg.layout


def declared_instance_nodes(slurm_conf: str, host: str) -> tuple[str, ...]:
    """The static instance nodes of host node ``host`` (``<host>-gpu<K>-<S>-<profile>``) that slurm.conf's text
    ``slurm_conf`` declares in its ``NodeName=`` lines (host lists expanded)."""
    static = re.compile(re.escape(host) + r"-gpu[0-9]{1,3}-[0-9]-[0-9a-z]{1,32}")
    found: list[str] = []
    for line in slurm_conf.splitlines()[:200_000]:
        body = line.split("#", 1)[0].strip()
        m = re.match(r"(?i)nodename=(\S+)", body)
        if m is None or not m.group(1).startswith(host):
            continue
        try:
            names = expand_hostlist(m.group(1))
        except SlurmError:
            continue
        found.extend(n for n in names if static.fullmatch(n))
    return tuple(dict.fromkeys(found))


def choose_layout(cfg: SlurmConfig, version_text: str, declared: int, *, host: str, conf: str) -> SlurmLayout:
    """The layout of host node ``host``: ``cfg``'s explicit choice, or for ``auto`` static instance nodes where
    slurm.conf (``conf``, for messages) declares ``declared`` of this host's, else dynamic ones when
    ``version_text`` (``slurmd -V``) is Slurm 23.11 or later. SlurmError with the one refusal line otherwise."""
    kind = configured_layout(cfg)
    if kind == "gpu":
        return SlurmLayout("gpu", line="one dynamic node per MIG GPU ([slurm] layout = gpu)")
    if kind == "node":
        return SlurmLayout("node", line="the whole host one node, changed as a whole ([slurm] layout = node)")
    if kind == "instance":
        static = cfg.instance_nodes == "static"
        return SlurmLayout("instance", static, f"one {_form(static)} per MIG instance ([slurm] layout = instance)")
    version = slurm_version(version_text)
    shown = version_text.rsplit(maxsplit=1)[-1] if version_text.split() else "(none)"
    if declared or cfg.instance_nodes == "static":
        why = f"{conf} declares {declared} for {host}" if declared else "[slurm] instance_nodes = static"
        return SlurmLayout("instance", True, f"one {_form(True)} per MIG instance ({why}; Slurm {shown})")
    if version is not None and version[:2] >= PER_GPU_SINCE:
        return SlurmLayout(
            "instance", False, f"one {_form(False)} per MIG instance (Slurm {shown}; {conf} declares no static ones)"
        )
    what = f"Slurm {shown}" if version is not None else f"a Slurm whose version slurmd -V did not say ({shown!r})"
    command = f"flexmig slurm conf --node-per-instance --static --host {host} --model MODEL --gpus N"
    raise SlurmError(
        f"[slurm] layout = auto: {what} takes one node per MIG instance only as static nodes (dynamic ones need "
        f"23.11) and {conf} declares none for {host}: add the State=FUTURE NodeName= lines and "
        f"SlurmdPidFile=/run/slurmd-%n.pid that `{command}` prints (and the nodes to the flexmig partitions), or "
        'set layout = "node"; nothing was changed'
    )


def _form(static: bool) -> str:
    return "static node of slurm.conf" if static else "dynamic node"


def with_layout(cfg: SlurmConfig, layout: SlurmLayout) -> SlurmConfig:
    """``cfg`` as the agents run it with ``layout``: the switches set, and for a host of several nodes the paths
    each node needs its own of (``slurmd_pid_file``, ``slurmd_env``, ``gres_map``, ``slurmd_unit`` under systemd)
    made per node where they are at their whole-node defaults. SlurmError with one line when a path set in the
    configuration has no ``{node}``, or static nodes are given ``slurmd_conf`` (slurm.conf's lines say it all)."""
    if layout.kind == "node":
        return replace(cfg, layout="node")
    changes: dict[str, object] = {
        "layout": layout.kind,
        "node_per_gpu": layout.kind == "gpu",
        "node_per_instance": layout.kind == "instance",
        "instance_nodes": "static" if layout.static else "dynamic",
    }
    if cfg.node_per_gpu or cfg.node_per_instance:  # the older switches: their paths are checked at load, as before
        return replace(cfg, **changes)  # type: ignore[arg-type]
    for key, (whole, per_node) in _PER_NODE_DEFAULTS.items():
        if getattr(cfg, key) == whole:
            changes[key] = per_node
    if cfg.slurmd_control == "systemd" and cfg.slurmd_unit == _DEFAULT.slurmd_unit:
        changes["slurmd_unit"] = "slurmd-static@{node}.service" if layout.static else "slurmd@{node}.service"
    out = replace(cfg, **changes)  # type: ignore[arg-type]
    named = {key: str(getattr(out, key)) for key in _PER_NODE_DEFAULTS}
    if out.slurmd_control == "systemd":
        named["slurmd_unit"] = out.slurmd_unit
    for key, value in named.items():
        if NODE_FIELD not in value:
            raise SlurmError(
                f"[slurm] {key} = {value!r} has no {NODE_FIELD}, and the host is {layout.line}: each node's slurmd "
                f"needs its own (leave {key} out for flexmig's, or set layout = \"node\"); nothing was changed"
            )
    if layout.static and (out.slurmd_conf.split() or out.slurmd_conf_per_slice.split()):
        raise SlurmError(
            f"[slurm] slurmd_conf / slurmd_conf_per_slice are set, and the host is {layout.line}: a static node "
            "registers what its slurm.conf line says; leave them empty; nothing was changed"
        )
    return out


def slurm_conf_path(cfg: SlurmConfig) -> Path:
    """The slurm.conf Slurm's commands read: ``[slurm] conf``, else ``SLURM_CONF``, else Slurm's default."""
    if cfg.conf is not None:
        return cfg.conf
    env = os.environ.get("SLURM_CONF")
    return Path(env) if env else DEFAULT_SLURM_CONF
