"""flexmigd as a subprocess on a simulated node, for integration tests (not a test module).

:func:`running_daemon`: ``flexmigd --sim SPEC`` serving metrics on a free port, for the body of a ``with``.

:class:`ActNode` writes a configuration under the test's directory (mode, control socket, journal, job
directories, optionally MQTT), starts ``flexmigd --sim SPEC --sim-state FILE`` on a free metrics port, and gives
tests what they check against: the exposition (parsed), ``flexmig status`` and ``flexmig plan`` as JSON, the
journal, and the simulator's ground truth read back from its state file. Every wait is bounded; ``stop`` sends
SIGTERM and the context manager always stops the daemon and kills the jobs' ranks left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
from prometheus_client.parser import text_string_to_metric_families

from flexmig import sim
from flexmig.act.client import ControlClient
from flexmig.act.journal import Journal
from flexmig.errors import FlexmigError
from flexmig.mqtt.events import Event
from flexmig.sim.truth import GpuTruth
from support.jobs import counter_spec, kill_ranks, write_spec
from support.prometheus import SPEC, http_get, stop
from support.wait import free_port, wait_until

WAIT_S = 60.0


@dataclass(frozen=True)
class RunningDaemon:
    """A running flexmigd: its process, metrics port and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def metrics(self) -> str:
        """The current exposition."""
        return http_get(f"http://127.0.0.1:{self.port}/metrics").decode()


@contextlib.contextmanager
def running_daemon(
    workdir: Path, spec: str = SPEC, config: Path | None = None, *, env: Mapping[str, str] | None = None
) -> Iterator[RunningDaemon]:
    """``flexmigd --sim spec [--config config]`` as a process, serving metrics on a free loopback port, for the
    body of a ``with``; stopped with SIGTERM (then SIGKILL) on exit. Its log is ``workdir/flexmigd-PORT.log``; ``env``
    adds to its environment (``NOTIFY_SOCKET`` is empty unless given). The one way tests start flexmigd as a
    process (:class:`ActNode` sets up an acting node around the same command; :mod:`support.daemon` runs one in
    the test's own process).

    Fails at once (with the log) if the daemon exits before serving."""
    port = free_port()
    log_path = workdir / f"flexmigd-{port}.log"
    argv = [sys.executable, "-m", "flexmig.daemon", "--sim", spec, "--metrics-addr", f"127.0.0.1:{port}"]
    if config is not None:
        argv += ["--config", str(config)]
    environment = {**os.environ, "NOTIFY_SOCKET": "", **(env or {})}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)

        def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"flexmigd exited with {proc.returncode}: {log_path.read_text()}")
            return b"flexmig_mig_memory_total_bytes" in http_get(f"http://127.0.0.1:{port}/metrics")

        try:
            wait_until(serving, WAIT_S, f"flexmigd metrics (log: {log_path})", every_s=0.2)
            yield RunningDaemon(proc, port, log_path)
        finally:
            stop(proc)



