"""``flexmig demo``: flexmigd in mode act on a simulated H200, fed a stream of small jobs that implement the hook.

The node starts in a fragmented layout (four idle 1g.18gb instances at memory slices 0, 2, 4 and 6: three free
compute slices, yet no room for anything bigger than 1g), so the daemon reports fragmentation within seconds.
Four 1g jobs take the instances; then a 3g.71gb job arrives that fits nowhere, and the planner makes room for it
by migrating two running jobs through their checkpoint hook; more jobs follow (a 2-rank job that may be spread
or re-split, bigger and smaller ones) for as long as the demo runs. Everything runs as the user who started it:
the daemon (``flexmigd``, exactly as an operator runs it, with a configuration written for the demo), its journal,
control socket and the jobs' directories live in a private temporary directory, removed when the demo ends
(Ctrl-C: the jobs are stopped, then the daemon, then the directory goes).

It prints the metrics URL, the line that points ``flexmig status`` at the daemon's control socket and the one that
lets nvitop, gpustat or nvidia-smi in another terminal watch the simulated node (``flexmig sim exec``, on the node's
state file), and tells what happens: findings, submissions, the plans the daemon executes (from its log) and every
action's outcome.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pwd
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import psutil

from flexmig.act.client import ControlClient
from flexmig.config import parse_config
from flexmig.config.keys import toml_string
from flexmig.detect.findings import finding_docs
from flexmig.errors import FlexmigError
from flexmig.simenv import ENV

__all__ = ["DEMO_SPEC", "DemoJob", "register", "run"]

#: The demo's node: one H200 with four idle 1g.18gb instances at slices 0, 2, 4 and 6 (fragmented on purpose).
DEMO_SPEC = "h200:1g.18gb@0+1g.18gb@2+1g.18gb@4+1g.18gb@6"

#: The planner's costs for the demo's jobs on a simulated node, not the daemon's defaults for training jobs on hardware
#: (1 s checkpoint, 5 s restart, 5 s per instance change): a demo job acknowledges at its next 0.1 s step and exits,
#: restarts in a Python start and a JSON load, and the simulated driver changes an instance in milliseconds. The
#: demo prints what each action and plan took beside these estimates.
_PLANNER_COSTS = "checkpoint_s = 0.3\nrestart_s = 0.5\nreconfigure_s = 0.05\n"
_POLL_S = 0.5
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 40.0
_MAX_ACTIVE = 6  # jobs running or queued at once in the stream after the first minute
_LOG_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
_METRICS_LINE = re.compile(r"metrics on (http://\S+/metrics)")
_DOWNTIME = re.compile(r"^action_completed #(\d+) .*\(flexmig's share of the pause ([0-9.]+) s")
_ESTIMATE = re.compile(r"\(~([0-9.]+) s\)$")
_PLAN_DONE = re.compile(r"^plan \d+ (completed|did not complete) in ")


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One job of the demo's stream: when it is submitted, what it needs, and how long it trains."""

    at_s: float
    name: str
    profile: str
    steps: int
    step_time_s: float = 0.1
    ranks: int = 1
    max_ranks: int = 1

    def describe(self) -> str:
        """``3g.71gb, 40 s of work`` for the narrative."""
        shape = f"{self.ranks} x {self.profile}" if self.ranks > 1 else self.profile
        elastic = f", may run on 1-{self.max_ranks} instances" if self.max_ranks > 1 else ""
        return f"{shape}, ~{self.steps * self.step_time_s:.0f} s of work{elastic}"


#: The first minute: four 1g jobs fill the idle instances, then a 3g job that fits nowhere makes the planner
#: migrate two of them (they are settled after the demo's 8 s); then a 2-rank job that may be spread.
FIRST_MINUTE: tuple[DemoJob, ...] = (
    DemoJob(0.0, "train-a", "1g.18gb", 700),
    DemoJob(0.5, "train-b", "1g.18gb", 350),
    DemoJob(1.0, "train-c", "1g.18gb", 800),
    DemoJob(1.5, "train-d", "1g.18gb", 450),
    DemoJob(10.0, "wide-e", "3g.71gb", 500),
    DemoJob(30.0, "ddp-f", "1g.18gb", 600, ranks=2, max_ranks=2),
)

#: What follows, round and round: (name stem, profile, steps, ranks).
_STREAM: tuple[tuple[str, str, int, int], ...] = (
    ("train", "1g.18gb", 300, 1),
    ("eval", "2g.35gb", 250, 1),
    ("ddp", "1g.18gb", 400, 2),
    ("wide", "3g.71gb", 350, 1),
    ("train", "1g.18gb", 200, 1),
    ("big", "4g.71gb", 300, 1),
)


