"""The ``[slurm]`` table of the configuration's schema (its own module: the largest table, with its own topic).

:class:`SlurmConfig` is re-exported by :mod:`flexmig.config.schema` and :mod:`flexmig.config`; see
docs/slurm-node.md for what the keys do.
"""

# ruff: noqa: RUF009  (every field default goes through _doc(), which returns dataclasses.field() with metadata)

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flexmig.config.fields import doc_field

_doc = doc_field  # short: every field of every table goes through it

__all__ = ["SlurmConfig"]


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
    layout: str = _doc(
        "auto",
        "How the host is Slurm nodes: auto (one node per MIG instance, static nodes where slurm.conf declares this "
        "host's, else dynamic ones from Slurm 23.11; refused with one line otherwise), instance, gpu (node_per_gpu) "
        "or node (the whole host one node, changed as a whole). node_per_gpu/node_per_instance choose too.",
        pattern=r"auto|instance|gpu|node",
        allowed="auto, instance, gpu or node",
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
        "seconds between two reads, the timed read every interval_s included, and at least probe_s (and fewer "
        "where a long queue would hold slurmctld's job lock longer than cluster_job_lock_share). Its own slurmd's "
        "crash is not held back. Give every node the same value.",
        lo=0.01,
        hi=100000,
    )
    cluster_job_lock_share: float = _doc(
        0.1,
        "Site-wide: the share of slurmctld's time the flexmig daemons of the whole cluster may hold its job lock "
        "by their reads of the queue together (slurmctld packs every job for each read: about 0.29 ms plus 2.5 us "
        "a job): each node leaves at least (GPU hosts x what a read of the last queue's length holds / this) "
        "seconds between two reads. 1 leaves the bound to cluster_reads_per_s. Give every node the same value.",
        lo=0.001,
        hi=1,
    )
    max_closed_nodes: int = _doc(
        0,
        "Site-wide: at most this many nodes closed for flexmig's changes at once (flexmig's reservations whose "
        "windows overlap, counted in Slurm); 0: no limit. Give every node the same value.",
        lo=0,
        hi=100000,
    )
