"""Slurm, a busy node: an administrator's seeded mix of MIG jobs on a real Slurm 22.05 testbed, with flexmig as it is
now, with flexmig as it was (a git revision's code), and with no flexmig (a static layout); on Slurm 23.11 or later
also with one Slurm node per GPU (``[slurm] node_per_gpu``) or per MIG instance (``[slurm] node_per_instance``).

The mix (seed 24): 45 batch jobs of 1g.18gb, 2g.35gb, 3g.71gb and 7g.141gb (weights 40/25/20/15 %), each sleeping
30-120 s (uniform) with ``--time`` twice its run time (rounded up to whole minutes, Slurm's unit), submitted at
times drawn uniformly over a 12-minute window (the issue's "12-minute mix"), on one simulated H200 (7 compute
slices). ``--scale`` multiplies run times and arrival gaps (``--quick`` is ``--scale 0.25``; limits stay at least one
minute, Slurm's smallest).

Rivals, each on a fresh private testbed (``flexmig.slurm.testbed``), run one after the other or side by side
(``--parallel``, which shares the machine's two cores among them):

* ``static``: no flexmig; the node laid out once as ``3g.71gb + 2g.35gb + 1g.18gb`` (every profile of
  the mix but 7g, which no layout can hold beside the others): the 7g jobs never run, the rest run as Slurm places
  them;
* ``before``: flexmigd of ``--before`` (a git revision, default the commit before the reservation approach), with
  that revision's testbed settings (its own slurmd, drain at once);
* ``now``: flexmigd of this tree, with the testbed's settings (Slurm read every 2 s, probed every 1 s) and the
  production defaults for everything else (``min_interval_s`` 60, ``max_wait_s`` 1800, ``drain_timeout_s`` 900);
* ``per-gpu``: the same flexmigd with ``[slurm] node_per_gpu``: one dynamic Slurm node per GPU, each with its own
  slurmd, re-registered alone (Slurm 23.11 or later: ``FLEXMIG_SLURM_BIN`` names its commands, e.g. ``make
  slurm-newer``'s chroot; on one GPU it is ``now`` with a node name per GPU);
* ``per-instance``: the same flexmigd with ``[slurm] node_per_instance``: one dynamic Slurm node per MIG instance,
  idle instances carved for the waiting jobs while busy ones run on (Slurm 23.11 or later, as ``per-gpu``);
* ``per-inst-static``: ``per-instance`` with ``instance_nodes = "static"``: the instance nodes are State=FUTURE
  nodes of slurm.conf, one per place each MIG profile can take (any Slurm from 22.05: Debian 12's runs it).
* ``default``: the testbed of ``per-inst-static`` (slurm.conf with the host's State=FUTURE instance lines) and a
  flexmigd whose ``[slurm]`` table names no mode: ``layout = "auto"``, the default, chooses (static instance nodes
  here; with no such lines, dynamic ones on 23.11 or later).

``--gpus N`` puts N simulated H200s on the node (each laid out as the rival's one-GPU layout) and N times the jobs
over the same window (the offline model's ``--gpus`` mix): with ``now`` and ``static`` one Slurm node of N GPUs,
with ``per-gpu`` N nodes.

``--hosts H`` runs the mix on a cluster: H simulated hosts of ``--gpus`` GPUs each under one slurmctld and munged
(``flexmig slurm testbed --hosts``), each with its own flexmigd, GPUs of their own UUIDs and slurmds, in the
one-node-per-instance rivals (``default``, ``per-instance``, ``per-inst-static``), with H x N times the jobs over the
same window. Every figure then counts every host: the instance nodes Slurm lists of any host, the slices of all
H x N GPUs (utilisation and the packing bound), each job once on a MIG device of its own (the UUIDs differ from host
to host), and the re-registrations of every host's journal.

Figures, from the jobs' own start and end stamps and a monitor that reads the node's state every 0.5 s:

* closed: share of the busy time (first submission to last end) the node was closed to new jobs: drained, inside
  an active flexmig reservation, or not registered (with ``per-gpu``, the share of the GPU nodes closed; with
  ``per-instance``, the share of the instance nodes Slurm lists that are closed, and a closed period is one while
  any of them is);
* utilisation while jobs wait: busy compute slices / (7 x GPUs) over the times some submitted job had not started;
  and over the whole run (first submission to last end), where every idle slice counts;
* makespan against the packing bound (the larger of all slice-seconds / 7 and the latest arrival plus run time);
* re-registrations per hour (flexmig's journal) and each closed period's length (of any one Slurm node);
* each job's wait from its submission to its start: the mean and the longest;
* each job ran once, on one ``MIG-`` device of its own (no two jobs at once on one UUID).

Run (root, Debian's ``slurmctld slurmd slurm-client munge``): ``.venv/bin/python bench/slurm_mix.py [--quick]``;
per GPU node on Slurm 24.11: ``.venv/bin/python tests/support/slurm_newer.py up /var/cache/flexmig/slurm-trixie``,
then ``FLEXMIG_SLURM_BIN=/var/cache/flexmig/slurm-trixie.bin .venv/bin/python bench/slurm_mix.py --gpus 2 --rivals
per-gpu``, then ``... slurm_newer.py down ...``. The header names the Slurm that ran (``slurmctld -V``); the
``per-gpu`` and ``per-instance`` rivals on a Slurm older than 23.11 are refused before anything starts. A SIGTERM
stops the run as Ctrl-C does: its testbeds are stopped and removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexmig.cli.slurm_testbed import seed_sim_state
from flexmig.errors import SlurmError
from flexmig.mig import H200
from flexmig.mig.nodespec import parse_node_spec
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import flexmig_name
from flexmig.slurm.settings import slot_node
from flexmig.slurm.sitecheck import version_problem
from flexmig.slurm.testbed import DEBIAN_PACKAGES, MAX_HOSTS, Testbed, free_port, missing_binaries
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "1719b29"  # the tree before the reservation approach (drain at once, flexmigd runs slurmd)
WEIGHTS = {"1g.18gb": 0.40, "2g.35gb": 0.25, "3g.71gb": 0.20, "7g.141gb": 0.15}
SLICES = {p: H200.profile(p).compute_slices for p in WEIGHTS}
STATIC = "h200:3g.71gb@0+2g.35gb@4+1g.18gb@6"
START = "h200:7g.141gb@0"
SEED = 24
SCHEDULER = {"testbed": Testbed.scheduler_parameters, "slurm": ""}
"""``--scheduler``: the testbed's SchedulerParameters (the scheduler and its backfill every second), or Slurm's own
defaults (none given: the main scheduler every 60 s besides its events, the backfill scheduler every 30 s), as a
cluster runs them."""
WINDOW_S = 720.0  # the "12-minute mix": arrivals over 12 minutes
PER_INSTANCE = ("per-instance", "per-inst-static", "default")
"""The rivals with one Slurm node per MIG instance: the ones that run on several hosts (``--hosts``)."""


@dataclass(frozen=True)
class MixJob:
    """One job of the mix: when it arrives (s after the first), its profile, run time and limit (minutes)."""

    index: int
    arrival_s: float
    profile: str
    runtime_s: float
    limit_min: int


def mix(seed: int = SEED, n: int = 45, scale: float = 1.0, window_s: float = WINDOW_S) -> list[MixJob]:
    """The administrator's seeded mix: ``n`` arrival times drawn uniformly over ``window_s`` (sorted), each job a
    profile by ``WEIGHTS``, a run time uniform in 30-120 s and ``--time`` twice that, rounded up to minutes."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, window_s) for _ in range(n))
    out = []
    for i, t in enumerate(arrivals):
        profile = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        runtime = rng.uniform(30, 120) * scale
        out.append(MixJob(i, round(t * scale, 2), profile, round(runtime, 2), max(1, math.ceil(2 * runtime / 60))))
    return out


