"""Submitting jobs to a busy node: what one ``flexmig jobs submit`` costs, and what the idle daemon burns, as the
queue of pending jobs grows.

The real ``flexmigd`` (mode act, default sampling and planning intervals) on a simulated H200 whose one GPU is held
by a running job (``examples/hook_minimal.py`` on 7g.141gb), so every job submitted waits (``pending``). For each
queue length N (0, 1,000 and 10,000 by default) the journal is filled with N pending 1g.18gb jobs while the daemon
is down (the same records a submit writes), the daemon is started again (it adopts the running job), and then:

* **submit**: ``--submits`` more jobs submitted one after another through the control socket, exactly as the CLI
  does (:class:`flexmig.act.client.ControlClient`), each timed from request to answer: p50, p99 and the worst;
* **idle CPU**: the daemon's own CPU time (user + system, ``/proc/PID/stat``) over ``--idle-s`` seconds with no
  request (65 s by default: at least one planning round at the default ``planner.interval_s`` of 60 s), as a share
  of one core, after a quiet period for the planning rounds the submits woke;
* **plan**: one ``flexmig plan`` request (what a planning round computes, on the planner's thread): the planner's
  own cost at N, for comparison; it no longer holds up submissions.

The rival is the queue length itself: the ratios print each figure at N against the same figure at 0 (a submit
whose cost does not depend on the queue has ratio ~1). ``uptime`` and the machine line are printed: figures taken
while other work loads the machine are provisional.

Run: ``.venv/bin/python bench/submit.py [--pending 0,1000,10000] [--submits 40] [--idle-s 65]`` (about 8 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from flexmig.act.client import ControlClient, ControlError
from flexmig.act.executor import new_job_uid
from flexmig.act.journal import Journal
from flexmig.act.records import JobRecord
from flexmig.jobspec import JobPolicy
from flexmig.jobspec.spec import load_job_spec
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 120.0


def spec_text(base: Path, name: str, profile: str) -> str:
    return f"""\
name = "{name}"
argv = ["{sys.executable}", "{ROOT}/examples/hook_minimal.py", "--step-time", "0.5"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt-{name}"
[ranks]
min = 1
max = 1
start = 1
[need]
profile = "{profile}"
"""


class Node:
    """One flexmigd on a simulated H200 under ``base``."""

    def __init__(self, base: Path, max_pending: int) -> None:
        self.base = base
        self.sock = base / "control.sock"
        self.journal = base / "state" / "journal.sqlite3"
        self.config = base / "flexmig.toml"
        self.config.write_text(
            'mode = "act"\nnode_name = "bench"\n[prometheus]\nenabled = false\n'
            f'[jobs]\nallowed_dirs = ["{base}"]\nmax_pending = {max_pending}\n[control]\nsocket = "{self.sock}"\n'
            f'[state]\ndirectory = "{base}/state"\njournal = "{self.journal}"\n'
        )
        self.config.chmod(0o600)
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = ControlClient(self.sock, timeout_s=WAIT_S)

    def start(self) -> None:
        argv = [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--sim-state", str(self.base / "sim.json")]
        argv += ["--no-sim-workload", "--config", str(self.config)]
        with (self.base / "flexmigd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NOTIFY_SOCKET": ""}
            )
        deadline = time.monotonic() + WAIT_S
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"flexmigd exited: see {self.base / 'flexmigd.log'}")
            with contextlib.suppress(OSError, ControlError), socket.socket(socket.AF_UNIX) as s:
                s.connect(str(self.sock))
                self.client.call("jobs.list")
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"flexmigd did not answer within {WAIT_S} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(WAIT_S)
        self.proc = None

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def submit(self, name: str, profile: str = "1g.18gb") -> tuple[float, dict[str, object]]:
        path = self.base / f"{name}.toml"
        path.write_text(spec_text(self.base, name, profile))
        path.chmod(0o644)
        t0 = time.perf_counter()
        answer = self.client.call("jobs.submit", path=str(path))
        return time.perf_counter() - t0, answer


def fill(journal: Path, template: Path, base: Path, n: int) -> None:
    """N pending jobs in the journal, as ``jobs submit`` writes them when the node is full."""
    spec = load_job_spec(template, JobPolicy((base,)))
    j = Journal(journal, synchronous="OFF")  # filling only: the daemon reopens it with FULL
    try:
        now = time.time()
        for i in range(n):
            name = f"queued-{i:05d}"
            rec = JobRecord(name, new_job_uid(), replace(spec, name=name), "pending", submitted_s=now + i * 1e-3)
            j.put_job(rec)
    finally:
        j.close()


def run(n: int, submits: int, idle_s: float) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="fm-sub-"))
    base.chmod(0o755)
    node = Node(base, max_pending=n + submits + 1)
    ranks: list[int] = []
    try:
        node.start()
        node.submit("blocker", "7g.141gb")  # holds the whole GPU: every later job waits
        ranks = [int(pid) for j in node.client.call("jobs.list") for pid in j["pids"]]
        node.stop()
        template = base / "template.toml"
        template.write_text(spec_text(base, "template", "1g.18gb"))
        template.chmod(0o644)
        fill(node.journal, template, base, n)
        node.start()
        times = []
        for k in range(submits):
            took, answer = node.submit(f"extra-{k:03d}")
            assert answer.get("queued"), answer
            times.append(took)
        t_plan = time.perf_counter()
        node.client.call("plan")
        plan_s = time.perf_counter() - t_plan
        time.sleep(min(5.0, idle_s))  # let the rounds the submits woke pass
        c0, t0 = node.cpu_s(), time.monotonic()
        time.sleep(idle_s)
        idle = (node.cpu_s() - c0) / (time.monotonic() - t0)
        times.sort()
        return {
            "p50": statistics.median(times),
            "p99": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))],
            "worst": times[-1],
            "idle": idle,
            "plan": plan_s,
        }
    finally:
        node.stop()  # first: stopping the blocker with the daemon up would let the queue start
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", default="0,1000,10000", help="queue lengths, comma-separated")
    p.add_argument("--submits", type=int, default=40, help="submits timed at each queue length")
    p.add_argument("--idle-s", type=float, default=65.0, help="seconds of idle CPU measured at each queue length")
    args = p.parse_args()
    print(machine())
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    rows = {}
    for n in (int(x) for x in args.pending.split(",")):
        rows[n] = run(n, args.submits, args.idle_s)
        r = rows[n]
        print(
            f"pending {n:>6}: submit p50 {r['p50'] * 1000:8.1f} ms  p99 {r['p99'] * 1000:8.1f} ms  "
            f"worst {r['worst'] * 1000:8.1f} ms   idle CPU {r['idle']:6.1%} of a core   plan {r['plan']:7.2f} s",
            flush=True,
        )
    first = rows[min(rows)]
    for n, r in rows.items():
        if n != min(rows):
            print(
                f"ratio {n:>6}/{min(rows)}: submit p50 x{r['p50'] / first['p50']:.2f}  "
                f"p99 x{r['p99'] / first['p99']:.2f}  idle CPU x{r['idle'] / max(first['idle'], 1e-9):.2f}"
            )
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
