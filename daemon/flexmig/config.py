"""The daemon's configuration: one TOML file (``/etc/flexmig/flexmig.toml``) read into frozen dataclasses.

Every key has a default, so an empty file is a valid configuration (observe mode, metrics on loopback, MQTT
and DCGM off). The schema is the dataclasses below: each field's metadata holds its documentation and its
range, and the same metadata drives validation, :func:`render_toml` and ``flexmig config example``, so the
documented file cannot drift from what the loader accepts.

Validation is strict because this file steers a root daemon: unknown keys are errors (with a "did you mean"),
types are exact (``true`` is not a number, ``1.5`` is not an integer), numbers have ranges, paths are
absolute, listen addresses are loopback unless ``allow_remote`` says otherwise, and credentials only ever come
from files. Every problem is reported at once, each naming the file, the dotted key and the line.

The loader reads; it does not create directories or open sockets. :func:`load_config` adds the file checks
(permissions of the file itself and of the credential files it names); :func:`parse_config` is the pure part.
"""

# ruff: noqa: RUF009  (every field default goes through _doc(), which returns dataclasses.field() with metadata)

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import socket
import textwrap
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Collection, Iterator
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

from flexmig.errors import ConfigError
from flexmig.security import Secret, check_file_permissions, read_secret_file

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFERRABLE_KEYS",
    "Config",
    "ConfigFileError",
    "ConfigProblem",
    "ControlConfig",
    "DcgmConfig",
    "DemandMix",
    "DetectConfig",
    "HostPort",
    "JobsConfig",
    "Mode",
    "MqttConfig",
    "PlannerConfig",
    "PrometheusConfig",
    "ReloadResult",
    "SamplingConfig",
    "StateConfig",
    "changed_keys",
    "find_key_line",
    "iter_keys",
    "load_config",
    "load_config_deferring",
    "parse_config",
    "reload_config",
    "render_toml",
]

DEFAULT_CONFIG_PATH = Path("/etc/flexmig/flexmig.toml")

#: What the daemon may do. ``observe``: sample, detect, export, never change a GPU. ``advise``: also plan and
#: publish plans. ``act``: execute plans (needs root with CAP_SYS_ADMIN).
Mode = Literal["observe", "advise", "act"]

_MAX_FILE_BYTES = 1 << 20
_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------------------------
# Value types


