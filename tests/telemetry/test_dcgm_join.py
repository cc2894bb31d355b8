"""DCGM figures land on our instances: a dcgm-exporter-format endpoint served from the simulator's truth.

The node is an A100 (no GPM), the case DCGM exists for: without the endpoint its instances have no activity at
all; with it, in either naming era, each instance carries dcgm-exporter's figures, joined by gpu + GPU_I_ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexmig.config import Config, DcgmConfig, HostPort, PrometheusConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.sim import SimNode
from flexmig.telemetry.settings import TelemetrySettings
from support.daemon import sweeps
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SPEC = "a100-40x1:3g.20gb@4+2g.10gb@0+1g.5gb@2"
MIB = 1 << 20

# (our quantity, legacy name, 4.9 name); activity fields of the simulator's Activity
_PROF = (
    ("sm", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
    ("occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
    ("tensor", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    ("dram", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"),
)


def render(node: SimNode, era: str, *, uuid_override: str | None = None) -> str:
    """What dcgm-exporter (old names, or 4.9 names and units) would print for this node right now."""
    host = "Hostname" if era == "legacy" else "hostname"
    lines: list[str] = []
    rows: dict[str, list[str]] = {}
    for g in node.gpus():
        for gi in g.gpu_instances:
            ci = gi.compute_instances[0]
            uuid = uuid_override or g.uuid
            labels = (
                f'gpu="{g.index}",UUID="{uuid}",device="nvidia{g.index}",modelName="{g.model.name}",'
                f'GPU_I_PROFILE="{gi.profile.name}",GPU_I_ID="{gi.id}",{host}="sim"'
            )
            used = sum(p.memory_bytes for p in ci.processes)
            for field, old, new in _PROF:
                rows.setdefault(old if era == "legacy" else new, []).append(
                    f"{{{labels}}} {getattr(ci.activity, field)}"
                )
            if era == "legacy":
                rows.setdefault("DCGM_FI_DEV_FB_USED", []).append(f"{{{labels}}} {used // MIB}")
                rows.setdefault("DCGM_FI_DEV_FB_TOTAL", []).append(f"{{{labels}}} {gi.memory_bytes // MIB}")
            else:
                rows.setdefault("DCGM_FI_DEV_FB_USED_BYTES", []).append(f"{{{labels}}} {used}")
                rows.setdefault("DCGM_FI_DEV_FB_CAPACITY_BYTES", []).append(f"{{{labels}}} {gi.memory_bytes}")
        # a whole-GPU row, which must not be taken for any instance
        rows.setdefault("DCGM_FI_DEV_GPU_TEMP", []).append(f'{{gpu="{g.index}",UUID="{g.uuid}",{host}="sim"}} 40')
    for name, samples in rows.items():
        lines.append(f"# HELP {name} {name}")
        lines.append(f"# TYPE {name} gauge")
        lines.extend(name + s for s in samples)
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def exporter(body: Callable[[], str]) -> Iterator[str]:
    """A dcgm-exporter stand-in on a free loopback port, rendering ``body()`` on every GET."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.asynccontextmanager
