"""An in-process flexmigd for tests: start it on a simulated node, wait for sweeps, scrape its /metrics.

Not a test module; imported by ``test_daemon_detect*``, ``test_daemon_mqtt*`` and ``test_findings_metrics*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator, Callable

from prometheus_client.parser import text_string_to_metric_families

from flexmig.config import Config, HostPort
from flexmig.daemon import Daemon
from flexmig.nvml import Nvml
from flexmig.sim import SimNode
from flexmig.telemetry.snapshot import InstanceSnapshot, Snapshot
from support.wait import until

Series = dict[str, list[tuple[dict[str, str], float]]]
LOOPBACK_ANY = HostPort("127.0.0.1", 0)  # metrics on a free loopback port


@contextlib.asynccontextmanager
async def started(daemon: Daemon) -> AsyncIterator[Daemon]:
    """Run ``daemon`` for the body of an ``async with``; stopped (cleanly, bounded) on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    up = asyncio.create_task(daemon.started())
    done, _ = await asyncio.wait({task, up}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if up not in done:
        up.cancel()
        if task in done:
            task.result()  # raises what stopped start-up
        raise AssertionError("daemon did not start within 30 s")
    try:
        yield daemon
        assert not task.done(), "a daemon loop ended while the daemon should be running"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def running(spec: str, config: Config, *, workload: bool = False) -> contextlib.AbstractAsyncContextManager[Daemon]:
    """A started daemon on ``spec`` with metrics on a free loopback port."""
    return started(Daemon(config, sim_spec=spec, sim_workload=workload, metrics_addr=LOOPBACK_ANY))


def sim_node(daemon: Daemon) -> SimNode:
    assert daemon.backend is not None and daemon.backend.node is not None
    return daemon.backend.node


def nvml_of(daemon: Daemon) -> Nvml:
    assert daemon.backend is not None
    return daemon.backend.nvml


async def sweeps(daemon: Daemon, n: int, timeout_s: float = 20.0) -> None:
    """Wait until ``n`` more sweeps have been published."""
    snap = daemon.latest()
    assert snap is not None
    target = snap.stats.sweeps + n
    await until(lambda: (s := daemon.latest()) is not None and s.stats.sweeps >= target, timeout_s, f"{n} more sweeps")


async def until_snapshot(
    daemon: Daemon, probe: Callable[[Snapshot], object], what: str, timeout_s: float = 20.0
) -> Snapshot:
    """The first published snapshot for which ``probe`` is truthy (AssertionError naming ``what`` after the bound)."""
    snap: Snapshot = await until(
        lambda: s if (s := daemon.latest()) is not None and probe(s) else None, timeout_s, f"a snapshot with {what}"
    )
    return snap


def instance(snap: Snapshot, mig_uuid: str) -> InstanceSnapshot:
    """The instance ``mig_uuid`` in ``snap`` (AssertionError if it is not there)."""
    found = [i for i in snap.instances() if i.mig_uuid == mig_uuid]
    assert found, f"no instance {mig_uuid} in the snapshot"
    return found[0]


async def exposition(daemon: Daemon) -> str:
    """The daemon's /metrics text."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    return await asyncio.to_thread(get)


def parse(text: str) -> Series:
    """Exposition text -> sample name -> [(labels, value)]."""
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, float(s.value)))
    return out


async def scrape(daemon: Daemon) -> Series:
    """The daemon's /metrics, parsed."""
    return parse(await exposition(daemon))


def values(series: Series, name: str, **match: str) -> list[float]:
    """Values of ``name`` whose labels include ``match``."""
    return [v for labels, v in series.get(name, []) if all(labels.get(k) == w for k, w in match.items())]


def by_label(series: Series, name: str, label: str, **match: str) -> dict[str, float]:
    """``label`` value -> value, for the samples of ``name`` matching ``match``."""
    return {labels[label]: v for labels, v in series.get(name, []) if all(labels.get(k) == w for k, w in match.items())}