@dataclass(frozen=True)
class HostPort:
    """A ``host:port`` address; IPv6 hosts are written in brackets (``[::1]:9400``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """Parse ``host:port``; raises ``ValueError`` saying what is wrong (the caller adds file, key, line)."""
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^:\[\]\s]+):(\d{1,5})", text)
        if not m:
            raise ValueError(f"{_show(text)} is not host:port (write IPv6 hosts in brackets: [::1]:9400)")
        host = m.group(1) or m.group(3)
        port = int(m.group(2) or m.group(4))
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is outside 1-65535")
        if m.group(1):
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise ValueError(f"{_show(host)} is not an IPv6 address") from None
        elif not _is_ipv4(host) and not re.fullmatch(
            r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
            host,
        ):
            raise ValueError(f"{_show(host)} is neither an IP address nor a host name")
        return cls(host, port)

    def is_loopback(self) -> bool:
        """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1): only this machine can connect."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _is_ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _doc(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    gt: float | None = None,
    pattern: str | None = None,
    example: str | None = None,
    toml: str | None = None,
    octal: bool = False,
    restart: bool = False,
) -> Any:
    """A dataclass field with the schema metadata that validation and the example file use.

    ``lo``/``hi`` are inclusive bounds, ``gt`` an exclusive lower bound, ``pattern`` a regex a string must match
    in full, ``example`` the value shown (commented out) for optional keys, ``toml`` the key's name in the file
    when it is not a Python identifier, ``octal`` prints the default as ``0o600``, and ``restart`` marks keys
    that a reload cannot apply (the daemon must be restarted).
    """
    meta = {
        "doc": doc,
        "lo": lo,
        "hi": hi,
        "gt": gt,
        "pattern": pattern,
        "example": example,
        "toml": toml,
        "octal": octal,
        "restart": restart,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------------------------------------------
# The schema


@dataclass(frozen=True)
class SamplingConfig:
    """How often the node is sampled and how much history is kept in memory."""

    interval_s: float = _doc(1.0, "Seconds between two sweeps over every GPU and MIG instance.", lo=0.05, hi=3600)
    retention_s: float = _doc(
        3600.0,
        "Seconds of per-instance history kept in the in-memory ring buffers; at least the longest detection window.",
        lo=1,
        hi=7 * 86400,
    )
    stall_s: float = _doc(
        30.0,
        "A sweep older than this means the sampling loop is wedged (a hung NVML call): the systemd watchdog stops "
        "being fed, so systemd restarts the daemon. At least twice interval_s.",
        lo=1,
        hi=3600,
    )
    gpm: bool = _doc(True, "Read SM/DRAM/tensor activity through GPM where the GPU has it (Hopper and newer).")


@dataclass(frozen=True)
class PrometheusConfig:
    """The ``/metrics`` endpoint (names ``flexmig_*``, labels joinable with dcgm-exporter's)."""

    enabled: bool = _doc(True, "Serve Prometheus metrics.", restart=True)
    listen: HostPort = _doc(
        HostPort("127.0.0.1", 9400),
        "Address to listen on. Loopback only unless allow_remote = true. Note: dcgm-exporter also defaults to "
        "port 9400; when both run on one node, move one of them.",
        restart=True,
    )
    allow_remote: bool = _doc(
        False, "Allow a listen address other than loopback (metrics then reach the network unauthenticated)."
    )


@dataclass(frozen=True)
class MqttConfig:
    """MQTT events and retained state under ``<topic_prefix>/<node>/`` (status, state, events/<kind>)."""

    enabled: bool = _doc(False, "Publish to an MQTT broker.", restart=True)
    broker: HostPort = _doc(HostPort("127.0.0.1", 1883), "Broker address host:port (8883 is the usual TLS port).")
    client_id: str = _doc(
        "",
        "MQTT client identifier; empty means flexmig-<node name>.",
        pattern=r"[A-Za-z0-9._-]{0,64}",
    )
    topic_prefix: str = _doc(
        "flexmig/v1",
        "Topic prefix; the node's topics are <topic_prefix>/<node>/... No wildcards, no empty levels.",
        pattern=r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,7}",
    )
    keepalive_s: int = _doc(
        30, "MQTT keepalive in seconds; the broker publishes our last will after 1.5x this.", lo=5, hi=3600
    )
    tls: bool = _doc(False, "Connect with TLS (server certificate verified against tls_ca or the system store).")
    tls_ca: Path | None = _doc(
        None, "CA bundle that signed the broker's certificate.", example="/etc/flexmig/mqtt-ca.pem"
    )
    tls_cert: Path | None = _doc(
        None, "Client certificate for mutual TLS (needs tls_key).", example="/etc/flexmig/mqtt.crt"
    )
    tls_key: Path | None = _doc(
        None,
        "Client private key for mutual TLS; like password_file it must not be readable by others.",
        example="/etc/flexmig/mqtt.key",
    )
    username: str | None = _doc(None, "Broker user name.", example="flexmig-node", pattern=r"[^\x00-\x1f]{1,256}")
    password_file: Path | None = _doc(
        None,
        "File whose first line is the broker password (mode 0600 or 0640, owned by root). Passwords are never "
        "written in this file.",
        example="/etc/flexmig/mqtt.password",
    )
    allow_plaintext_password: bool = _doc(
        False, "Allow sending the password without TLS to a broker that is not on loopback."
    )
    commands_enabled: bool = _doc(
        False,
        "Accept commands on <topic_prefix>/<node>/commands/<verb> (README: Security); needs username and "
        "password_file.",
    )
    outbox: Path = _doc(
        Path("/var/lib/flexmig/outbox.sqlite3"),
        "Persistent outbox: events wait here while the broker is away.",
        restart=True,
    )

    def password(self, trusted_uids: Collection[int] | None = None) -> Secret | None:
        """The broker password read from ``password_file`` (permissions checked), or None when there is none."""
        if self.password_file is None:
            return None
        return read_secret_file(self.password_file, trusted_uids)


@dataclass(frozen=True)
class DcgmConfig:
    """An optional local dcgm-exporter scraped for DCGM_FI_PROF_* per-instance activity."""

    enabled: bool = _doc(False, "Scrape dcgm-exporter.")
    url: str = _doc("http://127.0.0.1:9400/metrics", "dcgm-exporter's metrics URL (http or https, no credentials).")
    timeout_s: float = _doc(2.0, "Timeout of one scrape in seconds.", lo=0.1, hi=60)


@dataclass(frozen=True)
class DemandMix:
    """Relative demand for each instance size (by compute slices); weights the external fragmentation score.

    The default leans to small instances, as MIG is chosen for jobs smaller than a GPU (detect.settings).
    """

    g1: float = _doc(0.35, "Weight of 1-slice profiles (1g.*).", lo=0, hi=1e6, toml="1g")
    g2: float = _doc(0.25, "Weight of 2-slice profiles (2g.*).", lo=0, hi=1e6, toml="2g")
    g3: float = _doc(0.20, "Weight of 3-slice profiles (3g.*).", lo=0, hi=1e6, toml="3g")
    g4: float = _doc(0.10, "Weight of 4-slice profiles (4g.*).", lo=0, hi=1e6, toml="4g")
    g7: float = _doc(0.10, "Weight of the whole-GPU profile (7g.*).", lo=0, hi=1e6, toml="7g")

    def weights(self) -> dict[int, float]:
        """Compute-slice count -> weight, for the detection layer."""
        return {1: self.g1, 2: self.g2, 3: self.g3, 4: self.g4, 7: self.g7}


