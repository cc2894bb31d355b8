"""Detection in the running daemon: the ``detection`` component puts the service layer's
:class:`~flexmig.service.detection.Detector` on the snapshot hub as an enricher, so every published snapshot carries
its Report (see :mod:`flexmig.service.detection`).
"""

from __future__ import annotations

from collections.abc import Sequence

from flexmig.config import Config
from flexmig.metrics.collector import Extension
from flexmig.metrics.findings import FindingsMetrics
from flexmig.service.detection import Detector, detect_settings
from flexmig.telemetry.publish import SnapshotHub
from flexmig.wiring.component import idle

__all__ = ["DetectionComponent"]


class DetectionComponent:
    """Detection in the daemon (component ``detection``): its :class:`Detector` enriches every snapshot the hub
    publishes, from the first sweep on (it starts before the sampler)."""

    name = "detection"
    restart = False

    def __init__(self, detector: Detector, hub: SnapshotHub) -> None:
        self.detector = detector
        self.hub = hub

    async def start(self) -> None:
        """Enrich every published snapshot from now on."""
        self.hub.add_enricher(self.detector.enrich)

    async def run(self) -> None:
        """No loop: detection runs in each sweep's publish."""
        await idle()

    async def drain(self) -> None:
        """Nothing in flight."""

    async def close(self) -> None:
        """Nothing held."""

    def reload(self, config: Config) -> None:
        """New ``[detect]`` thresholds at once; running conditions keep their state."""
        self.detector.configure(detect_settings(config.detect))

    def metrics(self) -> Sequence[Extension]:
        """``flexmig_detect_*`` and the findings of each report."""
        return (FindingsMetrics(self.detector.stats),)
