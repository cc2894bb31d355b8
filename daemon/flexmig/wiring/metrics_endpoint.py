"""The ``/metrics`` endpoint in the running daemon: where the Prometheus side begins.

:class:`MetricsEndpoint` (component ``metrics``) serves one exposition
(:class:`~flexmig.metrics.scrape.Exposition`): the families of the latest snapshot, rendered once per snapshot at
the ``[prometheus] detail`` level and shared by every scraper (it reads the hub and never calls NVML in a scrape),
and those every component adds (:meth:`~flexmig.wiring.component.Component.metrics`), asked once, at start. The
HTTP server runs on its own thread (:class:`~flexmig.metrics.server.MetricsServer`), so a slow scraper never holds
up the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from flexmig.config import Config, HostPort
from flexmig.metrics.collector import Extension
from flexmig.metrics.families import Level
from flexmig.metrics.runtime import ServerMetrics
from flexmig.metrics.scrape import Exposition
from flexmig.metrics.server import MetricsServer, ServerStats
from flexmig.telemetry.snapshot import Snapshot
from flexmig.wiring.component import idle

__all__ = ["MetricsEndpoint"]

log = logging.getLogger(__name__)


class MetricsEndpoint:
    """Serves ``/metrics`` on ``listen`` from start to close."""

    name = "metrics"
    restart = False

    def __init__(
        self,
        listen: HostPort,
        latest: Callable[[], Snapshot | None],
        families: Callable[[], Sequence[Extension]],
        *,
        detail: Level = "standard",
    ) -> None:
        self.listen = listen
        self.latest = latest
        self.families = families
        """Every component's metric families (asked at start, when all of them exist)."""
        self.detail: Level = detail
        """The families' detail level (``[prometheus] detail``, a restart key)."""
        self.server: MetricsServer | None = None
        self.stats = ServerStats()
        """What the server did (connections at the cap, time-outs), exported with the metrics."""
        self.port: int | None = None
        """The bound port, once serving (the one the system chose for port 0)."""

    async def start(self) -> None:
        """Bind and serve (a FlexmigError naming the address when it is taken)."""
        exposition = Exposition(self.latest, self.families(), detail=self.detail)
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
