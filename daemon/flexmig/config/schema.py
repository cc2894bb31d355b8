"""The configuration's schema: one frozen dataclass per TOML table, each field with its default and its rules.

Every key has a default, so an empty file is a valid configuration (observe mode, metrics on loopback, MQTT
and DCGM off). Each field's metadata (``_doc``) holds its documentation and its range; the same metadata
drives validation (:mod:`flexmig.config.checks`) and the example file (:mod:`flexmig.config.render`), so the
documented file cannot drift from what the loader accepts.
"""

# ruff: noqa: RUF009  (every field default goes through _doc(), which returns dataclasses.field() with metadata)

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Collection, Iterator
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, cast

from flexmig.config.address import HostPort
from flexmig.config.keys import join_key
from flexmig.detect.settings import DEFAULT_DEMAND, FragmentationSettings, UnderuseSettings
from flexmig.plan.types import PlannerSettings
from flexmig.security import Secret, read_secret_file

__all__ = [
    "BaselineConfig",
    "Config",
    "ControlConfig",
    "DcgmConfig",
    "DemandMixConfig",
    "DetectConfig",
    "JobsConfig",
    "Mode",
    "MqttConfig",
    "PlannerConfig",
    "PrometheusConfig",
    "SamplingConfig",
    "SlurmConfig",
    "StateConfig",
    "iter_keys",
    "toml_name",
]

#: flexmigd's default ``/metrics`` port. The Prometheus project's list of default exporter ports has no free
#: number left in 9100-9999 and goes on above 10000 (Kubernetes holds 10248-10259); 17400 lies outside both,
#: below Linux's ephemeral range (32768-60999), and is the default of no exporter met on a GPU node:
#: dcgm-exporter 9400, node_exporter 9100, nvidia_gpu_exporter 9835, nv-hostengine 5555, Slurm 6817-6819,
#: torchrun's rendezvous 29400.
DEFAULT_METRICS_PORT = 17400

#: dcgm-exporter's default port (``--address :9400``), where ``[dcgm] url`` reads it by default.
DCGM_EXPORTER_PORT = 9400

#: What the daemon may do. ``observe``: sample, detect, export, never change a GPU. ``advise``: also plan and
#: publish plans. ``act``: execute plans (needs root with CAP_SYS_ADMIN).
Mode = Literal["observe", "advise", "act"]

#: How many metric families ``/metrics`` exports (flexmig.metrics.families.LEVELS).
MetricsDetail = Literal["minimal", "standard", "full"]

_PLANNER = PlannerSettings()  # the planner's defaults are the [planner] table's
_UNDERUSE = UnderuseSettings()  # detection's defaults are the [detect] table's
_FRAGMENTATION = FragmentationSettings()
_DEMAND = dict(DEFAULT_DEMAND)  # and its default mix the [detect.demand_mix] table's