@dataclass
class Run:
    """What one rival's run gave."""

    name: str
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> job id, starts, ends, devices
    # (time, closed share of the Slurm nodes, registered GPUs, each Slurm node closed)
    samples: list[tuple[float, float, str, list[bool]]] = field(default_factory=list)
    t0: float = 0.0
    reregistrations: int = 0
    error: str = ""
    log: list[str] = field(default_factory=list)  # flexmigd's Slurm lines


class Bed:
    """A fresh testbed on ``spec`` under /tmp, with flexmigd from ``tree`` (None: no flexmigd after the first
    registration); ``per_gpu``: one Slurm node per GPU. Slurm's commands from ``FLEXMIG_SLURM_BIN`` when set."""

    def __init__(
        self, spec: str, name: str, per_gpu: bool = False, per_instance: bool = False, static: bool = False,
        scheduler: str = Testbed.scheduler_parameters, hosts: int = 1,
    ) -> None:
        ns = parse_node_spec(spec)
        self.per_instance = per_instance
        self.spec = spec
        self.hosts = hosts
        self.base = Path(tempfile.mkdtemp(prefix=f"fm-mix-{name}-", dir="/tmp"))
        self.base.chmod(0o755)
        where = os.environ.get("FLEXMIG_SLURM_BIN")
        self.tb = Testbed(self.base, ns.model, ns.count, node="mix", node_per_gpu=per_gpu,
                          node_per_instance=per_instance, static_nodes=static, scheduler_parameters=scheduler,
                          commands=SlurmCommands(Path(where) if where else None), hosts=hosts)  # fmt: skip
        self.names = [f"mix-gpu{k}" for k in range(ns.count)] if per_gpu else ["mix"]
        if per_instance:  # the nodes of the first layout; later, whichever instance nodes Slurm lists
            self.names = [f"{self.tb.host_node(h)}-gpu{k}-{i.start}" for h in range(hosts) for k in range(ns.count)
                          for i in (ns.layout or ())]  # fmt: skip
            if static:
                self.names = [slot_node(self.tb.host_node(h), k, i.start, i.profile.name) for h in range(hosts)
                              for k in range(ns.count) for i in (ns.layout or ())]  # fmt: skip
        self.client = SlurmClient(self.tb.slurm_commands())
        self.procs: list[subprocess.Popen[bytes]] = []

    def log_path(self, host: int) -> Path:
        """Host ``host``'s flexmigd log (``flexmigd.log`` on one host, ``flexmigd-h<I>.log`` on several)."""
        return self.tb.paths.log / ("flexmigd.log" if self.hosts == 1 else f"flexmigd-h{host + 1}.log")

    def start(self, code: Path | None, config: Any) -> None:
        """Start the testbed, then each host's flexmigd (``config(host)``: its configuration's text), with the GPUs of
        its own UUIDs; until the first nodes respond."""
        self.tb.prepare()
        self.tb.start()
        for host in range(self.hosts):
            f = self.tb.host_paths(host).flexmig
            if host > 0:
                seed_sim_state(self.spec, f / "sim.json", host)
            conf = f / "flexmigd.toml"
            conf.write_text(config(host))
            conf.chmod(0o600)
            env = self.tb.env(host)
            if code is not None:
                env["PYTHONPATH"] = str(code)
            argv = [sys.executable, "-m", "flexmig.daemon", "--sim", self.spec, "--sim-state", str(f / "sim.json"),
                    "--config", str(conf)]  # fmt: skip
            with self.log_path(host).open("ab") as log:
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env))
        deadline = time.monotonic() + 90
        while not (nodes := self.nodes()) or not all(n.responding for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.base}: the node(s) {', '.join(self.names)} did not register")
            time.sleep(0.3)

    def stop_flexmigd(self) -> None:
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def close(self, keep: bool = False) -> None:
        self.stop_flexmigd()
        self.tb.stop()
        if keep:
            print(f"kept {self.base} (logs in {self.tb.paths.log})", file=sys.stderr)
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def listed(self) -> list[SlurmNode | None] | None:
        """Slurm's record of each of the bed's nodes, in GPU order (None: not registered); None when Slurm does not
        answer."""
        try:
            by_name = {n.name: n for n in asyncio.run(self.client.nodes())}
        except (SlurmError, subprocess.TimeoutExpired):
            return None
        if self.per_instance and self.procs and any(self.instance_names(by_name)):
            self.names = self.instance_names(by_name)
        return [by_name.get(name) for name in self.names]

    @staticmethod
    def instance_names(by_name: dict[str, SlurmNode]) -> list[str]:
        """The instance nodes Slurm lists (``node_per_instance``), every host's."""
        return sorted(n for n in by_name if re.fullmatch(r"mix(-h[0-9]+)?-gpu[0-9]+-[0-9](-[0-9a-z]+)?", n))

    def nodes(self) -> list[SlurmNode] | None:
        """The bed's Slurm nodes, in GPU order; None when Slurm does not answer or one is not registered."""
        found = self.listed()
        return None if found is None or any(n is None for n in found) else [n for n in found if n is not None]

    def closed(self) -> tuple[float, str, list[bool]]:
        """The share of the bed's Slurm nodes that are drained, inside an active flexmig reservation, or not
        registered (or not responding); the GPUs they are registered with (``3g+2g+1g+1g``, one node's apart by
        `` | ``); and each node's closed."""
        found = self.listed()
        if found is None:
            return 1.0, "", [True] * len(self.names)
        reservations = None
        closed, shown = [], []
        for name, n in zip(self.names, found, strict=True):
            if n is None:
                closed.append(True)
                shown.append("")
                continue
            shown.append("+".join(f"{t.split('.')[0]}" for t, c in sorted(
                n.gpu_counts().items(), key=lambda x: -SLICES.get(x[0], 0)) for _ in range(c)))  # fmt: skip
            if not n.responding or n.drained:
                closed.append(True)
            elif "RESERVED" in n.flags:  # per instance: a held region's nodes too, from the hold's time
                if reservations is None:
                    try:
                        reservations = asyncio.run(self.client.reservations())
                    except (SlurmError, subprocess.TimeoutExpired):
                        reservations = ()
                now = time.time()
                mine = [r for r in reservations if r.name == flexmig_name(name)
                        or (self.per_instance and r.name.startswith("flexmig-") and name in r.nodes)]  # fmt: skip
                closed.append(any(r.active(now) for r in mine))
            else:
                closed.append(False)
        return sum(closed) / len(closed), " | ".join(shown), closed

    def submit(self, job: MixJob) -> int:
        stamp = self.base / f"job-{job.index}"
        script = (
            "#!/bin/sh\n"
            f'echo "start $(date +%s.%N) $CUDA_VISIBLE_DEVICES" >> {stamp}\n'
            f"sleep {job.runtime_s:.2f}\n"
            f'echo "end $(date +%s.%N)" >> {stamp}\n'
        )
        for attempt in range(5):  # a loaded machine: slurmctld may not accept a connection at once
            try:
                return self.tb.sbatch(f"--gres=gpu:{job.profile}:1", f"--time={job.limit_min}", "--job-name",
                                      f"mix{job.index}", script=script)  # fmt: skip
            except SlurmError:
                if attempt == 4:
                    raise
                time.sleep(2.0)
        raise AssertionError("unreachable")

    def stamps(self, job: MixJob) -> dict[str, Any]:
        path = self.base / f"job-{job.index}"
        starts, ends, devices = [], [], []
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if parts and parts[0] == "start":
                    starts.append(float(parts[1]))
                    devices.append(parts[2] if len(parts) > 2 else "")
                elif parts and parts[0] == "end":
                    ends.append(float(parts[1]))
        return {"starts": starts, "ends": ends, "devices": devices}

    def slurm_log(self) -> list[str]:
        """flexmigd's log lines about Slurm (notes, plans, re-registrations), every host's (``h<I>`` before each line
        on several hosts), in time order."""
        keep = ("Slurm", "slurm_reregister")
        out = []
        for host in range(self.hosts):
            path = self.log_path(host)
            if path.exists():
                tag = "" if self.hosts == 1 else f" h{host + 1}"
                out += [line[:23] + tag + line[23:] for line in path.read_text(errors="replace").splitlines()
                        if any(k in line for k in keep)]  # fmt: skip
        return sorted(out, key=lambda line: line[:23])

    def reregistrations(self) -> int:
        """The re-registrations that created instances, over every host's journal."""
        n = 0
        for host in range(self.hosts):
            path = self.tb.host_paths(host).flexmig / "state" / "journal.sqlite3"
            if not path.exists():
                continue
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                for (payload,) in db.execute(
                    "SELECT payload FROM actions WHERE kind='slurm_reregister' AND state='done'"
                ):
                    doc = json.loads(payload)
                    n += bool(doc.get("changes")) and not doc.get("retire")  # per instance: the instances created
            finally:
                db.close()
        return n


