"""A private Slurm on loopback: munged, slurmctld (and, through flexmigd, the slurmds) under one directory, for one
simulated host or several (``hosts``: a cluster on one machine, each host with its flexmigd, reached at 127.0.0.I).

It backs ``flexmig slurm testbed`` and the integration tests. Everything lives under the directory it is given:
the munge key and socket, slurm.conf, slurmctld's state, the spool, pid files and logs, the jobs' output and
checkpoints (one tree for every host), and each host's gres.conf, stand-in device files, MIG minors table and
flexmigd's configuration and journal (:class:`~flexmig.slurm.testbed_conf.HostPaths`). Nothing outside it is
touched, and two testbeds on one machine use different ports.

What a real Slurm 22.05.8 needs here (verified on Debian 12, no GPU):

* munged runs as user ``munge`` with its own key; it refuses a socket directory that is not mode 0755, and the
  whole path to it must be reachable by that user (so not under a mode-0700 directory);
* slurmctld and slurmd run as root on 127.0.0.1 with their own ports, ``SelectType=select/cons_tres``,
  ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, ``GresTypes=gpu`` and no accounting; slurmctld
  answers within about a second of its start;
* gres ``MultipleFiles`` must name character devices (plain files are refused): the stand-ins have the major and
  minor of /dev/null;
* the node is dynamic (``slurmd -Z``, which needs ``MaxNodeCount``) so that flexmig can re-register it with
  another ``Gres=`` without restarting slurmctld; systemd is not PID 1 here, so flexmigd restarts slurmd through
  the hook command :mod:`flexmig.slurm.standin`, the stand-in for slurmd's unit (the production path otherwise);
* a job asking for a GRES type no node has is refused at submission ("Requested node configuration is not
  available"): a ``State=FUTURE`` placeholder node advertising every profile makes it pend (reason
  ReqNodeNotAvail) instead, which is the demand flexmig reads;
* ``JobRequeue=0``, so that only jobs submitted with ``--requeue`` may be requeued (with the default of 1 every
  batch job says ``requeue: true``).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from flexmig.errors import SlurmError
from flexmig.mig.catalogue import GpuModel
from flexmig.slurm.client import SlurmCommands
from flexmig.slurm.install import render_taskprolog
from flexmig.slurm.minors import render_mig_minors
from flexmig.slurm.pool import pool_lines, pool_node, pool_places
from flexmig.slurm.settings import slot_node
from flexmig.slurm.slots import slot_lines, slot_places
from flexmig.slurm.squeue import parse_squeue
from flexmig.slurm.testbed_conf import HostPaths, TestbedPaths, future_gres, render_slurm_conf
from flexmig.slurm.testbed_proc import (
    DEBIAN_PACKAGES,
    alive,
    check_reachable,
    free_port,
    free_ports,
    job_python,
    missing_binaries,
    pid_from,
    python,
    stop_pid,
)

__all__ = [
    "DEBIAN_PACKAGES",
    "MAX_HOSTS",
    "HostPaths",
    "Testbed",
    "TestbedPaths",
    "free_port",
    "future_gres",
    "job_python",
    "missing_binaries",
    "render_slurm_conf",
    "stop_pid",
]

MAX_HOSTS = 16
"""The most simulated hosts a testbed runs (each a flexmigd; on one machine)."""
_SOCKET_MAX = 107
_START_TIMEOUT_S = 30.0


@dataclass
class Testbed:
    """munged and slurmctld of one private Slurm; slurmd is flexmig's to start (it registers the node).

    ``node`` is the dynamic node's name; ``future_node`` the placeholder's. Use as a context manager, or call
    :meth:`start` and :meth:`stop`.
    """

    root: Path
    model: GpuModel
    gpus: int
    node: str = "flexmig-sim"
    cpus: int = 16
    node_per_gpu: bool = False
    """One dynamic node per GPU (``<node>-gpu<K>``, Slurm 23.11 and later): flexmigd's ``[slurm] node_per_gpu``."""
    node_per_instance: bool = False
    """One dynamic node per MIG instance (``<node>-gpu<K>-<S>``, Slurm 23.11 and later): flexmigd's ``[slurm]
    node_per_instance``."""
    static_nodes: bool = False
    """With ``node_per_instance``: the instance nodes are static ones of slurm.conf (``<node>-gpu<K>-<S>-<profile>``,
    State=FUTURE, any Slurm from 22.05): flexmigd's ``[slurm] instance_nodes = "static"``."""
    pool_nodes: bool = True
    """With ``node_per_instance``: the host's pool nodes (:mod:`flexmig.slurm.pool_nodes`) get their slurmd ports
    after the instance nodes'; with static instance nodes slurm.conf also lists them
    (:func:`flexmig.slurm.pool.pool_lines`, State=FUTURE), so that a job asking for several devices of one profile
    pends until flexmigd registers its pool node instead of being refused at submission."""
    gpu_port_base: int = 0
    """With ``node_per_gpu``: GPU K's slurmd port less K; with ``node_per_instance``: the instance at S of GPU K's
    port less 8K + S (0: chosen free by :meth:`flexmigd_config`, then kept)."""
    hook_prefix: tuple[str, ...] = ()
    """Words put before the slurmd hook command (a test's wrapper around the stand-in)."""
    partition: str = "mig"
    scheduler_parameters: str = "sched_interval=1,bf_interval=1"
    """slurm.conf's SchedulerParameters: the scheduler every second (Slurm's defaults: 60 s, backfill 30 s)."""
    commands: SlurmCommands = field(default_factory=SlurmCommands)
    ctld_port: int = 0
    slurmd_port: int = 0
    job_user: str | None = None
    """Whose jobs :meth:`sbatch` submits (``sbatch --uid``; the tests' users made for the run), None: the caller's."""
    started: list[str] = field(default_factory=list)
    hosts: int = 1
    """Simulated hosts under the one slurmctld and munged, each with its flexmigd, GPUs and slurmds (``--hosts N``):
    host I's node is ``<node>-h<I>`` (:meth:`host_node`), reached at 127.0.0.I (:meth:`host_addr`). One host keeps
    the name ``node`` and the paths of a single-node testbed."""
    port_bases: dict[int, int] = field(default_factory=dict)
    """The slurmd port base of each host but the first (whose is :attr:`gpu_port_base`), chosen once, then kept."""

    def __post_init__(self) -> None:
        self.root = self.root.absolute()
        self.paths = TestbedPaths(self.root)
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise SlurmError(f"--hosts {self.hosts}: must be 1-{MAX_HOSTS}")

    def host_node(self, host: int = 0) -> str:
        """The Slurm node name of host ``host`` (from 0): ``node`` on a testbed of one host, else ``<node>-h<I>``
        (I from 1; instance and GPU nodes extend it, which Slurm's hostlists take as they are)."""
        return self.node if self.hosts == 1 else f"{self.node}-h{host + 1}"

    def host_addr(self, host: int = 0) -> str:
        """Where slurmctld reaches host ``host``'s slurmds: 127.0.0.I (loopback, each host its own address, so that
        flexmig counts the cluster's hosts as a real cluster's; the slurmds listen on every address, each on its
        own port)."""
        return f"127.0.0.{host + 1}"

    def host_paths(self, host: int = 0) -> HostPaths:
        """What host ``host`` has of its own (:class:`HostPaths`)."""
        return HostPaths(self.root if self.hosts == 1 else self.root / "hosts" / f"h{host + 1}")

    def port_base(self, host: int = 0) -> int:
        """Host ``host``'s slurmd port base (its GPU or instance nodes' ports), chosen free once, then kept."""
        count = 8 * self.gpus if self.node_per_instance else self.gpus if self.node_per_gpu else 1
        if self.node_per_instance and self.pool_nodes:  # the pool nodes' ports follow (static or dynamic)
            count += sum(1 for _ in pool_places(self.model, self.gpus))
        if host == 0:
            self.gpu_port_base = self.gpu_port_base or free_ports(count)
            return self.gpu_port_base
        if host not in self.port_bases:
            self.port_bases[host] = free_ports(count)
        return self.port_bases[host]

    @property
    def per_node(self) -> bool:
        """flexmigd runs several nodes on the host (``node_per_gpu`` or ``node_per_instance``)."""
        return self.node_per_gpu or self.node_per_instance

    def node_names(self, host: int | None = None) -> list[str]:
        """Every name flexmigd may give a node of host ``host`` (None: of every host)."""
        if host is None:
            return [name for h in range(self.hosts) for name in self.node_names(h)]
        node = self.host_node(host)
        pools = [pool_node(node, k, n, p.name) for k, p, n in pool_places(self.model, self.gpus)]
        pools = pools if self.node_per_instance and self.pool_nodes else []
        if self.node_per_instance and self.static_nodes:
            return [slot_node(node, k, s, p.name) for k, p, s in slot_places(self.model, self.gpus)] + pools
        if self.node_per_instance:
            return [f"{node}-gpu{k}-{s}" for k in range(self.gpus) for s in range(8)] + pools
        return [f"{node}-gpu{k}" for k in range(self.gpus)] if self.node_per_gpu else [node]

    @property
    def future_node(self) -> str:
        """The FUTURE placeholder's name."""
        return f"{self.node}-future"

    def slurm_commands(self) -> SlurmCommands:
        """Commands that talk to this testbed."""
        return SlurmCommands(self.commands.bin_dir, self.paths.slurm_conf, self.commands.timeout_s)

    def env(self, host: int | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this testbed (as host ``host``'s daemons read slurm.conf,
        beside its own gres.conf)."""
        conf = self.paths.slurm_conf if host is None else self.host_paths(host).slurm_conf
        return {**os.environ, "SLURM_CONF": str(conf)}

    # ------------------------------------------------------------------------------------------ prepare
    def prepare(self, taskprolog: str | None = None) -> None:
        """Write the directory tree, munge key, slurm.conf, an empty gres.conf, the TaskProlog (``taskprolog``'s
        text, else flexmig's, run by :func:`job_python`) and the Prolog, and the simulated node's MIG minors table.
        Refuses a non-root caller, missing binaries, unusable paths and a machine whose jobs' users could not run
        the TaskProlog."""
        munge_user = self._check_machine()
        self._make_dirs()
        interpreter = job_python()
        self._write_munge_key(munge_user)
        if not self.ctld_port:
            self.ctld_port = free_port()
        if not self.slurmd_port:
            self.slurmd_port = free_port()
        self._write_slurm_conf()
        self._write_node_files(taskprolog, interpreter)

    def _check_machine(self) -> pwd.struct_passwd:
        """Root, the binaries, a socket path that fits, user munge (returned); SlurmError saying which is not."""
        if os.geteuid() != 0:
            raise SlurmError("the Slurm testbed runs munged, slurmctld and slurmd as root: run it as root")
        missing = missing_binaries(self.commands)
        if missing:
            raise SlurmError(
                f"not installed: {', '.join(missing)} (Debian: apt-get install -y --no-install-recommends "
                f"{DEBIAN_PACKAGES})"
            )
        p = self.paths
        if len(str(p.munge_socket)) > _SOCKET_MAX:
            raise SlurmError(
                f"{p.munge_socket}: longer than {_SOCKET_MAX} bytes, too long for a socket; use a shorter DIR"
            )
        try:
            return pwd.getpwnam("munge")
        except KeyError:
            raise SlurmError("there is no user 'munge' (the munge package creates it)") from None

    def _write_munge_key(self, munge_user: pwd.struct_passwd) -> None:
        """munged's key (made once) and socket directory, owned by user munge."""
        p = self.paths
        sock_dir = p.munge_socket.parent
        sock_dir.mkdir(parents=True, exist_ok=True)
        key = p.munge / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
        for path in (p.munge, sock_dir, key):
            os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
        p.munge.chmod(0o755)
        sock_dir.chmod(0o755)

    def _write_slurm_conf(self) -> None:
        """slurm.conf, readable by every user's Slurm commands (static instance nodes' ports chosen now, then kept)."""
        p = self.paths
        static: list[str] = []
        if self.node_per_instance and self.static_nodes:  # slurm.conf names the ports: chosen now, then kept
            for host in range(self.hosts):
                static += slot_lines(
                    self.host_node(host), self.model, self.gpus, port_base=self.port_base(host),
                    cpus_per_slice=max(1, self.cpus // 7), hostname="localhost", addr=self.host_addr(host),
                )  # fmt: skip
                if self.pool_nodes:
                    static += pool_lines(
                        self.host_node(host), self.model, self.gpus, port_base=self.port_base(host),
                        cpus_per_slice=max(1, self.cpus // 7), hostname="localhost", addr=self.host_addr(host),
                    )  # fmt: skip
        conf = render_slurm_conf(
            p,
            ctld_port=self.ctld_port,
            slurmd_port=self.slurmd_port,
            future_node=self.future_node,
            future_gres=future_gres(self.model, self.gpus),
            cpus=self.cpus,
            partition=self.partition,
            dynamic_nodes=len(static) or self._dynamic_nodes(),
            static_nodes=static,
            scheduler_parameters=self.scheduler_parameters,
        )
        p.slurm_conf.write_text(conf)
        p.slurm_conf.chmod(0o644)  # every user's Slurm commands read it
        for host in range(self.hosts) if self.hosts > 1 else ():  # each host's etc/ sees the one slurm.conf
            link = self.host_paths(host).slurm_conf
            link.unlink(missing_ok=True)
            os.link(p.slurm_conf, link)

    def _dynamic_nodes(self) -> int:
        """How many dynamic nodes the hosts' flexmigds may register at once."""
        return ((7 if self.node_per_instance else 1) * self.gpus if self.per_node else 1) * self.hosts

    def _write_node_files(self, taskprolog: str | None, interpreter: str) -> None:
        """An empty gres.conf (once), the TaskProlog and Prolog, the simulated driver's MIG minors table."""
        p = self.paths
        for host in range(self.hosts):
            h = self.host_paths(host)
            if not h.gres_conf.exists():
                h.gres_conf.write_text("# gres.conf of the flexmig testbed; flexmigd writes this host's block\n")
                h.gres_conf.chmod(0o644)
            h.mig_minors.write_text(render_mig_minors(self.gpus))
            h.mig_minors.chmod(0o644)
        map_path = self.map_path
        p.taskprolog.write_text(taskprolog or render_taskprolog(map_path, interpreter))
        p.taskprolog.chmod(0o755)
        p.prolog.write_text(render_taskprolog(map_path, interpreter, prolog=True))
        p.prolog.chmod(0o755)

    def _make_dirs(self) -> None:
        """The testbed's directories, with their modes whatever the umask (flexmigd's unit has 0077): munged must
        reach its socket, and the jobs' users read etc/ and run/ and write their output in jobs/."""
        p = self.paths
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        check_reachable(self.root, "munge")
        hosts = [self.host_paths(host) for host in range(self.hosts)]
        for d in (
            *((p.root / "hosts", *(h.root for h in hosts)) if self.hosts > 1 else ()),
            p.etc,
            p.log,
            p.run,
            *(d for h in hosts for d in (h.etc, h.dev, h.dev / "nvidia-caps", h.mig_minors.parent, h.flexmig)),
            p.root / "ctld",
            p.root / "spool",
            p.root / "spool" / self.node,
            *(p.root / "spool" / name for name in self.node_names()),
        ):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        for h in hosts:
            h.flexmig.chmod(0o700)
        p.jobs.mkdir(exist_ok=True)
        p.jobs.chmod(0o1777)

    # ------------------------------------------------------------------------------------------ daemons
    def start(self) -> None:
        """Start munged and slurmctld and wait until slurmctld answers (bounded)."""
        p = self.paths
        munged = self.commands.path("munged")
        subprocess.run(
            [
                munged,
                f"--key-file={p.munge / 'munge.key'}",
                f"--socket={p.munge_socket}",
                f"--pid-file={p.munge / 'munged.pid'}",
                f"--log-file={p.munge / 'munged.log'}",
                f"--seed-file={p.munge / 'munged.seed'}",
            ],
            user="munge",
            group="munge",
            check=True,
            timeout=_START_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        self.started.append("munged")
        env = self.env()
        # -i: ignore state left by an earlier run of this directory's slurmctld only if it cannot be read
        subprocess.run(
            [self.commands.path("slurmctld"), "-i"],
            env=env,
            check=True,
            timeout=_START_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        self.started.append("slurmctld")
        self.wait_ctld()

    def wait_ctld(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Until ``scontrol ping`` says slurmctld is up; SlurmError (with its log's last line) after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        scontrol = self.commands.path("scontrol")
        last = ""
        while time.monotonic() < deadline:
            res = subprocess.run(
                [scontrol, "ping"], env=self.env(), capture_output=True, text=True, timeout=15, check=False
            )
            last = (res.stdout + res.stderr).strip()
            if "is UP" in last:
                return
            time.sleep(0.2)
        raise SlurmError(
            f"slurmctld did not answer within {timeout_s:g} s: {last}; see {self.paths.log / 'slurmctld.log'}"
        )

    def stop(self) -> None:
        """Cancel the jobs, stop slurmd (flexmig's), slurmctld and munged by their pid files, then kill what the
        jobs left running (slurmstepd outlives slurmd); bounded. Safe to call twice."""
        p = self.paths
        self.cancel_jobs()
        slurmds = sorted(p.run.glob("slurmd-*.pid")) if p.run.is_dir() else []  # one per GPU node, or the node's
        for pid_file in (*slurmds, p.run / "slurmctld.pid", p.munge / "munged.pid"):
            pid = pid_from(pid_file)
            if pid is not None and alive(pid):
                stop_pid(pid)
        self.kill_jobs()
        self.started.clear()

    def cancel_jobs(self, timeout_s: float = 10.0) -> None:
        """``scancel`` every job slurmctld still runs, and wait (bounded) until none is active; nothing when
        slurmctld is not running."""
        pid = pid_from(self.paths.run / "slurmctld.pid")
        if pid is None or not alive(pid):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                res = subprocess.run(
                    [self.commands.path("squeue"), "--json", "--states=all"],
                    env=self.env(),
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                active = [j.job_id for j in parse_squeue(res.stdout) if j.active or j.pending]
            except (SlurmError, subprocess.TimeoutExpired):
                return
            if not active:
                return
            subprocess.run(
                [self.commands.path("scancel"), "--full", *(str(j) for j in active)],
                env=self.env(),
                capture_output=True,
                timeout=10,
                check=False,
            )
            time.sleep(0.3)

    def kill_jobs(self, timeout_s: float = 10.0) -> list[int]:
        """Kill what this testbed's jobs left: its ``slurmstepd`` processes (they clear their environment, but hold
        the testbed's slurmd log open) and the processes of its jobs (``SLURM_JOB_ID`` set and this testbed's
        ``SLURM_CONF``); never a shell that merely exported ``SLURM_CONF``. Returns their pids."""
        root = str(self.root) + os.sep
        confs = {str(self.paths.slurm_conf), *(str(self.host_paths(h).slurm_conf) for h in range(self.hosts))}
        found = []
        for proc in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid == os.getpid():
                    continue
                if (proc.info["name"] or "").startswith("slurmstepd"):
                    if any(f.path.startswith(root) for f in proc.open_files()):
                        found.append(proc)
                    continue
                env = proc.environ()
                if env.get("SLURM_CONF") in confs and "SLURM_JOB_ID" in env:
                    found.append(proc)
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(found, timeout=timeout_s)
        return [proc.pid for proc in found]

    def slurmd_hook(self, host: int = 0) -> list[str]:
        """The hook command that restarts host ``host``'s slurmds (the stand-in for their systemd unit)."""
        slurmd = ["--slurmd", self.commands.path("slurmd")] if self.commands.bin_dir is not None else []
        pid = self.paths.slurmd_pid("{node}" if self.per_node else self.host_node(host))
        return [*self.hook_prefix, python(), "-m", "flexmig.slurm.standin", "--pid-file", str(pid), *slurmd]

    @property
    def map_path(self) -> Path:
        """The GRES map flexmigd writes and the TaskProlog reads (``{node}`` in it with ``node_per_gpu``, or with
        several hosts, each its node's)."""
        return self.paths.gres_map("{node}" if self.per_node or self.hosts > 1 else "")

    def _map_node(self, host: int) -> str:
        """The node name in host ``host``'s GRES map's name, in the whole-node mode ('' with one host)."""
        return "" if self.hosts == 1 else self.host_node(host)

    def flexmigd_config(
        self, *, metrics_port: int, interval_s: float | None = 2.0, port_base: int = 0, host: int = 0
    ) -> str:
        """flexmigd's configuration for host ``host`` of this testbed: mode act, Slurm on, every path under the
        directory (``interval_s`` None: the production default); with ``node_per_gpu`` GPU K's slurmd listens on
        ``port_base + K`` (0: the host's :meth:`port_base`, the same at a restart)."""
        f = self.host_paths(host).flexmig
        node = self.host_node(host)
        who = "{node}" if self.per_node else node

        def q(value: object) -> str:
            return json.dumps(str(value))

        return "\n".join(
            [
                "# flexmigd on a simulated host of the testbed, written by `flexmig slurm testbed`",
                'mode = "act"',
                f"node_name = {q(node)}",
                "[prometheus]",
                f'listen = "127.0.0.1:{metrics_port}"',
                "[control]",
                f"socket = {q(f / 'control.sock')}",
                "[state]",
                f"directory = {q(f / 'state')}",
                f"journal = {q(f / 'state' / 'journal.sqlite3')}",
                "[slurm]",
                "enabled = true",
                f"node = {q(node)}",
                *([f"interval_s = {interval_s:g}"] if interval_s is not None else []),
                *self._host_files(host, q),
                'slurmd_control = "hook"',
                f"slurmd_hook = [{', '.join(q(a) for a in self.slurmd_hook(host))}]",
                f"slurmd_env = {q(f / ('slurmd.env' if who == node else 'slurmd-{node}.env'))}",
                *self._node_conf(host, port_base),
                f"checkpoint_dir = {q(self.paths.checkpoints / '{user}' / '{job_id}')}",
                "hook_settle_s = 5",
                "reregister_s = 2",
                "",
            ]
        )

    def _host_files(self, host: int, q: Callable[[object], str]) -> list[str]:
        """``[slurm]``'s paths of host ``host``: slurm.conf, gres.conf, map, devices, minors, slurmd's pid file."""
        h = self.host_paths(host)
        who = "{node}" if self.per_node else self.host_node(host)
        return [
            f"conf = {q(h.slurm_conf)}",
            *([f"bin_dir = {q(self.commands.bin_dir)}"] if self.commands.bin_dir is not None else []),
            f"gres_conf = {q(h.gres_conf)}",
            f"gres_map = {q(self.map_path if self.per_node else self.paths.gres_map(self._map_node(host)))}",
            f"dev_dir = {q(h.dev)}",
            f"mig_minors = {q(h.mig_minors)}",
            f"slurmd_pid_file = {q(self.paths.slurmd_pid(who))}",
        ]

    def _node_conf(self, host: int, port_base: int) -> list[str]:
        """``[slurm]``'s keys of the mode and of the nodes host ``host`` registers."""
        addr = self.host_addr(host)
        if not self.per_node and self.hosts == 1:  # named: the default layout is one node per MIG instance
            return ['layout = "node"', f'slurmd_conf = "NodeAddr={addr} CPUs={self.cpus}"']
        if not self.per_node:  # a whole host's dynamic node on its own port (Slurm 23.11 and later)
            port = port_base or self.port_base(host)
            return ['layout = "node"', f'slurmd_conf = "NodeAddr={addr} Port={port} CPUs={self.cpus}"']
        base = port_base or self.port_base(host)
        mode = "node_per_instance" if self.node_per_instance else "node_per_gpu"
        per_node = [f"{mode} = true", f"slurmd_port_base = {base}"]
        if self.node_per_instance and self.static_nodes:  # slurm.conf's lines say it all
            return ['instance_nodes = "static"', *per_node]
        if self.node_per_instance:  # each instance node a compute slice's share of the host's CPUs
            share = max(1, self.cpus // 7)
            return [f'slurmd_conf = "NodeAddr={addr}"', f'slurmd_conf_per_slice = "CPUs={share}"', *per_node]
        return [f'slurmd_conf = "NodeAddr={addr} CPUs={self.cpus}"', *per_node]

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------ helpers
    def sbatch(self, *args: str, script: str, user: str | None = None) -> int:
        """Submit ``script`` (its text) with ``args`` as ``user`` (default :attr:`job_user`); the job ID. Its output
        goes to ``jobs/job-<id>.out``."""
        path = self.host_paths(0).flexmig / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        path.chmod(0o755)
        who = user or self.job_user
        as_user = [f"--uid={who}", f"--gid={grp.getgrgid(pwd.getpwnam(who).pw_gid).gr_name}"] if who else []
        res = subprocess.run(
            [self.commands.path("sbatch"), "--parsable", *as_user, f"--output={self.paths.jobs}/job-%j.out", *args,
             str(path)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if res.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
        return int(res.stdout.strip().split(";")[0])

    def logs(self) -> Iterator[tuple[str, str]]:
        """(name, last lines) of each daemon log, for a failing test's message."""
        for path in sorted(self.paths.log.glob("*.log")):
            with contextlib.suppress(OSError):
                yield path.name, "\n".join(path.read_text(errors="replace").splitlines()[-15:])
