"""Where everything of a Slurm testbed lives (:class:`TestbedPaths`) and its slurm.conf (:func:`render_slurm_conf`):
the files of :mod:`flexmig.slurm.testbed`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from flexmig.mig.catalogue import GpuModel

__all__ = ["HostPaths", "TestbedPaths", "future_gres", "render_slurm_conf"]


@dataclass(frozen=True, slots=True)
class TestbedPaths:
    """Where everything of a testbed rooted at ``root`` lives."""

    root: Path

    @property
    def munge(self) -> Path:
        """munged's directory (key, pid, log, seed), owned by user munge."""
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        """munged's socket (its directory must be mode 0755)."""
        return self.root / "munge" / "sock" / "munge.socket"

    @property
    def etc(self) -> Path:
        """slurm.conf, gres.conf, the TaskProlog."""
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        """The testbed's slurm.conf (``export SLURM_CONF=...``)."""
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        """gres.conf, next to slurm.conf as slurmd expects."""
        return self.etc / "gres.conf"

    @property
    def taskprolog(self) -> Path:
        """The TaskProlog slurm.conf names."""
        return self.etc / "taskprolog"

    @property
    def prolog(self) -> Path:
        """The Prolog slurm.conf names (slurmd runs it as root: it makes each job user's checkpoint base)."""
        return self.etc / "prolog"

    @property
    def log(self) -> Path:
        """Daemon logs."""
        return self.root / "log"

    @property
    def jobs(self) -> Path:
        """Job output (``job-<id>.out``): sticky and open to all, like /tmp, since jobs run as their own users."""
        return self.root / "jobs"

    @property
    def checkpoints(self) -> Path:
        """The fixed part of the testbed's ``[slurm] checkpoint_dir`` (``ckpt/{user}/{job_id}``): the Prolog's."""
        return self.root / "ckpt"

    @property
    def run(self) -> Path:
        """Pid files."""
        return self.root / "run"

    @property
    def dev(self) -> Path:
        """Stand-in device files of the simulated GPUs."""
        return self.root / "dev"

    @property
    def mig_minors(self) -> Path:
        """The simulated driver's MIG minors table."""
        return self.root / "proc" / "mig-minors"

    @property
    def flexmig(self) -> Path:
        """flexmigd's configuration, journal, simulated node state and control socket."""
        return self.root / "flexmig"

    def slurmd_pid(self, node: str) -> Path:
        """slurmd's pid file for ``node`` (``SlurmdPidFile`` uses ``%n``; ``{node}``: flexmig's template of it)."""
        return self.run / f"slurmd-{node}.pid"

    def gres_map(self, node: str) -> Path:
        """flexmigd's GRES map for ``node`` (``{node}``: one per GPU node, ``[slurm] node_per_gpu``): where a node's
        is, ``run/flexmig/slurm/`` (the TaskProlog runs as the job's user and reads it; flexmigd makes the
        directories, under its unit's umask)."""
        return self.run / "flexmig" / "slurm" / ("gres-map.json" if node == "" else f"gres-map-{node}.json")



@dataclass(frozen=True, slots=True)
class HostPaths:
    """What one simulated host of a testbed has of its own, as each machine of a cluster does: its ``etc/``
    (gres.conf beside a link of the cluster's slurm.conf: slurmd reads gres.conf next to the slurm.conf it is given),
    stand-in devices, MIG minors table, and flexmigd's configuration, journal, simulated state and control socket.
    A testbed of one host keeps them where they always were, at the testbed's root; with ``--hosts N``, host I's
    are under ``hosts/h<I>/``."""

    root: Path

    @property
    def etc(self) -> Path:
        """The host's gres.conf and its link of slurm.conf."""
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        """slurm.conf as this host's slurmds and flexmigd read it (its gres.conf is beside it)."""
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        """This host's gres.conf (flexmigd writes its nodes' block)."""
        return self.etc / "gres.conf"

    @property
    def dev(self) -> Path:
        """Stand-in device files of the host's simulated GPUs."""
        return self.root / "dev"

    @property
    def mig_minors(self) -> Path:
        """The host's simulated driver's MIG minors table."""
        return self.root / "proc" / "mig-minors"

    @property
    def flexmig(self) -> Path:
        """The host's flexmigd: configuration, journal, simulated node state, control socket, log."""
        return self.root / "flexmig"