def config_now(bed: Bed, host: int = 0) -> str:
    """flexmigd's configuration for rival ``bed``'s host ``host`` (the testbed names the whole-node rivals' layout,
    no longer the default)."""
    return bed.tb.flexmigd_config(metrics_port=free_port(), interval_s=2.0, host=host)


def config_default(bed: Bed, host: int = 0) -> str:
    """flexmigd's configuration with no mode named (``[slurm] layout``'s default chooses), the testbed's paths kept."""
    dropped = ("node_per_instance = ", "instance_nodes = ", "node_per_gpu = ", "layout = ")
    return "\n".join(line for line in config_now(bed, host).split("\n") if not line.startswith(dropped))


def config_before(bed: Bed) -> str:
    """The configuration the earlier revision's testbed wrote (its keys only)."""
    p, f = bed.tb.paths, bed.tb.paths.flexmig
    q = json.dumps
    return "\n".join([
        'mode = "act"', f"node_name = {q(bed.tb.node)}", "[prometheus]", f'listen = "127.0.0.1:{free_port()}"',
        "[control]", f"socket = {q(str(f / 'control.sock'))}", "[state]", f"directory = {q(str(f / 'state'))}",
        f"journal = {q(str(f / 'state' / 'journal.sqlite3'))}", "[slurm]", "enabled = true",
        f"node = {q(bed.tb.node)}", "interval_s = 2", f"conf = {q(str(p.slurm_conf))}",
        f"gres_conf = {q(str(p.gres_conf))}", f"gres_map = {q(str(bed.tb.map_path))}", f"dev_dir = {q(str(p.dev))}",
        f"mig_minors = {q(str(p.mig_minors))}", f"slurmd_pid_file = {q(str(p.slurmd_pid(bed.tb.node)))}",
        f'slurmd_conf = "NodeAddr=127.0.0.1 CPUs={bed.tb.cpus}"',
        f"checkpoint_dir = {q(str(bed.base / 'ckpt' / '{user}' / '{job_id}'))}", "hook_settle_s = 5",
        "reregister_s = 2", "min_interval_s = 10", "",
    ])  # fmt: skip


