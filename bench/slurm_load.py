"""Slurm, the load a cluster of flexmig hosts puts on slurmctld, modelled from the figures measured on one host.

Per host, one flexmigd with ``[slurm] node_per_instance`` on 8 H200s, at the defaults (``probe_s`` 1,
``interval_s`` 10, ``cluster_reads_per_s`` 20), on a busy cluster whose job counters move every second (the worst
case: every probe asks for a read). What each host asks of slurmctld:

* a **probe** every ``probe_s``: ``sdiag``'s job counters (one RPC, no job lock);
* a **read** when the counters moved, at most every :func:`flexmig.slurm.shared_reads.read_spacing` (the GPU hosts over
  ``cluster_reads_per_s``, times 1 to 1.5 at random, at least ``probe_s``), and every ``interval_s`` whatever the
  budget: the jobs waiting or running (``squeue --json``, under the job lock: 0.29 ms a read with a short queue,
  5.2 ms with 2,000 held jobs, measured on 22.05.8, ``docs/slurm-node.md``; here linear in the queue), every node
  (``sinfo --json`` on 22.05, ``scontrol --json show nodes`` from 23.02: ``NODE_JSON_BYTES`` a node, the size of
  the testbed's answers in ``tests/data/slurm``) and partitions, and the reservations: ``RPCS_A_READ`` RPCs;
* its instance nodes: one Slurm node and one slurmd per MIG instance (dynamic nodes from 23.11; on 22.05 static
  FUTURE nodes, one per place a profile can take, declared in slurm.conf, a slurmd for each that has an instance);
  slurmctld pings each node every ``SlurmdTimeout``/3 (100 s at Slurm's default 300 s);
* a change of its instances: ``RPCS_A_CHANGE`` RPCs under the node write lock for each instance created or
  destroyed (drain, delete; create, register, the schedule step), at the rate the per-instance model gives on
  8 GPUs (``bench/slurm_model.py --gpus 8 --policies instances``; run here on seeds ``--seeds``), together with the
  instances a host holds (the mean and the most over the run).

A change's own node reads are printed apart (they were never in the figures above): each instance created or
destroyed reads the full node list in its steps (counted in ``flexmig/slurm/change.py``: before, close, check, drain,
recheck and delete of a retired instance's node, 5, and close, idle, check, drain, register, attributes, resume and
schedule of a new one, 7; now the steps that only ask whether the node is there, drained and why read that node
alone, ``sinfo -n NAME``, and the full list only when it is not listed: 3 and 7), and it polls its node while it
waits for it to empty, leave Slurm or register (``POLLS_A_CHANGE``: 3-4 polls a carving of one instance destroyed
and one created, sdiag's count on 22.05.8 and 24.11.5, ``tests/slurm/test_slurm_node_brief.py``), every poll a full
node list before, one node (``REQUEST_NODE_INFO_SINGLE``) now.

The queue grows with the cluster: ``--jobs-per-host`` jobs waiting or running a host (default 20: 2.5 a GPU).
The table prints, for each cluster size, what slurmctld serves a second, the job-lock time a second, the bytes of
node lists it writes a second, and the instance nodes and slurmds; the last line says what ``interval_s`` keeps the
timed reads within the budget (they are not held back by it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass

import slurm_model as sm
from flexmig.mig import H200
from flexmig.slurm.shared_reads import JOB_LOCK_SHARE, READ_SHARE, job_lock_s, read_spacing
from machine import machine
from slurm_mix import mix

PROBE_S = 1.0  # [slurm] probe_s
INTERVAL_S = 10.0  # [slurm] interval_s
READS_PER_S = 20.0  # [slurm] cluster_reads_per_s
JITTER = 1.25  # the spacing's mean factor (1 to 1.5 at random)
READ_S = 0.014  # a read's wall time on the node with a short queue (docs/slurm-node.md: 14 ms)
READ_2000_S = 0.34  # ... with 2,000 jobs (6.4 MB of JSON asked for and parsed)
RPCS_A_READ = 4  # job info, node info, partition info, reservation info
RPCS_A_CHANGE = 2.5  # an instance destroyed (drain, delete) or created (create, register, schedule): 5 a pair
NODE_JSON_BYTES = 1600  # one node in sinfo --json (22.05.8: 1,634 bytes; 24.11.5's scontrol --json: 3,127)
LISTS_BEFORE = 6.0  # full node lists an instance's change read in its steps (5 retiring it, 7 making it)
LISTS_A_CHANGE = 5.0  # ... now (3 retiring, 7 making: a step that asks only "there, drained, why" reads one node)
POLLS_A_CHANGE = 2  # its waits' node polls (measured: 3-4 a carving of one destroy and one create)
PING_S = 100.0  # slurmctld pings each node every SlurmdTimeout/3 (300 s by default)
GPUS = 8


@dataclass(frozen=True)
class Host:
    """One host's instance nodes over a modelled run: the mean and the most, and instances created an hour."""

    mean_nodes: float
    most_nodes: int
    changes_per_h: float


