"""Slurm: what flexmig's dynamic MIG costs and saves on a real Slurm 22.05 (munged, slurmctld, slurmd), one machine.

Each run starts a fresh private testbed (``flexmig.slurm.testbed``, what ``flexmig slurm testbed`` runs) with
flexmigd as a subprocess in mode act on a simulated H200, submits real ``sbatch`` jobs, and reads the figures from
the jobs' own start stamps and from flexmigd's journal (every step of a re-registration is journalled with its
wall-clock start and end). Scenarios:

* ``pending demand``: three ``--gres=gpu:1g.18gb:1`` jobs, released together, on a node laid out as one idle
  7g.141gb: flexmig destroys the 7g, creates three 1g and re-registers the node. Time from release to each job's
  first line. Rival, same run: the same jobs on a node already laid out as three 1g.18gb (Slurm alone, nothing to
  change: the best a static layout can do, and only if it was guessed right beforehand).
* ``drain with checkpoint``: a ``--requeue --comment=flexmig:hook`` job on a 3g.71gb (``examples/hook_minimal.py``,
  which would run for hours), then four pending 1g jobs; flexmig drains the node, signals the job, waits for its
  acknowledgement, requeues it held, repartitions, releases it. Drain = from the drain command to the node empty.
* ``drain without checkpoint``: the same with a job that does not implement the hook. flexmig never signals it, so
  the drain lasts the job's remaining run time. A long job would make that hours (and flexmig refuses such drains:
  no re-registration while a job without a time limit runs); so this job is SHORT (``--time=1``, it sleeps
  ``--plain-s`` seconds) and the figure is that job's remaining time, not a property of flexmig.
* ``static node`` (the rival of a re-registration): a node with a ``NodeName=`` line in slurm.conf, the only other
  way Slurm 22.05 takes new MIG GRES: rewrite gres.conf and slurm.conf, restart slurmctld and slurmd, wait until the
  node is idle with the new GRES.

flexmig's added time per re-registration = the action's wall time minus the waits that are the jobs' (the hook
job's checkpoint until its acknowledgement, the node emptying). The 1.5 s that flexmig waits before releasing a
requeued job (slurmd refuses a job restarted in the same second it was killed) is shown on its own.

Run (root, Debian's ``slurmctld slurmd slurm-client munge`` installed): ``.venv/bin/python bench/slurm.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexmig.mig.nodespec import parse_node_spec
from flexmig.slurm.nodes import parse_sinfo
from flexmig.slurm.squeue import SlurmJob, parse_squeue
from flexmig.slurm.testbed import DEBIAN_PACKAGES, Testbed, free_port, missing_binaries, stop_pid
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
HOOK_JOB = ROOT / "examples" / "hook_minimal.py"
WAIT_S = 120.0
INTERVAL_S = 2.0  # flexmigd's [slurm] interval_s on the testbed (the default is 10 s)
JOB_WAITS = ("await_ack", "await_idle")  # the jobs' time inside a re-registration, not flexmig's
GAP = "credential_gap"
PHASE = random.Random(13)  # when, within flexmigd's read interval, a burst is released


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S, poll_s: float = 0.1) -> Any:
    """``probe()`` until truthy; RuntimeError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(poll_s)
    raise RuntimeError(f"{what}: not within {timeout_s:g} s")


@dataclass
class Action:
    """One journalled ``slurm_reregister``: its payload, state and steps (name -> (start, end), wall time)."""

    payload: dict[str, Any]
    state: str
    started: float
    finished: float
    steps: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """The action's wall time, first step to last."""
        return self.finished - self.started

    def step_s(self, prefix: str) -> float:
        """Seconds spent in steps named ``prefix`` or ``prefix:...``."""
        return sum(e - s for n, (s, e) in self.steps.items() if n == prefix or n.startswith(prefix + ":"))

    @property
    def drain(self) -> float:
        """From closing the node to the node empty (``close`` start to ``await_idle`` end; ``drain`` in revisions
        before flexmig's reservation)."""
        first = "close" if "close" in self.steps else "drain"
        return self.steps["await_idle"][1] - self.steps[first][0]

    @property
    def added(self) -> float:
        """flexmig's own time: the whole action less the jobs' waits."""
        return self.total - sum(self.step_s(w) for w in JOB_WAITS)