def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` whose labels include ``labels`` in an exposition, None if absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


@dataclass
class ActNode:
    """One flexmigd with its actuator on a simulated node under ``base``."""

    base: Path
    spec: str
    mode: str = "act"
    node_name: str = "act-node"
    broker: str | None = None
    grace_s: float | None = None  # jobs.shutdown_grace_s (default 60)
    mqtt_extra: str = ""  # more [mqtt] keys (credentials, commands_enabled), with ``broker``
    control: bool = True  # [control] enabled: the socket is served
    extra: str = ""  # more tables for the configuration (e.g. [baseline]), appended as given
    allowed: Path | None = None  # jobs.allowed_dirs (default: base)
    port: int = field(default_factory=free_port)
    nofile: int | None = None  # RLIMIT_NOFILE (soft and hard) of the daemon, as LimitNOFILE= would set it
    entry: tuple[str, ...] = ("-m", "flexmig.daemon")  # what the interpreter runs: a test's harness around main()
    env: dict[str, str] = field(default_factory=dict)  # more environment for the daemon
    sim_workload: bool = True  # False: --no-sim-workload (the node runs only the jobs flexmigd launches)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def sock(self) -> Path:
        return self.base / "control.sock"

    @property
    def journal(self) -> Path:
        return self.base / "state" / "journal.sqlite3"

    @property
    def sim_state(self) -> Path:
        return self.base / "sim.json"

    @property
    def config(self) -> Path:
        return self.base / "flexmig.toml"

    @property
    def log(self) -> Path:
        return self.base / f"flexmigd-{self.starts}.log"

    def write_config(self, mode: str | None = None) -> None:
        """The configuration file (rewritten for a SIGHUP with another mode)."""
        self.mode = mode or self.mode
        mqtt = ""
        if self.broker:
            mqtt = f'[mqtt]\nenabled = true\nbroker = "{self.broker}"\noutbox = "{self.base}/outbox.sqlite3"\n'
            mqtt += self.mqtt_extra
        text = (
            f'mode = "{self.mode}"\nnode_name = "{self.node_name}"\n'
            "[planner]\ninterval_s = 1\nsettling_s = 0\n"
            f'[jobs]\nallowed_dirs = ["{self.allowed or self.base}"]\nack_timeout_s = 60\n'
            + (f"shutdown_grace_s = {self.grace_s}\n" if self.grace_s is not None else "")
            + f'[control]\nsocket = "{self.sock}"\n'
            + ("" if self.control else "enabled = false\n")
            + f'[state]\ndirectory = "{self.base}/state"\njournal = "{self.journal}"\n'
            + mqtt
            + self.extra
        )
        self.config.write_text(text)
        self.config.chmod(0o600)

    def start(self) -> ActNode:
        """Start flexmigd and wait until it serves metrics and its control socket.

        The metrics port is one that was free when it was picked; a process of another test may take it before
        flexmigd binds it (it then exits saying so). That start is retried on another free port, twice at most."""
        self.write_config()
        self.starts += 1
        for attempt in range(3):
            try:
                return self._start_once()
            except AssertionError as exc:
                if attempt == 2 or "cannot serve metrics" not in str(exc) or "Address already in use" not in str(exc):
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> ActNode:
        argv = [
            sys.executable, *self.entry, "--sim", self.spec, "--sim-state", str(self.sim_state),
            "--config", str(self.config), "--metrics-addr", f"127.0.0.1:{self.port}",
        ]  # fmt: skip
        if not self.sim_workload:
            argv.append("--no-sim-workload")
        if self.nofile is not None:  # prlimit sets the limit, then execs flexmigd (same pid)
            argv = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *argv]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NOTIFY_SOCKET": "", **self.env},
            )

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"flexmigd exited with {self.proc.returncode}: {self.log.read_text()}")
            return (self.sock.exists() or not self.control) and b"flexmig_actions_total" in http_get(self.url)

        try:
            wait_until(up, what=f"flexmigd up (log {self.log})")
        except RuntimeError as exc:
            raise AssertionError(str(exc)) from None
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def stop(self, timeout_s: float = WAIT_S) -> int:
        """SIGTERM; the exit status (SIGKILL after ``timeout_s``, and an AssertionError)."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise AssertionError(f"flexmigd did not stop within {timeout_s} s after SIGTERM") from None
        return int(proc.returncode)

    def hup(self, mode: str) -> None:
        """Rewrite the configuration with ``mode``, send SIGHUP, and wait until the daemon switched."""
        assert self.proc is not None
        before = self.log.read_text().count(f" -> {mode}")
        self.write_config(mode)
        self.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: self.log.read_text().count(f" -> {mode}") > before, what=f"reload to mode {mode}")

    # ------------------------------------------------------------------------------------------ reading
    def metrics(self) -> str:
        return http_get(self.url).decode()

    def metric(self, name: str, **labels: str) -> float | None:
        return sample(self.metrics(), name, Hostname=self.node_name, **labels)

    def cli(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``flexmig COMMAND --socket SOCK ARGS...``."""
        return subprocess.run(
            [sys.executable, "-m", "flexmig.cli.main", command, "--socket", str(self.sock), *args],
            capture_output=True, text=True, timeout=WAIT_S, check=False,
        )  # fmt: skip

    def cli_json(self, command: str, *args: str) -> Any:
        out = self.cli(command, "--json", *args)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Job summaries by name, from the journal (read-only, beside the daemon)."""
        if not self.journal.exists():
            return {}
        j = Journal(self.journal)
        try:
            return {rec.name: rec.summary() for rec in j.jobs()}
        finally:
            j.close()

    def unfinished_plans(self) -> list[int]:
        j = Journal(self.journal)
        try:
            return j.unfinished_plans()
        finally:
            j.close()

    def truth(self) -> tuple[GpuTruth, ...]:
        """The simulated node as the daemon left it in its state file."""
        copy = self.base / "truth.json"
        shutil.copyfile(self.sim_state, copy)
        node = sim.install(self.spec, state_path=copy)
        try:
            return node.gpus()
        finally:
            sim.uninstall()

    def layout(self) -> dict[int, list[tuple[int, str]]]:
        """GPU -> sorted (start, profile) of its instances, from the ground truth."""
        return {g.index: sorted((gi.start, gi.profile.name) for gi in g.gpu_instances) for g in self.truth()}


@contextlib.contextmanager
def short_base(prefix: str = "fm-") -> Iterator[Path]:
    """A short, world-traversable temporary directory (unix socket paths are limited to 107 bytes), removed after."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def act_node(base: Path, spec: str, **kw: Any) -> Iterator[ActNode]:
    """A started :class:`ActNode`; on exit it is stopped, and every job's ranks (and anything else still running
    under ``base``) are killed and waited for."""
    node = ActNode(base, spec, **kw)
    try:
        yield node.start()
    finally:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(AssertionError):
                node.stop()
        kill_ranks(node.journal, base=node.base)


class JobCycler(threading.Thread):
    """Keeps an :class:`ActNode` acting until :meth:`stop`: a stdlib job is submitted, migrated, re-split to 2
    ranks and back, and stopped, over and over, so every kind of move shows in rates and histograms."""

    def __init__(self, node: ActNode, name: str = "cycle", pause_s: float = 0.5) -> None:
        super().__init__(name=f"cycler-{name}", daemon=True)
        self.node = node
        self.job = name
        self.pause_s = pause_s
        self.cycles = 0
        self.errors: list[str] = []
        self._halt = threading.Event()
        self.spec = write_spec(node.base / f"{name}.toml", counter_spec(node.base, name, max_ranks=2))

    def run(self) -> None:
        client = ControlClient(self.node.sock, timeout_s=WAIT_S)
        steps: list[tuple[str, dict[str, Any]]] = [
            ("jobs.submit", {"path": str(self.spec)}),
            ("jobs.migrate", {"name": self.job}),
            ("jobs.resplit", {"name": self.job, "ranks": 2}),
            ("jobs.resplit", {"name": self.job, "ranks": 1}),
            ("jobs.stop", {"name": self.job}),
        ]
        while not self._halt.is_set():
            for op, args in steps:
                try:
                    client.call(op, **args)
                except FlexmigError as exc:
                    self.errors.append(f"{op}: {exc}")
                if self._halt.wait(self.pause_s / len(steps)):
                    return
            self.cycles += 1

    def stop(self) -> None:
        """Finish the step in progress and end (bounded)."""
        self._halt.set()
        self.join(WAIT_S)


# ---------------------------------------------------------------------------------------------------- MQTT


def open_session(port: int, node: str, client_id: str = "act-watcher") -> None:
    """Open a persistent QoS 1 session on ``node``'s events, so the broker queues them from now on."""

    async def go() -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier=client_id, clean_session=False) as c:
            await c.subscribe(f"flexmig/v1/{node}/events/#", qos=1)

    asyncio.run(go())


def collect_events(
    port: int, node: str, *, quiet_s: float = 1.5, limit_s: float = 20.0, client_id: str = "act-watcher"
) -> list[Event]:
    """Every event queued for the persistent session (until ``quiet_s`` without one, at most ``limit_s``)."""

    async def go() -> list[Event]:
        out: list[Event] = []
        async with aiomqtt.Client("127.0.0.1", port, identifier=client_id, clean_session=False) as c:
            await c.subscribe(f"flexmig/v1/{node}/events/#", qos=1)
            deadline = time.monotonic() + limit_s
            messages = c.messages
            while time.monotonic() < deadline:
                try:
                    async with asyncio.timeout(quiet_s):
                        message = await anext(messages)
                except TimeoutError:
                    break
                out.append(Event.from_json(bytes(message.payload)))
        return out

    return asyncio.run(go())


def node_action_steps(
    port: int, node: str, target: str, *, client_id: str, limit_s: float = 30.0, having: str = "retire"
) -> list[str]:
    """The journalled steps of the first action on Slurm node ``target`` with step ``having`` among them
    (``retire``: its retirement; ``register``: its registration), from the ``action_completed`` events queued for
    ``client_id``'s session (opened before); AssertionError after ``limit_s``."""

    def steps_having() -> list[str] | None:
        events = collect_events(port, node, client_id=client_id, quiet_s=1.0, limit_s=5.0)
        done = [e for e in events if e.kind.value == "action_completed" and target in str(e.payload.get("target"))]
        for e in done:
            if having in (steps := [s["step"] for s in e.payload["steps"]]):
                return steps
        return None

    found: list[str] = wait_until(
        steps_having, limit_s, f"an action_completed event of {target} with a {having} step", every_s=0.0
    )
    return found
