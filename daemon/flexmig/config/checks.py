"""Validation of parsed TOML against the schema: exact types, ranges, patterns, and the rules between keys.

:class:`Checker` walks the parsed document along the dataclasses of :mod:`flexmig.config.schema`, so a key is
known, typed and bounded exactly as its field says; it collects every problem instead of stopping at the first.
:func:`cross_checks` holds the rules that span keys (a stall timeout against the sampling interval, a password
against plaintext transport); :func:`cross_check_problems` runs them beside the per-key problems, leaving out
only the rules whose keys had problems of their own, so a file's problems all come in one round.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import types
import typing
import urllib.parse
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

from flexmig.config.address import HostPort
from flexmig.config.keys import join_key
from flexmig.config.problems import show, type_name
from flexmig.config.schema import Config, DetectConfig, MqttConfig, SlurmConfig, toml_name

__all__ = ["PER_SLICE_KEYS", "Checker", "cross_check_problems", "cross_checks", "per_instance", "per_slice_params"]

_T = TypeVar("_T")


class Checker:
    """Walks the parsed TOML against the dataclass schema, collecting (key, message) problems in ``problems``."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []
        self.meant: set[str] = set()
        """Known keys an unknown key's "did you mean" names: the file probably meant to set them."""

    def fail(self, key: str, message: str) -> None:
        """Record a problem at the dotted ``key``."""
        self.problems.append((key, message))

    def section(self, cls: type[_T], data: object, prefix: str) -> _T:
        """The table ``data`` as ``cls``: unknown keys are problems, invalid values keep their defaults."""
        if not isinstance(data, dict):
            self.fail(prefix, f"expected a table, got {type_name(data)}")
            return cls()
        hints = typing.get_type_hints(cls)
        known = {toml_name(f): f for f in fields(cast(Any, cls))}
        for name in data:
            if name not in known:
                self.fail(join_key(prefix, name), _unknown_message(name, list(known), isinstance(data[name], dict)))
                close = _close_match(name, list(known))
                if close is not None:
                    self.meant.add(join_key(prefix, close))
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name not in data:
                continue
            key = join_key(prefix, name)
            converted = self.value(hints[f.name], data[name], key, f.metadata)
            if converted is not _INVALID:
                values[f.name] = converted
        return cls(**values)

    def value(self, tp: Any, raw: object, key: str, meta: Any) -> Any:
        """``raw`` converted to the field type ``tp`` under the field's rules, or the invalid marker."""
        origin = typing.get_origin(tp)
        if origin in (types.UnionType, typing.Union):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            return self.value(inner[0], raw, key, meta)
        if is_dataclass(tp) and isinstance(tp, type) and tp is not HostPort:
            return self.section(tp, raw, key)
        if origin is Literal:
            choices = typing.get_args(tp)
            if not isinstance(raw, str) or raw not in choices:
                self.fail(key, f"{show(raw)} is not one of {', '.join(choices)}")
                return _INVALID
            return raw
        if origin is tuple:
            (item_tp, _ellipsis) = typing.get_args(tp)
            if not isinstance(raw, list):
                self.fail(key, f"expected an array, got {type_name(raw)}")
                return _INVALID
            items = [self.value(item_tp, item, f"{key}[{i}]", meta) for i, item in enumerate(raw)]
            return _INVALID if any(i is _INVALID for i in items) else tuple(items)
        if tp in (bool, int, float):
            return self.scalar(tp, raw, key, meta)
        return self.text(tp, raw, key, meta)

    def scalar(self, tp: Any, raw: object, key: str, meta: Any) -> Any:
        """``raw`` as a bool, an int or a finite float within the field's range, or the invalid marker."""
        if tp is bool:
            if not isinstance(raw, bool):
                self.fail(key, f"expected true or false, got {type_name(raw)}")
                return _INVALID
            return raw
        if tp is int:
            if isinstance(raw, bool) or not isinstance(raw, int):
                self.fail(key, f"expected an integer, got {type_name(raw)}")
                return _INVALID
            return raw if self.in_range(raw, key, meta) else _INVALID
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):  # a float
            self.fail(key, f"expected a number, got {type_name(raw)}")
            return _INVALID
        if not math.isfinite(raw):
            self.fail(key, f"expected a finite number, got {raw}")
            return _INVALID
        return float(raw) if self.in_range(raw, key, meta) else _INVALID

    def text(self, tp: Any, raw: object, key: str, meta: Any) -> Any:
        """``raw`` as a string (matching the field's pattern), an absolute path or a host:port, or the invalid
        marker."""
        if not isinstance(raw, str):
            self.fail(key, f"expected a string, got {type_name(raw)}")
            return _INVALID
        if "\x00" in raw:
            self.fail(key, "contains a NUL character")
            return _INVALID
        if tp is str:
            pattern = meta.get("pattern")
            if pattern and not re.fullmatch(pattern, raw):
                rule = meta.get("allowed") or "see flexmig config example"
                self.fail(key, f"{show(raw)} is not allowed here: {rule}")
                return _INVALID
            return raw
        if tp is Path:
            if not raw.startswith("/"):
                self.fail(key, f"{show(raw)} is not an absolute path")
                return _INVALID
            return Path(raw)
        if tp is HostPort:
            try:
                return HostPort.parse(raw)
            except ValueError as exc:
                self.fail(key, str(exc))
                return _INVALID
        raise TypeError(f"config schema: no converter for {tp!r} at {key}")  # a bug in the schema, not in input

    def in_range(self, value: float, key: str, meta: Any) -> bool:
        """True when ``value`` lies within the field's bounds; records the problem otherwise."""
        lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
        if (lo is not None and value < lo) or (hi is not None and value > hi) or (gt is not None and value <= gt):
            low = f"> {gt:g}" if gt is not None else f">= {lo:g}" if lo is not None else ""
            high = f"<= {hi:g}" if hi is not None else ""
            shown = f"0o{int(value):o}" if meta.get("octal") else f"{value:g}"
            self.fail(key, f"{shown} is out of range (must be {' and '.join(x for x in (low, high) if x)})")
            return False
        return True


