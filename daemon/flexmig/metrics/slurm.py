"""Prometheus families of flexmig's Slurm side: whether Slurm answers, the demand it shows, the last decision, and
what was done to Slurm jobs.

* ``flexmig_slurm_up{Hostname}``: 1 when the last read of Slurm (squeue, sinfo) succeeded, 0 when it failed;
* ``flexmig_slurm_read_errors_total{Hostname}``: reads that failed (down, timed out, garbage);
* ``flexmig_slurm_pending_jobs{Hostname}``, ``flexmig_slurm_running_jobs{Hostname}``,
  ``flexmig_slurm_movable_jobs{Hostname}``: the jobs of the last read that count for this node;
* ``flexmig_slurm_in_sync{Hostname}``: 1 when Slurm lists the node with exactly the instances NVML shows;
* ``flexmig_slurm_registered_gpus{Hostname, profile}``: the GPU GRES Slurm lists for the node, by type;
* ``flexmig_slurm_drain_estimate_seconds{Hostname, slurm_node}``, ``flexmig_slurm_reregistration_gain_slice_seconds``
  and ``..._cost_slice_seconds``: the last decision's figures, one series per Slurm node flexmig decides for (the
  host's node, or each GPU node with ``node_per_gpu``); ``flexmig_slurm_reregistration_wanted{Hostname, slurm_node}``
  1 when it said go;
* ``flexmig_slurm_job_actions_total{Hostname, action}``: Slurm jobs signalled, requeued and released;
* ``flexmig_slurm_drain_seconds{Hostname}`` (histogram): how long re-registrations waited for the node to empty;
* ``flexmig_slurm_slurmd_restarts_total{Hostname}``: crashed slurmds flexmig started again.

Re-registrations themselves are actions: ``flexmig_actions_total{action="slurm_reregister"}`` and
``flexmig_action_duration_seconds`` count and time them. Names, kinds, labels and help texts are the catalogue's
(:mod:`flexmig.metrics.families`). Fed on the event loop, read by the scrape thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from flexmig.metrics.actions import DURATION_BUCKETS_S, Histogram
from flexmig.metrics.families import by_name
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["JOB_ACTIONS", "SlurmMetrics"]

JOB_ACTIONS: tuple[str, ...] = ("signalled", "requeued", "released")
"""Values of the ``action`` label of ``flexmig_slurm_job_actions_total``."""


class SlurmMetrics:
    """The Slurm families, fed by :meth:`read_ok`, :meth:`read_failed`, :meth:`decided` and :meth:`job_action`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._up: int | None = None
        self._errors = 0
        self._counts: dict[str, int] = {}
        self._in_sync: int | None = None
        self._registered: dict[str, int] = {}
        self._decisions: dict[str, tuple[float, float, float, int]] = {}
        self._jobs: Counter[str] = Counter(dict.fromkeys(JOB_ACTIONS, 0))
        self._drain = Histogram(DURATION_BUCKETS_S)
        self._reads = 0
        self._read_s: float | None = None
        self._spacing_s: float | None = None
        self._slurmd_restarts = 0

    def read_ok(
        self, *, pending: int, running: int, movable: int, in_sync: bool, registered: Mapping[str, int]
    ) -> None:
        """A read that succeeded, with what it showed."""
        with self._lock:
            self._up = 1
            self._counts = {"pending": pending, "running": running, "movable": movable}
            self._in_sync = int(in_sync)
            self._registered = dict(registered)

    def read_failed(self) -> None:
        """A read that failed."""
        with self._lock:
            self._up = 0
            self._errors += 1

    def decided(self, node: str, *, drain_s: float, gain: float, cost: float, go: bool) -> None:
        """The last re-registration decision's figures for the Slurm node ``node``."""
        with self._lock:
            self._decisions[node] = (drain_s, gain, cost, int(go))

    def job_action(self, action: str) -> None:
        """One Slurm job signalled, requeued or released."""
        with self._lock:
            self._jobs[action] += 1

    def slurmd_restarted(self) -> None:
        """flexmig started a crashed slurmd again."""
        with self._lock:
            self._slurmd_restarts += 1

    def queue_read(self, seconds: float) -> None:
        """The queue was read, in ``seconds``."""
        with self._lock:
            self._reads += 1
            self._read_s = seconds

    def spacing(self, seconds: float) -> None:
        """The least time between two reads that the queue's moving counters ask for is now ``seconds``."""
        with self._lock:
            self._spacing_s = seconds

    def drained(self, seconds: float) -> None:
        """A re-registration waited ``seconds`` for the node to empty."""
        with self._lock:
            self._drain.observe(max(0.0, seconds))

    def collect(self, snapshot: Snapshot) -> Iterator[Metric]:
        """Every family, labelled with the snapshot's host (families without a value yet are left out)."""
        with self._lock:
            up, errors, counts, in_sync = self._up, self._errors, dict(self._counts), self._in_sync
            registered, decisions, jobs, drain = (
                dict(self._registered),
                dict(self._decisions),
                Counter(self._jobs),
                self._drain.copy(),
            )
            restarts = self._slurmd_restarts
            reads, read_s, spacing_s = self._reads, self._read_s, self._spacing_s
        host = snapshot.hostname
        q = by_name("flexmig_slurm_queue_reads").counter()
        q.add_metric([host], reads)
        yield q
        if read_s is not None:
            yield _gauge("flexmig_slurm_queue_read_seconds", host, read_s)
        if spacing_s is not None:
            yield _gauge("flexmig_slurm_queue_read_spacing_seconds", host, spacing_s)
        r0 = by_name("flexmig_slurm_slurmd_restarts").counter()
        r0.add_metric([host], restarts)
        yield r0
        if up is not None:
            yield _gauge("flexmig_slurm_up", host, up)
        e = by_name("flexmig_slurm_read_errors").counter()
        e.add_metric([host], errors)
        yield e
        for name, value in counts.items():
            yield _gauge(f"flexmig_slurm_{name}_jobs", host, value)
        if in_sync is not None:
            yield _gauge("flexmig_slurm_in_sync", host, in_sync)
            r = by_name("flexmig_slurm_registered_gpus").gauge()
            for profile, n in sorted(registered.items()):
                r.add_metric([host, profile], n)
            yield r
        if decisions:
            names = (
                "flexmig_slurm_drain_estimate_seconds",
                "flexmig_slurm_reregistration_gain_slice_seconds",
                "flexmig_slurm_reregistration_cost_slice_seconds",
                "flexmig_slurm_reregistration_wanted",
            )
            for i, name in enumerate(names):
                g = by_name(name).gauge()
                for node, figures in sorted(decisions.items()):
                    g.add_metric([host, node], figures[i])
                yield g
        j = by_name("flexmig_slurm_job_actions").counter()
        for action in JOB_ACTIONS:
            j.add_metric([host, action], jobs[action])
        yield j
        h = by_name("flexmig_slurm_drain_seconds").histogram()
        h.add_metric([host], drain.cumulative(), drain.total)
        yield h


def _gauge(name: str, host: str, value: float) -> GaugeMetricFamily:
    g = by_name(name).gauge()
    g.add_metric([host], value)
    return g