def host_profile(seeds: list[int]) -> Host:
    """The per-instance model on 8 GPUs, over ``seeds``: its instance counts and re-registrations an hour."""
    means, mosts, rates = [], [], []
    for seed in seeds:
        r = sm.simulate(mix(seed, sm.JOBS * GPUS), sm.policies()["instances"], gpus=GPUS)
        counts = [row[1].count("@") for row in r.state.timeline]
        means.append(statistics.mean(counts))
        mosts.append(max(counts))
        rates.append(r.reregs_per_h)
    return Host(statistics.mean(means), max(mosts), statistics.median(rates))


def static_nodes_per_gpu() -> int:
    """Static instance nodes a GPU declares on 22.05: one per place each plain profile can take."""
    return sum(len(p.starts) for p in H200.plain_profiles)


@dataclass(frozen=True)
class Row:
    """What a cluster of ``hosts`` asks of slurmctld a second, and how often each host reads."""

    hosts: int
    reads_per_s: float
    rpcs_per_s: float
    lock_ms_per_s: float
    node_mb_per_s: float
    nodes: float
    slurmds: float
    every_s: float


def spacing_before(hosts: int, read_s: float) -> float:
    """The spacing before the job-lock share (commit e92b2a5 and earlier): the read budget and a tenth of the
    node's time only."""
    return max(PROBE_S, hosts / READS_PER_S, READ_SHARE * read_s)


