"""``flexmigd``: the node daemon. Wiring only: every loop lives in its own module.

Start-up: read the configuration, open NVML (or install the simulated node) on the NVML thread, take the first
inventory and sweep, start the metrics server, tell systemd READY; then run every loop under one TaskGroup until
SIGTERM or SIGINT. Components are added as named loops (:meth:`Daemon.add_loop`), snapshot enrichers and
subscribers (``daemon.hub``) and extra metric families (:meth:`Daemon.add_metrics`), so the MQTT publisher, the
planner, the actuator and the control socket plug in without touching the sampling code.
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
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from flexmig import __version__
from flexmig.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigProblem,
    HostPort,
    applies_at_next_start,
    load_config_deferring,
    reload_config,
)
from flexmig.errors import ConfigError, FlexmigError
from flexmig.export.prometheus import MetricsServer, SnapshotCollector, SnapshotMetrics, build_registry
from flexmig.nvml.worker import NvmlWorker
from flexmig.sdnotify import Heartbeat, Notifier, Watchdog, watchdog_timeout_s
from flexmig.security import RedactingFilter, Secret, attach_redaction
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
        self._loops: list[tuple[str, LoopFactory]] = []
        self._reload_hooks: list[Callable[[Config], None]] = []
        self._start_hooks: list[Callable[[], Awaitable[None]]] = []
        self._stop_hooks: list[Callable[[], Awaitable[None]]] = []
        self._notifier: Notifier | None = None
        self._metrics_ext: list[SnapshotMetrics] = []
        self._started = asyncio.Event()
        self.components = wire(self)  # detection, MQTT (if enabled), the actuator and planner, through the hooks below

    # ------------------------------------------------------------------------------------------ extension
    def add_loop(self, name: str, factory: LoopFactory) -> None:
        """Run ``factory()`` under the daemon's TaskGroup once start-up is done; it should loop until cancelled."""
        self._loops.append((name, factory))

    def add_metrics(self, extension: SnapshotMetrics) -> None:
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
                registry = build_registry(SnapshotCollector(self.hub.latest, self._metrics_ext))
                server = MetricsServer(registry, self.metrics_addr.host, self.metrics_addr.port)
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
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self.sampler.run(), name="sampling")]
                if dcgm is not None:
                    tasks.append(tg.create_task(dcgm_loop(dcgm, self.settings.dcgm_interval_s), name="dcgm"))
                if self.backend.workload is not None:
                    step = self._workload_step(self.backend.workload)
                    tasks.append(
                        tg.create_task(
                            periodic_step(self.worker, step, self.settings.interval_s, self.clock), name="workload"
                        )
                    )
                timeout = watchdog_timeout_s()
                if timeout is not None:
                    dog = Watchdog(notifier, self.heartbeat, timeout_s=timeout, max_age_s=self.config.sampling.stall_s)
                    tasks.append(tg.create_task(_watchdog_loop(dog), name="watchdog"))
                for name, factory in self._loops:
                    tasks.append(tg.create_task(factory(), name=name))
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
            if server is not None:
                server.stop()
            backend, self.backend = self.backend, None
            if backend is not None:
                with contextlib.suppress(FlexmigError):
                    await self.worker.call(backend.close)
            self.worker.shutdown()
            notifier.close()

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
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    try:
        await daemon.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


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
    """Entry point of the ``flexmigd`` console script; returns the exit status (2: bad input, 1: cannot run)."""
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