def _doc(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    gt: float | None = None,
    pattern: str | None = None,
    allowed: str | None = None,
    example: str | None = None,
    toml: str | None = None,
    octal: bool = False,
    restart: bool = False,
) -> Any:
    """A dataclass field with the schema metadata that validation and the example file use.

    ``lo``/``hi`` are inclusive bounds, ``gt`` an exclusive lower bound, ``pattern`` a regex a string must match
    in full (``allowed`` says in words what it allows, for error messages), ``example`` the value shown
    (commented out) for optional keys, ``toml`` the key's name in the file when it is not a Python identifier,
    ``octal`` prints the default as ``0o600``, and ``restart`` marks keys that a reload cannot apply (the daemon
    must be restarted; on a table's field of :class:`Config`, every key of that table). The flag is the only rule
    for what a reload changes: each component applies the other keys at once, and a reload names the restart keys
    that changed (``tests/daemon/test_reload_keys.py`` holds every key to its flag).
    """
    meta = {
        "doc": doc,
        "lo": lo,
        "hi": hi,
        "gt": gt,
        "pattern": pattern,
        "allowed": allowed,
        "example": example,
        "toml": toml,
        "octal": octal,
        "restart": restart,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SamplingConfig:
    """How often the node is sampled and how much history is kept in memory."""

    interval_s: float = _doc(1.0, "Seconds between two sweeps over every GPU and MIG instance.", lo=0.05, hi=3600)
    retention_s: float = _doc(
        3600.0,
        "Seconds of per-instance history kept in the in-memory ring buffers; at least the longest detection window.",
        lo=1,
        hi=7 * 86400,
        restart=True,
    )
    stall_s: float = _doc(
        30.0,
        "A sweep older than this means the sampling loop is wedged (a hung NVML call): the systemd watchdog stops "
        "being fed, so systemd restarts the daemon. At least twice interval_s.",
        lo=1,
        hi=3600,
        restart=True,
    )
    gpm: bool = _doc(
        True, "Read SM/DRAM/tensor activity through GPM where the GPU has it (Hopper and newer).", restart=True
    )


@dataclass(frozen=True)
class PrometheusConfig:
    """The ``/metrics`` endpoint (names ``flexmig_*``, labels joinable with dcgm-exporter's)."""

    enabled: bool = _doc(True, "Serve Prometheus metrics.", restart=True)
    listen: HostPort = _doc(
        HostPort("127.0.0.1", DEFAULT_METRICS_PORT),
        "Address to listen on. Loopback only unless allow_remote = true. The default port, 17400, is taken by "
        "no common exporter (dcgm-exporter listens on 9400, node_exporter on 9100).",
        restart=True,
    )
    allow_remote: bool = _doc(
        False,
        "Allow a listen address other than loopback (metrics then reach the network unauthenticated).",
        restart=True,
    )
    detail: MetricsDetail = _doc(
        "standard",
        "Which families are exported (docs/metrics.md, Detail and series budget): minimal (per instance: memory "
        "size and use, SM activity, processes, idle time, active findings), standard (also the window statistics, "
        "the placement, each GPU's power limit, MIG mode and clocks) or full (every family, 0 for every finding "
        "judged absent).",
        restart=True,
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
        allowed="at most 64 letters, digits, '.', '_' or '-'",
    )
    topic_prefix: str = _doc(
        "flexmig/v1",
        "Topic prefix; the node's topics are <topic_prefix>/<node>/... No wildcards, no empty levels.",
        pattern=r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,7}",
        allowed="1 to 8 '/'-separated levels of letters, digits, '.', '_' or '-' (no wildcards, no empty level)",
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
    username: str | None = _doc(
        None,
        "Broker user name.",
        example="flexmig-node",
        pattern=r"[^\x00-\x1f]{1,256}",
        allowed="1 to 256 characters, no control characters",
    )
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
        "Accept commands on <topic_prefix>/<node>/commands/<verb> (docs/mqtt.md, MQTT commands); needs username "
        "and password_file.",
    )
    outbox: Path = _doc(
        Path("/var/lib/flexmig/outbox.sqlite3"),
        "Persistent outbox: events wait here while the broker is away (SQLite, mode 0600, in a directory only the "
        "daemon's user may write; a corrupt file is moved aside as outbox.sqlite3.corrupt-TIME and a fresh one "
        "holds the events that could be read).",
        restart=True,
    )
    outbox_max_bytes: int = _doc(
        256 * 1024 * 1024,
        "Most bytes of event JSON the outbox holds; past it the oldest events are dropped, counted "
        '(flexmig_events_dropped_total{reason="outbox_full"}) and logged at most once a minute. The file takes '
        "up to about twice this (SQLite pages, the index on event IDs).",
        lo=1024 * 1024,
        hi=1 << 40,
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
    url: str = _doc(
        f"http://127.0.0.1:{DCGM_EXPORTER_PORT}/metrics",
        "dcgm-exporter's metrics URL (http or https, no credentials); 9400 is dcgm-exporter's default port.",
    )
    timeout_s: float = _doc(2.0, "Timeout of one scrape in seconds.", lo=0.1, hi=60)


@dataclass(frozen=True)
class DemandMixConfig:
    """Relative demand for each instance size (by compute slices); weights the fragmentation figures.

    The default leans to small instances, as MIG is chosen for jobs smaller than a GPU (detect.settings).
    """

    # The defaults are detection's own mix (flexmig.detect.DEFAULT_DEMAND), the one place they are set.
    g1: float = _doc(_DEMAND["1g"], "Weight of 1-slice profiles (1g.*).", lo=0, hi=1e6, toml="1g")
    g2: float = _doc(_DEMAND["2g"], "Weight of 2-slice profiles (2g.*).", lo=0, hi=1e6, toml="2g")
    g3: float = _doc(_DEMAND["3g"], "Weight of 3-slice profiles (3g.*).", lo=0, hi=1e6, toml="3g")
    g4: float = _doc(_DEMAND["4g"], "Weight of 4-slice profiles (4g.*).", lo=0, hi=1e6, toml="4g")
    g7: float = _doc(_DEMAND["7g"], "Weight of the whole-GPU profile (7g.*).", lo=0, hi=1e6, toml="7g")

    def weights(self) -> dict[int, float]:
        """Compute-slice count -> weight, for the detection layer."""
        return {1: self.g1, 2: self.g2, 3: self.g3, 4: self.g4, 7: self.g7}


@dataclass(frozen=True)
class DetectConfig:
    """Thresholds of the underuse and fragmentation findings."""

    # The defaults are detection's own (flexmig.detect.DetectSettings), the one place they are set.
    underuse_activity: float = _doc(
        _UNDERUSE.activity_enter,
        "An instance whose SM activity (p95, else mean) stays at or below this ratio, and whose memory stays at "
        "or below underuse_memory, for underuse_window_s is underused (idle when it runs no process).",
        lo=0,
        hi=1,
    )
    underuse_activity_exit: float = _doc(
        _UNDERUSE.activity_exit,
        "The finding ends once activity stays above this ratio for underuse_exit_window_s.",
        lo=0,
        hi=1,
    )
    underuse_memory: float = _doc(
        _UNDERUSE.memory_enter, "Memory used, as a ratio of the instance's memory, that counts as low.", lo=0, hi=1
    )
    underuse_memory_exit: float = _doc(
        _UNDERUSE.memory_exit, "... or once memory used stays above this ratio for underuse_exit_window_s.", lo=0, hi=1
    )
    underuse_window_s: float = _doc(
        _UNDERUSE.enter_after_s, "How long low use must hold before it is a finding, in seconds.", lo=1, hi=86400
    )
    underuse_exit_window_s: float = _doc(
        _UNDERUSE.exit_after_s,
        "How long high use must hold before an underuse finding ends, in seconds.",
        lo=0,
        hi=86400,
    )
    oversize_margin: float = _doc(
        _UNDERUSE.oversize_margin,
        "A job is oversized when a smaller profile holds its p95 SMs and memory with this headroom.",
        lo=0,
        hi=10,
    )
    oversize_window_s: float = _doc(
        _UNDERUSE.oversize_after_s, "How long a job must fit a smaller profile to be oversized.", lo=1, hi=86400
    )
    fragmentation_threshold: float = _doc(
        _FRAGMENTATION.enter,
        "A GPU is fragmented while the share of its compute slices that repacking would make usable by a "
        "profile of the demand mix (its recoverable score, 0-1) stays at or above this (0.25: 2 of 7 slices).",
        lo=0,
        hi=1,
    )
    fragmentation_exit: float = _doc(
        _FRAGMENTATION.exit,
        "The fragmentation finding ends once the recoverable score stays at or below this (0.15: 1 of 7 slices).",
        lo=0,
        hi=1,
    )
    fragmentation_window_s: float = _doc(
        _FRAGMENTATION.enter_after_s,
        "How long fragmentation (or its end) must persist before it is reported, in seconds.",
        lo=0,
        hi=86400,
    )
    demand_mix: DemandMixConfig = _doc(factory=DemandMixConfig, doc=DemandMixConfig.__doc__ or "")


@dataclass(frozen=True)
class PlannerConfig:
    """The planner (modes advise and act): how often it runs and what actions cost."""

    # Every key PlannerSettings also has takes its default from there (the one set of planner defaults), so a
    # daemon without a [planner] table plans exactly as the planner documents; its docstring gives the figures.
    interval_s: float = _doc(60.0, "Seconds between two planning rounds.", lo=1, hi=86400)
    settling_s: float = _doc(
        _PLANNER.settling_s,
        "A job started, migrated or re-split is not moved again for this long, in seconds.",
        lo=0,
        hi=86400,
    )
    # Action costs: the measured figures of bench/migration.py and the torch DDP example (examples/train_ddp.py,
    # 2 ranks, gloo, on the simulated node).
    checkpoint_s: float = _doc(
        _PLANNER.checkpoint_s,
        "Expected time from the checkpoint request to the job's ranks having exited (measured for the torch DDP "
        "example: acknowledgement 40-70 ms, ranks gone 0.1 s later with Hook.exit, 1.1 s later through the "
        "interpreter's teardown; bench/migration.py). Raise it for jobs with large checkpoints.",
        lo=0,
        hi=3600,
    )
    reconfigure_s: float = _doc(
        _PLANNER.reconfigure_s, "Expected time to destroy or create one MIG instance.", lo=0, hi=3600
    )
    restart_s: float = _doc(
        _PLANNER.restart_s,
        "Expected time from the acknowledgement to the job's first step after resuming when its new ranks start "
        "cold (measured: 4.9 s for the torch DDP example, 10 s under heavy load; flexmig's own part 0.05-0.15 s; "
        "bench/migration.py).",
        lo=0,
        hi=3600,
    )
    standby_restart_s: float = _doc(
        _PLANNER.standby_restart_s,
        "The same for a job with standby ranks ([hook] standby), whose next generation did its start-up before the "
        "request (measured: 0.3-0.55 s for the torch DDP example; bench/migration.py).",
        lo=0,
        hi=3600,
    )
    spread_efficiency: float = _doc(
        _PLANNER.spread_efficiency,
        "Speed of a job spread over several instances, as a fraction of the speed its compute slices would give "
        "in one instance (one rank per instance, no P2P/NVLink between MIG instances).",
        gt=0,
        hi=1,
    )
    gain_margin: float = _doc(
        _PLANNER.gain_margin,
        "Move a job only when the expected gain (the wait it spares another job, the run time it saves) is at "
        "least (1 + this) times its cost.",
        lo=0,
        hi=10,
    )
    migrate_enabled: bool = _doc(_PLANNER.migrate, "Plan migrations of jobs between instances.")
    resplit_enabled: bool = _doc(
        _PLANNER.resplit, "Plan re-splits of distributed jobs over another number of instances."
    )
    malleable_enabled: bool = _doc(
        _PLANNER.malleable,
        "Let a job whose spec allows fewer ranks than it starts with (ranks.min below ranks.start) start or keep "
        "running on fewer ranks, at lower speed, when that beats waiting, and grow it back when room frees.",
    )


@dataclass(frozen=True)
class JobsConfig:
    """Job specs the daemon launches, and where jobs may keep their files."""

    directory: Path = _doc(
        Path("/etc/flexmig/jobs"),
        "Not read (kept so that configurations written for it still load): job specs are submitted with "
        "`flexmig jobs submit`, which checks them against `allowed_dirs`.",
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
        "when the daemon cannot read job directories (a unit without the act drop-in's CAP_DAC_READ_SEARCH).",
        example="/run/flexmig/acks",
        restart=True,
    )
    rank_log_max_bytes: int = _doc(
        16 * 1024 * 1024,
        "Size at which a rank's log (STATE_DIR/logs/NAME/gGEN-rSLOT.log) is rotated; a rank's output never takes "
        "more than (rank_log_keep + 1) times this. Applies to ranks launched after a reload.",
        lo=64 * 1024,
        hi=1024**4,
    )
    rank_log_keep: int = _doc(
        2,
        "Rotated files kept per rank log (.1 newest); older ones, and the logs of all but this many earlier "
        "generations of a job, are removed. 0: a full log is emptied and begun again.",
        lo=0,
        hi=100,
    )
    max_pending: int = _doc(
        1000,
        "Most jobs waiting for room (pending); a submission past it is refused, naming this key, and changes nothing. "
        "Each waiting job costs every planning round some work, so keep it to what the node can work through.",
        lo=1,
        hi=1_000_000,
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
    max_wait_s: float = _doc(
        900.0,
        "Longest a control request (socket or MQTT command) may wait to begin, behind the action in flight; past "
        "it the request is dropped, nothing done, and the log says so. A client's own deadline (flexmig --timeout) "
        "is capped at this; a request that states none gets it.",
        lo=1,
        hi=86400,
    )


@dataclass(frozen=True)
class StateConfig:
    """Persistent state."""

    directory: Path = _doc(Path("/var/lib/flexmig"), "State directory (systemd StateDirectory=flexmig).", restart=True)
    journal: Path = _doc(Path("/var/lib/flexmig/journal.sqlite3"), "Action journal (SQLite, WAL mode).", restart=True)


_SLURM_NAME = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,62})?"