def run(
    name: str, jobs: list[MixJob], before: Path | None, budget_s: float, gpus: int = 1, scheduler: str = "testbed",
    hosts: int = 1,
) -> Run:
    """One rival's run of the mix on ``hosts`` hosts of ``gpus`` GPUs each, with ``scheduler``'s
    SchedulerParameters."""
    out = Run(name)
    layout = (STATIC if name == "static" else START).split(":", 1)[1]
    bed = Bed(f"h200x{gpus}:{layout}" if gpus > 1 else f"h200:{layout}", name, per_gpu=name == "per-gpu",
              per_instance=name in PER_INSTANCE, static=name in ("per-inst-static", "default"),
              scheduler=SCHEDULER[scheduler], hosts=hosts)  # fmt: skip
    stop = threading.Event()
    try:
        if name == "before":
            bed.start(before, lambda _host: config_before(bed))
        else:
            bed.start(None, lambda host: config_default(bed, host) if name == "default" else config_now(bed, host))
        if name == "static":
            bed.stop_flexmigd()  # the node stays registered (slurmd runs on): Slurm alone from here

        def monitor() -> None:
            while not stop.is_set():
                out.samples.append((time.time(), *bed.closed()))
                stop.wait(0.5)

        watcher = threading.Thread(target=monitor, daemon=True)
        out.t0 = time.time()
        watcher.start()
        for job in jobs:
            delay = out.t0 + job.arrival_s - time.time()
            if delay > 0:
                time.sleep(delay)
            out.jobs[job.index] = {"id": bed.submit(job), "submit": time.time()}
        runnable = [j for j in jobs if name != "static" or j.profile != "7g.141gb"]
        deadline = out.t0 + budget_s
        while time.time() < deadline:
            if all(bed.stamps(j)["ends"] for j in runnable):
                break
            time.sleep(1.0)
        else:
            out.error = f"not all jobs ended within {budget_s:.0f} s"
        stop.set()
        watcher.join(10)
        for j in jobs:
            out.jobs[j.index].update(bed.stamps(j))
        out.reregistrations = bed.reregistrations()
        out.log = bed.slurm_log()
    except Exception as exc:  # a rival that breaks is reported, the others still run
        out.error = f"{type(exc).__name__}: {exc}"
        stop.set()
    finally:
        bed.close(keep=bool(out.error) or bool(os.environ.get("FLEXMIG_KEEP_TESTBED")))
    return out