async def running(url: str | None) -> AsyncIterator[Daemon]:
    config = Config(
        sampling=SamplingConfig(interval_s=0.05),
        prometheus=PrometheusConfig(detail="full"),  # the activity families are of detail full
        dcgm=DcgmConfig(enabled=url is not None, url=url or "http://127.0.0.1:9400/metrics"),
    )
    settings = TelemetrySettings.from_config(config)
    settings = TelemetrySettings(
        interval_s=settings.interval_s,
        history_s=settings.history_s,
        dcgm_url=settings.dcgm_url,
        dcgm_interval_s=0.1,
        dcgm_timeout_s=2.0,
    )
    daemon = Daemon(
        config, sim_spec=SPEC, sim_workload=False, metrics_addr=HostPort("127.0.0.1", 0), telemetry=settings
    )
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    started = asyncio.create_task(daemon.started())
    done, _ = await asyncio.wait({task, started}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if started not in done:
        started.cancel()
        if task in done:
            task.result()
        raise AssertionError("daemon did not start")
    try:
        yield daemon
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def metric(daemon: Daemon, name: str, mig_uuid: str) -> float | None:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    for family in text_string_to_metric_families(await asyncio.to_thread(get)):
        for s in family.samples:
            if s.name == name and s.labels.get("mig_uuid") == mig_uuid:
                return float(s.value)
    return None


def node_of(daemon: Daemon) -> SimNode:
    assert daemon.backend is not None and daemon.backend.node is not None
    return daemon.backend.node


@pytest.mark.parametrize("era", ["legacy", "4.9"])
def test_dcgm_profiling_fields_appear_on_our_instances_in_both_naming_eras(era: str) -> None:
    holder: list[SimNode] = []

    async def scenario() -> None:
        with exporter(lambda: render(holder[0], era) if holder else "") as url:
            async with running(url) as daemon:
                node = node_of(daemon)
                holder.append(node)
                uuids = node.mig_uuids()
                figures = {u: (0.1 + 0.2 * i, 0.05 + 0.1 * i, 0.02 * i, 0.3) for i, u in enumerate(uuids)}
                for u, (sm, occ, tensor, dram) in figures.items():
                    node.set_activity(u, sm=sm, occupancy=occ, tensor=tensor, dram=dram)

                async def joined() -> bool:
                    got = [await metric(daemon, "flexmig_mig_sm_active_ratio", u) for u in uuids]
                    return all(g is not None and abs(g - figures[u][0]) < 1e-9 for g, u in zip(got, uuids, strict=True))

                await until(joined, 20.0, "DCGM's series joined to our instances")
                for u, (_sm, occ, tensor, dram) in figures.items():
                    assert await metric(daemon, "flexmig_mig_sm_occupancy_ratio", u) == pytest.approx(occ)
                    assert await metric(daemon, "flexmig_mig_tensor_active_ratio", u) == pytest.approx(tensor)
                    assert await metric(daemon, "flexmig_mig_dram_active_ratio", u) == pytest.approx(dram)
                    assert await metric(daemon, "flexmig_mig_activity_source_info", u) == 1.0
                snap = daemon.latest()
                assert snap is not None and snap.dcgm is not None
                assert snap.dcgm.up and snap.dcgm.era == era and snap.dcgm.instances == len(uuids)
                assert {i.activity.source for i in snap.instances() if i.activity} == {"dcgm"}

    asyncio.run(scenario())


@pytest.mark.parametrize("era", ["legacy", "4.9"])
def test_dcgm_framebuffer_fills_in_memory_nvml_would_not_give(era: str) -> None:
    holder: list[SimNode] = []

    async def scenario() -> None:
        with exporter(lambda: render(holder[0], era) if holder else "") as url:
            async with running(url) as daemon:
                node = node_of(daemon)
                holder.append(node)
                uuid = node.mig_uuids()[0]
                # NVML stops answering memory first, so 1.5 GiB can only come from DCGM
                node.inject_error("nvmlDeviceGetMemoryInfo", "NO_PERMISSION", gpu=0, times=None)
                node.start_process(uuid, memory_bytes=1536 * MIB)

                async def from_dcgm() -> bool:
                    return await metric(daemon, "flexmig_mig_memory_used_bytes", uuid) == 1536 * MIB

                await until(from_dcgm, 20.0, "memory figures from DCGM")
                snap = daemon.latest()
                assert snap is not None
                assert snap.stats.nvml_errors.get(("nvmlDeviceGetMemoryInfo", "NO_PERMISSION"), 0) > 0  # NVML failed
                gi, _ = node.gpu(0).mig_device(uuid)
                assert await metric(daemon, "flexmig_mig_memory_total_bytes", uuid) == gi.memory_bytes

    asyncio.run(scenario())


def test_without_dcgm_an_ampere_instance_has_no_activity_series_not_zeros() -> None:
    async def scenario() -> None:
        async with running(None) as daemon:
            node = node_of(daemon)
            uuid = node.mig_uuids()[0]
            node.set_activity(uuid, sm=0.9)
            await sweeps(daemon, 2)  # sampled after the activity began
            assert await metric(daemon, "flexmig_mig_sm_active_ratio", uuid) is None
            assert await metric(daemon, "flexmig_mig_memory_total_bytes", uuid) is not None

    asyncio.run(scenario())


def test_rows_whose_gpu_uuid_disagrees_with_nvml_are_not_joined() -> None:
    holder: list[SimNode] = []

    async def scenario() -> None:
        wrong = "GPU-00000000-0000-0000-0000-000000000000"
        with exporter(lambda: render(holder[0], "4.9", uuid_override=wrong) if holder else "") as url:
            async with running(url) as daemon:
                node = node_of(daemon)
                holder.append(node)
                uuid = node.mig_uuids()[0]
                node.set_activity(uuid, sm=0.5)

                def scraped() -> bool:
                    snap = daemon.latest()
                    return snap is not None and snap.dcgm is not None and snap.dcgm.instances > 0

                await until(scraped, 20.0, "a scrape of the exporter")
                await sweeps(daemon, 2)  # sweeps that had the rows to join
                assert await metric(daemon, "flexmig_mig_sm_active_ratio", uuid) is None

    asyncio.run(scenario())


def test_an_unreachable_exporter_is_counted_and_sampling_goes_on() -> None:
    async def scenario() -> None:
        with exporter(lambda: "") as url:
            pass  # the port is closed again: nobody answers there
        async with running(url) as daemon:

            def failed_twice() -> bool:
                snap = daemon.latest()
                return snap is not None and snap.stats.source_errors.get("dcgm", 0) >= 2

            await until(failed_twice, 20.0, "two failed scrapes counted")
            snap = daemon.latest()
            assert snap is not None and snap.dcgm is not None and not snap.dcgm.up
            assert len(snap.instances()) == 3

    asyncio.run(scenario())