def row(hosts: int, host: Host, jobs_per_host: float, *, before: bool = False) -> Row:
    """The cluster of ``hosts`` such hosts, ``jobs_per_host`` jobs in the queue each, on a busy cluster (the counters
    move every second). ``before``: the timed read every ``interval_s`` came whatever the spacing, and the spacing
    did not count the job lock. A host probes (``sdiag``) only once its spacing has passed, so on a busy cluster one
    probe comes before each read that the counters ask for, and none before a timed read."""
    jobs = round(hosts * jobs_per_host)
    lock_ms = job_lock_s(jobs) * 1000  # every read packs every job of the cluster, whatever the host needs of it
    read_s = READ_S + (READ_2000_S - READ_S) * jobs / 2000  # a big queue is read less often (READ_SHARE)
    if before:
        spacing = spacing_before(hosts, read_s)
    else:
        spacing = read_spacing(hosts, read_s, reads_per_s=READS_PER_S, probe_s=PROBE_S, jobs=jobs)
    if spacing > PROBE_S:
        spacing *= JITTER
    every = min(INTERVAL_S, spacing) if before else spacing  # now the timed read waits for the spacing too
    reads = hosts / every
    probes = reads if spacing < INTERVAL_S else 0.0
    nodes = hosts * host.mean_nodes
    rpcs = probes + reads * RPCS_A_READ + nodes / PING_S + hosts * host.changes_per_h * RPCS_A_CHANGE / 3600
    return Row(
        hosts, reads, rpcs, reads * lock_ms, reads * nodes * NODE_JSON_BYTES / 1e6, nodes, host.mean_nodes, every
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="161-163", help="seeds of the 8-GPU per-instance model (default 161-163)")
    ap.add_argument("--hosts", default="1,20,100,1000", help="cluster sizes (default 1,20,100,1000)")
    ap.add_argument("--jobs-per-host", type=float, default=20.0, help="jobs waiting or running a host (20)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.hosts.split(",") if x]
    if not sizes or min(sizes) < 1 or args.jobs_per_host < 0:
        ap.error("--hosts must list sizes of at least 1 and --jobs-per-host be at least 0")
    load = os.getloadavg()
    print("flexmig Slurm cluster, offline: the load of flexmig hosts on slurmctld (node_per_instance, 8 H200s a host)")
    print(f"machine: {machine()}; load: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    host = host_profile(sm.seeds_of(args.seeds))
    print(f"a host (the per-instance model, 8 GPUs, seeds {args.seeds}): {host.mean_nodes:.1f} instance nodes on "
          f"average, {host.most_nodes} at most (7 a GPU: {7 * GPUS}), {host.changes_per_h:.0f} instances created an "
          f"hour; on 22.05 {static_nodes_per_gpu() * GPUS} static instance nodes declared "
          f"({static_nodes_per_gpu()} a GPU)")  # fmt: skip
    print(f"defaults: probe_s {PROBE_S:g}, interval_s {INTERVAL_S:g}, cluster_reads_per_s {READS_PER_S:g}, the "
          f"hosts' reads within {JOB_LOCK_SHARE:.0%} of the job lock; the queue {args.jobs_per_host:g} jobs a host; "
          f"counters moving every second (a busy cluster)\n")  # fmt: skip
    print("before: the timed read every interval_s not held back, the spacing blind to the queue's length")
    _table(sizes, host, args.jobs_per_host, before=True)
    print("\nnow: every read waits for the spacing, which keeps the hosts' reads within the job-lock share")
    _table(sizes, host, args.jobs_per_host, before=False)
    _change_reads(sizes, host)
    return 0


def _change_reads(sizes: list[int], host: Host) -> None:
    """What the changes' own node reads write a second (not in the tables above): their steps' full node lists, and
    their waits' polls, a full list each before and one node each now."""
    print(f"\na change's own node reads (not in the tables above): {LISTS_BEFORE:g} node lists an instance created "
          f"or destroyed before, {LISTS_A_CHANGE:g} now, and {POLLS_A_CHANGE} polls of its node")  # fmt: skip
    head = ("hosts", "changes/s", "step lists before", "step lists now", "polls before", "polls now")
    print("".join(f"{h:>19}" for h in head) + "   (MB/s)")
    for h in sizes:
        changes = h * host.changes_per_h * 2 / 3600  # each instance created is destroyed again
        cluster = h * host.mean_nodes * NODE_JSON_BYTES / 1e6  # one full node list, MB
        one = NODE_JSON_BYTES / 1e6
        cells = (f"{h}", f"{changes:.2f}", f"{changes * LISTS_BEFORE * cluster:.1f}",
                 f"{changes * LISTS_A_CHANGE * cluster:.1f}", f"{changes * POLLS_A_CHANGE * cluster:.1f}",
                 f"{changes * POLLS_A_CHANGE * one:.3f}")  # fmt: skip
        print("".join(f"{c:>19}" for c in cells))


def _table(sizes: list[int], host: Host, jobs_per_host: float, *, before: bool) -> None:
    head = ("hosts", "reads/s", "a host reads every", "RPCs/s", "job lock ms/s", "node lists MB/s",
            "instance nodes", "slurmds/host")  # fmt: skip
    print("".join(f"{h:>19}" for h in head))
    for h in sizes:
        r = row(h, host, jobs_per_host, before=before)
        cells = (f"{r.hosts}", f"{r.reads_per_s:.1f}", f"{r.every_s:.1f} s", f"{r.rpcs_per_s:.0f}",
                 f"{r.lock_ms_per_s:.0f}", f"{r.node_mb_per_s:.1f}", f"{r.nodes:.0f} (<={r.hosts * host.most_nodes})",
                 f"{r.slurmds:.1f}")  # fmt: skip
        print("".join(f"{c:>19}" for c in cells))
        if not before and r.every_s > 60:
            shared = JOB_LOCK_SHARE / job_lock_s(round(h * jobs_per_host))
            print(f"{'':19}{h} hosts: each host's view of the queue up to {r.every_s / 60:.0f} min old; one view "
                  f"shared by all hosts (not built) read {shared:.1f} times a second in the same share")  # fmt: skip
        if r.lock_ms_per_s > 500:
            print(f"{'':19}{h} hosts: the job lock held {r.lock_ms_per_s / 1000:.1f} s a second by flexmig's reads "
                  f"alone ({h * jobs_per_host:.0f} jobs in the queue, each read packing all of them)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