def stream(after_s: float, every_s: float = 12.0) -> Iterator[DemoJob]:
    """The endless stream of jobs after the first minute, one every ``every_s`` seconds from ``after_s``."""
    n = 0
    while True:
        stem, profile, steps, ranks = _STREAM[n % len(_STREAM)]
        yield DemoJob(after_s + n * every_s, f"{stem}-{n + 1}", profile, steps, ranks=ranks, max_ranks=ranks)
        n += 1


def register(sub: Any) -> None:
    """Add the ``demo`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run flexmigd in mode act on a simulated node with a stream of demo jobs", description=__doc__
    )
    p.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="where flexmigd serves /metrics (default: its configuration's prometheus.listen)",
    )
    p.add_argument("--broker", metavar="HOST:PORT", help="also publish MQTT events to this broker")
    p.add_argument(
        "--until-move",
        action="store_true",
        help="end the demo (status 0) once the first migration or re-split, and the rest of its plan, completed",
    )
    p.add_argument(
        "--timeout", type=float, metavar="S", help="end the demo after S seconds (status 1 with --until-move)"
    )
    p.add_argument("--keep", action="store_true", help="keep the demo's directory (journal, logs) at the end")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------------- the run


class _Stop(Exception):
    """SIGTERM or SIGINT: end the demo cleanly."""


class _Narrator:
    """Prints the demo's lines, each stamped with the seconds since the demo started (from several threads)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.width = shutil.get_terminal_size().columns if out.isatty() else None  # a log keeps whole lines

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        """One line (or several) of narrative."""
        stamp = f"{self.elapsed():6.1f}s  "
        lines = text.splitlines() or [""]
        if self.width is not None and self.width > 40:
            lines = [w for line in lines for w in textwrap.wrap(line, self.width - len(stamp), subsequent_indent="  ")]
        with self._lock:
            for i, line in enumerate(lines):
                self.out.write(f"{stamp if i == 0 else ' ' * len(stamp)}{line}\n")
            self.out.flush()

    def plain(self, text: str) -> None:
        """Lines without a time stamp (the banner)."""
        with self._lock:
            self.out.write(text + "\n")
            self.out.flush()


