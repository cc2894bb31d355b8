"""The ``/metrics`` endpoint in the running daemon: where the Prometheus side begins.

:class:`MetricsEndpoint` (component ``metrics``) serves one exposition
(:class:`~flexmig.metrics.scrape.Exposition`): the families of the latest snapshot, rendered once per snapshot at
the ``[prometheus] detail`` level and shared by every scraper (it reads the hub and never calls NVML in a scrape),
and those of the :class:`MetricsRegistry`: each component's families
(:meth:`~flexmig.wiring.component.Component.metrics`), registered as it starts (:class:`flexmig.daemon.Daemon`
asks a component for them once its start is done, so they read state that exists), the daemon's own first. A
component that starts after the endpoint is exported from its start on, with no placeholder before. The HTTP
server runs on its own thread (:class:`~flexmig.metrics.server.MetricsServer`), so a slow scraper never holds up
the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import Metric

from flexmig.config import Config, HostPort
from flexmig.metrics.collector import Extension, SnapshotFamilies, live_metrics
from flexmig.metrics.exposition import Writer
from flexmig.metrics.families import Level
from flexmig.metrics.runtime import ServerMetrics
from flexmig.metrics.scrape import Exposition
from flexmig.metrics.server import MetricsServer, ServerStats
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.component import idle

__all__ = ["MetricsEndpoint", "MetricsRegistry"]

log = logging.getLogger(__name__)


class MetricsRegistry:
    """The families ``/metrics`` exports beside the snapshot's own, in the order they were registered: the daemon's
    (its task restarts) at :func:`~flexmig.wiring.wire`, then each component's as it starts."""

    def __init__(self) -> None:
        self._owners: list[tuple[str, tuple[Extension, ...]]] = []

    def register(self, owner: str, extensions: Sequence[Extension]) -> None:
        """Export ``extensions`` (``owner`` names them: a component) from now on, after those registered before."""
        if extensions:
            self._owners.append((owner, tuple(extensions)))

    def extensions(self) -> tuple[Extension, ...]:
        """Every registered family source, in order."""
        return tuple(e for _, exts in self._owners for e in exts)

    def exported(self) -> tuple[Extension, ...]:
        """What the exposition is built with: two views that read the registry at each render, so a component that
        registers later is exported from then on (one for the cached snapshot part, one for the live part)."""
        return (_RegisteredFamilies(self), _RegisteredMetrics(self))


class _RegisteredFamilies:
    """The registered :class:`~flexmig.metrics.collector.SnapshotFamilies`, written once per snapshot."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self._registry = registry

    def write(self, snapshot: Snapshot, out: Writer) -> None:
        for ext in self._registry.extensions():
            if not isinstance(ext, SnapshotFamilies):
                continue
            try:
                ext.write(snapshot, out)
            except Exception:  # one broken extension must not take every other series down with it
                log.exception("metrics extension %r failed; its series are missing from this scrape", ext)


class _RegisteredMetrics:
    """The registered families collected at every scrape."""

    def __init__(self, registry: MetricsRegistry) -> None:
        self._registry = registry

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        yield from live_metrics(snapshot, self._registry.extensions())


class MetricsEndpoint:
    """Serves ``/metrics`` on ``listen`` from start to close."""

    name = "metrics"
    restart = False

    def __init__(
        self,
        listen: HostPort,
        latest: Callable[[], Snapshot | None],
        registry: MetricsRegistry,
        *,
        detail: Level = "standard",
    ) -> None:
        self.listen = listen
        self.latest = latest
        self.registry = registry
        """The daemon's and the components' families, registered as each component starts."""
        self.detail: Level = detail
        """The families' detail level (``[prometheus] detail``, a restart key)."""
        self.server: MetricsServer | None = None
        self.stats = ServerStats()
        """What the server did (connections at the cap, time-outs), exported with the metrics."""
        self.port: int | None = None
        """The bound port, once serving (the one the system chose for port 0)."""

    async def start(self) -> None:
        """Bind and serve (a FlexmigError naming the address when it is taken)."""
        exposition = Exposition(self.latest, self.registry.exported(), detail=self.detail)
        server = MetricsServer(exposition, self.listen.host, self.listen.port)
        self.stats = server.stats
        _, self.port = server.start()
        self.server = server
        host = self.listen.host
        log.info("metrics on http://%s:%d/metrics", f"[{host}]" if ":" in host else host, self.port)

    async def run(self) -> None:
        """No loop here: the server has a thread of its own."""
        await idle()

    async def drain(self) -> None:
        """Scrapes go on until close: the last one may see the stop."""

    async def close(self) -> None:
        """Stop serving and cut open connections."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def reload(self, config: Config) -> None:
        """Nothing to apply: the address and the rules for it are restart keys."""

    def metrics(self) -> Sequence[Extension]:
        """The server's own connections and cut-offs."""
        return (ServerMetrics(lambda: self.stats),)