def figures(r: Run, jobs: list[MixJob], gpus: int = 1) -> dict[str, Any]:
    """The run's figures on a node of ``gpus`` GPUs (see the module docstring)."""
    spans = []
    for j in jobs:
        rec = r.jobs.get(j.index, {})
        if rec.get("starts") and rec.get("ends"):
            spans.append((rec["starts"][0], rec["ends"][-1], SLICES[j.profile], rec["submit"]))
    if not spans:
        return {"error": r.error or "no job ran"}
    first = min(rec["submit"] for rec in r.jobs.values())
    last = max(e for _, e, _, _ in spans)
    makespan = last - first
    step = 0.5
    busy_total = waiting_slices = waiting_time = 0.0
    t = first
    submits = sorted((rec["submit"], rec.get("starts", [math.inf])[0] if rec.get("starts") else math.inf)
                     for rec in r.jobs.values())  # fmt: skip
    while t < last:
        used = sum(s for a, b, s, _ in spans if a <= t < b)
        busy_total += used * step
        if any(sub <= t < st for sub, st in submits):
            waiting_slices += used * step
            waiting_time += step
        t += step
    kept = [x for x in r.samples if first <= x[0] <= last]
    closed = [float(x[1]) for x in kept]
    periods: list[float] = []
    if len({len(x[3]) for x in kept if len(x) > 3}) > 1:  # nodes came and went (per instance): any one closed
        kept = [(x[0], x[1], x[2], [bool(x[1])]) for x in kept]
    for k in range(max((len(x[3]) for x in kept if len(x) > 3), default=1)):
        run_len = 0
        for x in kept:
            if x[3][k] if len(x) > 3 else bool(x[1]):
                run_len += 1
            elif run_len:
                periods.append(run_len * 0.5)
                run_len = 0
        if run_len:
            periods.append(run_len * 0.5)
    devices: dict[str, list[tuple[float, float]]] = {}
    once = own = True
    for j in jobs:
        rec = r.jobs.get(j.index, {})
        if not rec.get("starts"):
            continue
        once = once and len(rec["starts"]) == 1
        dev = rec["devices"][0]
        own = own and dev.startswith("MIG-") and "," not in dev
        devices.setdefault(dev, []).append((rec["starts"][0], rec["ends"][-1] if rec.get("ends") else last))
    for ivs in devices.values():
        ivs.sort()
        own = own and all(b[0] >= a[1] - 0.01 for a, b in itertools.pairwise(ivs))
    waits = [st - sub for sub, st in submits if st < math.inf]
    return {
        "ran": len(spans),
        "wait_mean": statistics.mean(waits),
        "wait_max": max(waits),
        "closed_share": (sum(closed) / len(closed)) if closed else float("nan"),
        "util_waiting": waiting_slices / (7 * gpus * waiting_time) if waiting_time else float("nan"),
        "util_run": busy_total / (7 * gpus * makespan) if makespan else float("nan"),
        "makespan": makespan,
        "reregs_per_h": r.reregistrations / (makespan / 3600) if makespan else 0.0,
        "closed_periods": periods,
        "once": once,
        "own_device": own,
        "error": r.error,
    }


