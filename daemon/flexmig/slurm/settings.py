"""The settings of flexmig's Slurm side, as one frozen value (built from the ``[slurm]`` table of the configuration,
whose defaults are these: those of a Debian node, with Slurm's commands on ``PATH``, gres.conf in ``/etc/slurm``,
slurmd's pid file where Debian's unit puts it, the driver's MIG minors in ``/proc``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from flexmig.config import SlurmConfig

_DEFAULT = SlurmConfig()  # one set of defaults: the [slurm] table's

__all__ = [
    "NODE_FIELD",
    "SlurmSettings",
    "gpu_node",
    "instance_node",
    "instance_port",
    "parse_instance_node",
    "slot_node",
    "slot_tag",
]

NODE_FIELD = "{node}"
"""What ``slurmd_pid_file``, ``slurmd_env``, ``gres_map``, ``slurmd_unit`` and ``slurmd_hook``'s words may contain:
the name of the node they serve (with ``node_per_gpu``, each GPU node's own)."""


def gpu_node(node: str, gpu: int) -> str:
    """The name of GPU ``gpu``'s dynamic node on host node ``node`` (``node_per_gpu``): ``<node>-gpu<K>``."""
    return f"{node}-gpu{gpu}"


def instance_node(node: str, gpu: int, start: int) -> str:
    """The name of the dynamic node of the MIG instance at memory slice ``start`` of GPU ``gpu`` on host node
    ``node`` (``node_per_instance``): ``<node>-gpu<K>-<S>``. Instances of one GPU never overlap, so while one lives
    its name is its own."""
    return f"{node}-gpu{gpu}-{start}"


def slot_tag(profile: str) -> str:
    """A MIG profile's name as a node name's last part (``instance_nodes = static``): ``3g.71gb`` -> ``3g71gb``,
    ``1g.18gb+me`` -> ``1g18gbme`` (dots and plus signs are not for host names)."""
    return profile.replace(".", "").replace("+", "")


def slot_node(node: str, gpu: int, start: int, profile: str) -> str:
    """The name of the static node of MIG profile ``profile`` at memory slice ``start`` of GPU ``gpu`` on host node
    ``node`` (``instance_nodes = static``): ``<node>-gpu<K>-<S>-<profile without dots>``. A static node's GRES is
    fixed in slurm.conf, so every place a profile can take has a node of its own; of the nodes of one GPU, only
    those whose instances exist are out of State=FUTURE."""
    return f"{instance_node(node, gpu, start)}-{slot_tag(profile)}"


def parse_instance_node(node: str, name: str) -> tuple[int, int] | None:
    """``(gpu, start)`` when ``name`` is an instance node of host node ``node`` (:func:`instance_node`, or a static
    one, :func:`slot_node`), else None."""
    m = re.fullmatch(re.escape(node) + r"-gpu([0-9]{1,3})-([0-9])(-[0-9a-z]{1,32})?", name)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def instance_port(base: int, gpu: int, start: int) -> int:
    """The slurmd port of the instance node at ``start`` of GPU ``gpu``: ``base + 8 * gpu + start`` (a GPU has 8
    memory slices at most)."""
    return base + 8 * gpu + start


@dataclass(frozen=True, slots=True)
class SlurmSettings:
    """Everything the Slurm component needs to read demand and re-register the node.

    * ``node``: the Slurm node name (empty: the daemon's node name);
    * ``partitions``: only demand of these partitions counts (empty: the node's own partitions);
    * ``interval_s``: how often Slurm's queue is read;
    * ``conf``, ``bin_dir``, ``command_timeout_s``: where Slurm's configuration and commands are, and how long one
      command may take (slurmctld down: each command needs about 9 s to say so);
    * ``gres_conf``, ``gres_map``: flexmig's block in gres.conf, and the map the TaskProlog reads;
    * ``dev_dir``, ``mig_minors``: device files and the driver's capability table (a simulated node: stand-ins);
    * ``slurmd_pid_file``, ``slurmd_conf``: slurmd's pid file and the dynamic node's other parameters
      (``CPUs=64 RealMemory=500000 Feature=mig``); ``slurmd_conf_per_slice``: with ``node_per_instance``,
      the parameters (name, value) an instance node registers multiplied by its compute slices;
      ``slurmd_env``: the environment file slurmd's unit reads;
      ``slurmd_control`` (``systemd`` or ``hook``), ``slurmd_unit``, ``slurmd_hook``: how slurmd is restarted;
    * ``hook_token``: a job opts into checkpoint-and-requeue with this word in its comment (``--comment``);
      ``hook_settle_s``: it is signalled only once it has run that long (a signal that comes before its handler is
      installed ends it);
    * ``checkpoint_dir``: each job's checkpoint directory (``{job_id}``, ``{user}``, ``{uid}`` filled in);
    * ``ack_timeout_s``, ``drain_timeout_s``, ``register_timeout_s``: bounds of the change's waits;
    * ``reregister_s``, ``min_interval_s``, ``max_wait_s``: the planner's fixed cost of one re-registration, the
      shortest time between two changes that close a busy node, the longest a served job waits for a commitment;
    * ``probe_s``: how often ``sdiag`` and slurmd's pid file are looked at between two reads of the queue;
    * ``max_closed_nodes``: the site-wide limit of nodes closed for flexmig at once (0: none);
    * ``node_per_gpu``, ``slurmd_port_base``: one dynamic node per MIG GPU (Slurm 23.11 and later), GPU K's slurmd
      on port ``slurmd_port_base + K``; :meth:`for_gpu` gives one GPU node's settings;
    * ``node_per_instance``: one dynamic node per MIG instance (Slurm 23.11 and later), :func:`instance_node`;
      ``instance_nodes``: ``static`` for nodes slurm.conf lists in State=FUTURE instead (any Slurm from 22.05),
      :func:`slot_node`;
      ``hold_after_s``: how long a job that fits nowhere waits before it holds a region of a GPU, ``hold_when_idle``:
      at once when no waiting job can use the node's idle slices; ``max_moves_per_job``: how often a running hook
      job may be moved for a waiting one (:mod:`flexmig.slurm.moving`).
    """

    node: str = ""
    partitions: tuple[str, ...] = ()
    interval_s: float = _DEFAULT.interval_s
    conf: Path | None = None
    bin_dir: Path | None = None
    command_timeout_s: float = _DEFAULT.command_timeout_s
    gres_conf: Path = _DEFAULT.gres_conf
    gres_map: Path = _DEFAULT.gres_map
    dev_dir: Path = _DEFAULT.dev_dir
    mig_minors: Path = _DEFAULT.mig_minors
    slurmd_pid_file: Path = _DEFAULT.slurmd_pid_file
    slurmd_conf: tuple[str, ...] = ()
    slurmd_conf_per_slice: tuple[tuple[str, int], ...] = ()
    slurmd_env: Path = _DEFAULT.slurmd_env
    slurmd_control: str = _DEFAULT.slurmd_control
    slurmd_unit: str = _DEFAULT.slurmd_unit
    slurmd_hook: tuple[str, ...] = ()
    hook_token: str = _DEFAULT.hook_token
    hook_settle_s: float = _DEFAULT.hook_settle_s
    checkpoint_dir: str = _DEFAULT.checkpoint_dir
    checkpoint_signal: str = _DEFAULT.checkpoint_signal
    ack_wait_s: float = _DEFAULT.ack_wait_s
    ack_timeout_s: float = _DEFAULT.ack_timeout_s
    drain_timeout_s: float = _DEFAULT.drain_timeout_s
    register_timeout_s: float = _DEFAULT.register_timeout_s
    reregister_s: float = _DEFAULT.reregister_s
    min_interval_s: float = _DEFAULT.min_interval_s
    max_wait_s: float = _DEFAULT.max_wait_s
    probe_s: float = _DEFAULT.probe_s
    max_closed_nodes: int = _DEFAULT.max_closed_nodes
    node_per_gpu: bool = _DEFAULT.node_per_gpu
    node_per_instance: bool = _DEFAULT.node_per_instance
    instance_nodes: str = _DEFAULT.instance_nodes
    hold_after_s: float = _DEFAULT.hold_after_s
    hold_when_idle: bool = _DEFAULT.hold_when_idle
    max_moves_per_job: int = _DEFAULT.max_moves_per_job
    slurmd_port_base: int = _DEFAULT.slurmd_port_base

    @property
    def static_nodes(self) -> bool:
        """True when instance nodes are slurm.conf's State=FUTURE nodes (``instance_nodes = static``)."""
        return self.node_per_instance and self.instance_nodes == "static"

    def instance_name(self, node: str, gpu: int, start: int, profile: str) -> str:
        """The Slurm node of the MIG instance ``profile`` at ``start`` of GPU ``gpu`` on host node ``node``:
        :func:`slot_node` with static nodes, else :func:`instance_node`."""
        return slot_node(node, gpu, start, profile) if self.static_nodes else instance_node(node, gpu, start)

    def for_node(self, node: str, port: int | None = None) -> SlurmSettings:
        """The settings of the agent of node ``node``: ``{node}`` filled in wherever it appears, and ``Port=port``
        added to ``slurmd_conf`` (a GPU node's own slurmd port); ``self`` when there is nothing to fill in."""
        if port is None and not self._templated():
            return self

        def fill(path: Path) -> Path:
            return Path(str(path).replace(NODE_FIELD, node))

        return replace(
            self,
            slurmd_pid_file=fill(self.slurmd_pid_file),
            slurmd_env=fill(self.slurmd_env),
            gres_map=fill(self.gres_map),
            slurmd_unit=self.slurmd_unit.replace(NODE_FIELD, node),
            slurmd_hook=tuple(w.replace(NODE_FIELD, node) for w in self.slurmd_hook),
            slurmd_conf=(*self.slurmd_conf, *((f"Port={port}",) if port is not None else ())),
        )

    def _templated(self) -> bool:
        words = (str(self.slurmd_pid_file), str(self.slurmd_env), str(self.gres_map), self.slurmd_unit)
        return any(NODE_FIELD in w for w in (*words, *self.slurmd_hook))
