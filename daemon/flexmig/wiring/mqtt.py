"""MQTT in the running daemon: the ``mqtt`` component, a lifecycle adapter over the outbox and the publisher.

:class:`MqttComponent` owns the outbox and the publisher; at start it gives its
:class:`~flexmig.mqtt.findings.FindingsPublisher` (detection's reports as events and the retained state) the
publisher and subscribes it to the hub (before the first sweep); its loop is the publisher's, restarted after a
failure (its state is in the outbox, on disk); cancelling it (SIGTERM) publishes ``offline`` before the connection
closes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from flexmig.config import Config, MqttConfig
from flexmig.metrics.collector import SnapshotMetrics
from flexmig.metrics.findings import PublisherMetrics
from flexmig.metrics.losses import LossMetrics
from flexmig.mqtt.findings import FindingsPublisher, LastObservation
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings
from flexmig.storage import LockSet
from flexmig.telemetry.publish import SnapshotHub

__all__ = ["MqttComponent"]

log = logging.getLogger(__name__)


class MqttComponent:
    """The outbox, the publisher and the detection-to-MQTT subscriber of one daemon (``[mqtt] enabled = true``).

    Construction only keeps the settings; :meth:`start` takes the outbox's directory, opens the outbox (OutboxError:
    the daemon refuses to start rather than lose events) and subscribes to the hub. The broker address and
    credentials are only used by :meth:`run`, which never raises for network or broker trouble.

    ``broker_problem`` (flexmigd started with a malformed ``mqtt.broker``, see
    :func:`flexmig.config.load_config_deferring`): one error line says so, naming the file, line and key;
    publishing stays off, events wait in the outbox, and the first accepted reload (:meth:`reload`) turns it on.
    """

    name = "mqtt"
    restart = True  # its state is in the outbox, on disk

    def __init__(
        self,
        cfg: MqttConfig,
        node: str,
        detector: LastObservation,
        hub: SnapshotHub,
        *,
        mode: str | None = None,
        broker_problem: str | None = None,
        locks: LockSet | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.hub = hub
        self.broker_problem = broker_problem
        """Why publishing starts off (a malformed broker address), until a reload fixes it; None: it starts on."""
        self.locks = locks or LockSet()
        self.findings = FindingsPublisher(None, detector, node, mode=mode)
        self._lock: Path | None = None
        self._outbox: Outbox | None = None
        self._reloaded: Config | None = None  # a reload accepted before start (SIGHUP during start-up)

    @property
    def outbox(self) -> Outbox:
        """The open outbox (from :meth:`start` to :meth:`close`)."""
        if self._outbox is None:
            raise RuntimeError("the mqtt component has not started")
        return self._outbox

    @property
    def publisher(self) -> MqttPublisher:
        """The publisher (from :meth:`start` on)."""
        return self.findings.publisher

    async def start(self) -> None:
        """Take the outbox's directory, open the outbox, and publish what detection finds on every sweep from the
        first on."""
        cfg = self.cfg
        if cfg.outbox.parent.is_dir():  # a missing directory: the outbox says so, naming itself
            # Before the outbox is opened: another daemon's outbox is neither read nor, if corrupt, moved aside.
            self._lock = self.locks.take_dir(cfg.outbox.parent, "state directory")
        try:
            self._outbox = Outbox(cfg.outbox, max_bytes=cfg.outbox_max_bytes)
        except BaseException:
            self._release()
            raise
        settings = PublisherSettings.from_config(cfg, self.node)
        self.findings.attach(MqttPublisher(settings, self._outbox, off=self.broker_problem))
        if self.broker_problem is not None:
            log.error(
                "%s; MQTT publishing is off until it is fixed (SIGHUP after fixing); events wait in the outbox %s",
                self.broker_problem,
                self._outbox.path,
            )
        if self._reloaded is not None:
            self.reload(self._reloaded)
        self.hub.subscribe(self.findings)

    async def drain(self) -> None:
        """Nothing to wait for: events are in the outbox; the loop says ``offline`` when cancelled."""

    def metrics(self) -> Sequence[SnapshotMetrics]:
        """The publisher's counters, and the events it lost."""
        stats = self.publisher.stats
        return PublisherMetrics(stats, self.findings.emitted), LossMetrics(publisher=stats)

    def reload(self, config: Config) -> None:
        """An accepted reload: if publishing was off for a malformed broker address, publish to the new one (the
        reload validated it). Otherwise ``[mqtt]`` changes wait for the next start."""
        if self._outbox is None:
            self._reloaded = config  # applied at start
            return
        if config.mqtt.enabled and self.publisher.resume(PublisherSettings.from_config(config.mqtt, self.node)):
            log.info(
                "MQTT broker address fixed by the reload: publishing to %s; %d event(s) queued",
                config.mqtt.broker,
                len(self.outbox),
            )

    async def run(self) -> None:
        """The publisher loop until cancelled (it says ``offline`` first). It may run again after a failure (the
        daemon restarts it): the outbox stays open until :meth:`close`."""
        await self.publisher.run()

    async def close(self) -> None:
        """Close the outbox and let its directory go (after every loop has ended, however it ended, or a start
        that never happened)."""
        outbox, self._outbox = self._outbox, None
        if outbox is not None:
            outbox.close()
        self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            self.locks.drop(lock)
