"""``flexmigd``: the node daemon. Wiring only: every loop lives in its own module.

Start-up: read the configuration, open NVML (or install the simulated node) on the NVML thread, take the first
inventory and sweep, start the metrics server, tell systemd READY; then run every loop under one TaskGroup until
SIGTERM or SIGINT. Components are added as named loops (:meth:`Daemon.add_loop`), snapshot enrichers and
subscribers (``daemon.hub``) and extra metric families (:meth:`Daemon.add_metrics`), so the MQTT publisher, the
planner, the actuator and the control socket plug in without touching the sampling code. What a component holds is
let go of in its close hook (:meth:`Daemon.on_close`), which runs however the loops ended, or if they never began.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig import __version__, signals
from flexmig.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigProblem,
    HostPort,
    applies_at_next_start,
    load_config_deferring,
    reload_config,
)
from flexmig.errors import BackgroundTaskError, ConfigError, FlexmigError
from flexmig.metrics.collector import Extension
from flexmig.metrics.runtime import ServerMetrics, TaskMetrics
from flexmig.metrics.scrape import Exposition
from flexmig.metrics.server import MetricsServer, ServerStats
from flexmig.nvml.worker import NvmlWorker
from flexmig.sdnotify import Heartbeat, Notifier, Watchdog, watchdog_timeout_s
from flexmig.security import RedactingFilter, Secret, attach_redaction
from flexmig.tasks import FATAL_TASK, describe
from flexmig.telemetry.dcgm import DcgmSource
from flexmig.telemetry.host import HostSource
from flexmig.telemetry.publish import SnapshotHub
from flexmig.telemetry.sampler import SamplingLoop, dcgm_loop, periodic_step
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring import wire
from flexmig.wiring.backend import Backend, DemoWorkload, open_backend

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

LoopFactory = Callable[[], Coroutine[Any, Any, None]]


class Daemon:
    """One flexmig daemon: the NVML thread, the sampling loop, the metrics server, and whatever else is added."""

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
        deferred_problems: Sequence[ConfigProblem] = (),
    ) -> None:
        """``config_path`` is the file :meth:`reload` reads again; ``telemetry`` overrides the settings derived
        from ``config`` (finer knobs than the file has); ``sim_state`` keeps the simulated node in a file across
        restarts; ``deferred_problems`` are the problems of keys ``config`` left at their defaults
        (:func:`~flexmig.config.load_config_deferring`: a malformed ``mqtt.broker`` keeps MQTT off until a reload
        fixes it)."""
        self.config = config
        self.deferred_problems = tuple(deferred_problems)
        self.config_path = config_path
        self.sim_spec = sim_spec
        self.sim_workload = sim_workload
        self.sim_state = sim_state
        self.settings = telemetry or TelemetrySettings.from_config(config)
        listen = metrics_addr or config.prometheus.listen
        if not listen.is_loopback() and not config.prometheus.allow_remote:
            raise ConfigError(
                f"metrics address {listen} is not loopback; set prometheus.allow_remote = true to serve the network"
            )
        self.metrics_addr = listen if config.prometheus.enabled or metrics_addr is not None else None
        self.hostname = hostname or config.node_name or socket.gethostname()  # the Hostname label
        self.clock = clock
        self.hub = SnapshotHub()
        self.heartbeat = Heartbeat(clock)
        self.worker = NvmlWorker()
        self.backend: Backend | None = None
        self.sampler: SamplingLoop | None = None
        self.metrics_port: int | None = None
        self._loops: list[tuple[str, LoopFactory, bool]] = []
        self.restart_backoff_s: tuple[float, float] = (1.0, 60.0)
        """First and longest wait before a restartable loop runs again (doubling in between)."""
        self.restarts = Counter[str]()
        """Restarts of each restartable loop since start (``flexmig_task_restarts_total``)."""
        self._stop: asyncio.Event | None = None
        self._fatal: BackgroundTaskError | None = None
        self._reload_hooks: list[Callable[[Config], None]] = []
        self._start_hooks: list[Callable[[], Awaitable[None]]] = []
        self._stop_hooks: list[Callable[[], Awaitable[None]]] = []
        self._close_hooks: list[Callable[[], Awaitable[None]]] = []
        self._notifier: Notifier | None = None
        self._metrics_ext: list[Extension] = []
        self._started = asyncio.Event()
        self.metrics_stats = ServerStats()
        """What the metrics server did (its connections at the cap, time-outs), exported with the metrics."""
        self.add_metrics(TaskMetrics(self.restarts))
        self.add_metrics(ServerMetrics(lambda: self.metrics_stats))
        self.components = wire(self)  # detection, MQTT (if enabled), the actuator and planner, through the hooks below

    # ------------------------------------------------------------------------------------------ extension
    def add_loop(self, name: str, factory: LoopFactory, *, restart: bool = False) -> None:
        """Run ``factory()`` under the daemon's TaskGroup once start-up is done; it should loop until cancelled.

        If it raises, the daemon stops with a line naming it (:meth:`fail`), unless ``restart``: then it runs
        again after a pause (1 s doubling to 60 s), each restart logged and counted, and the daemon stops only
        when it failed more than :data:`MAX_RESTARTS` times in :data:`RESTART_WINDOW_S`. Only loops that hold no
        state worth losing may restart (a broker connection, a scrape); the rest are fatal: a restart of the
        whole daemon, which reconciles its journal, is the safe way back for them.
        """
        self._loops.append((name, factory, restart))

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

    def add_metrics(self, extension: Extension) -> None:
        """Export more metric families from each snapshot (call before :meth:`run`)."""
        self._metrics_ext.append(extension)

    def on_reload(self, hook: Callable[[Config], None]) -> None:
        """Call ``hook`` with the new configuration after each accepted reload (SIGHUP)."""
        self._reload_hooks.append(hook)

    def on_start(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` after the first sweep and before READY; an exception from it stops the start-up."""
        self._start_hooks.append(hook)

    def on_stop(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` when a stop is asked, before the loops are cancelled (to let an action finish)."""
        self._stop_hooks.append(hook)

    def on_close(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await ``hook`` once the daemon's loops have ended, before NVML is closed, newest hook first: what a
        component holds (sockets, journal, outbox, locks, a simulated node's directory) is let go of here, not in a
        loop's ``finally``, so it is let go of whether the loop ran, restarted, died or never began (a start-up that
        failed or a stop asked during it). Runs on every way out of :meth:`run`; a hook that raises is logged and the
        next one still runs."""
        self._close_hooks.append(hook)

    def reload(self) -> bool:
        """Read the configuration file again (SIGHUP). A bad file is logged and the old configuration kept.

        Applied at once: the sampling interval, and whatever the ``on_reload`` hooks apply; keys marked
        restart-only, and the other telemetry keys (retention, GPM, DCGM), take effect at the next start.
        """
        if self.config_path is None:
            log.warning("reload asked, but the daemon runs on built-in defaults (no configuration file)")
            return False
        notifier = self._notifier
        if notifier is not None:
            notifier.reloading()
        result = reload_config(self.config, self.config_path)
        if result.error is not None:
            log.error("configuration reload refused, keeping the current one: %s", result.error)
        else:
            self.config = result.config
            if self.sampler is not None:
                self.sampler.interval_s = result.config.sampling.interval_s
            for hook in self._reload_hooks:
                try:
                    hook(result.config)
                except Exception:
                    log.exception("reload hook %r failed", hook)
            fixed = {p.key for p in self.deferred_problems}  # applied by their components' reload hooks
            self.deferred_problems = ()
            later = [k for k in result.changed if k not in fixed and applies_at_next_start(k)]
            log.info(
                "configuration reloaded: %s%s",
                ", ".join(result.changed) or "nothing changed",
                f" (at next restart: {', '.join(later)})" if later else "",
            )
        if notifier is not None:
            notifier.ready()
        return result.ok

    def latest(self) -> Snapshot | None:
        """The last published snapshot."""
        return self.hub.latest()

    async def started(self) -> None:
        """Wait until the first sweep is published and the metrics server listens."""
        await self._started.wait()

    # ------------------------------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event) -> None:
        """Start, run every loop until ``stop`` is set (or a loop fails), then shut down in reverse order."""
        notifier = self._notifier = Notifier.from_env()
        server: MetricsServer | None = None
        self._stop, self._fatal = stop, None
        loop = asyncio.get_running_loop()
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_exception)
        try:
            self.backend = await self.worker.call(
                open_backend,
                self.sim_spec,
                self.settings.gpm,
                self.clock,
                self.sim_state,
                sim_workload=self.sim_workload,
            )
            host = HostSource(clock=self.clock) if self.settings.host else None
            dcgm = None
            if self.settings.dcgm_url is not None:
                dcgm = DcgmSource(
                    self.settings.dcgm_url,
                    timeout_s=self.settings.dcgm_timeout_s,
                    max_age_s=self.settings.dcgm_max_age_s,
                    clock=self.clock,
                )
            self.sampler = SamplingLoop(
                self.backend.reader,
                self.worker,
                self.settings,
                self._published,
                hostname=self.hostname,
                host=host,
                dcgm=dcgm,
                clock=self.clock,
            )
            first = await self.sampler.start()
            if self.metrics_addr is not None:
                exposition = Exposition(self.hub.latest, self._metrics_ext, detail=self.config.prometheus.detail)
                server = MetricsServer(exposition, self.metrics_addr.host, self.metrics_addr.port)
                self.metrics_stats = server.stats
                _, self.metrics_port = server.start()
                log.info("metrics on http://%s:%d/metrics", _bracket(self.metrics_addr.host), self.metrics_port)
            log.info(
                "flexmigd %s up: %d GPU(s), %d MIG instance(s)%s",
                __version__,
                len(first.gpus),
                len(first.instances()),
                f" (simulated {self.sim_spec})" if self.sim_spec else "",
            )
            for start_hook in self._start_hooks:
                await start_hook()
            notifier.ready(f"sampling {len(first.gpus)} GPU(s), {len(first.instances())} MIG instance(s)")
            self._started.set()
            sampler, opened = self.sampler, self.backend
            loops: list[tuple[str, LoopFactory, bool]] = [("sampling", sampler.run, False)]
            if dcgm is not None:
                loops.append(("dcgm", lambda: dcgm_loop(dcgm, self.settings.dcgm_interval_s), True))
            if opened.workload is not None:
                step = self._workload_step(opened.workload)
                loops.append(
                    ("workload", lambda: periodic_step(self.worker, step, self.settings.interval_s, self.clock), True)
                )
            timeout = watchdog_timeout_s()
            if timeout is not None:
                dog = Watchdog(notifier, self.heartbeat, timeout_s=timeout, max_age_s=self.config.sampling.stall_s)
                loops.append(("watchdog", lambda: _watchdog_loop(dog), False))
            everything = (*loops, *self._loops)
            waiting = [len(everything)]  # loops that have not begun (names may repeat: a count, not a set)
            all_begun = asyncio.Event()

            def began() -> None:
                waiting[0] -= 1
                if waiting[0] <= 0:
                    all_begun.set()

            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._supervised(name, factory, restart, began), name=name)
                    for name, factory, restart in everything
                ]
                # A task cancelled before its first step never runs a line of its coroutine (not even a finally):
                # no loop is cancelled before it began, so a stop asked during start-up reaches it inside its try.
                await all_begun.wait()
                await stop.wait()
                log.info("stopping")
                notifier.stopping()
                for stop_hook in self._stop_hooks:
                    try:
                        await stop_hook()
                    except Exception:
                        log.exception("stop hook %r failed", stop_hook)
                for task in tasks:
                    task.cancel()
        finally:
            for close_hook in reversed(self._close_hooks):
                try:
                    await close_hook()
                except Exception:
                    log.exception("close hook %r failed", close_hook)
            if server is not None:
                server.stop()
            backend, self.backend = self.backend, None
            if backend is not None:
                with contextlib.suppress(FlexmigError):
                    await self.worker.call(backend.close)
            self.worker.shutdown()
            notifier.close()
            loop.set_exception_handler(previous_handler)
        if self._fatal is not None:
            raise self._fatal

    async def _supervised(self, name: str, factory: LoopFactory, restart: bool, began: Callable[[], None]) -> None:
        """Run one loop under the daemon's policy (see :meth:`add_loop`); never raises but CancelledError.
        ``began()`` says it runs (and, once this step is over, its loop waits in its first await)."""
        failures: deque[float] = deque()
        first = True
        pause, longest = self.restart_backoff_s
        while True:
            try:
                if first:  # run() goes on only after this step, which takes the loop to its first await
                    first = False
                    began()
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                now = time.monotonic()
                failures.append(now)
                while failures and failures[0] < now - RESTART_WINDOW_S:
                    failures.popleft()
                if not restart or len(failures) > MAX_RESTARTS:
                    note = f" (after {MAX_RESTARTS} restarts in {RESTART_WINDOW_S / 60:.0f} min)" if restart else ""
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

    def _workload_step(self, workload: DemoWorkload) -> Callable[[float], None]:
        """The demo workload's step, leaving alone the instances the actuator uses (read on the NVML thread)."""
        actuator = self.components.actuator

        def step(now: float) -> None:
            workload(now, exclude=actuator.workload_exclude)

        return step

    def _published(self, snapshot: Snapshot) -> Snapshot:
        snapshot = self.hub.publish(snapshot)
        self.heartbeat.beat(snapshot.monotonic)
        return snapshot


#: A restartable loop that fails more often than this within :data:`RESTART_WINDOW_S` stops the daemon.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


async def _watchdog_loop(dog: Watchdog) -> None:
    interval = dog.interval_s
    assert interval is not None
    while True:
        dog.tick()
        await asyncio.sleep(interval)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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
        )
        # Secrets once known stay redacted: a line about the old password may still come after a reload.
        daemon.on_reload(lambda cfg: redactor.update((*redactor.secrets, *config_secrets(cfg))))
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