def bound(jobs: list[MixJob], gpus: int = 1) -> float:
    """The packing bound: all slice-seconds over the ``gpus`` GPUs' 7 slices each, or the latest arrival plus run
    time."""
    packed = sum(SLICES[j.profile] * j.runtime_s for j in jobs) / (7 * gpus)
    return max(packed, *(j.arrival_s + j.runtime_s for j in jobs))


def timeline(r: Run, jobs: list[MixJob], step_s: float = 10.0, gpus: int = 1) -> list[str]:
    """Where the run lost capacity: per ``step_s``, the registered GPUs, the node closed or open, busy slices, the
    jobs waiting (by profile) and the jobs started; flexmigd's notes at their times."""
    recs = [(j, r.jobs.get(j.index, {})) for j in jobs]
    first = min((rec["submit"] for _, rec in recs if "submit" in rec), default=r.t0)
    ends = [rec["ends"][-1] for _, rec in recs if rec.get("ends")]
    last = max(ends, default=first)
    notes: list[tuple[float, str]] = []
    for line in r.log:
        with contextlib.suppress(ValueError, IndexError):
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + float("0." + line[20:23])
            text = line.split(": ", 1)[1] if ": " in line else line
            notes.append((stamp, text[:150]))
    out = []
    t = first
    short = {p: p.split(".")[0] for p in WEIGHTS}
    while t < last:
        window = [x for x in r.samples if t <= x[0] < t + step_s]
        layouts = window[-1][2] if window and len(window[-1]) > 2 else "?"
        closed = sum(float(x[1]) for x in window) / len(window) if window else 0.0
        busy = 0.0
        waiting: dict[str, int] = {}
        started: list[str] = []
        for j, rec in recs:
            a = rec.get("starts", [math.inf])[0] if rec.get("starts") else math.inf
            b = rec["ends"][-1] if rec.get("ends") else last
            overlap = max(0.0, min(b, t + step_s) - max(a, t))
            busy += SLICES[j.profile] * overlap / step_s
            if rec.get("submit", math.inf) <= t + step_s / 2 < a:
                waiting[short[j.profile]] = waiting.get(short[j.profile], 0) + 1
            if t <= a < t + step_s:
                started.append(f"{short[j.profile]}#{j.index}")
        wait = " ".join(f"{n}x{p}" for p, n in sorted(waiting.items()))
        out.append(f"{t - first:6.0f}s {layouts:<14} {'CLOSED' if closed >= 0.5 else 'open':6} busy "
                   f"{busy:3.1f}/{7 * gpus} waiting [{wait}] started {' '.join(started)}")  # fmt: skip
        for stamp, text in notes:
            if t <= stamp < t + step_s:
                out.append(f"        | {text}")
        t += step_s
    return out