@dataclass(frozen=True)
class DetectConfig:
    """Thresholds of the underuse and fragmentation findings."""

    underuse_activity: float = _doc(
        0.05,
        "An instance whose SM activity (p95, else mean) stays at or below this ratio, and whose memory stays at "
        "or below underuse_memory, for underuse_window_s is underused (idle when it runs no process).",
        lo=0,
        hi=1,
    )
    underuse_activity_exit: float = _doc(
        0.15, "The finding ends once activity stays above this ratio for underuse_exit_window_s.", lo=0, hi=1
    )
    underuse_memory: float = _doc(
        0.10, "Memory used, as a ratio of the instance's memory, that counts as low.", lo=0, hi=1
    )
    underuse_memory_exit: float = _doc(
        0.25, "... or once memory used stays above this ratio for underuse_exit_window_s.", lo=0, hi=1
    )
    underuse_window_s: float = _doc(
        600.0, "How long low use must hold before it is a finding, in seconds.", lo=1, hi=86400
    )
    underuse_exit_window_s: float = _doc(
        120.0, "How long high use must hold before an underuse finding ends, in seconds.", lo=0, hi=86400
    )
    oversize_margin: float = _doc(
        0.25, "A job is oversized when a smaller profile holds its p95 SMs and memory with this headroom.", lo=0, hi=10
    )
    oversize_window_s: float = _doc(900.0, "How long a job must fit a smaller profile to be oversized.", lo=1, hi=86400)
    fragmentation_threshold: float = _doc(
        0.5, "A GPU whose external fragmentation score (0-1) stays at or above this is fragmented.", lo=0, hi=1
    )
    fragmentation_exit: float = _doc(
        0.3, "The fragmentation finding ends once the score stays at or below this.", lo=0, hi=1
    )
    fragmentation_window_s: float = _doc(
        60.0, "How long fragmentation (or its end) must persist before it is reported, in seconds.", lo=0, hi=86400
    )
    demand_mix: DemandMix = _doc(factory=DemandMix, doc=DemandMix.__doc__ or "")


@dataclass(frozen=True)
class PlannerConfig:
    """The planner (modes advise and act): how often it runs and what actions cost."""

    interval_s: float = _doc(60.0, "Seconds between two planning rounds.", lo=1, hi=86400)
    settling_s: float = _doc(
        300.0, "A job started, migrated or re-split is not moved again for this long, in seconds.", lo=0, hi=86400
    )
    # Action costs: the measured figures of bench/migration.py and the torch DDP example (examples/train_ddp.py,
    # 2 ranks, gloo, on the simulated node): the daemon adds ~0.06 s per move; the job acknowledges a checkpoint
    # in 40-90 ms and its ranks exit 2-3 s later; relaunched ranks reach their first step 4-6 s after the launch.
    # On hardware add the driver's instance create/destroy (order of seconds, not measurable on the simulator).
    checkpoint_s: float = _doc(
        3.0,
        "Expected time from the checkpoint request to the job's ranks having exited (measured: acknowledgement "
        "40-90 ms, ranks exit 2-3 s; bench/migration.py). Raise it for jobs with large checkpoints.",
        lo=0,
        hi=3600,
    )
    reconfigure_s: float = _doc(5.0, "Expected time to destroy or create one MIG instance.", lo=0, hi=3600)
    restart_s: float = _doc(
        6.0,
        "Expected time from relaunch to the job's first step after resuming (measured: 4-6 s for the torch "
        "example, of which the daemon's own part is ~0.06 s; bench/migration.py).",
        lo=0,
        hi=3600,
    )
    spread_efficiency: float = _doc(
        0.9,
        "Speed of a job spread over several instances, as a fraction of the speed its compute slices would give "
        "in one instance (one rank per instance, no P2P/NVLink between MIG instances).",
        gt=0,
        hi=1,
    )
    gain_margin: float = _doc(
        0.1,
        "Move a job only when the expected gain (the wait it spares another job, the run time it saves) is at "
        "least (1 + this) times its cost.",
        lo=0,
        hi=10,
    )
    migrate_enabled: bool = _doc(True, "Plan migrations of jobs between instances.")
    resplit_enabled: bool = _doc(True, "Plan re-splits of distributed jobs over another number of instances.")


