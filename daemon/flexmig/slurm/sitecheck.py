"""Which Slurm setups flexmig manages, and one line for each it refuses (checked before anything is stopped).

Supported: a node with its own ``slurm.conf`` and ``gres.conf`` on local storage, flexmig's marked block as the
node's only GPU lines, slurmd under its own unit (systemd, or the hook), ``TaskPlugin=task/cgroup`` with
``ConstrainDevices=yes`` on a real node (flexmig's lines name the GPU and both capability devices of each MIG
device, what Slurm's device cgroup needs), accounting through slurmdbd with ``AccountingStorageTRES`` counting
``gres/gpu`` (every MIG device counts as one GPU).

Refused, each with one line naming the file or key:

* **configless mode** (no local slurm.conf: slurmd fetches slurm.conf and gres.conf from slurmctld, one gres.conf for
  every node, so no node agent can describe its own node);
* **a shared gres.conf** (on a network file system: every flexmig node would rewrite one file; with lines for this
  node's GPUs outside flexmig's block, or with no ``NodeName=``: Slurm would add them to flexmig's);
* **AutoDetect** in gres.conf for this node (slurmd would number the devices itself, by device file, not as flexmig
  registered them);
* **ConstrainDevices on a simulated node** (the stand-in device files are /dev/null's: a device cgroup built from
  them would confine nothing real);
* **per-profile GPU TRES that miss profiles** (``AccountingStorageTRES=gres/gpu:3g.71gb`` without
  ``gres/gpu:1g.18gb``: slurmctld creates TRES only at its start, so jobs on a profile flexmig creates later would
  not be accounted by type; list every profile of the node's model, or none);
* **a full node table** (a node that is not registered while slurmctld's node table, FUTURE placeholders included,
  holds ``MaxNodeCount`` nodes: slurmctld would refuse its registration, "node table is full", and a slurmd
  started for it would wait in vain);
* **a static instance node missing from slurm.conf or with other GRES** (``[slurm] instance_nodes = static``: the
  node of a MIG instance must be a ``State=FUTURE`` line of slurm.conf with exactly that instance's ``Gres=``, as
  ``flexmig slurm conf --node-per-instance --static`` prints them; Slurm keeps a static node's GRES as slurm.conf
  says, whatever its slurmd reports);
* **one node per GPU on a Slurm older than 23.11** (``[slurm] node_per_gpu``: a dynamic node takes its own
  ``Port=`` in ``slurmd --conf`` only since 23.11, so no second slurmd could run on the host).

Pure: texts in, a line out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from flexmig.errors import SlurmError
from flexmig.slurm.gres import parse_gres
from flexmig.slurm.gresconf import block_markers, configures_gpus_of

__all__ = [
    "NETWORK_FS",
    "cgroup_problem",
    "configless_problem",
    "gres_conf_problem",
    "node_table_problem",
    "shared_fs_problem",
    "slot_problem",
    "slurm_version",
    "tres_problem",
]

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "fuse.glusterfs",
     "fuse.sshfs", "9p", "afs", "ocfs2", "gfs2", "panfs", "wekafs"}
)  # fmt: skip
"""File system types another node may write too."""


def configless_problem(conf_exists: bool, conf: str, slurmctld_parameters: str) -> str | None:
    """A refusal when the node has no local slurm.conf (``conf``): configless mode."""
    if conf_exists:
        return None
    mode = " (slurmctld has enable_configless)" if "enable_configless" in slurmctld_parameters else ""
    return (
        f"{conf}: no local slurm.conf{mode}: configless mode is not supported (slurmd would take gres.conf from "
        "slurmctld, one for every node); keep slurm.conf and gres.conf on flexmig nodes"
    )


def gres_conf_problem(text: str, node: str, source: str) -> str | None:
    """A refusal when gres.conf configures this node's GPUs outside flexmig's block (``AutoDetect=``, a line
    without ``NodeName=``, a ``NodeName=`` range that names the node): found before anything is stopped."""
    begin, end = block_markers(node)
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped == begin:
            inside = True
            continue
        if inside:
            inside = stripped != end
            continue
        if configures_gpus_of(stripped, node):
            what = "AutoDetect" if "autodetect=" in stripped.lower() else "GPU lines"
            return (
                f"{source}:{number}: {stripped[:80]!r}: {what} for node {node} outside flexmig's block; remove it "
                "(flexmig writes this node's GPU lines from NVML)"
            )
    return None


def shared_fs_problem(path: PurePosixPath, mountinfo: str) -> str | None:
    """A refusal when ``path`` lies on a network file system (``/proc/self/mountinfo``'s longest matching mount)."""
    best: tuple[int, str, str] | None = None
    for line in mountinfo.splitlines()[:10000]:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > best[0]):
            best = (len(mount), mount, tail[0])
    if best is not None and best[2] in NETWORK_FS:
        return (
            f"{path}: on a shared {best[2]} file system ({best[1]}): a shared gres.conf is not supported (every "
            "flexmig node would rewrite it); give each node its own gres.conf on local storage"
        )
    return None