class Node:
    """A fresh testbed with flexmigd (mode act) on the simulated node ``spec``; stops and removes all on exit."""

    def __init__(self, spec: str, *, with_flexmigd: bool = True) -> None:
        ns = parse_node_spec(spec)
        self.spec = spec
        self.base = Path(tempfile.mkdtemp(prefix="fm-bench-", dir="/tmp"))
        self.base.chmod(0o755)
        self.tb = Testbed(self.base, ns.model, ns.count, node="bench")
        self.with_flexmigd = with_flexmigd
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Node:
        try:
            self.tb.prepare()
            self.tb.start()
            if self.with_flexmigd:
                self.start_flexmigd()
        except BaseException:
            self.__exit__()
            raise
        return self

    def start_flexmigd(self) -> None:
        f = self.tb.paths.flexmig
        conf = f / "flexmigd.toml"
        text = self.tb.flexmigd_config(metrics_port=free_port(), interval_s=INTERVAL_S)
        conf.write_text(text)  # the testbed's whole-node host names layout = "node", the mode this benchmark measures
        conf.chmod(0o600)
        argv = [
            sys.executable, "-m", "flexmig.daemon", "--sim", self.spec, "--sim-state", str(f / "sim.json"),
            "--config", str(conf),
        ]  # fmt: skip
        with (self.tb.paths.log / "flexmigd.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.tb.env())
        wait_for("the node registered", lambda: (n := self.node()) is not None and n.responding)

    def stop_flexmigd(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        self.stop_flexmigd()
        self.tb.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------------------------------- Slurm
    def cmd(self, *argv: str) -> str:
        res = subprocess.run(
            [self.tb.commands.path(argv[0]), *argv[1:]],
            env=self.tb.env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}")
        return res.stdout

    def jobs(self) -> dict[int, SlurmJob]:
        return {j.job_id: j for j in parse_squeue(self.cmd("squeue", "--json"))}

    def node(self) -> Any:
        return next((n for n in parse_sinfo(self.cmd("sinfo", "--json")) if n.name == self.tb.node), None)

    def stamp_script(self, body: str) -> str:
        """A batch script that appends its start time to ``start-<job>`` before ``body``."""
        return f'#!/bin/sh\necho "$(date +%s.%N)" >> {self.base}/start-$SLURM_JOB_ID\n{body}\n'

    def sleeper(self, *args: str, seconds: float = 600) -> int:
        return self.tb.sbatch(*args, script=self.stamp_script(f"sleep {seconds:g}"))

    def hook_job(self, *args: str) -> int:
        log = self.base / "hook-$SLURM_JOB_ID.jsonl"
        body = f'exec {sys.executable} {HOOK_JOB} --step-time 0.02 --log-every 50 --log "{log}"'
        return self.tb.sbatch("--requeue", "--comment=flexmig:hook", *args, script=self.stamp_script(body))

    def burst(self, n: int, *args: str) -> tuple[list[int], float]:
        """``n`` sleepers submitted held, then released in one command; their IDs and the release time."""
        jobs = [self.sleeper("--hold", *args) for _ in range(n)]
        # flexmigd reads Slurm every INTERVAL_S: a release right after its start would always land at the same
        # point of that cycle, so it comes at a random point instead (the wait to be noticed then averages half of it)
        time.sleep(PHASE.uniform(0.0, INTERVAL_S))
        t0 = time.time()
        self.cmd("scontrol", "release", ",".join(map(str, jobs)))
        return jobs, t0

    def starts(self, job: int) -> list[float]:
        path = self.base / f"start-{job}"
        return [float(x) for x in path.read_text().split()] if path.exists() else []

    def wait_running(self, jobs: list[int], *, restarts: int = 0) -> None:
        def ok() -> bool:
            js = self.jobs()
            return all(j in js and js[j].state == "RUNNING" and js[j].restart_count >= restarts for j in jobs) and all(
                len(self.starts(j)) > restarts for j in jobs
            )

        wait_for(f"jobs {jobs} running", ok, poll_s=0.3)

    # ------------------------------------------------------------------------------------------- journal
    def actions(self) -> list[Action]:
        """flexmigd's ``slurm_reregister`` actions that changed instances (read-only)."""
        path = self.tb.paths.flexmig / "state" / "journal.sqlite3"
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            out = []
            for aid, payload, state, s, e in db.execute(
                "SELECT id, payload, state, started_s, finished_s FROM actions WHERE kind='slurm_reregister' "
                "ORDER BY id"
            ):
                p = json.loads(payload)
                if not p.get("changes") or e is None:
                    continue
                a = Action(p, state, s, e)
                for name, ss, se in db.execute(
                    "SELECT name, started_s, finished_s FROM steps WHERE action_id=? ORDER BY id", (aid,)
                ):
                    a.steps[name] = (ss, se if se is not None else ss)
                out.append(a)
            return out
        finally:
            db.close()

    def one_action(self) -> Action:
        got = wait_for("a finished re-registration in the journal", self.actions, timeout_s=30)
        act: Action = got[0]
        if act.state != "done":
            raise RuntimeError(f"re-registration {act.state}: {act.payload}")
        return act


# ------------------------------------------------------------------------------------------------- scenarios
def pending_demand(spec: str) -> dict[str, Any]:
    """Three 1g jobs on ``spec``; each job's seconds from release to its first line (and the action, if any)."""
    with Node(spec) as n:
        jobs, t0 = n.burst(3, "--gres=gpu:1g.18gb:1")
        n.wait_running(jobs)
        waits = [n.starts(j)[0] - t0 for j in jobs]
        acts = n.actions()
        out: dict[str, Any] = {"waits": waits, "action": acts[0] if acts else None}
        if acts:  # where the time went: flexmig noticing the demand, its change, Slurm starting the jobs
            out["notice"] = acts[0].started - t0
            out["schedule"] = [n.starts(j)[0] - acts[0].finished for j in jobs]
        return out


def drain(hook: bool, plain_s: float) -> dict[str, Any]:
    """A job on the 3g.71gb (with or without the hook), then four pending 1g jobs; the re-registration."""
    with Node("h200:4g.71gb@0+3g.71gb@4") as n:
        if hook:
            big = n.hook_job("--gres=gpu:3g.71gb:1")
        else:
            big = n.sleeper("--gres=gpu:3g.71gb:1", "--time=1", seconds=plain_s)
        n.wait_running([big])
        started = n.starts(big)[0]
        time.sleep(max(0.0, started + 6.0 - time.time()))  # past the testbed's hook_settle_s (5 s)
        small, t0 = n.burst(4, "--gres=gpu:1g.18gb:1")
        n.wait_running(small)
        waits = [n.starts(j)[0] - t0 for j in small]
        act = n.one_action()
        out: dict[str, Any] = {"action": act, "waits": waits, "remaining_s": plain_s - (t0 - started)}
        if hook:
            n.wait_running([big], restarts=1)
            again = n.starts(big)[1]
            out["ack_s"] = act.step_s("await_ack")
            out["job_down_s"] = again - act.steps[f"signal:{big}"][0]
        return out


def static_node() -> float:
    """The rival of a re-registration: a static node's new GRES through restarting slurmctld and slurmd."""
    with Node("h200:7g.141gb@0", with_flexmigd=False) as n:
        p = n.tb.paths
        node = "static"
        (p.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        minors = [(21, 22), (102, 103), (111, 112), (120, 121)]
        os.mknod(p.dev / "nvidia0", 0o20666, os.makedev(1, 3))
        for a, b in minors:
            for m in (a, b):
                os.mknod(p.dev / "nvidia-caps" / f"nvidia-cap{m}", 0o20666, os.makedev(1, 3))

        def lines(types: list[tuple[str, int]]) -> str:
            return "".join(
                f"NodeName={node} Name=gpu Type={t} MultipleFiles={p.dev}/nvidia0,{p.dev}/nvidia-caps/nvidia-cap{a},"
                f"{p.dev}/nvidia-caps/nvidia-cap{b}\n"
                for (t, _), (a, b) in zip(types, minors, strict=False)
            )

        base_conf = p.slurm_conf.read_text()

        def configure(gres: str, types: list[tuple[str, int]]) -> None:
            p.gres_conf.write_text(lines(types))
            node_line = f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} Gres={gres}\n"  # as slurmd finds
            p.slurm_conf.write_text(base_conf.replace("PartitionName=", node_line + "PartitionName=", 1))

        def slurmd() -> None:
            subprocess.run(
                [n.tb.commands.path("slurmd"), "-N", node], env=n.tb.env(), check=True, capture_output=True, timeout=30
            )

        def registered(gpus: dict[str, int]) -> bool:
            found = next((x for x in parse_sinfo(n.cmd("sinfo", "--json")) if x.name == node), None)
            return found is not None and found.idle and found.responding and found.gpu_counts() == gpus

        configure("gpu:7g.141gb:1", [("7g.141gb", 1)])
        try:
            stop_pid(int((p.run / "slurmctld.pid").read_text()))
            subprocess.run([n.tb.commands.path("slurmctld"), "-i"], env=n.tb.env(), check=True, timeout=30)
            n.tb.wait_ctld()
            slurmd()
            wait_for("the static node up", lambda: registered({"7g.141gb": 1}), timeout_s=60)
            t0 = time.monotonic()
            stop_pid(int(p.slurmd_pid(node).read_text()))
            stop_pid(int((p.run / "slurmctld.pid").read_text()))
            configure("gpu:1g.18gb:3", [("1g.18gb", 1)] * 3)
            subprocess.run([n.tb.commands.path("slurmctld"), "-i"], env=n.tb.env(), check=True, timeout=30)
            n.tb.wait_ctld()
            slurmd()
            wait_for("the static node with its new GRES", lambda: registered({"1g.18gb": 3}), 60, poll_s=0.05)
            return time.monotonic() - t0
        except RuntimeError as exc:
            logs = "; ".join(f"{name}: {text.splitlines()[-3:]}" for name, text in n.tb.logs())
            raise RuntimeError(f"{exc}; {logs}") from None
        finally:
            with contextlib.suppress(OSError, ValueError):
                stop_pid(int(p.slurmd_pid(node).read_text()))


# ------------------------------------------------------------------------------------------------- report
def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> str:
    return f"{med(xs):6.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})" if xs else "-"


def steps_table(columns: dict[str, list[Action]]) -> Iterator[str]:
    """Median milliseconds per step kind (``signal:J`` counts as ``signal``), one column per scenario."""
    names: list[str] = []
    for acts in columns.values():
        for a in acts:
            for s in a.steps:
                key = s.split(":", 1)[0]
                if key not in names:
                    names.append(key)
    yield "    " + f"{'step (ms)':16}" + "".join(f"{c:>18}" for c in columns)
    for key in names:
        cells = []
        for acts in columns.values():
            vals = [a.step_s(key) for a in acts if any(s == key or s.startswith(key + ":") for s in a.steps)]
            cells.append(f"{med(vals) * 1000:18.1f}" if vals else f"{'-':>18}")
        yield f"    {key:16}" + "".join(cells)
    totals = [f"{med([a.total for a in acts]) * 1000:18.1f}" if acts else f"{'-':>18}" for acts in columns.values()]
    yield f"    {'whole action':16}" + "".join(totals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario (default 3)")
    ap.add_argument("--plain-s", type=float, default=20.0, help="run time of the job without the hook (default 20)")
    args = ap.parse_args()
    missing = missing_binaries()
    if missing or os.geteuid() != 0:
        print(f"needs root and {DEBIAN_PACKAGES} (missing: {', '.join(missing) or 'none'})", file=sys.stderr)
        return 2
    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "slurmctld ${Version}", "slurmctld"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print("flexmig Slurm benchmark")
    print(
        f"machine: {machine()}, {version}, flexmigd [slurm] interval_s = {INTERVAL_S:g}, {args.runs} runs per scenario"
    )
    t_all = time.monotonic()
    flex: list[float] = []
    rival: list[float] = []
    pend_acts: list[Action] = []
    notice: list[float] = []
    schedule: list[float] = []
    for _ in range(args.runs):
        got = pending_demand("h200:7g.141gb@0")
        flex += got["waits"]
        if got["action"] is not None:
            pend_acts.append(got["action"])
            notice.append(got["notice"])
            schedule += got["schedule"]
        rival += pending_demand("h200:1g.18gb@4+1g.18gb@5+1g.18gb@6")["waits"]
    static = [static_node() for _ in range(args.runs)]
    hooked = [drain(True, args.plain_s) for _ in range(args.runs)]
    plain = [drain(False, args.plain_s) for _ in range(args.runs)]

    print("\n1. pending demand: three gpu:1g.18gb jobs released together, seconds from release to running")
    print(f"  node laid out as one idle 7g.141gb, flexmig repartitions: {spread(flex)}")
    print(f"  rival: node already laid out as 3x1g.18gb (Slurm alone): {spread(rival)}")
    print(f"  ratio of medians: {med(flex) / med(rival):.2f}x; flexmig's part, one after the other:")
    print(
        f"    release to flexmig's re-registration starting (it reads Slurm every {INTERVAL_S:g} s): {spread(notice)}"
    )
    print(f"    the re-registration (destroy, create, gres.conf, slurmd -Z): {spread([a.total for a in pend_acts])}")
    print(f"    its end to the job running (Slurm's scheduler, sched_interval=1): {spread(schedule)}")

    print("\n2. drain of a node that runs a job on its 3g.71gb, four gpu:1g.18gb jobs pending")
    h_acts = [h["action"] for h in hooked]
    p_acts = [p["action"] for p in plain]
    print(f"  with checkpoint (--requeue hook job):   drain {spread([a.drain for a in h_acts])}")
    print(f"    of which the job's checkpoint to its acknowledgement: {spread([h['ack_s'] for h in hooked])}")
    print(f"    hook job from signal to running again (resumed): {spread([h['job_down_s'] for h in hooked])}")
    print(f"    pending jobs from release to running: {spread([w for h in hooked for w in h['waits']])}")
    print(f"  without checkpoint (a SHORT job, {args.plain_s:g} s, no hook): drain {spread([a.drain for a in p_acts])}")
    print(
        f"    = the job's remaining run time at the request ({spread([p['remaining_s'] for p in plain])}); a real job "
        "without the hook keeps the node drained until it ends"
    )
    print(f"    pending jobs from release to running: {spread([w for p in plain for w in p['waits']])}")
    ratio = med([a.drain for a in p_acts]) / med([a.drain for a in h_acts])
    print(f"  ratio of median drains (without / with): {ratio:.1f}x")

    print("\n3. flexmig's added time per re-registration (action wall time minus the jobs' waits)")
    print(f"  no job on the node:       {spread([a.added for a in pend_acts])}")
    print(f"  with a hook job requeued: {spread([a.added for a in h_acts])}, of which the credential gap "
          f"{spread([a.step_s(GAP) for a in h_acts])}")  # fmt: skip
    print("  the steps of a re-registration, median:")
    for line in steps_table({"pending demand": pend_acts, "with checkpoint": h_acts, "without": p_acts}):
        print(line)
    print(f"  rival: static node, gres.conf + slurm.conf rewritten, slurmctld and slurmd restarted: {spread(static)}")
    print(f"  ratio (rival / flexmig without jobs): {med(static) / med([a.added for a in pend_acts]):.1f}x")
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