@dataclass(frozen=True)
class JobsConfig:
    """Job specs the daemon launches, and where jobs may keep their files."""

    directory: Path = _doc(
        Path("/etc/flexmig/jobs"), "Directory of job spec files (*.toml; same permission rules as this file)."
    )
    allowed_dirs: tuple[Path, ...] = _doc(
        (Path("/var/lib/flexmig/jobs"),),
        "Directories under which a job's working and checkpoint directories may lie ('/' is refused).",
    )
    ack_timeout_s: float = _doc(
        300.0, "Default time a job has to acknowledge a checkpoint; on timeout the move is cancelled.", lo=1, hi=86400
    )
    ack_dir: Path | None = _doc(
        None,
        "Jobs acknowledge checkpoints here (created mode 1733) instead of in their checkpoint directories; needed "
        "when the daemon cannot read job directories (the shipped systemd unit has no CAP_DAC_OVERRIDE).",
        example="/run/flexmig/acks",
        restart=True,
    )
    shutdown_grace_s: float = _doc(
        60.0,
        "On SIGTERM, how long the action in flight may take to finish; after that the daemon exits and the "
        "journal has the next start finish or roll it back. Keep it below systemd's TimeoutStopSec (90 s).",
        lo=0,
        hi=3600,
    )


@dataclass(frozen=True)
class ControlConfig:
    """The local control socket that ``flexmig status`` and ``flexmig plan`` talk to."""

    enabled: bool = _doc(True, "Serve the control socket.", restart=True)
    socket: Path = _doc(Path("/run/flexmig/control.sock"), "Unix socket path (at most 107 bytes).", restart=True)
    socket_mode: int = _doc(
        0o600, "Permissions of the socket: owner read/write required, nothing for others.", octal=True, restart=True
    )


@dataclass(frozen=True)
class StateConfig:
    """Persistent state."""

    directory: Path = _doc(Path("/var/lib/flexmig"), "State directory (systemd StateDirectory=flexmig).", restart=True)
    journal: Path = _doc(Path("/var/lib/flexmig/journal.sqlite3"), "Action journal (SQLite, WAL mode).", restart=True)


@dataclass(frozen=True)
class Config:
    """The whole configuration; :meth:`default` is what an empty file gives."""

    mode: Mode = _doc(
        "observe",
        "What the daemon may do: observe (never changes a GPU), advise (plans, publishes "
        "them, changes nothing) or act (executes plans; needs root with CAP_SYS_ADMIN).",
    )
    node_name: str = _doc(
        "",
        "This node's name in MQTT topics and metrics; empty means the host name (first label).",
        pattern=r"([A-Za-z0-9][A-Za-z0-9._-]{0,62})?",
    )
    sampling: SamplingConfig = _doc(factory=SamplingConfig, doc=SamplingConfig.__doc__ or "")
    prometheus: PrometheusConfig = _doc(factory=PrometheusConfig, doc=PrometheusConfig.__doc__ or "")
    mqtt: MqttConfig = _doc(factory=MqttConfig, doc=MqttConfig.__doc__ or "")
    dcgm: DcgmConfig = _doc(factory=DcgmConfig, doc=DcgmConfig.__doc__ or "")
    detect: DetectConfig = _doc(factory=DetectConfig, doc=DetectConfig.__doc__ or "")
    planner: PlannerConfig = _doc(factory=PlannerConfig, doc=PlannerConfig.__doc__ or "")
    jobs: JobsConfig = _doc(factory=JobsConfig, doc=JobsConfig.__doc__ or "")
    control: ControlConfig = _doc(factory=ControlConfig, doc=ControlConfig.__doc__ or "")
    state: StateConfig = _doc(factory=StateConfig, doc=StateConfig.__doc__ or "")

    @classmethod
    def default(cls) -> Config:
        """The configuration an empty file gives."""
        return cls()

    def node(self, hostname: Callable[[], str] = socket.gethostname) -> str:
        """The node name: ``node_name``, or the host name's first label made topic-safe."""
        if self.node_name:
            return self.node_name
        label = re.sub(r"[^A-Za-z0-9._-]", "-", hostname().split(".", 1)[0])[:63].strip("-.")
        return label or "node"

    def mqtt_client_id(self, hostname: Callable[[], str] = socket.gethostname) -> str:
        """``mqtt.client_id``, or ``flexmig-<node>``."""
        return self.mqtt.client_id or f"flexmig-{self.node(hostname)}"