class _Invalid:
    """Marker for a value that failed validation (its problem is already recorded)."""


_INVALID: Any = _Invalid()

_SECRET_HINTS = {"password", "passwd", "secret", "token"}


def _close_match(name: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown_message(name: str, known: list[str], is_table: bool) -> str:
    if name.lower() in _SECRET_HINTS:
        return "unknown key: secrets are never written in the configuration; put it in a file and set password_file"
    close = _close_match(name, known)
    hint = f" (did you mean {close!r}?)" if close else ""
    return f"unknown {'section' if is_table else 'key'}{hint}"


def cross_check_problems(cfg: Config, checker: Checker) -> Iterator[tuple[tuple[str, ...], str]]:
    """The rules between keys that still say something after the per-key checks of ``checker``: a rule is left
    out when one of its keys (or a table around it, or a key inside it) had a problem of its own or was probably
    misspelt, since the value it would judge is a default standing in for what the file meant. So one round
    reports every problem: per-key and between keys together, and none that fixing the others would undo."""
    doubtful = {_bare(k) for k, _ in checker.problems} | {_bare(k) for k in checker.meant}
    for keys, message in cross_checks(cfg):
        if not any(_related(_bare(k), d) for k in keys for d in doubtful):
            yield keys, message


def _bare(key: str) -> str:
    """``jobs.allowed_dirs[0]`` -> ``jobs.allowed_dirs``."""
    return re.sub(r"\[\d+\]", "", key)


def _related(a: str, b: str) -> bool:
    """True when one key is the other, or lies inside it (a table)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".") or not a or not b


def cross_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """Rules between keys; yields (keys, message): the problem is reported at the first of ``keys`` that the
    file sets (the others may be defaults). Only runs when every key's own value was valid."""
    yield from _sampling_checks(cfg)
    yield from _detect_checks(cfg.detect)
    yield from _endpoint_checks(cfg)
    yield from _mqtt_checks(cfg.mqtt)
    url_problem = _check_url(cfg.dcgm.url)
    if url_problem:
        yield ("dcgm.url",), url_problem
    yield from _local_checks(cfg)
    yield from _slurm_checks(cfg)


def _sampling_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """The sampler's interval, stall limit and retention against each other and detection's windows."""
    s, d = cfg.sampling, cfg.detect
    if s.stall_s < 2 * s.interval_s:
        yield (
            ("sampling.stall_s", "sampling.interval_s"),
            f"sampling.stall_s ({s.stall_s:g}) must be at least twice sampling.interval_s ({s.interval_s:g})",
        )
    for window in ("underuse_window_s", "fragmentation_window_s"):
        if s.retention_s < getattr(d, window):
            yield (
                ("sampling.retention_s", f"detect.{window}"),
                f"sampling.retention_s ({s.retention_s:g}) is shorter than detect.{window} ({getattr(d, window):g})",
            )
    if s.retention_s < 2 * s.interval_s:
        yield (
            ("sampling.retention_s", "sampling.interval_s"),
            f"sampling.retention_s ({s.retention_s:g}) must hold two sweeps of sampling.interval_s ({s.interval_s:g})",
        )


def _detect_checks(d: DetectConfig) -> Iterator[tuple[tuple[str, ...], str]]:
    """Detection's enter and exit thresholds, and its demand mix."""
    for enter, leave in (("underuse_activity", "underuse_activity_exit"), ("underuse_memory", "underuse_memory_exit")):
        if getattr(d, enter) > getattr(d, leave):
            yield ((f"detect.{leave}", f"detect.{enter}"), f"detect.{leave} must be at least detect.{enter}")
    if d.fragmentation_exit > d.fragmentation_threshold:
        yield (
            ("detect.fragmentation_exit", "detect.fragmentation_threshold"),
            "detect.fragmentation_exit must be at most detect.fragmentation_threshold",
        )
    if sum(d.demand_mix.weights().values()) <= 0:
        yield ("detect.demand_mix",), "at least one weight must be positive"


def _endpoint_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """The metrics endpoint's address, and dcgm-exporter's not being it."""
    p = cfg.prometheus
    if p.enabled and not p.allow_remote and not p.listen.is_loopback():
        yield (
            ("prometheus.listen", "prometheus.allow_remote", "prometheus.enabled"),
            f"{p.listen} is not a loopback address; set prometheus.allow_remote = true to serve metrics to the network",
        )
    dc = cfg.dcgm
    if dc.enabled and p.enabled:
        target = urllib.parse.urlsplit(dc.url)
        if target.hostname is not None and _same_endpoint(target.hostname, target.port or 80, p.listen):
            yield (
                ("dcgm.url", "dcgm.enabled", "prometheus.listen"),
                f"dcgm.url {dc.url} is flexmigd's own metrics address (prometheus.listen {p.listen}); flexmigd "
                "would scrape itself: point dcgm.url at dcgm-exporter (port 9400 by default) or move prometheus.listen",
            )


def _mqtt_checks(m: MqttConfig) -> Iterator[tuple[tuple[str, ...], str]]:
    """MQTT's TLS files, credentials and commands."""
    if (m.tls_cert is None) != (m.tls_key is None):
        yield ("mqtt.tls_cert", "mqtt.tls_key"), "tls_cert and tls_key go together"
    for name in ("tls_ca", "tls_cert", "tls_key"):
        if getattr(m, name) is not None and not m.tls:
            yield (f"mqtt.{name}", "mqtt.tls"), "set mqtt.tls = true to use TLS files"
    if m.password_file is not None and m.username is None:
        yield ("mqtt.password_file",), "a password needs mqtt.username"
    if m.password_file is not None and not m.tls and not m.broker.is_loopback() and not m.allow_plaintext_password:
        yield (
            ("mqtt.password_file", "mqtt.broker", "mqtt.tls", "mqtt.allow_plaintext_password"),
            f"the password would cross the network in clear to {m.broker}; set mqtt.tls = true "
            "(or mqtt.allow_plaintext_password = true)",
        )
    if m.commands_enabled and (m.username is None or m.password_file is None):
        yield (
            ("mqtt.commands_enabled",),
            "commands need broker credentials: set mqtt.username and mqtt.password_file",
        )


def _local_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """The control socket, the baseline file and the jobs' directories."""
    c = cfg.control
    if c.socket_mode & 0o600 != 0o600 or c.socket_mode & 0o007 or c.socket_mode & ~0o777:
        yield (
            ("control.socket_mode",),
            f"0o{c.socket_mode:o} must give the owner read/write (0o600) and others nothing (at most 0o770)",
        )
    if len(os.fsencode(str(c.socket))) > 107:
        yield ("control.socket",), "longer than 107 bytes, the limit of a unix socket path"
    b = cfg.baseline
    if b.mig_parted_config and b.mig_parted_file is None:
        yield (
            ("baseline.mig_parted_config", "baseline.mig_parted_file"),
            "names a configuration of no file: set mig_parted_file",
        )
    for i, allowed in enumerate(cfg.jobs.allowed_dirs):
        if allowed == Path("/"):
            yield (f"jobs.allowed_dirs[{i}]",), "'/' would let a job write anywhere"


_CHECKPOINT_FIELDS = {"job_id", "user", "uid"}


def _slurm_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """The ``[slurm]`` table's rules between and inside keys."""
    sl = cfg.slurm
    names = re.findall(r"\{([^{}]*)\}", sl.checkpoint_dir)
    stray = re.sub(r"\{[^{}]*\}", "", sl.checkpoint_dir)
    unknown = sorted(set(names) - _CHECKPOINT_FIELDS)
    if unknown or "{" in stray or "}" in stray:
        what = f"unknown field {{{unknown[0]}}}" if unknown else "a stray brace"
        yield ("slurm.checkpoint_dir",), f"{what}: only {{job_id}}, {{user}} and {{uid}} are filled in"
    elif "job_id" not in names:
        yield ("slurm.checkpoint_dir",), "must contain {job_id}: each job needs its own checkpoint directory"
    if ".." in Path(sl.checkpoint_dir).parts:
        yield ("slurm.checkpoint_dir",), "must not contain '..'"
    words = sl.slurmd_conf.split()
    if any(w.split("=", 1)[0].lower() == "gres" for w in words):
        yield ("slurm.slurmd_conf",), "leave Gres= out: flexmig sets it from the node's MIG instances"
    if sl.enabled and sl.gres_map.parent == Path("/"):
        yield ("slurm.gres_map",), "put the map in a directory of its own, not in /"
    if any(w.split("=", 1)[0].lower() == "port" for w in words) and sl.node_per_gpu:
        yield ("slurm.slurmd_conf",), "leave Port= out with node_per_gpu: each GPU node's is slurmd_port_base + K"
    if any(w.split("=", 1)[0].lower() == "port" for w in words) and per_instance(sl):
        yield ("slurm.slurmd_conf",), "leave Port= out with node_per_instance: each node's is slurmd_port_base + 8K + S"
    if sl.node_per_gpu and sl.node_per_instance:
        yield ("slurm.node_per_instance",), "set node_per_gpu or node_per_instance, not both"
    yield from _layout_checks(sl)
    if sl.instance_nodes == "static" and per_instance(sl):
        for key in ("slurmd_conf", "slurmd_conf_per_slice"):
            if getattr(sl, key).split():
                yield (f"slurm.{key}",), (
                    "leave it empty with instance_nodes = static: a static node registers what its slurm.conf line "
                    "says (`flexmig slurm conf --node-per-instance --static` prints the lines)"
                )
    yield from _per_slice_checks(sl, {w.split("=", 1)[0].lower() for w in words})
    if sl.node_per_gpu or sl.node_per_instance:
        yield from _per_gpu_checks(sl)


def per_instance(sl: SlurmConfig) -> bool:
    """True when the host is one Slurm node per MIG instance: ``node_per_instance``, ``layout = instance``, or
    ``layout = auto`` (which chooses that mode, static or dynamic, or refuses) without ``node_per_gpu``."""
    return sl.node_per_instance or (sl.layout in ("auto", "instance") and not sl.node_per_gpu)


def _layout_checks(sl: SlurmConfig) -> Iterator[tuple[tuple[str, ...], str]]:
    """``layout`` against the older switches: ``node_per_gpu`` and ``node_per_instance`` are explicit choices too
    (with ``layout = auto`` or their own layout), and ``instance_nodes = static`` is one of the per-instance mode."""
    chosen = "gpu" if sl.node_per_gpu else "instance" if sl.node_per_instance else None
    if chosen is not None and sl.layout not in ("auto", chosen):
        key = "node_per_gpu" if sl.node_per_gpu else "node_per_instance"
        yield ("slurm.layout",), f"layout = {sl.layout!r} contradicts {key} = true: set one of them"
    if sl.instance_nodes == "static" and (sl.node_per_gpu or sl.layout in ("gpu", "node")):
        yield ("slurm.instance_nodes",), "static instance nodes are for layout = auto or instance (node_per_instance)"


PER_SLICE_KEYS = {"cpus": ("CPUs", 9000), "realmemory": ("RealMemory", 10**9), "tmpdisk": ("TmpDisk", 600_000_000)}
"""The node parameters ``[slurm] slurmd_conf_per_slice`` scales, by their lower-case name (Slurm's parameter names
are case-insensitive): the name as Slurm prints it, and the most one compute slice may have (seven slices' worth
fits Slurm's field: CPUs a 16-bit count, TmpDisk a 32-bit one in MB)."""


def per_slice_params(text: str) -> tuple[tuple[str, int], ...]:
    """``slurmd_conf_per_slice``'s words (checked) as (name as Slurm prints it, value a slice) pairs."""
    pairs = (w.split("=", 1) for w in text.split())
    return tuple((PER_SLICE_KEYS[k.lower()][0], int(v)) for k, v in pairs)


_CPU_LAYOUT = ("boards", "sockets", "socketsperboard", "corespersocket", "threadspercore")


def _per_slice_checks(sl: SlurmConfig, fixed: set[str]) -> Iterator[tuple[tuple[str, ...], str]]:
    """``slurmd_conf_per_slice``: only with ``node_per_instance``, only parameters that scale, each once, at least 1
    and within Slurm's range, and none that ``slurmd_conf`` (whose lower-case keys are ``fixed``) sets as well."""
    where = ("slurm.slurmd_conf_per_slice",)
    words = sl.slurmd_conf_per_slice.split()
    if words and not per_instance(sl):
        yield where, "only with node_per_instance: a node of several MIG instances registers slurmd_conf as it is"
        return
    seen: set[str] = set()
    for w in words:
        key, value = w.split("=", 1)
        name, most = PER_SLICE_KEYS.get(key.lower(), (key, 0))
        if not most:
            yield where, f"{key}=: only CPUs=, RealMemory= and TmpDisk= scale with an instance's compute slices"
        elif key.lower() in seen:
            yield where, f"{name}= is given twice"
        elif key.lower() in fixed:
            yield where, f"{name}= is in slurmd_conf too: set it in one of them"
        elif not 1 <= int(value) <= most:
            yield where, f"{name}={value}: must be 1 to {most} a slice"
        seen.add(key.lower())
    if "cpus" in seen and fixed.intersection(_CPU_LAYOUT):
        yield where, (
            "with CPUs= per slice, leave Boards=, Sockets=, SocketsPerBoard=, CoresPerSocket= and ThreadsPerCore= "
            "out of slurmd_conf: they fix a node's CPU count"
        )


def _per_gpu_checks(sl: SlurmConfig) -> Iterator[tuple[tuple[str, ...], str]]:
    """With ``node_per_gpu`` (or ``node_per_instance``) every node of the host needs its own pid file, environment
    file, GRES map and unit."""
    named = {"slurmd_pid_file": str(sl.slurmd_pid_file), "slurmd_env": str(sl.slurmd_env), "gres_map": str(sl.gres_map)}
    if sl.slurmd_control == "systemd":
        named["slurmd_unit"] = sl.slurmd_unit
    for key, value in named.items():
        if "{node}" not in value:
            mode = "node_per_gpu" if sl.node_per_gpu else "node_per_instance"
            yield (f"slurm.{key}",), f"must contain {{node}} with {mode}: each node's slurmd needs its own"


def _check_url(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"{show(url)}: scheme must be http or https"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials"
    if not parts.hostname:
        return f"{show(url)} has no host"
    if port == 0:
        return "port 0 is not a port"
    return None


def _same_endpoint(host: str, port: int, listen: HostPort) -> bool:
    """True when ``host:port`` names the address flexmigd serves its metrics on (loopback names count as one)."""
    if port != listen.port:
        return False
    loopback = {"localhost", "127.0.0.1", "::1"}
    return host == listen.host or (host in loopback and listen.host in loopback)
