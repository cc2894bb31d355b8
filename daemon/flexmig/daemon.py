"""``flexmigd``: the node daemon. A supervisor over a list of components; every loop lives in its own module.

:func:`flexmig.wiring.wire` builds the components in the order they start (the node, detection, MQTT, the sampler
with its first sweep, the metrics endpoint, the actuator with the control socket, Slurm, MQTT commands, the demo
workload, the watchdog); :meth:`Daemon.run` walks that list: start each in order, tell systemd READY, run every
component's loop under one TaskGroup until SIGTERM or SIGINT, then drain them and close them in reverse order.
SIGHUP reloads the configuration into each component in order (:meth:`Daemon.reload`). The daemon itself keeps
only what the components share: the configuration, the snapshot hub, the NVML worker thread, the heartbeat the
watchdog reads, the systemd notifier, and the count of restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig import __version__, signals
from flexmig.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigProblem,
    HostPort,
    as_applied,
    load_config_deferring,
    reload_config,
)
from flexmig.errors import BackgroundTaskError, ConfigError, FlexmigError
from flexmig.nvml.worker import NvmlWorker
from flexmig.sdnotify import Heartbeat, Notifier
from flexmig.security import RedactingFilter, Secret, attach_redaction
from flexmig.tasks import FATAL_TASK, describe
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.sampler import SamplingLoop
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring import Component, Components, wire
from flexmig.wiring.backend import Backend

__all__ = [
    "Daemon",
    "JournalFormatter",
    "build_parser",
    "config_secrets",
    "main",
    "serve",
    "setup_logging",
    "writes_to_journal",
]

log = logging.getLogger("flexmig.daemon")

GC_THRESHOLD = 10_000
"""Net container allocations between two young collections of the garbage collector, once the daemon has started
(Python's default is 700; see :func:`settle_gc`)."""


def settle_gc() -> None:
    """Tune the garbage collector for the running daemon, once every component started (:meth:`Daemon.run`).

    What start-up made (modules, the configuration, the first inventory and sweep, the journal, the service layer)
    lives as long as the daemon: moved out of the collector's generations (``gc.freeze``), it is not walked again by
    every full collection. And a sweep allocates thousands of containers that reference counting frees again: at
    Python's default threshold (700) they start a young collection every sweep or so, which finds nothing; at
    :data:`GC_THRESHOLD` the collector runs when garbage with cycles has really piled up (about 0.15 ms a sweep less
    at 56 MIG devices). It is the daemon's, not a component's: it acts on the whole process, and freezing after the
    last start also keeps what the components after the sampler made out of the collector's walks."""
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])