# --------------------------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong in a configuration file: where (file, dotted key, line) and what."""

    file: str
    key: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigFileError(ConfigError):
    """A configuration file was refused; ``problems`` lists every problem found, one line each in the message."""

    def __init__(self, problems: Collection[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


# --------------------------------------------------------------------------------------------------------------
# Locating keys in the TOML text (tomllib gives no positions)

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def _parse_key(s: str, pos: int) -> tuple[list[str], int] | None:
    """Parse a (dotted) TOML key at ``s[pos:]``; returns its parts and the position after it, or None."""
    parts: list[str] = []
    n = len(s)
    while True:
        while pos < n and s[pos] in " \t":
            pos += 1
        if pos >= n:
            return None
        ch = s[pos]
        if ch == '"':
            end = pos + 1
            buf: list[str] = []
            while end < n and s[end] != '"':
                if s[end] == "\\" and end + 1 < n:
                    esc = s[end + 1]
                    width = {"u": 4, "U": 8}.get(esc, 0)
                    if width:
                        digits = s[end + 2 : end + 2 + width]
                        try:
                            buf.append(chr(int(digits, 16)))
                        except ValueError:
                            return None
                        end += 2 + width
                        continue
                    buf.append(_ESCAPES.get(esc, esc))
                    end += 2
                    continue
                buf.append(s[end])
                end += 1
            if end >= n:
                return None
            parts.append("".join(buf))
            pos = end + 1
        elif ch == "'":
            end = s.find("'", pos + 1)
            if end < 0:
                return None
            parts.append(s[pos + 1 : end])
            pos = end + 1
        else:
            m = _BARE_KEY.match(s, pos)
            if not m:
                return None
            parts.append(m.group())
            pos = m.end()
        while pos < n and s[pos] in " \t":
            pos += 1
        if pos < n and s[pos] == ".":
            pos += 1
            continue
        return parts, pos


def find_key_line(text: str, dotted: str, *, exact: bool = False) -> int | None:
    """The 1-based line where the dotted key (``mqtt.broker``) is set in TOML ``text``.

    Understands table headers (``[mqtt]``, ``[detect.demand_mix]``), dotted and quoted keys, and skips the
    inside of multi-line strings. When the key itself is not in the text (a missing or inline-table value), it
    returns the line of the nearest enclosing table: its header, or the first key set inside it (a sibling, an
    inline table); None when nothing matches, or with ``exact`` when the key itself is not there.
    """
    want = _split_dotted(dotted)
    current: tuple[str, ...] = ()
    headers: dict[tuple[str, ...], int] = {}
    prefix_hits: dict[tuple[str, ...], int] = {}
    in_string: str | None = None
    # Split on "\n" only, as TOML (and tomllib's line numbers) do; str.splitlines() also splits on \x0c, \u2028...
    for lineno, raw in enumerate(text.split("\n"), 1):
        if in_string is not None:
            if raw.count(in_string) % 2 == 1:
                in_string = None
            continue
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            inner = 2 if line.startswith("[[") else 1
            parsed = _parse_key(line, inner)
            if parsed is None:
                continue
            current = tuple(parsed[0])
            for i in range(1, len(current) + 1):
                headers.setdefault(current[:i], lineno)
            if current == want:
                return lineno
            continue
        parsed = _parse_key(line, 0)
        if parsed is None:
            continue
        keys, pos = parsed
        if pos >= len(line) or line[pos] != "=":
            continue
        full = current + tuple(keys)
        if full == want:
            return lineno
        for i in range(1, len(full) + 1):
            prefix_hits.setdefault(full[:i], lineno)
        rest = line[pos + 1 :].lstrip()
        for delim in ('"""', "'''"):
            if rest.startswith(delim) and rest.count(delim) % 2 == 1:
                in_string = delim
                break
    if exact:
        return None
    for i in range(len(want), 0, -1):
        for table in (headers, prefix_hits):
            if want[:i] in table:
                return table[want[:i]]
    return None


def _no_index(key: str) -> str:
    """``jobs.allowed_dirs[1]`` -> ``jobs.allowed_dirs``."""
    return re.sub(r"(\[\d+\])+$", "", key)


def _split_dotted(dotted: str) -> tuple[str, ...]:
    parsed = _parse_key(dotted, 0)
    return tuple(parsed[0]) if parsed is not None else tuple(dotted.split("."))


def _join_key(prefix: str, name: str) -> str:
    part = name if _BARE_KEY.fullmatch(name) else _toml_string(name)
    return f"{prefix}.{part}" if prefix else part


# --------------------------------------------------------------------------------------------------------------
# Validation


def _show(value: object, limit: int = 40) -> str:
    """A short, printable rendering of a user value for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _toml_name(f: Any) -> str:
    return cast(str, f.metadata.get("toml") or f.name)


class _Checker:
    """Walks the parsed TOML against the dataclass schema, collecting (key, message) problems."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fail(self, key: str, message: str) -> None:
        self.problems.append((key, message))

    def section(self, cls: type[_T], data: object, prefix: str) -> _T:
        if not isinstance(data, dict):
            self.fail(prefix, f"expected a table, got {_type_name(data)}")
            return cls()
        hints = _hints(cls)
        known = {_toml_name(f): f for f in fields(cast(Any, cls))}
        for name in data:
            if name not in known:
                self.fail(_join_key(prefix, name), _unknown_message(name, list(known), isinstance(data[name], dict)))
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name not in data:
                continue
            key = _join_key(prefix, name)
            converted = self.value(hints[f.name], data[name], key, f.metadata)
            if converted is not _INVALID:
                values[f.name] = converted
        return cls(**values)

    def value(self, tp: Any, raw: object, key: str, meta: Any) -> Any:
        origin = typing.get_origin(tp)
        if origin in (types.UnionType, typing.Union):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            return self.value(inner[0], raw, key, meta)
        if is_dataclass(tp) and isinstance(tp, type) and tp is not HostPort:
            return self.section(tp, raw, key)
        if origin is Literal:
            choices = typing.get_args(tp)
            if not isinstance(raw, str) or raw not in choices:
                self.fail(key, f"{_show(raw)} is not one of {', '.join(choices)}")
                return _INVALID
            return raw
        if origin is tuple:
            (item_tp, _ellipsis) = typing.get_args(tp)
            if not isinstance(raw, list):
                self.fail(key, f"expected an array, got {_type_name(raw)}")
                return _INVALID
            items = [self.value(item_tp, item, f"{key}[{i}]", meta) for i, item in enumerate(raw)]
            return _INVALID if any(i is _INVALID for i in items) else tuple(items)
        if tp is bool:
            if not isinstance(raw, bool):
                self.fail(key, f"expected true or false, got {_type_name(raw)}")
                return _INVALID
            return raw
        if tp is int:
            if isinstance(raw, bool) or not isinstance(raw, int):
                self.fail(key, f"expected an integer, got {_type_name(raw)}")
                return _INVALID
            return raw if self.in_range(raw, key, meta) else _INVALID
        if tp is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                self.fail(key, f"expected a number, got {_type_name(raw)}")
                return _INVALID
            if not math.isfinite(raw):
                self.fail(key, f"expected a finite number, got {raw}")
                return _INVALID
            return float(raw) if self.in_range(raw, key, meta) else _INVALID
        if not isinstance(raw, str):
            self.fail(key, f"expected a string, got {_type_name(raw)}")
            return _INVALID
        if "\x00" in raw:
            self.fail(key, "contains a NUL character")
            return _INVALID
        if tp is str:
            pattern = meta.get("pattern")
            if pattern and not re.fullmatch(pattern, raw):
                self.fail(key, f"{_show(raw)} does not match {pattern}")
                return _INVALID
            return raw
        if tp is Path:
            if not raw.startswith("/"):
                self.fail(key, f"{_show(raw)} is not an absolute path")
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


def _unknown_message(name: str, known: list[str], is_table: bool) -> str:
    if name.lower() in _SECRET_HINTS:
        return "unknown key: secrets are never written in the configuration; put it in a file and set password_file"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {'section' if is_table else 'key'}{hint}"


def _cross_checks(cfg: Config) -> Iterator[tuple[tuple[str, ...], str]]:
    """Rules between keys; yields (keys, message): the problem is reported at the first of ``keys`` that the
    file sets (the others may be defaults). Only runs when every key's own value was valid."""
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
                f"dcgm.url {dc.url} is flexmigd's own metrics address (prometheus.listen {p.listen}); dcgm-exporter "
                "also defaults to port 9400: move one of them",
            )
    m = cfg.mqtt
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
    url_problem = _check_url(cfg.dcgm.url)
    if url_problem:
        yield ("dcgm.url",), url_problem
    c = cfg.control
    if c.socket_mode & 0o600 != 0o600 or c.socket_mode & 0o007 or c.socket_mode & ~0o777:
        yield (
            ("control.socket_mode",),
            f"0o{c.socket_mode:o} must give the owner read/write (0o600) and others nothing (at most 0o770)",
        )
    if len(os.fsencode(str(c.socket))) > 107:
        yield ("control.socket",), "longer than 107 bytes, the limit of a unix socket path"
    for i, allowed in enumerate(cfg.jobs.allowed_dirs):
        if allowed == Path("/"):
            yield (f"jobs.allowed_dirs[{i}]",), "'/' would let a job write anywhere"


def _check_url(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"{_show(url)}: scheme must be http or https"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials"
    if not parts.hostname:
        return f"{_show(url)} has no host"
    if port == 0:
        return "port 0 is not a port"
    return None


def parse_config(text: str, source: str = "<string>") -> Config:
    """Parse and validate TOML text; pure (no file access). ``source`` names the file in error messages.

    Raises :class:`ConfigFileError` (a :class:`~flexmig.errors.ConfigError`) listing every problem with its
    dotted key and line; never anything else for any text.
    """
    return _parse(text, source)


def _drop_key(data: dict[str, Any], dotted: str) -> None:
    """Remove the dotted key from parsed TOML (its default applies), if every table on the way is a table."""
    *tables, leaf = _split_dotted(dotted)
    node: object = data
    for name in tables:
        node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def _parse(text: str, source: str, without: Collection[str] = ()) -> Config:
    """:func:`parse_config`, with the keys ``without`` left at their defaults whatever the text says."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(m.group(1)) if m else (text.count("\n") + 1 if "end of document" in message else None)
        raise ConfigFileError([ConfigProblem(source, "", line, f"TOML syntax: {message}")]) from None
    except RecursionError:
        raise ConfigFileError([ConfigProblem(source, "", None, "TOML syntax: nested too deeply")]) from None
    for key in without:
        _drop_key(data, key)
    checker = _Checker()
    cfg = checker.section(Config, data, "")
    if not checker.problems:
        for keys, msg in _cross_checks(cfg):
            checker.fail(next((k for k in keys if find_key_line(text, _no_index(k), exact=True)), keys[0]), msg)
    if checker.problems:
        problems = [
            ConfigProblem(source, key, find_key_line(text, _no_index(key)), msg) for key, msg in checker.problems
        ]
        problems.sort(key=lambda p: (p.line is None, p.line or 0))
        raise ConfigFileError(problems)
    return cfg


def _file_problem(path: Path, config_text: str, key: str, exc: ConfigError) -> ConfigProblem:
    return ConfigProblem(str(path), key, find_key_line(config_text, key), str(exc))


def load_config(path: Path | str = DEFAULT_CONFIG_PATH, *, trusted_uids: Collection[int] | None = None) -> Config:
    """Read, permission-check and validate a configuration file.

    The file must be owned by root or the current user (``trusted_uids`` overrides) and be neither group- nor
    world-writable; the credential files it names (``mqtt.password_file``, ``mqtt.tls_key``) must exist and not
    be readable by others; certificates must exist. Raises :class:`ConfigFileError` naming the file, key and
    line of every problem.
    """
    path = Path(path)
    text = _read_config_text(path, trusted_uids)
    cfg = parse_config(text, str(path))
    problems = _credential_file_problems(path, text, cfg, trusted_uids)
    if problems:
        raise ConfigFileError(problems)
    return cfg


#: Keys whose problems ``flexmigd`` can start with (:func:`load_config_deferring`): a malformed broker address
#: only stops MQTT publishing, which the outbox makes up for once a reload fixes it.
DEFERRABLE_KEYS = ("mqtt.broker",)


def load_config_deferring(
    path: Path | str,
    keys: Collection[str] = DEFERRABLE_KEYS,
    *,
    trusted_uids: Collection[int] | None = None,
) -> tuple[Config, tuple[ConfigProblem, ...]]:
    """:func:`load_config` for the daemon's start: when every problem of the file is in ``keys``, return the
    configuration with those keys at their defaults, and the problems (the caller turns off what they steer).

    Any other problem raises :class:`ConfigFileError` listing all of them, the deferrable ones included, exactly
    as :func:`load_config` would. ``flexmig config check`` and reloads stay strict (:func:`load_config`).
    """
    path = Path(path)
    text = _read_config_text(path, trusted_uids)
    deferred: tuple[ConfigProblem, ...] = ()
    try:
        cfg = parse_config(text, str(path))
    except ConfigFileError as exc:
        if not exc.problems or any(p.key not in keys for p in exc.problems):
            raise
        deferred = exc.problems
        try:
            cfg = _parse(text, str(path), without=keys)
        except ConfigFileError as rest:  # problems the bad keys hid (cross-checks only run on valid values)
            raise ConfigFileError(_in_file_order([*deferred, *rest.problems])) from None
    problems = _credential_file_problems(path, text, cfg, trusted_uids)
    if problems:
        raise ConfigFileError(_in_file_order([*deferred, *problems]))
    return cfg, deferred


def _in_file_order(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))


def _read_config_text(path: Path, trusted_uids: Collection[int] | None) -> str:
    """The file's text after its permission, size and encoding checks (ConfigFileError otherwise)."""
    try:
        check_file_permissions(path, "config", trusted_uids)
        with path.open("rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES + 1)
    except ConfigError as exc:
        raise ConfigFileError([ConfigProblem(str(path), "", None, _strip_path(str(exc), path))]) from None
    except OSError as exc:
        raise ConfigFileError([ConfigProblem(str(path), "", None, f"cannot read: {exc.strerror or exc}")]) from None
    if len(raw) > _MAX_FILE_BYTES:
        raise ConfigFileError([ConfigProblem(str(path), "", None, f"larger than {_MAX_FILE_BYTES} bytes")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigFileError([ConfigProblem(str(path), "", line, "not UTF-8 text")]) from None


def _credential_file_problems(
    path: Path, text: str, cfg: Config, trusted_uids: Collection[int] | None
) -> list[ConfigProblem]:
    """Problems with the files the configuration names (password file, TLS key and certificates)."""
    problems: list[ConfigProblem] = []
    m = cfg.mqtt
    for key, file, kind in (
        ("mqtt.password_file", m.password_file, "secret"),
        ("mqtt.tls_key", m.tls_key, "secret"),
        ("mqtt.tls_cert", m.tls_cert, "config"),
        ("mqtt.tls_ca", m.tls_ca, "config"),
    ):
        if file is None:
            continue
        try:
            check_file_permissions(file, cast(Literal["config", "secret"], kind), trusted_uids)
        except ConfigError as exc:
            problems.append(_file_problem(path, text, key, exc))
    return problems


def _strip_path(message: str, path: Path) -> str:
    prefix = f"{path}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


# --------------------------------------------------------------------------------------------------------------
# Reload


@dataclass(frozen=True)
class ReloadResult:
    """What a reload gave: the configuration to use from now on, and what changed.

    On error, ``config`` is the old configuration unchanged and ``error`` says why. ``needs_restart`` lists
    changed keys that only take effect after a restart (listen addresses, socket and state paths).
    """

    config: Config
    error: ConfigError | None = None
    changed: tuple[str, ...] = ()
    needs_restart: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the new file was accepted."""
        return self.error is None


def reload_config(
    current: Config, path: Path | str = DEFAULT_CONFIG_PATH, *, trusted_uids: Collection[int] | None = None
) -> ReloadResult:
    """Load ``path`` again; on any error keep ``current`` (the daemon goes on with its old settings)."""
    try:
        new = load_config(path, trusted_uids=trusted_uids)
    except ConfigError as exc:
        return ReloadResult(current, exc)
    changed = changed_keys(current, new)
    restart = tuple(k for k in changed if _needs_restart(k))
    return ReloadResult(new, None, changed, restart)


def iter_keys(cfg: object, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every leaf key of a configuration tree: (dotted key, value, field metadata), in schema order."""
    for f in fields(cast(Any, cfg)):
        key = _join_key(prefix, _toml_name(f))
        value = getattr(cfg, f.name)
        if is_dataclass(value) and not isinstance(value, (HostPort, type)):
            yield from iter_keys(value, key)
        else:
            yield key, value, f.metadata


def changed_keys(old: Config, new: Config) -> tuple[str, ...]:
    """Dotted keys whose values differ between two configurations."""
    return tuple(k for (k, a, _), (_, b, _) in zip(iter_keys(old), iter_keys(new), strict=True) if a != b)


def _needs_restart(key: str) -> bool:
    return any(k == key and meta.get("restart") for k, _, meta in iter_keys(Config.default()))


# --------------------------------------------------------------------------------------------------------------
# Rendering (flexmig config example)


def _toml_value(value: Any, meta: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"0o{value:o}" if meta.get("octal") else str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v, meta) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as \\uXXXX."""
    escaped = "".join(
        {'"': '\\"', "\\": "\\\\"}.get(ch, ch) if 0x20 <= ord(ch) != 0x7F else f"\\u{ord(ch):04x}" for ch in text
    )
    return f'"{escaped}"'


def _comment(text: str, indent: str = "") -> list[str]:
    text = text.replace("``", "")
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 100 - len(indent))] if text else []


def render_toml(cfg: Config | None = None, *, header: bool = True) -> str:
    """A complete, commented TOML file for ``cfg`` (default: :meth:`Config.default`) that parses back to it.

    Keys whose value is unset (optional files, user name) appear commented out with an example value.
    """
    cfg = Config.default() if cfg is None else cfg
    out: list[str] = []
    if header:
        out += [
            "# flexmig configuration: /etc/flexmig/flexmig.toml (see `flexmig config check`).",
            "# Every key is shown with its default; delete what you do not change. Unknown keys are errors.",
            "# The file must be owned by root and writable only by its owner (chmod 0644 or 0600).",
            "# After an edit: `systemctl reload flexmigd` (a file with errors is refused; the old one stays).",
            "",
        ]
    _render_table(cfg, "", out)
    return "\n".join(out).rstrip("\n") + "\n"


def _render_table(obj: Any, prefix: str, out: list[str]) -> None:
    subtables = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        name = _toml_name(f)
        if is_dataclass(value) and not isinstance(value, HostPort):
            subtables.append((name, value, f.metadata))
            continue
        out += _comment(f.metadata.get("doc", ""))
        key = _join_key("", name)
        if value is None:
            out.append(f"# {key} = {_toml_value(f.metadata.get('example') or '', f.metadata)}")
        else:
            out.append(f"{key} = {_toml_value(value, f.metadata)}")
        out.append("")
    for name, value, meta in subtables:
        table = _join_key(prefix, name)
        out += _comment(meta.get("doc", ""))
        out.append(f"[{table}]")
        out.append("")
        _render_table(value, table, out)


def _same_endpoint(host: str, port: int, listen: HostPort) -> bool:
    """True when ``host:port`` names the address flexmigd serves its metrics on (loopback names count as one)."""
    if port != listen.port:
        return False
    loopback = {"localhost", "127.0.0.1", "::1"}
    return host == listen.host or (host in loopback and listen.host in loopback)