def run(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C, ``--timeout``, or (with ``--until-move``) the first completed move."""
    base = Path(tempfile.mkdtemp(prefix="flexmig-demo-"))
    narrator = _Narrator(sys.stdout)
    demo = _Demo(base, narrator, args)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum: int, frame: FrameType | None) -> None:
        del frame
        raise _Stop(signal.Signals(signum).name)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        return demo.run()
    except _Stop:
        narrator.say("stopping: the jobs, then flexmigd")
        return 0
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            demo.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Demo:
    """The daemon, the feeder of jobs and the watcher of the node, for one demo run under ``base``."""

    def __init__(self, base: Path, narrator: _Narrator, args: argparse.Namespace) -> None:
        self.base = base
        self.say = narrator.say
        self.narrator = narrator
        self.args = args
        self.sock = base / "control.sock"
        self.log_path = base / "flexmigd.log"
        self.sim_state = base / "sim-state.json"
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.metrics_url: str | None = None
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self._reader: threading.Thread | None = None
        self._feeder: threading.Thread | None = None
        self._halt = threading.Event()
        self._seen_findings: set[tuple[Any, ...]] = set()
        self._jobs: dict[str, tuple[Any, ...]] = {}
        self._actions: dict[int, str] = {}
        self._downtime: dict[int, str] = {}
        self._in_plan = False
        self._plan_estimates: collections.deque[list[float]] = collections.deque()  # per plan logged, in order
        self._estimate_of: dict[int, list[float]] = {}  # plan ID -> its actions' estimates, in action order
        self.first_move_s: float | None = None

    # ------------------------------------------------------------------------------------------ set-up
    def write_config(self) -> Path:
        """The daemon's configuration for the demo: mode act, short windows, every path under ``base``."""
        b = self.base
        mqtt = ""
        if self.args.broker:
            mqtt = (
                f"[mqtt]\nenabled = true\nbroker = {toml_string(self.args.broker)}\n"
                f"outbox = {toml_string(str(b / 'state' / 'outbox.sqlite3'))}\n"
            )
        text = (
            "# flexmig demo: mode act on a simulated node, short windows so that things happen within a minute.\n"
            'mode = "act"\nnode_name = "demo"\n'
            "[detect]\nfragmentation_window_s = 3.0\n"
            "[planner]\ninterval_s = 2.0\nsettling_s = 8.0\n" + _PLANNER_COSTS +
            f"[jobs]\ndirectory = {toml_string(str(b / 'jobs'))}\nallowed_dirs = [{toml_string(str(b))}]\n"
            "ack_timeout_s = 30.0\nshutdown_grace_s = 20.0\n"
            f"[control]\nsocket = {toml_string(str(self.sock))}\n"
            f"[state]\ndirectory = {toml_string(str(b / 'state'))}\n"
            f"journal = {toml_string(str(b / 'state' / 'journal.sqlite3'))}\n" + mqtt
        )
        parse_config(text, "the demo's configuration")  # a bad --broker is refused here, before anything starts
        path = b / "flexmig.toml"
        path.write_text(text)
        path.chmod(0o600)
        (b / "jobs").mkdir(mode=0o755)
        # The journal would make it, but the outbox (--broker) is opened first and, by design, only in a directory
        # that exists: flexmigd never creates the directory a configured outbox names.
        (b / "state").mkdir(mode=0o700)
        return path

    def write_spec(self, job: DemoJob) -> Path:
        """The job spec of ``job`` (the demo job module, run by this Python), under ``base/jobs``."""
        work = self.base / "work" / job.name
        work.mkdir(parents=True, mode=0o755)
        argv = [sys.executable, "-m", "flexmig.cli.demo_job", "--steps", str(job.steps)]
        argv += ["--step-time", str(job.step_time_s)]
        text = (
            f"name = {toml_string(job.name)}\n"
            f"argv = [{', '.join(toml_string(a) for a in argv)}]\n"
            f"user = {toml_string(self.user)}\n"
            f"working_dir = {toml_string(str(work))}\n"
            f"checkpoint_dir = {toml_string(str(work / 'ckpt'))}\n"
            f"runtime_s = {job.steps * job.step_time_s:.1f}\n"  # the planner weighs moves by the time jobs have left
            f"[ranks]\nmin = 1\nmax = {job.max_ranks}\nstart = {job.ranks}\n"
            f"[need]\nprofile = {toml_string(job.profile)}\n"
            "[hook]\nack_timeout_s = 30\nexit_timeout_s = 20\n"
        )
        path = self.base / "jobs" / f"{job.name}.toml"
        path.write_text(text)
        path.chmod(0o644)
        return path

    def start_daemon(self) -> None:
        """Start flexmigd (its own session, so Ctrl-C reaches only the demo, which stops it in order)."""
        config = self.write_config()
        argv = [sys.executable, "-m", "flexmig.daemon", "--sim", DEMO_SPEC, "--no-sim-workload"]
        argv += ["--sim-state", str(self.sim_state), "--config", str(config)]
        if self.args.metrics_addr:
            argv += ["--metrics-addr", self.args.metrics_addr]
        hidden = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "JOURNAL_STREAM", ENV)  # the daemon's node is its own
        env = {k: v for k, v in os.environ.items() if k not in hidden}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_log, name="flexmigd-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not (self.sock.exists() and self.metrics_url is not None):
            self._echo_log()
            if self.proc.poll() is not None:
                self._reader.join(5)
                self._echo_log()
                raise FlexmigError(f"flexmigd exited with status {self.proc.returncode} (its last lines are above)")
            if time.monotonic() > deadline:
                raise FlexmigError(f"flexmigd did not come up within {_START_TIMEOUT_S:.0f} s (log: {self.log_path})")
            time.sleep(0.1)

    def _read_log(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        with self.log_path.open("a", encoding="utf-8") as log:
            for line in proc.stderr:
                log.write(line)
                log.flush()
                m = _METRICS_LINE.search(line)
                if m and self.metrics_url is None:
                    self.metrics_url = m.group(1)
                self.lines.put(line.rstrip("\n"))

    def banner(self) -> None:
        """Where to look: metrics, status, events."""
        flexmig = _flexmig_command()
        p = self.narrator.plain
        p(f"flexmig demo: flexmigd in mode act on a simulated H200 ({DEMO_SPEC.split(':', 1)[1]})")
        p(f"  state, logs, socket  {self.base}")
        p(f"  metrics              {self.metrics_url}")
        p("  status, live (another terminal):")
        p(f"    FLEXMIG_CONTROL_SOCKET={self.sock} {flexmig} status --watch")
        p("  nvitop, gpustat, nvidia-smi on this node (another terminal; pip install nvitop first):")
        p(f"    {flexmig} sim --state {self.sim_state} exec -- nvitop")
        if self.args.broker:
            p(f"  MQTT events          {flexmig} events --broker {self.args.broker} --node demo")
        else:
            p("  MQTT                 off (flexmig demo --broker HOST:PORT publishes events)")
        p("  Ctrl-C ends the demo: the jobs are stopped, then flexmigd; the directory is removed")
        p("")

    # ------------------------------------------------------------------------------------------ running
    def run(self) -> int:
        """Start, feed and watch until stopped; the exit status."""
        self.start_daemon()
        self.banner()
        self._feeder = threading.Thread(target=self._feed, name="demo-feeder", daemon=True)
        self._feeder.start()
        client = ControlClient(self.sock, timeout_s=30)
        deadline = None if self.args.timeout is None else time.monotonic() + self.args.timeout
        while True:
            self._echo_log()
            proc = self.proc
            assert proc is not None
            if proc.poll() is not None:
                self.say(f"flexmigd exited with status {proc.returncode}; its log: {self.log_path}")
                return 1
            busy = True
            with contextlib.suppress(FlexmigError):
                doc = client.call("status")
                self._watch(doc)
                busy = bool(doc.get("actions_in_progress"))
            if self.args.until_move and self.first_move_s is not None and not busy:  # its plan has run to its end
                self.say(f"first move completed {self.first_move_s:.1f} s after the demo started")
                return 0
            if deadline is not None and time.monotonic() > deadline:
                if self.args.until_move:
                    self.say(f"no move completed within {self.args.timeout:g} s")
                    return 1
                return 0
            time.sleep(_POLL_S)

    def _feed(self) -> None:
        """Submit the first minute's jobs at their times, then the stream while fewer than a few are active."""
        client = ControlClient(self.sock, timeout_s=120)
        last = FIRST_MINUTE[-1].at_s
        jobs = [*FIRST_MINUTE]
        later = stream(last + 30.0)
        while not self._halt.is_set():
            job = jobs.pop(0) if jobs else next(later)
            wait = job.at_s - self.narrator.elapsed()
            if wait > 0 and self._halt.wait(wait):
                return
            if job.at_s > last and self._active(client) >= _MAX_ACTIVE:
                continue  # the node is busy enough: skip this one
            self._submit(client, job)

    def _active(self, client: ControlClient) -> int:
        try:
            jobs = client.call("jobs.list")
        except FlexmigError:
            return _MAX_ACTIVE
        return sum(1 for j in jobs if j["state"] in ("running", "pending"))

    def _submit(self, client: ControlClient, job: DemoJob) -> None:
        path = self.write_spec(job)
        self.say(f"submit {job.name} ({job.describe()})")
        try:
            result = client.call("jobs.submit", path=str(path))
        except FlexmigError as exc:
            self.say(f"  {job.name} refused: {exc}")
            return
        if result.get("queued"):
            self.say(f"  {job.name} queued: {result['queued']}")

    def _echo_log(self) -> None:
        """The daemon's lines worth showing: the plans it executes, and every warning or error."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            m = _LOG_LINE.match(line)
            if m is None:
                if self._in_plan or not line.startswith(" "):
                    self.say(line if line.startswith("flexmigd") else f"flexmigd: {line}")
                continue
            level, _logger, message = m.groups()
            if d := _DOWNTIME.match(message):
                self._downtime[int(d.group(1))] = d.group(2)
            if message.startswith("planner executing"):
                self._in_plan = True
                self._plan_estimates.append([])
                self.say(f"flexmigd: {message}")
            elif self._in_plan and message.startswith("  "):
                if not message.startswith("  note: "):  # the start action's reason says the same
                    if e := _ESTIMATE.search(message):
                        self._plan_estimates[-1].append(float(e.group(1)))
                    self.say(f"flexmigd:   {message.strip()}")
            else:
                self._in_plan = False
                if _PLAN_DONE.match(message):
                    self.say(f"flexmigd: {message}")  # what the plan took, beside its estimate
                elif level in ("WARNING", "ERROR", "CRITICAL"):
                    self.say(f"flexmigd: {level.lower()}: {message}")

    def _watch(self, doc: Mapping[str, Any]) -> None:
        """Tell what changed since the last status: findings, jobs, actions."""
        findings = {(f["kind"], f["gpu"], f.get("start")): f for f in doc.get("findings", ())}
        for key, f in findings.items():
            if key not in self._seen_findings:
                where = f"GPU {f['gpu']}" + (f" {f['profile']}@{f['start']}" if f.get("start") is not None else "")
                self.say(f"finding: {f['kind']} on {where}: {f['reason']} (explained: {finding_docs(f['kind'])})")
        for key in self._seen_findings - set(findings):
            kind, gpu, start = key
            self.say(f"finding over: {kind} on GPU {gpu}" + (f" slice {start}" if start is not None else ""))
        self._seen_findings = set(findings)
        for j in doc.get("jobs", ()):
            where = ", ".join(f"gpu{i['gpu']}:{i['profile']}@{i['start']}" for i in j.get("instances", ()))
            state = (j["state"], where, j["generation"])
            if self._jobs.get(j["name"]) != state:
                self._jobs[j["name"]] = state
                detail = f" on {where}" if j["state"] == "running" else ""
                if j.get("error"):
                    detail += f" ({j['error']})"
                self.say(f"job {j['name']}: {j['state']}{detail}")
        for a in sorted(doc.get("recent_actions", ()), key=lambda a: int(a["action_id"])):
            aid = int(a["action_id"])
            if self._actions.get(aid) == a["state"]:
                continue
            self._actions[aid] = a["state"]
            if a["state"] in ("pending", "running"):
                continue
            who = f" {a['job']}" if a.get("job") else ""
            took = ""
            if a.get("started_s") and a.get("finished_s"):
                took = f" in {a['finished_s'] - a['started_s']:.1f} s"
            reason = a.get("reason") or ""
            estimate = None if reason.startswith("submitted from ") else self._estimate(a, doc)
            if estimate is not None:
                took += f" (estimated {estimate:.1f} s)"
            if aid in self._downtime:
                took += f" (flexmig's share of the job's pause {self._downtime[aid]} s)"
            if reason.startswith("submitted from "):
                reason = ""  # the submission was just told
            why = f" ({a['error']})" if a.get("error") else f": {reason}" if reason else ""
            self.say(f"action #{aid} {a['action']}{who} {a['state']}{took}{why}")
            if a["action"] in ("migrate", "resplit") and a["state"] == "done" and self.first_move_s is None:
                self.first_move_s = self.narrator.elapsed()

    def _estimate(self, action: Mapping[str, Any], doc: Mapping[str, Any]) -> float | None:
        """The planner's estimate for ``action`` of a plan it logged: the plans' action lines come in the order the
        journal numbers their actions."""
        plan = action.get("plan_id")
        if plan is None:
            return None
        if plan not in self._estimate_of:
            if not self._plan_estimates:
                return None
            self._estimate_of[plan] = self._plan_estimates.popleft()
        ids = sorted(int(a["action_id"]) for a in doc.get("recent_actions", ()) if a.get("plan_id") == plan)
        index = ids.index(int(action["action_id"]))
        costs = self._estimate_of[plan]
        return costs[index] if index < len(costs) else None

    # ------------------------------------------------------------------------------------------ clean-up
    def close(self) -> None:
        """Stop the feeder, the jobs (at once, no checkpoint: they are the demo's), the daemon; remove ``base``."""
        self._halt.set()
        proc = self.proc
        if proc is not None and proc.poll() is None and self.sock.exists():
            client = ControlClient(self.sock, timeout_s=30)
            with contextlib.suppress(FlexmigError):
                for j in client.call("jobs.list"):
                    if j["state"] == "running":
                        with contextlib.suppress(FlexmigError):
                            client.call("jobs.stop", name=j["name"], force=True)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.say(f"flexmigd did not stop within {_STOP_TIMEOUT_S:.0f} s; killing it")
                proc.kill()
                proc.wait(10)
        if self._reader is not None:
            self._reader.join(5)
        self._echo_log()
        if proc is not None and proc.returncode is not None:
            self.say(f"flexmigd stopped (status {proc.returncode})")
        _kill_leftovers(self.base)
        if self.args.keep:
            self.say(f"kept {self.base}")
        else:
            shutil.rmtree(self.base, ignore_errors=True)


def _flexmig_command() -> str:
    """How to run ``flexmig`` from here: the script beside this Python (relative to the working directory when it
    lies below it, as ``.venv-demo/bin/flexmig``), else the name on PATH."""
    script = Path(sys.executable).parent / "flexmig"
    if not script.exists():
        return "flexmig"
    with contextlib.suppress(ValueError):
        return str(script.relative_to(Path.cwd()))
    return str(script)


def _kill_leftovers(base: Path) -> None:
    """Kill what still runs in ``base`` (a job rank the daemon could not stop), and wait for it (bounded)."""
    prefix = str(base) + os.sep
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (p.cwd() + os.sep).startswith(prefix) and p.pid != os.getpid():
                found.append(p)
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(found, timeout=10)