def extract(rev: str) -> Path:
    """``rev``'s ``daemon/`` (the package) in a temporary directory, for ``PYTHONPATH``."""
    dest = Path(tempfile.mkdtemp(prefix="fm-mix-code-", dir="/tmp"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "daemon"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "daemon"


def slurm_version(where: str | None) -> str:
    """``slurmctld -V`` of the Slurm the run uses (``FLEXMIG_SLURM_BIN``'s, else the distribution's), e.g.
    ``slurm 24.11.5``; empty when it does not answer."""
    try:
        cmd = SlurmCommands(Path(where) if where else None).path("slurmctld")
        done = subprocess.run([cmd, "-V"], capture_output=True, text=True, timeout=60, check=False)
    except (SlurmError, OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply run times and arrival gaps (default 1)")
    ap.add_argument("--quick", action="store_true", help="--scale 0.25: a smoke run of a few minutes")
    ap.add_argument("--before", default=BEFORE, help=f"git revision of 'before' (default {BEFORE})")
    ap.add_argument("--rivals", default="static,before,now", help="which rivals to run (comma-separated)")
    ap.add_argument("--parallel", action="store_true", help="run the rivals side by side (shares the CPUs)")
    ap.add_argument("--save", type=Path, help="write the raw runs (stamps, samples) to this JSON file")
    ap.add_argument("--timeline", action="store_true", help="print each rival's timeline (layouts, waits, notes)")
    ap.add_argument("--seed", type=int, default=SEED, help=f"the mix's seed (default {SEED}, the administrator's)")
    ap.add_argument("--load", type=Path, help="report the raw runs of an earlier --save instead of running")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs on the node (default 1); the mix scales with them")
    ap.add_argument(
        "--hosts", type=int, default=1,
        help=f"simulated hosts of --gpus GPUs each under one slurmctld, each with its flexmigd (1-{MAX_HOSTS}; "
        "rivals default, per-instance, per-inst-static); the mix scales with all their GPUs",
    )  # fmt: skip
    ap.add_argument(
        "--scheduler", choices=sorted(SCHEDULER), default="testbed",
        help="SchedulerParameters: the testbed's (scheduler and backfill every second) or Slurm's own defaults",
    )  # fmt: skip
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the clean-up: testbeds stopped, dirs gone
    scale = 0.25 if args.quick else args.scale
    missing = missing_binaries()
    if missing or os.geteuid() != 0:
        print(f"needs root and {DEBIAN_PACKAGES} (missing: {', '.join(missing) or 'none'})", file=sys.stderr)
        return 2
    if not 1 <= args.gpus <= 8:
        ap.error(f"--gpus must be 1 to 8, not {args.gpus}")
    if not 1 <= args.hosts <= MAX_HOSTS:
        ap.error(f"--hosts must be 1 to {MAX_HOSTS}, not {args.hosts}")
    gpus, hosts = args.gpus, args.hosts
    total = gpus * hosts  # the GPUs of every host: the mix, the slices and the bound count them all
    jobs = mix(args.seed, n=45 * total, scale=scale)
    rivals = [x for x in args.rivals.split(",") if x]
    if hosts > 1 and any(r not in PER_INSTANCE for r in rivals):
        ap.error(f"--hosts {hosts} runs the rivals {', '.join(PER_INSTANCE)} only, not {args.rivals}")
    where = os.environ.get("FLEXMIG_SLURM_BIN")
    version = slurm_version(where) if args.load is None else ""
    newer = [r for r in rivals if r in ("per-gpu", "per-instance")]
    if newer and args.load is None and version_problem(version) is not None:
        print(f"the {newer[0]} rival needs Slurm 23.11 or later, this is {version or 'unknown'}: set FLEXMIG_SLURM_BIN "
              "(tests/support/slurm_newer.py up DIR makes one)", file=sys.stderr)  # fmt: skip
        return 2
    print("flexmig Slurm mix benchmark (a busy node)" if hosts == 1 else f"flexmig Slurm mix benchmark ({hosts} hosts)")
    print(f"machine: {machine()}; load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    if version:
        print(f"slurm: {version}" + (f" (FLEXMIG_SLURM_BIN={where})" if where else " (the distribution's)"))
    counts = {p: sum(j.profile == p for j in jobs) for p in WEIGHTS}
    print(f"mix (seed {args.seed}): {len(jobs)} jobs ({', '.join(f'{n} x {p}' for p, n in counts.items())}), "
          f"scale {scale:g}, arrivals over {jobs[-1].arrival_s:.0f} s, {hosts} host(s) x {gpus} GPU(s), packing "
          f"bound {bound(jobs, total):.0f} s; "
          f"rivals: {', '.join(rivals)}{' (side by side)' if args.parallel else ''}; SchedulerParameters: "
          f"{SCHEDULER[args.scheduler] or 'none (Slurm defaults: sched_interval=60, bf_interval=30)'}")  # fmt: skip
    before = extract(args.before) if "before" in rivals and args.load is None else None
    budget = 3600 * max(scale, 0.25) + 600
    results: dict[str, Run] = {}
    if args.load is not None:
        raw = json.loads(args.load.read_text())
        for n, r in raw.items():
            results[n] = Run(n, {int(k): v for k, v in r["jobs"].items()}, [tuple(x) for x in r["samples"]],
                             r["t0"], r["reregistrations"], r["error"], r.get("log", []))  # fmt: skip
        rivals = [n for n in rivals if n in results]
    try:
        if args.load is not None:
            pass
        elif args.parallel:
            sched = args.scheduler
            threads = [
                threading.Thread(
                    target=lambda n=n: results.__setitem__(n, run(n, jobs, before, budget, gpus, sched, hosts))
                )
                for n in rivals
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for n in rivals:
                results[n] = run(n, jobs, before, budget, gpus, args.scheduler, hosts)
    finally:
        if before is not None:
            shutil.rmtree(before.parent, ignore_errors=True)
    if args.save is not None and args.load is None:
        args.save.write_text(json.dumps({n: r.__dict__ for n, r in results.items()}))
    b = bound(jobs, total)
    print(f"\n{'':34}" + "".join(f"{n:>16}" for n in rivals))
    figs = {n: figures(results[n], jobs, total) for n in rivals}

    def row(label: str, fn: Any) -> None:
        cells = []
        for n in rivals:
            f = figs[n]
            try:
                cells.append(f"{fn(f):>16}")
            except (KeyError, TypeError, ValueError, statistics.StatisticsError):
                cells.append(f"{'-':>16}")
        print(f"{label:34}" + "".join(cells))

    row("jobs that ran", lambda f: f"{f['ran']}/{len(jobs)}")
    row("closed share of busy time", lambda f: f"{100 * f['closed_share']:.0f} %")
    row("slice utilisation while jobs wait", lambda f: f"{100 * f['util_waiting']:.0f} %")
    row("slice utilisation, whole run", lambda f: f"{100 * f['util_run']:.0f} %")
    row("makespan (s)", lambda f: f"{f['makespan']:.0f}")
    row("makespan / packing bound", lambda f: f"{f['makespan'] / b:.2f}x")
    row("re-registrations per hour", lambda f: f"{f['reregs_per_h']:.0f}")
    row("closed periods (n)", lambda f: f"{len(f['closed_periods'])}")
    row("closed period median (s)", lambda f: f"{statistics.median(f['closed_periods']):.1f}")
    row("closed period worst (s)", lambda f: f"{max(f['closed_periods']):.1f}")
    row("wait, mean (s)", lambda f: f"{f['wait_mean']:.0f}")
    row("wait, longest (s)", lambda f: f"{f['wait_max']:.0f}")
    row("each job ran once", lambda f: "yes" if f["once"] else "NO")
    row("each on its own MIG device", lambda f: "yes" if f["own_device"] else "NO")
    for n in rivals:
        if figs[n].get("error"):
            print(f"{n}: {figs[n]['error']}")
    if "now" in figs and "before" in figs and "makespan" in figs["now"] and "makespan" in figs["before"]:
        print(f"\nratio of makespans (before / now): {figs['before']['makespan'] / figs['now']['makespan']:.2f}x")
    if args.timeline:
        for n in rivals:
            print(f"\ntimeline of {n}:")
            print("\n".join(timeline(results[n], jobs, gpus=total)))
    print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
