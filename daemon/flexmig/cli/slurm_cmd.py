"""``flexmig slurm``: try flexmig with a real Slurm on one machine, and the files a Slurm site needs.

* ``flexmig slurm testbed [--hosts N] [--layout instance|gpu|node] --sim SPEC DIR``: a private Slurm on loopback
  under DIR (munged, slurmctld, and the slurmds flexmig registers), with one flexmigd in mode act on each of N
  simulated hosts SPEC (:mod:`flexmig.cli.slurm_testbed`). It prints the ``export SLURM_CONF=...`` line for
  ``sbatch``/``squeue``/``sinfo`` and runs until SIGINT or SIGTERM, then stops everything it started. Needs root and
  Debian's ``slurmctld slurmd slurm-client munge``.
* ``flexmig slurm taskprolog [--output FILE] [--map PATH]``: the TaskProlog to name in slurm.conf.
* ``flexmig slurm conf --model MODEL --gpus N [--node-per-gpu | --node-per-instance]``: the slurm.conf lines a site
  adds for a flexmig node (with ``--node-per-gpu``, for one dynamic node per GPU; ``--node-per-instance``, per MIG
  instance).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from flexmig.cli.slurm_testbed import run_testbed
from flexmig.errors import SlurmError
from flexmig.mig.catalogue import GpuModel, model_by_key
from flexmig.slurm.gresconf import check_node_name
from flexmig.slurm.install import PROLOG, TASKPROLOG, render_taskprolog, write_taskprolog
from flexmig.slurm.pool import pool_lines, pool_places, pool_port
from flexmig.slurm.slots import slot_count, slot_lines
from flexmig.slurm.testbed import MAX_HOSTS, future_gres
from flexmig.slurm.testbed_layout import LAYOUTS

__all__ = ["register"]

_REGISTER_WAIT_S = 60.0


def register(sub: Any) -> None:
    """Add the ``slurm`` subcommand and its actions."""
    p: argparse.ArgumentParser = sub.add_parser(
        "slurm", help="Slurm: a private testbed, the TaskProlog, slurm.conf lines", description=__doc__
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_testbed(actions)
    _add_taskprolog(actions)
    _add_conf(actions)


def _add_testbed(actions: Any) -> None:
    """``flexmig slurm testbed``."""
    tb = actions.add_parser(
        "testbed",
        help="run a private Slurm cluster on this machine, each simulated host with its flexmigd (mode act)",
        description="Starts munged, slurmctld and, for each simulated host, flexmigd (which registers its nodes, "
        "starting their slurmds) under DIR, prints the export line to use with sbatch, and stops everything on "
        "SIGINT or SIGTERM. Needs root. By default one Slurm node per MIG instance, as the Slurm on PATH (or in "
        "FLEXMIG_SLURM_BIN) can have them: dynamic from 23.11, static State=FUTURE nodes of slurm.conf before.",
    )
    tb.add_argument("--sim", metavar="SPEC", required=True, help="each host's simulated GPUs, e.g. h200:7g.141gb@0")
    tb.add_argument("dir", metavar="DIR", type=Path, help="directory for everything (created; keep it short)")
    tb.add_argument("--node", default="flexmig-sim", help="the Slurm node name (default flexmig-sim)")
    tb.add_argument("--cpus", type=int, default=16, help="CPUs each host advertises (default 16)")
    tb.add_argument(
        "--hosts", type=int, default=1, help=f"simulated hosts, each <node>-h<I> with its flexmigd (1-{MAX_HOSTS})"
    )
    tb.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="instance",
        help="Slurm nodes: one per MIG instance (default; static nodes before Slurm 23.11), per GPU (23.11+), or "
        "one per host (whole node, --hosts 1)",
    )
    tb.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    tb.set_defaults(func=run_testbed)


def _add_taskprolog(actions: Any) -> None:
    """``flexmig slurm taskprolog``."""
    tp = actions.add_parser(
        "taskprolog",
        help="print (or write) flexmig's TaskProlog for slurm.conf",
        description="The TaskProlog maps a job's GRES indices to MIG UUIDs and sets the checkpoint hook's "
        "variables. Name it in slurm.conf: TaskProlog=FILE.",
    )
    tp.add_argument("--output", type=Path, help="write it here (mode 0755) instead of printing it")
    tp.add_argument("--map", type=Path, default=Path("/run/flexmig/slurm/gres-map.json"), help="[slurm] gres_map")
    tp.add_argument("--python", default="/usr/bin/python3", help="interpreter of its first line")
    tp.add_argument(
        "--prolog",
        action="store_true",
        help="the Prolog instead (slurm.conf Prolog=FILE; slurmd runs it as root): it makes each job user's "
        "checkpoint base, which no user may make",
    )
    tp.set_defaults(func=run_taskprolog)


def _add_conf(actions: Any) -> None:
    """``flexmig slurm conf``."""
    cf = actions.add_parser(
        "conf",
        help="print the slurm.conf lines a flexmig node needs (FUTURE placeholder, MaxNodeCount, TaskProlog)",
        description="Demand for MIG profiles no node has yet is refused at submission unless a FUTURE node "
        "advertises them; this prints one for the model and GPU count.",
    )
    cf.add_argument("--model", default="h200", help="GPU model: a100-40, a100-80, h100-80, h200 (default h200)")
    cf.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    cf.add_argument("--cpus", type=int, default=64, help="CPUs of the node (default 64)")
    cf.add_argument("--name", default="flexmig-future", help="the placeholder's node name")
    cf.add_argument(
        "--taskprolog",
        default=f"/{TASKPROLOG}",
        help="the TaskProlog's path (default %(default)s, where flexmig install-files puts it)",
    )
    cf.add_argument(
        "--prolog",
        default=f"/{PROLOG}",
        help="the Prolog's path (default %(default)s, where flexmig install-files puts it)",
    )
    cf.add_argument(
        "--node-per-gpu",
        action="store_true",
        help="for [slurm] node_per_gpu (Slurm 23.11+): one dynamic node per GPU, each with its own slurmd",
    )
    cf.add_argument(
        "--node-per-instance",
        action="store_true",
        help="for [slurm] node_per_instance (Slurm 23.11+): one dynamic node per MIG instance, each its own slurmd",
    )
    cf.add_argument(
        "--static",
        action="store_true",
        help="with --node-per-instance, for instance_nodes = static (any Slurm from 22.05): the State=FUTURE node "
        "of every place each MIG profile can take on the host's GPUs (needs --host)",
    )
    cf.add_argument("--host", help="with --static: the host's Slurm node name ([slurm] node), which the names extend")
    cf.add_argument("--addr", help="with --static: where slurmctld reaches the host's slurmds (default: --host)")
    cf.add_argument("--port-base", type=int, default=6830, help="with --static: [slurm] slurmd_port_base (6830)")
    cf.set_defaults(func=run_conf)


# ------------------------------------------------------------------------------------------------- conf
def run_conf(args: argparse.Namespace) -> int:
    """Print the slurm.conf lines for a flexmig node."""
    try:
        model = model_by_key(args.model)
    except KeyError as exc:
        raise SlurmError(str(exc.args[0])) from None
    if not 1 <= args.gpus <= 64:
        raise SlurmError(f"--gpus {args.gpus}: must be 1-64")
    if args.node_per_gpu and args.node_per_instance:
        raise SlurmError("--node-per-gpu or --node-per-instance, not both")
    if args.static:
        return _static_conf(args, model)
    if args.node_per_gpu or args.node_per_instance:
        key, names = ("node_per_gpu", "<host>-gpu<K>")
        if args.node_per_instance:
            key, names = ("node_per_instance", "<host>-gpu<K>-<S>")
        nodes = args.gpus * (1 if args.node_per_gpu else max(p.max_instances for p in model.plain_profiles))
        if args.cpus < nodes:
            raise SlurmError(f"--cpus {args.cpus}: fewer than the {nodes} nodes of a host: each node needs a CPU")
        share = args.cpus // nodes
        print(f"# flexmig, {key} (Slurm 23.11+): each host registers up to {nodes} dynamic nodes, {names},")
        print("# each with its own slurmd (systemd/slurmd@.service), so the node table needs room for all of them")
        print(f"MaxNodeCount=<the nodes slurm.conf names, placeholders included, + {nodes} x flexmig hosts>")
        print("SlurmdPidFile=/run/slurmd-%n.pid")
        print("SlurmdSpoolDir=/var/spool/slurmd/%n")
        print("SlurmdLogFile=/var/log/slurm/slurmd-%n.log")
        print(f"TaskProlog={args.taskprolog}")
        print(f"Prolog={args.prolog}")
        print("# (rendered with: flexmig slurm taskprolog [--prolog] --map '/run/flexmig/slurm/gres-map-{node}.json')")
        print("# Jobs for MIG profiles no GPU node has yet pend against this placeholder (one GPU's worth)")
        # Per instance: a 7g instance's node offers seven slices' CPUs, and a job must fit the placeholder.
        print(f"NodeName={args.name} State=FUTURE CPUs={share * (7 if args.node_per_instance else 1)} "
              f"Gres={future_gres(model, 1)}")  # fmt: skip
        print(f"# and add {args.name} to the partitions of the flexmig nodes (or use Nodes=ALL);")
        if args.node_per_gpu:
            print(f'# flexmig.toml [slurm]: {key} = true, slurmd_conf = "CPUs={share} RealMemory=<a GPU\'s share>"')
        else:  # each instance node offers its compute slices' share of the host
            print(f'# flexmig.toml [slurm]: {key} = true, slurmd_conf_per_slice = "CPUs={share} '
                  "RealMemory=<a compute slice's share>\"")  # fmt: skip
        return 0
    print("# flexmig: nodes re-registered as dynamic nodes (slurmd -Z) need room in the node table")
    print("MaxNodeCount=<the nodes slurm.conf names, placeholders included, + flexmig nodes>")
    print(f"TaskProlog={args.taskprolog}")
    print("# as root before each job: makes the job user's checkpoint base (no user may make another's)")
    print(f"Prolog={args.prolog}")
    print("# Jobs for MIG profiles no node has yet pend against this placeholder instead of being refused")
    print(f"NodeName={args.name} State=FUTURE CPUs={args.cpus} Gres={future_gres(model, args.gpus)}")
    print(f"# and add {args.name} to the partitions of the flexmig nodes (or use Nodes=ALL)")
    return 0


def _static_conf(args: argparse.Namespace, model: GpuModel) -> int:
    """``--node-per-instance --static``: the State=FUTURE node of every place of every MIG profile on the host."""
    if not args.node_per_instance:
        raise SlurmError("--static goes with --node-per-instance (instance_nodes = static)")
    if not args.host:
        raise SlurmError("--static needs --host: the host's Slurm node name, which each static node's name extends")
    check_node_name(args.host)
    addr = args.addr or args.host
    if not re.fullmatch(r"[A-Za-z0-9_.:\-]{1,255}", addr):
        raise SlurmError(f"--addr {addr!r}: not a host name or address")
    top = pool_port(args.port_base, args.gpus, sum(1 for _ in pool_places(model, args.gpus)) - 1)  # the last
    if args.port_base < 1 or top > 65535:
        raise SlurmError(f"--port-base {args.port_base}: the host's ports would reach {top} (at most 65535)")
    share = args.cpus // (args.gpus * 7)
    if share < 1:
        raise SlurmError(f"--cpus {args.cpus}: fewer than the {args.gpus * 7} compute slices of the host")
    count = slot_count(model, args.gpus)
    pools = pool_lines(
        args.host, model, args.gpus, port_base=args.port_base, cpus_per_slice=share, hostname=args.host, addr=addr
    )
    print(f"# flexmig, node_per_instance with instance_nodes = static (any Slurm from 22.05): host {args.host}, "
          f"{args.gpus} x {model.name}: {count} instance nodes and {len(pools)} pool nodes,")  # fmt: skip
    print("# one per place each MIG profile can take; only those whose instances exist leave State=FUTURE (each")
    print("# with its own slurmd, systemd/slurmd-static@.service). A node's CPUs: a compute slice's share of the")
    print("# host's, times its profile's slices. Add the nodes to the flexmig partitions (or use Nodes=ALL).")
    print("SlurmdPidFile=/run/slurmd-%n.pid")
    print("SlurmdSpoolDir=/var/spool/slurmd/%n")
    print("SlurmdLogFile=/var/log/slurm/slurmd-%n.log")
    print(f"TaskProlog={args.taskprolog}")
    print(f"Prolog={args.prolog}")
    print("# (rendered with: flexmig slurm taskprolog [--prolog] --map '/run/flexmig/slurm/gres-map-{node}.json')")
    lines = slot_lines(
        args.host, model, args.gpus, port_base=args.port_base, cpus_per_slice=share, hostname=args.host, addr=addr
    )
    print("\n".join(lines))
    print("# Pool nodes: a job asking for several devices of one profile on one node (--gres=gpu:1g.18gb:2) runs on")
    print("# one, registered over that many idle instances while it needs them (their own nodes wait in FUTURE).")
    print("\n".join(pools))
    print(f'# flexmig.toml [slurm]: node = "{args.host}", node_per_instance = true, instance_nodes = "static", '
          f"slurmd_port_base = {args.port_base},")  # fmt: skip
    print('#   slurmd_unit = "slurmd-static@{node}.service", slurmd_env = "/run/flexmig/slurm/slurmd-{node}.env",')
    print('#   slurmd_pid_file = "/run/slurmd-{node}.pid", gres_map = "/run/flexmig/slurm/gres-map-{node}.json"')
    return 0


# ------------------------------------------------------------------------------------------- taskprolog
def run_taskprolog(args: argparse.Namespace) -> int:
    """Print or write the TaskProlog."""
    try:
        if args.output is None:
            sys.stdout.write(render_taskprolog(args.map, args.python, prolog=args.prolog))
        else:
            write_taskprolog(args.output, args.map, args.python, prolog=args.prolog)
            print(f"wrote {args.output}; in slurm.conf: {'Prolog' if args.prolog else 'TaskProlog'}={args.output}")
    except (ValueError, OSError) as exc:
        raise SlurmError(f"taskprolog: {exc}") from None
    return 0
