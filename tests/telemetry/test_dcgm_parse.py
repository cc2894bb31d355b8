"""The dcgm-exporter parser and scraper: both naming eras, joins by gpu + GPU_I_ID, bad input refused safely."""

# ruff: noqa: E501  (exposition lines are quoted whole, as dcgm-exporter writes them)

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from flexmig.errors import ConfigError
from flexmig.telemetry.dcgm import DcgmError, DcgmSource, check_url, fetch_text, parse_dcgm_exposition

MIB = 1024 * 1024

LEGACY = """\
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="3g.20gb",GPU_I_ID="2",Hostname="n1"} 0.750000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-aaa",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="1g.5gb",GPU_I_ID="9",Hostname="n1"} 0.000000
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-aaa",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="3g.20gb",GPU_I_ID="2",Hostname="n1"} 0.5
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-aaa",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="3g.20gb",GPU_I_ID="2",Hostname="n1"} 0.25
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",modelName="NVIDIA A100-SXM4-40GB",GPU_I_PROFILE="3g.20gb",GPU_I_ID="2",Hostname="n1"} 1024
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 30000
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1"} 41
"""

NEW = """\
# HELP DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO Graphics engine utilization ratio.
# TYPE DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO gauge
DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 0.4
# TYPE DCGM_FI_PROF_SM_UTIL_RATIO gauge
DCGM_FI_PROF_SM_UTIL_RATIO{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 0.35
# TYPE DCGM_FI_PROF_SM_OCCUPANCY_RATIO gauge
DCGM_FI_PROF_SM_OCCUPANCY_RATIO{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 0.2
# TYPE DCGM_FI_PROF_TENSOR_UTIL_RATIO gauge
DCGM_FI_PROF_TENSOR_UTIL_RATIO{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 0.1
# TYPE DCGM_FI_PROF_DRAM_UTIL_RATIO gauge
DCGM_FI_PROF_DRAM_UTIL_RATIO{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 0.05
# TYPE DCGM_FI_DEV_FB_USED_BYTES gauge
DCGM_FI_DEV_FB_USED_BYTES{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 5368709120
# TYPE DCGM_FI_DEV_FB_CAPACITY_BYTES gauge
DCGM_FI_DEV_FB_CAPACITY_BYTES{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H200",GPU_I_PROFILE="2g.35gb",GPU_I_ID="3",hostname="n1"} 35433480192
"""


def test_legacy_names_join_per_instance_and_mib_become_bytes() -> None:
    scrape = parse_dcgm_exposition(LEGACY)
    assert scrape.era == "legacy"
    assert set(scrape.instances) == {(0, 2), (0, 9)}
    row = scrape.instances[(0, 2)]
    assert (row.gr_engine_active, row.sm_active, row.dram_active) == (0.75, 0.5, 0.25)
    assert row.fb_used_bytes == 1024 * MIB
    assert row.gpu_uuid == "GPU-aaa"
    assert row.profile == "3g.20gb"
    assert row.tensor_active is None  # not exported: unavailable, not 0
    assert scrape.instances[(0, 9)].gr_engine_active == 0.0


def test_whole_gpu_rows_are_not_taken_for_an_instance() -> None:
    scrape = parse_dcgm_exposition(LEGACY)
    assert all(key[1] in (2, 9) for key in scrape.instances)


def test_dcgm_exporter_4_9_names_are_ratios_and_bytes() -> None:
    scrape = parse_dcgm_exposition(NEW)
    assert scrape.era == "4.9"
    row = scrape.instances[(1, 3)]
    assert (row.gr_engine_active, row.sm_active, row.sm_occupancy) == (0.4, 0.35, 0.2)
    assert (row.tensor_active, row.dram_active) == (0.1, 0.05)
    assert row.fb_used_bytes == 5 * 1024 * MIB
    assert row.fb_total_bytes == 35433480192


def test_when_both_spellings_are_present_the_4_9_one_wins() -> None:
    both = LEGACY + NEW.replace('gpu="1"', 'gpu="0"').replace('GPU_I_ID="3"', 'GPU_I_ID="2"')
    row = parse_dcgm_exposition(both).instances[(0, 2)]
    assert row.sm_active == 0.35
    assert row.era == "4.9"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="2"} NaN', "NaN"),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="2"} 57', "percent where a ratio belongs"),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="2"} -1', "negative"),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="x",GPU_I_ID="2"} 0.5', "non-numeric gpu"),
        ('DCGM_FI_PROF_SM_ACTIVE{gpu="0",GPU_I_ID="-1"} 0.5', "negative GI"),
    ],
)
def test_implausible_rows_are_dropped_not_trusted(line: str, why: str) -> None:
    assert parse_dcgm_exposition(line + "\n").instances == {}, why


def test_text_that_is_not_exposition_is_a_dcgm_error() -> None:
    with pytest.raises(DcgmError, match="not Prometheus exposition"):
        parse_dcgm_exposition('DCGM_FI_PROF_SM_ACTIVE{gpu="0" 0.5\n')


def test_bad_urls_are_configuration_errors_naming_the_url() -> None:
    with pytest.raises(ConfigError, match="ftp://x"):
        check_url("ftp://x/metrics")
    with pytest.raises(ConfigError, match="port"):
        check_url("http://127.0.0.1:99999/metrics")
    assert check_url("http://127.0.0.1:9400") == ("http", "127.0.0.1", 9400, "/metrics")


# ------------------------------------------------------------------------------------------ the HTTP side


class _Handler(http.server.BaseHTTPRequestHandler):
    body: bytes = b""
    status: int = 200
    chunked: bool = False
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if self.chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(self.body), 100):
                part = self.body[i : i + 100]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[tuple[type[_Handler], str]]:
    handler = type("H", (_Handler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.integration
@pytest.mark.parametrize("chunked", [False, True])
def test_scrape_reads_plain_and_chunked_bodies(exporter: tuple[type[_Handler], str], chunked: bool) -> None:
    handler, url = exporter
    handler.body = NEW.encode()
    handler.chunked = chunked
    assert asyncio.run(fetch_text(url, 5.0)) == NEW


@pytest.mark.integration
def test_a_failing_exporter_is_counted_and_the_last_good_scrape_kept(exporter: tuple[type[_Handler], str]) -> None:
    handler, url = exporter
    now = [100.0]
    source = DcgmSource(url, timeout_s=5.0, max_age_s=10.0, clock=lambda: now[0])
    handler.body = LEGACY.encode()
    good = asyncio.run(source.scrape())
    assert good is not None and source.up
    handler.status = 500
    assert asyncio.run(source.scrape()) is None
    assert source.failures == 1 and not source.up
    assert source.last_error is not None and "HTTP 500" in source.last_error
    assert source.fresh(105.0) is good
    assert source.fresh(111.0) is None  # too old to pose as current activity


@pytest.mark.integration
def test_an_oversized_body_is_refused(exporter: tuple[type[_Handler], str]) -> None:
    handler, url = exporter
    handler.body = b"x" * 5000
    with pytest.raises(DcgmError, match="refused"):
        asyncio.run(fetch_text(url, 5.0, max_bytes=1000))


@pytest.mark.integration
def test_nobody_listening_is_a_dcgm_error_naming_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(DcgmError, match=url):
        asyncio.run(fetch_text(url, 2.0))