@dataclass(frozen=True)
class SlurmConfig:
    """Slurm: the node's MIG layout follows the pending jobs of its partitions, and Slurm is told what the node then
    hosts (gres.conf lines, a dynamic-node re-registration). See docs/slurm-node.md."""

    enabled: bool = _doc(
        False,
        "Read this node's demand from Slurm (squeue, sinfo) instead of flexmig's own queue (flexmig jobs submit is "
        "then refused). In mode act flexmig also re-registers the node with Slurm after changing its instances.",
        restart=True,
    )
    node: str = _doc(
        "", "This node's Slurm node name; empty: node_name, else the host name.", pattern=_SLURM_NAME, restart=True
    )
    partitions: tuple[str, ...] = _doc(
        (), "Only pending jobs of these partitions count; empty: the partitions the node is in.", restart=True
    )
    interval_s: float = _doc(10.0, "Seconds between two reads of Slurm's queue.", lo=1, hi=3600)
    conf: Path | None = _doc(
        None,
        "The slurm.conf Slurm's commands read (SLURM_CONF); unset: Slurm's default.",
        example="/etc/slurm/slurm.conf",
        restart=True,
    )
    bin_dir: Path | None = _doc(
        None,
        "Directory of squeue, sinfo, scontrol, scancel and slurmd; unset: found on PATH and in the sbin directories.",
        example="/usr/bin",
        restart=True,
    )
    command_timeout_s: float = _doc(
        30.0,
        "Longest time one Slurm command may take (with slurmctld down each needs about 9 s to say so).",
        lo=1,
        hi=600,
        restart=True,
    )
    gres_conf: Path = _doc(
        Path("/etc/slurm/gres.conf"),
        "The gres.conf slurmd reads (next to slurm.conf). flexmig rewrites only its own marked block for this node.",
        restart=True,
    )
    gres_map: Path = _doc(
        Path("/run/flexmig/slurm/gres-map.json"),
        "Where flexmig writes each GRES index's MIG UUID for its TaskProlog (flexmig slurm taskprolog --map); "
        "{node} is the node's name (the TaskProlog fills it in from SLURMD_NODENAME).",
        restart=True,
    )
    dev_dir: Path = _doc(
        Path("/dev"), "Where the GPU and capability device files are (a simulated node: its stand-ins).", restart=True
    )
    mig_minors: Path = _doc(
        Path("/proc/driver/nvidia-caps/mig-minors"), "The driver's MIG capability minors table.", restart=True
    )
    slurmd_pid_file: Path = _doc(
        Path("/run/slurmd.pid"),
        "slurmd's pid file (SlurmdPidFile of slurm.conf): whether slurmd runs, stopped cleanly or crashed; {node} "
        "is the node's name (slurm.conf's %n).",
        restart=True,
    )
    slurmd_control: str = _doc(
        "systemd",
        "How flexmig restarts slurmd to register the node: systemd (systemctl restart slurmd_unit, with flexmig's "
        "drop-in reading slurmd_env) or hook (the slurmd_hook command, called with start, stop or restart).",
        pattern=r"systemd|hook",
        allowed="systemd or hook",
        restart=True,
    )
    slurmd_unit: str = _doc(
        "slurmd.service", "slurmd's systemd unit (slurmd_control = systemd); {node} is the node's name.",
        pattern=r"[A-Za-z0-9@_.:{}-]{1,128}",
        restart=True,
    )  # fmt: skip
    slurmd_hook: tuple[str, ...] = _doc(
        (),
        "The command (argv, no shell) that starts, stops or restarts slurmd (slurmd_control = hook); it gets the "
        "verb as its last argument and FLEXMIG_SLURMD_ENV, FLEXMIG_SLURMD_NODE, FLEXMIG_SLURMD_CONF; {node} in a "
        "word is the node's name.",
        example='["/usr/local/sbin/slurmd-ctl"]',
        restart=True,
    )
    slurmd_env: Path = _doc(
        Path("/run/flexmig/slurm/slurmd.env"),
        "The environment file flexmig writes for slurmd's unit: FLEXMIG_SLURMD_NODE and FLEXMIG_SLURMD_CONF (the "
        "slurmd -Z --conf value with Gres=); {node} is the node's name.",
        restart=True,
    )
    slurmd_conf: str = _doc(
        "",
        "The dynamic node's other parameters for slurmd -Z --conf, as KEY=VALUE words (not Gres=, flexmig sets it).",
        pattern=r"\s*([A-Za-z]+=[A-Za-z0-9_.,:@/+-]+\s*)*",
        example="CPUs=64 RealMemory=500000 Feature=mig",
        restart=True,
    )
    slurmd_conf_per_slice: str = _doc(
        "",
        "With node_per_instance: KEY=INTEGER words (CPUs, RealMemory, TmpDisk) that each instance node registers "
        "multiplied by its instance's compute slices, beside slurmd_conf: with CPUs=8, a 1g instance's node offers "
        "8 CPUs and a 7g one's 56, so that a job on a bigger instance gets a bigger share of the host.",
        pattern=r"\s*([A-Za-z]+=[0-9]{1,9}\s*)*",
        example="CPUs=8 RealMemory=64000",
        restart=True,
    )
    node_per_gpu: bool = _doc(
        False,
        "Slurm 23.11 and later: one dynamic node per MIG GPU, <node>-gpu<K>, each with its own slurmd (Port= "
        "slurmd_port_base + K), so a change of one GPU re-registers that GPU's node alone. slurmd_pid_file, "
        "slurmd_env and gres_map (and slurmd_unit with systemd) then must contain {node}, the GPU node's name.",
        restart=True,
    )
    node_per_instance: bool = _doc(
        False,
        "One Slurm node per MIG instance, each with its own slurmd (Port= slurmd_port_base + 8K + S): a dynamic "
        "node <node>-gpu<K>-<S> (S: its first memory slice; Slurm 23.11 and later), or a State=FUTURE node of "
        "slurm.conf (instance_nodes: static; Slurm 22.05 and later). A node's GRES never changes: flexmig "
        "creates an instance with its node and destroys only idle ones, so no change waits for an unrelated job. "
        "The same {node} rules as node_per_gpu; not together with it.",
        restart=True,
    )
    instance_nodes: str = _doc(
        "dynamic",
        "With node_per_instance, how the instance nodes exist: dynamic (Slurm 23.11 and later: flexmig creates "
        "and deletes <node>-gpu<K>-<S>, slurmd -Z) or static (any Slurm from 22.05: slurm.conf lists one State=FUTURE "
        "node <node>-gpu<K>-<S>-<profile> per place a MIG profile can take, as `flexmig slurm conf "
        "--node-per-instance --static` prints them; flexmig starts a node's slurmd when its instance exists and "
        "returns the node to FUTURE when the instance goes).",
        pattern=r"dynamic|static",
        allowed="dynamic or static",
        restart=True,
    )
    hold_after_s: float = _doc(
        900.0,
        "With node_per_instance: a waiting job that fits in no free or idle instance holds a region after waiting "
        "this long (seconds): nothing is carved there for later jobs, and its free instances take only jobs that "
        "end before its busy ones, so a big job does not starve behind a stream of small ones (sooner with "
        "hold_when_idle).",
        lo=0.0,
        hi=86400.0,
    )
    hold_when_idle: bool = _doc(
        True,
        "With node_per_instance: in a round where a compute slice idles and no waiting job can use it (no free "
        "instance of its profile, nothing can be carved for it), the first waiting job that fits nowhere holds its "
        "region at once instead of after hold_after_s: the jobs behind it no longer overtake it while it waits for "
        "busy instances to end, as Slurm's own backfill would not let them (false: they do until it has waited "
        "hold_after_s; shorter mean waits, less of the GPU busy while jobs wait).",
    )
    max_moves_per_job: int = _doc(
        2,
        "With node_per_instance: how often one running hook job may be moved at most (checkpointed, requeued and "
        "restarted on room elsewhere) so that a waiting job that fits nowhere gets the region it needs; counted by "
        "the job's restarts. 0: no job is ever moved.",
        lo=0,
        hi=100,
    )
    slurmd_port_base: int = _doc(
        6830,
        "With node_per_gpu: GPU K's slurmd listens on this port plus K (its --conf Port=); with node_per_instance, "
        "the instance at memory slice S of GPU K on this port plus 8K + S.",
        lo=1,
        hi=65535,
        restart=True,
    )
    hook_token: str = _doc(
        "flexmig:hook",
        "A job opts into checkpoint-and-requeue by carrying this word in its comment (sbatch --comment) and "
        "being submitted with --requeue. Jobs without it are never signalled.",
        pattern=r"[A-Za-z0-9:_.+-]{1,64}",
        restart=True,
    )
    hook_settle_s: float = _doc(
        60.0,
        "A hook job is signalled only after running this long (before, its handler may not be installed).",
        lo=0,
        hi=86400,
        restart=True,
    )
    checkpoint_dir: str = _doc(
        "/var/lib/flexmig-slurm/{user}/{job_id}",
        "Each Slurm job's checkpoint directory ({job_id}, {user}, {uid} are filled in): the directories before the "
        "first placeholder are root's, the first with one is made for the user by flexmig's Prolog (as root), the "
        "rest by the TaskProlog as the job's user. Not under /tmp or /var/tmp: flexmigd's unit has them private. Put "
        "it on a shared file system if a requeued job may resume on another node.",
        pattern=r"/[^\n]*",
        restart=True,
    )
    checkpoint_signal: str = _doc(
        "USR1",
        "The signal asking a hook job to checkpoint (scancel --signal ... --batch).",
        pattern=r"USR1|USR2|HUP|INT",
        restart=True,
    )
    ack_wait_s: float = _doc(
        600.0,
        "How long a hook job waits, after acknowledging, to be requeued (FLEXMIG_ACK_WAIT_S).",
        lo=1,
        hi=86400,
        restart=True,
    )
    ack_timeout_s: float = _doc(
        120.0,
        "Time a signalled job has to acknowledge; on timeout the whole change is cancelled.",
        lo=1,
        hi=86400,
        restart=True,
    )
    drain_timeout_s: float = _doc(
        900.0,
        "Longest time the node stays closed for a change (flexmig's reservation's duration): if its jobs have not "
        "ended by then, the reservation ends, the node reopens and the change is abandoned.",
        lo=60,
        hi=7 * 86400,
        restart=True,
    )
    register_timeout_s: float = _doc(
        60.0, "Longest wait for slurmctld to list the re-registered node.", lo=1, hi=3600, restart=True
    )
    reregister_s: float = _doc(
        5.0,
        "The planner's estimate of one re-registration beyond the drain (slurmd restart, registration).",
        lo=0,
        hi=3600,
    )
    min_interval_s: float = _doc(
        60.0,
        "Shortest time between two changes that close a busy node (they are batched meanwhile); an idle node is "
        "changed at once.",
        lo=0,
        hi=86400,
    )
    max_wait_s: float = _doc(
        1800.0,
        "A job waiting for a layout the node does not have commits a change once it has waited this long, whatever "
        "the change costs (nothing starves).",
        lo=0,
        hi=7 * 86400,
    )
    probe_s: float = _doc(
        1.0,
        "Seconds between two cheap looks (sdiag's job counters, slurmd's pid file) between reads of the queue: a "
        "new job or a crashed slurmd is seen within this.",
        lo=0.2,
        hi=3600,
    )
    cluster_reads_per_s: float = _doc(
        20.0,
        "Site-wide: how many reads of Slurm's queue a second the flexmig daemons of the whole cluster may make "
        "together when they see it move (sdiag's counters), so that a busy cluster's slurmctld is not asked for "
        "every job by every node every probe_s: each node leaves at least (GPU hosts slurmctld lists / this) "
        "seconds between two such reads, and at least probe_s. Its own slurmd's crash and the timed read every "
        "interval_s are not held back. Give every node the same value.",
        lo=0.01,
        hi=100000,
    )
    max_closed_nodes: int = _doc(
        0,
        "Site-wide: at most this many nodes closed for flexmig's changes at once (flexmig's reservations whose "
        "windows overlap, counted in Slurm); 0: no limit. Give every node the same value.",
        lo=0,
        hi=100000,
    )