def future_gres(model: GpuModel, gpus: int) -> str:
    """The ``Gres=`` of the FUTURE placeholder: as many of every plain profile as the node could ever hold."""
    return ",".join(f"gpu:{p.name}:{p.max_instances * gpus}" for p in model.plain_profiles)


def render_slurm_conf(
    paths: TestbedPaths,
    *,
    ctld_port: int,
    slurmd_port: int,
    future_node: str,
    future_gres: str,
    cpus: int,
    partition: str = "mig",
    dynamic_nodes: int = 1,
    static_nodes: Sequence[str] = (),
    scheduler_parameters: str = "sched_interval=1,bf_interval=1",
) -> str:
    """The testbed's slurm.conf; ``dynamic_nodes``: how many nodes flexmigd registers (one per GPU with
    ``node_per_gpu``), which the node table must hold beside the FUTURE placeholder; ``static_nodes``: the
    ``NodeName=`` lines of static instance nodes (``instance_nodes = static``), which replace the placeholder;
    ``scheduler_parameters``: SchedulerParameters (the scheduler every second; Slurm's defaults are 60 s, and 30 s
    for the backfill scheduler)."""
    p = paths
    nodes = _node_lines(future_node=future_node, future_gres=future_gres, cpus=cpus, static_nodes=static_nodes)
    return "\n".join(
        [
            "# A private single-node Slurm written by `flexmig slurm testbed`; everything lives under this directory.",
            *_daemon_lines(p, ctld_port=ctld_port, slurmd_port=slurmd_port),
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "GresTypes=gpu",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2",
            f"MaxNodeCount={max(8, dynamic_nodes + 1)}",  # the placeholder is a node of the table too
            "SchedulerType=sched/backfill",
            *([f"SchedulerParameters={scheduler_parameters}"] if scheduler_parameters else []),
            "JobRequeue=0",
            "KillWait=5",
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            f"TaskProlog={p.taskprolog}",
            f"Prolog={p.prolog}",
            *nodes,
            f"PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _node_lines(*, future_node: str, future_gres: str, cpus: int, static_nodes: Sequence[str]) -> list[str]:
    """slurm.conf's node lines: the static instance nodes, else the FUTURE placeholder."""
    if static_nodes:  # their CPUs are slurm.conf's (the testbed's, not this machine's): taken as they are
        return [
            "SlurmdParameters=config_overrides",
            "# flexmig's static instance nodes: one per place each MIG profile can take",
            *static_nodes,
        ]
    return [
        "# Demand for MIG profiles the node does not have yet pends against this placeholder instead of being",
        "# refused at submission; it never registers.",
        f"NodeName={future_node} State=FUTURE CPUs={cpus} Gres={future_gres}",
    ]


def _daemon_lines(p: TestbedPaths, *, ctld_port: int, slurmd_port: int) -> list[str]:
    """slurm.conf's lines of the daemons: who they run as, their ports, munge, their state, pid and log files."""
    return [
        "ClusterName=flexmig",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={p.munge_socket}",
        "MpiDefault=none",
        "MailProg=/bin/true",
        f"StateSaveLocation={p.root / 'ctld'}",
        f"SlurmdSpoolDir={p.root / 'spool'}/%n",
        f"SlurmctldPidFile={p.run / 'slurmctld.pid'}",
        f"SlurmdPidFile={p.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={p.log / 'slurmctld.log'}",
        f"SlurmdLogFile={p.log}/slurmd-%n.log",
    ]