def cgroup_problem(task_plugin: str, cgroup_conf: Mapping[str, str], *, simulated: bool) -> str | None:
    """A refusal for ``ConstrainDevices=yes`` with ``task/cgroup`` on a simulated node."""
    constrain = cgroup_conf.get("constraindevices", "no").lower() in ("yes", "true", "1")
    if simulated and constrain and "task/cgroup" in task_plugin:
        return (
            "cgroup.conf: ConstrainDevices=yes on a simulated node: its stand-in device files are /dev/null's, a "
            "device cgroup built from them confines nothing; set ConstrainDevices=no on the testbed"
        )
    return None


def parse_cgroup_conf(text: str) -> dict[str, str]:
    """cgroup.conf's ``Key=Value`` lines, keys lower-cased."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:2000]:
        body = line.split("#", 1)[0].strip()
        key, sep, value = body.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def tres_problem(accounting_tres: str, profiles: Iterable[str]) -> str | None:
    """A refusal when ``AccountingStorageTRES`` names some GPU profiles (``gres/gpu:TYPE``) but not all of
    ``profiles``."""
    listed = {t.strip().split(":", 1)[1] for t in accounting_tres.split(",") if t.strip().startswith("gres/gpu:")}
    if not listed:
        return None
    missing = sorted(set(profiles) - listed)
    if not missing:
        return None
    return (
        f"AccountingStorageTRES lists GPU types ({', '.join(sorted(listed))}) but not {', '.join(missing)}: jobs on "
        "profiles flexmig creates would not be accounted by type; list every profile of the node's model, or none"
    )


def node_table_problem(max_node_count: str, records: int, node: str) -> str | None:
    """A refusal when node ``node``, not registered, cannot be: slurmctld's node table holds ``records`` nodes
    (FUTURE placeholders included) and slurm.conf's ``MaxNodeCount`` is ``max_node_count`` (as ``scontrol show
    config`` prints it; a value that is no number is not judged)."""
    try:
        limit = int(max_node_count.split(maxsplit=1)[0])
    except (IndexError, ValueError):
        return None
    if records < limit:
        return None
    return (
        f"node {node} cannot register: slurm.conf's MaxNodeCount is {limit} and slurmctld's node table holds "
        f"{records} nodes already (FUTURE placeholders count; slurmctld logs \"node table is full\"): raise "
        "MaxNodeCount by the flexmig nodes of every host (`flexmig slurm conf` prints the line); nothing was changed"
    )


def slot_problem(node: str, configured: str | None, gres: str) -> str | None:
    """A refusal when static instance node ``node`` (``[slurm] instance_nodes = static``), not registered, cannot
    serve its MIG instance: slurm.conf does not have it (``configured`` None) or gives it other GPU GRES than
    ``gres`` (``gpu:3g.71gb:1``)."""
    fix = "`flexmig slurm conf --node-per-instance --static` prints the lines; nothing was changed"
    if configured is None:
        return f"static node {node} is not in slurm.conf: add the State=FUTURE lines of this host ({fix})"
    try:
        have = sorted(g.spec() for g in parse_gres(configured, where=f"node {node}'s Gres") if g.name == "gpu")
        want = sorted(g.spec() for g in parse_gres(gres, where="Gres="))
    except SlurmError:
        have, want = [configured], [gres]
    if have == want:
        return None
    return f"slurm.conf gives static node {node} Gres={configured or '(none)'}, its MIG instance is {gres} ({fix})"


PER_GPU_SINCE = (23, 11)
"""The first Slurm whose dynamic nodes take their own ``Port=`` (SchedMD commit f30e8508b8): one slurmd per GPU."""


def slurm_version(text: str) -> tuple[int, int, int] | None:
    """Slurm's version as numbers (``22.05.8``, ``scontrol show config``'s ``SLURM_VERSION``, or ``slurm-wlm
    24.11.5`` as ``slurmd -V`` prints it; ``25.05.0-0rc1`` counts as 25.05.0, ``23.11`` as 23.11.0), None when
    ``text`` names none."""
    words = text.split()
    parts = (words[-1] if words else "").split(".")
    try:
        found = tuple(int(p.split("-")[0]) for p in parts[:3])
    except ValueError:
        return None
    if len(found) < 2:
        return None
    return (found[0], found[1], found[2] if len(found) == 3 else 0)


def version_problem(version: str, key: str = "node_per_gpu") -> str | None:
    """One line when ``[slurm] node_per_gpu`` (or ``key``, ``node_per_instance``) cannot work on Slurm ``version``
    (:func:`slurm_version` reads it)."""
    found = slurm_version(version)
    if found is None:
        return f"[slurm] {key} needs Slurm 23.11 or later; cannot read Slurm's version from {version!r}"
    if found[:2] < PER_GPU_SINCE:
        text = version.rsplit(maxsplit=1)[-1]
        return (
            f"[slurm] {key} needs Slurm 23.11 or later (a dynamic node's own Port=), this is Slurm {text}: "
            f"set {key} = false"
            + (", or instance_nodes = static (State=FUTURE nodes in slurm.conf)" if key == "node_per_instance" else "")
            + "; nothing was changed"
        )
    return None