@dataclass(frozen=True)
class BaselineConfig:
    """The node's baseline layout: what its GPUs hold when flexmig is not re-laying them (the static layout an
    operator declares, e.g. with mig-parted), and what ``flexmig standdown`` restores."""

    mig_parted_file: Path | None = _doc(
        None,
        "A mig-parted configuration file (version v1, mig-configs) whose configuration mig_parted_config is the "
        "baseline; same permission rules as this file.",
        example="/etc/nvidia-mig-manager/config.yaml",
    )
    mig_parted_config: str = _doc(
        "",
        "The configuration of mig_parted_file to use (mig-parted's -c, e.g. all-balanced); empty when the file "
        "holds only one.",
        pattern=r"[^\x00-\x1f]{0,128}",
        allowed="at most 128 characters, no control characters",
    )


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
        allowed="empty, or up to 63 letters, digits, '.', '_' or '-' starting with a letter or digit",
        restart=True,
    )
    sampling: SamplingConfig = _doc(factory=SamplingConfig, doc=SamplingConfig.__doc__ or "")
    prometheus: PrometheusConfig = _doc(factory=PrometheusConfig, doc=PrometheusConfig.__doc__ or "")
    # The publisher, its outbox, the command listener and the scraper are set up at start, from the whole table.
    mqtt: MqttConfig = _doc(factory=MqttConfig, doc=MqttConfig.__doc__ or "", restart=True)
    dcgm: DcgmConfig = _doc(factory=DcgmConfig, doc=DcgmConfig.__doc__ or "", restart=True)
    detect: DetectConfig = _doc(factory=DetectConfig, doc=DetectConfig.__doc__ or "")
    planner: PlannerConfig = _doc(factory=PlannerConfig, doc=PlannerConfig.__doc__ or "")
    jobs: JobsConfig = _doc(factory=JobsConfig, doc=JobsConfig.__doc__ or "")
    control: ControlConfig = _doc(factory=ControlConfig, doc=ControlConfig.__doc__ or "")
    state: StateConfig = _doc(factory=StateConfig, doc=StateConfig.__doc__ or "")
    baseline: BaselineConfig = _doc(factory=BaselineConfig, doc=BaselineConfig.__doc__ or "")
    slurm: SlurmConfig = _doc(factory=SlurmConfig, doc=SlurmConfig.__doc__ or "")

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


def toml_name(f: Any) -> str:
    """The key a dataclass field has in the file (``1g`` for ``g1``)."""
    return cast(str, f.metadata.get("toml") or f.name)


def iter_keys(cfg: object, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every leaf key of a configuration tree: (dotted key, value, field metadata), in schema order. A table marked
    ``restart`` marks each of its keys so."""
    yield from _iter_keys(cfg, prefix, restart=False)


def _iter_keys(cfg: object, prefix: str, *, restart: bool) -> Iterator[tuple[str, Any, Any]]:
    for f in fields(cast(Any, cfg)):
        key = join_key(prefix, toml_name(f))
        value = getattr(cfg, f.name)
        if is_dataclass(value) and not isinstance(value, (HostPort, type)):
            yield from _iter_keys(value, key, restart=restart or bool(f.metadata.get("restart")))
        else:
            yield key, value, {**f.metadata, "restart": True} if restart else f.metadata