class Daemon:
    """One flexmig daemon: the components :func:`~flexmig.wiring.wire` builds, and what they share."""

    def __init__(
        self,
        config: Config,
        *,
        sim_spec: str | None = None,
        sim_workload: bool = True,
        sim_state: Path | None = None,
        metrics_addr: HostPort | None = None,
        config_path: Path | None = None,
        hostname: str | None = None,
        telemetry: TelemetrySettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        deferred_problems: Sequence[ConfigProblem] = (),
        redactor: RedactingFilter | None = None,
    ) -> None:
        """``config_path`` is the file :meth:`reload` reads again; ``telemetry`` overrides the settings derived
        from ``config`` (finer knobs than the file has); ``sim_state`` keeps the simulated node in a file across
        restarts; ``deferred_problems`` are the problems of keys ``config`` left at their defaults
        (:func:`~flexmig.config.load_config_deferring`: a malformed ``mqtt.broker`` keeps MQTT off until a reload
        fixes it); ``redactor`` is the log filter that learns each reloaded configuration's secrets."""
        self.config = config
        """The configuration file as last read (a reload compares the file with it)."""
        self.applied = config
        """What the components run with: :attr:`config` with its restart keys at their values of the start."""
        self.deferred_problems = tuple(deferred_problems)
        self.config_path = config_path
        self.sim_spec = sim_spec
        self.sim_workload = sim_workload
        self.sim_state = sim_state
        self.redactor = redactor
        self.settings = telemetry or TelemetrySettings.from_config(config)
        listen = metrics_addr or config.prometheus.listen
        if not listen.is_loopback() and not config.prometheus.allow_remote:
            raise ConfigError(
                f"metrics address {listen} is not loopback; set prometheus.allow_remote = true to serve the network"
            )
        self.metrics_addr = listen if config.prometheus.enabled or metrics_addr is not None else None
        self.hostname = hostname or config.node_name or socket.gethostname()  # the Hostname label
        self.clock = clock
        """Measures every duration (monotonic)."""
        self.wall = wall
        """Stamps what is recorded and shown (wall time); never used for a duration."""
        self.hub = SnapshotHub()
        self.heartbeat = Heartbeat(clock)
        self.worker = NvmlWorker()
        self.notifier = Notifier.from_env()
        self.restart_backoff_s: tuple[float, float] = (1.0, 60.0)
        """First and longest wait before a restartable component's loop runs again (doubling in between)."""
        self.restarts = Counter[str]()
        """Restarts of each restartable loop since start (``flexmig_task_restarts_total``)."""
        self._stop: asyncio.Event | None = None
        self._fatal: BackgroundTaskError | None = None
        self._started = asyncio.Event()
        self.components: Components = wire(self)
        self._order: list[Component] = list(self.components)

    # ------------------------------------------------------------------------------------------ the list
    def add(self, component: Component) -> None:
        """Run one more component after those :func:`~flexmig.wiring.wire` built (call before :meth:`run`)."""
        self._order.append(component)

    @property
    def order(self) -> tuple[Component, ...]:
        """Every component, in the order they start."""
        return tuple(self._order)

    @property
    def backend(self) -> Backend | None:
        """The open node (the ``nvml`` component's), from its start to its close."""
        return self.components.node.backend

    @property
    def sampler(self) -> SamplingLoop | None:
        """The sampling loop, once started."""
        return self.components.sampler.loop

    @property
    def metrics_port(self) -> int | None:
        """The port ``/metrics`` is served on, once it is."""
        endpoint = self.components.metrics
        return None if endpoint is None else endpoint.port

    def fail(self, task: str, exc: BaseException, *, note: str = "") -> None:
        """A background task died: say so in one line and stop the daemon (``run`` then raises
        :class:`~flexmig.errors.BackgroundTaskError`, exit status 1). The first death is the one reported."""
        line = f"background task {task!r} died: {describe(exc)}{note}"
        bug = not isinstance(exc, OSError | FlexmigError)  # environmental errors are one line; bugs get a traceback
        log.error("%s", line, exc_info=exc if bug else None)
        if self._fatal is None:
            self._fatal = BackgroundTaskError(line)
        if self._stop is not None:
            self._stop.set()

    def reload(self) -> bool:
        """Read the configuration file again (SIGHUP). A bad file is logged and the old configuration kept.

        Each component gets the new configuration in order (:meth:`~flexmig.wiring.component.Component.reload`),
        with the keys the schema marks ``restart`` still at their values of the start (:func:`~flexmig.config.
        as_applied`): those take effect at the next start, and the log line names those that changed.
        """
        if self.config_path is None:
            log.warning("reload asked, but the daemon runs on built-in defaults (no configuration file)")
            return False
        self.notifier.reloading()
        result = reload_config(self.config, self.config_path)
        if result.error is not None:
            log.error("configuration reload refused, keeping the current one: %s", result.error)
        else:
            fixed = {p.key for p in self.deferred_problems}  # unusable at start: the reload's value applies
            self.deferred_problems = ()
            self.config = result.config
            self.applied = as_applied(self.applied, result.config, fixed=fixed)
            for component in self._order:
                try:
                    component.reload(self.applied)
                except Exception:
                    log.exception("reload of component %r failed", component.name)
            if self.redactor is not None:  # secrets once known stay redacted: a line about the old one may come
                self.redactor.update((*self.redactor.secrets, *config_secrets(result.config)))
            later = [k for k in result.needs_restart if k not in fixed]
            log.info(
                "configuration reloaded: %s%s",
                ", ".join(result.changed) or "nothing changed",
                f" (at next restart: {', '.join(later)})" if later else "",
            )
        self.notifier.ready()
        return result.ok

    def latest(self) -> Snapshot | None:
        """The last published snapshot."""
        return self.hub.latest()

    async def started(self) -> None:
        """Wait until every component started (the first sweep is published, the metrics port listens)."""
        await self._started.wait()

    # ------------------------------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event) -> None:
        """Start every component, run their loops until ``stop`` is set (or one fails), then drain and close them in
        reverse order, on every way out."""
        self._stop, self._fatal = stop, None
        loop = asyncio.get_running_loop()
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)
        try:
            await self._start_all()
            await self._run_all(stop)
        finally:
            await self._close_all()
            self.worker.shutdown()
            self.notifier.close()
            loop.set_exception_handler(previous_handler)
        if self._fatal is not None:
            raise self._fatal

    async def _start_all(self) -> None:
        """Each component's start, in order; then the line that says the daemon is up, and READY."""
        for component in self._order:
            await component.start()
            # Its families from now on, asked once it started: they read what its start made.
            self.components.registry.register(component.name, component.metrics())
        settle_gc()
        first = self.components.sampler.first
        gpus, instances = (len(first.gpus), len(first.instances())) if first is not None else (0, 0)
        log.info(
            "flexmigd %s up: %d GPU(s), %d MIG instance(s)%s",
            __version__,
            gpus,
            instances,
            f" (simulated {self.sim_spec})" if self.sim_spec else "",
        )
        self.notifier.ready(f"sampling {gpus} GPU(s), {instances} MIG instance(s)")
        self._started.set()

    async def _run_all(self, stop: asyncio.Event) -> None:
        """Every component's loop under one TaskGroup until ``stop``; then the drains (in reverse order) and the
        cancellation of the loops."""
        waiting = [len(self._order)]  # loops that have not begun
        all_begun = asyncio.Event()

        def began() -> None:
            waiting[0] -= 1
            if waiting[0] <= 0:
                all_begun.set()

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._supervised(c, began), name=c.name) for c in self._order]
            # A task cancelled before its first step never runs a line of its coroutine (not even a finally): no
            # loop is cancelled before it began, so a stop asked during start-up reaches it inside its try.
            await all_begun.wait()
            await stop.wait()
            log.info("stopping")
            self.notifier.stopping()
            for component in reversed(self._order):
                try:
                    await component.drain()
                except Exception:
                    log.exception("drain of component %r failed", component.name)
            for task in tasks:
                task.cancel()

    async def _close_all(self) -> None:
        """Each component's close, in reverse order; one that raises is logged and the next one still runs."""
        for component in reversed(self._order):
            try:
                await component.close()
            except Exception:
                log.exception("close of component %r failed", component.name)

    async def _supervised(self, component: Component, began: Callable[[], None]) -> None:
        """Run one component's loop: a failure stops the daemon, or, when ``component.restart``, runs it again after
        a pause (1 s doubling to 60 s), each restart logged and counted, until more than :data:`MAX_RESTARTS` in
        :data:`RESTART_WINDOW_S`. Never raises but CancelledError. ``began()`` says it runs (and, once this step is
        over, its loop waits in its first await)."""
        name = component.name
        failures: deque[float] = deque()
        first = True
        pause, longest = self.restart_backoff_s
        while True:
            try:
                if first:  # run() goes on only after this step, which takes the loop to its first await
                    first = False
                    began()
                await component.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                failures.append(now)
                while failures and failures[0] < now - RESTART_WINDOW_S:
                    failures.popleft()
                if not component.restart or len(failures) > MAX_RESTARTS:
                    note = (
                        f" (after {MAX_RESTARTS} restarts in {RESTART_WINDOW_S / 60:.0f} min)"
                        if component.restart
                        else ""
                    )
                    self.fail(name, exc, note=note)
                    return
                self.restarts[name] += 1
                log.warning(
                    "background task %r failed (%s); restart %d in %.1f s", name, describe(exc), self.restarts[name],
                    pause,
                )  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(longest, pause * 2)
                continue
            if self._stop is None or not self._stop.is_set():
                log.warning("background task %r ended by itself", name)
            return

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: a spawned task's death is fatal (:mod:`flexmig.tasks`); anything
        else asyncio reports (a library's own task or callback) is one line at ERROR, its traceback at DEBUG."""
        exc = context.get("exception")
        task = context.get(FATAL_TASK)
        if task is not None and isinstance(exc, BaseException):
            self.fail(str(task), exc)
            return
        what = str(context.get("message") or "unhandled error in the event loop")
        detail = f": {describe(exc)}" if isinstance(exc, BaseException) else ""
        log.error("asyncio: %s%s", what, detail, exc_info=exc if log.isEnabledFor(logging.DEBUG) else None)


#: A restartable loop that fails more often than this within :data:`RESTART_WINDOW_S` stops the daemon.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


# ---------------------------------------------------------------------------------------------------- command


def build_parser() -> argparse.ArgumentParser:
    """``flexmigd``'s arguments."""
    p = argparse.ArgumentParser(
        prog="flexmigd",
        description="flexmig node daemon: per-MIG-instance telemetry, Prometheus metrics, repartitioning.",
    )
    p.add_argument("--version", action="version", version=f"flexmigd {__version__}")
    p.add_argument(
        "--sim",
        metavar="SPEC",
        help="run on a simulated node (e.g. h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6) with a synthetic workload",
    )
    p.add_argument(
        "--sim-state",
        metavar="FILE",
        type=Path,
        help="with --sim: restore the simulated node from FILE if it exists, and save every change there",
    )
    p.add_argument(
        "--no-sim-workload",
        action="store_true",
        help="with --sim: no synthetic workload; the node runs only the jobs flexmigd launches (the demo)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help=f"configuration file (default: {DEFAULT_CONFIG_PATH} if it exists, else built-in defaults)",
    )
    p.add_argument(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="serve Prometheus metrics here (default: prometheus.listen of the configuration, 127.0.0.1:17400)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")
    return p


def _load(args: argparse.Namespace) -> tuple[Config, Path | None, HostPort | None, tuple[ConfigProblem, ...]]:
    path: Path | None = args.config
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    config, deferred = load_config_deferring(path) if path is not None else (Config.default(), ())
    addr = None
    if args.metrics_addr is not None:
        try:
            addr = HostPort.parse(args.metrics_addr)
        except ValueError as exc:
            raise ConfigError(f"--metrics-addr: {exc}") from None
    return config, path, addr, deferred


async def serve(daemon: Daemon) -> None:
    """Run ``daemon`` until SIGTERM or SIGINT, with SIGHUP reloading its configuration: what ``flexmigd`` runs."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    if signals.take_pending(signal.SIGHUP):  # asked for while flexmigd loaded or read its configuration
        log.info("SIGHUP during start-up: reloading the configuration")
        loop.call_soon(daemon.reload)
    try:
        await daemon.run(stop)
    finally:
        for sig, previous in before.items():
            loop.remove_signal_handler(sig)
            if previous is not None:  # a signal flexmigd held before the loop (flexmig.signals) stays held
                signal.signal(sig, previous)


def config_secrets(config: Config) -> tuple[Secret, ...]:
    """The secrets ``config`` names (the MQTT password), read now, for the log filter; an unreadable one is left
    out (whoever needs it reports that when it tries)."""
    try:
        password = config.mqtt.password()
    except ConfigError:
        return ()
    return () if password is None else (password,)


#: Syslog priorities of the logging levels, as journald reads them from a ``<N>`` prefix on a stream line.
_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """Log lines for journald: no timestamp (the journal stamps every line itself), and the record's priority as a
    ``<N>`` prefix, which journald turns into the entry's priority (``SyslogLevelPrefix=``, on by default), so
    ``journalctl -p warning`` shows the daemon's warnings."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record as ``<N>LEVEL logger: message`` (each line of a multi-line message keeps the priority)."""
        priority = _SYSLOG_PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).split("\n"))


def writes_to_journal(stream: Any, environ: Mapping[str, str]) -> bool:
    """True when ``stream`` is the journal stream systemd connected (``$JOURNAL_STREAM`` holds its device and inode
    as ``DEV:INODE``; systemd.exec(5) says to compare them with the stream's own, since the variable is inherited
    by children whose stderr may go elsewhere)."""
    value = environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def setup_logging(level: str, environ: Mapping[str, str] | None = None) -> RedactingFilter:
    """The daemon's logging: one stderr handler (the journal under systemd) at ``level``, with a redacting filter on
    every root handler, so no record, a third-party library's included, shows a secret. Returns the filter, whose
    secrets are set once the configuration is read (and again at each reload).

    Under journald the lines carry no timestamp of their own (:class:`JournalFormatter`); elsewhere each starts
    with the local time."""
    handler = logging.StreamHandler(sys.stderr)
    if writes_to_journal(sys.stderr, os.environ if environ is None else environ):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    return attach_redaction()


def main(argv: Sequence[str] | None = None) -> int:
    """The daemon's command (``flexmigd``, through :mod:`flexmig.flexmigd`); returns the exit status (2: bad input,
    1: cannot run)."""
    signals.hold()  # done already by flexmig.flexmigd; here for python -m flexmig.daemon and direct callers
    args = build_parser().parse_args(argv)
    redactor = setup_logging(args.log_level)
    try:
        config, path, addr, deferred = _load(args)
        redactor.update(config_secrets(config))
        if args.sim is None and (args.sim_state is not None or args.no_sim_workload):
            raise ConfigError(f"{'--sim-state FILE' if args.sim_state else '--no-sim-workload'} needs --sim SPEC")
        daemon = Daemon(
            config,
            sim_spec=args.sim,
            sim_state=args.sim_state,
            sim_workload=not args.no_sim_workload,
            metrics_addr=addr,
            config_path=path,
            deferred_problems=deferred,
            redactor=redactor,
        )
        asyncio.run(serve(daemon))
    except FlexmigError as exc:
        print(f"flexmigd: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except OSError as exc:  # the metrics port is taken, and the like
        print(f"flexmigd: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
