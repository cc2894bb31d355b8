"""Per-instance activity from a dcgm-exporter endpoint: an async scrape and a small, strict parser.

This is how Ampere GPUs (no GPM) get per-instance activity, and how a site that already runs dcgm-exporter sees
the same figures in flexmig. dcgm-exporter labels a MIG instance's series with ``gpu`` (the NVML index) and
``GPU_I_ID`` (the GPU-instance ID); rows without ``GPU_I_ID`` describe a whole GPU and are ignored here.

Two naming eras are accepted, row by row (dcgm-exporter 4.9 renamed the fields DCGM 4.7 deprecated):

* before 4.9 (DCGM 4.6 and older field names): ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``..._SM_ACTIVE``,
  ``..._SM_OCCUPANCY``, ``..._PIPE_TENSOR_ACTIVE``, ``..._DRAM_ACTIVE`` (already ratios 0..1, as DCGM's profiling
  fields always were), and framebuffer sizes ``DCGM_FI_DEV_FB_USED``/``FREE``/``TOTAL`` in MiB;
* 4.9 and later (DCGM 4.7 names): ``DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO``, ``..._SM_UTIL_RATIO``,
  ``..._SM_OCCUPANCY_RATIO``, ``..._TENSOR_UTIL_RATIO``, ``..._DRAM_UTIL_RATIO`` and
  ``DCGM_FI_DEV_FB_USED_BYTES``/``FREE_BYTES``/``CAPACITY_BYTES`` in bytes.

Where both spellings of one field appear in a scrape (an exporter with a hand-written CSV), the 4.9 one wins. The
HTTP client is a few lines over asyncio streams, bounded in time and size: the endpoint is local and trusted for
availability, not for content, so nothing it sends can do more than fail the parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from flexmig.errors import ConfigError, DcgmError

__all__ = [
    "DCGM_FIELDS",
    "DcgmError",
    "DcgmField",
    "DcgmInstance",
    "DcgmScrape",
    "DcgmSource",
    "check_url",
    "fetch_text",
    "parse_dcgm_exposition",
]

Era = Literal["legacy", "4.9"]
Quantity = Literal[
    "gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fb_used", "fb_free", "fb_total"
]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DcgmField:
    """How one dcgm-exporter metric name maps onto our quantity: its era and the factor to base units."""

    quantity: Quantity
    era: Era
    scale: float


DCGM_FIELDS: Mapping[str, DcgmField] = {
    # before dcgm-exporter 4.9
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": DcgmField("gr_engine_active", "legacy", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField("sm_active", "legacy", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": DcgmField("sm_occupancy", "legacy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": DcgmField("tensor_active", "legacy", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField("dram_active", "legacy", 1.0),
    "DCGM_FI_DEV_FB_USED": DcgmField("fb_used", "legacy", _MIB),
    "DCGM_FI_DEV_FB_FREE": DcgmField("fb_free", "legacy", _MIB),
    "DCGM_FI_DEV_FB_TOTAL": DcgmField("fb_total", "legacy", _MIB),
    # dcgm-exporter 4.9 (DCGM 4.7 names, base units)
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": DcgmField("gr_engine_active", "4.9", 1.0),
    "DCGM_FI_PROF_SM_UTIL_RATIO": DcgmField("sm_active", "4.9", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": DcgmField("sm_occupancy", "4.9", 1.0),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": DcgmField("tensor_active", "4.9", 1.0),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": DcgmField("dram_active", "4.9", 1.0),
    "DCGM_FI_DEV_FB_USED_BYTES": DcgmField("fb_used", "4.9", 1.0),
    "DCGM_FI_DEV_FB_FREE_BYTES": DcgmField("fb_free", "4.9", 1.0),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": DcgmField("fb_total", "4.9", 1.0),
}

_RATIOS: frozenset[str] = frozenset({"gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active"})


@dataclass(frozen=True, slots=True)
class DcgmInstance:
    """dcgm-exporter's figures for one GPU instance, in base units (ratios 0..1, bytes); None where not exported."""

    gpu: int
    gpu_instance_id: int
    gpu_uuid: str | None
    profile: str | None
    era: Era
    gr_engine_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fb_used_bytes: int | None = None
    fb_free_bytes: int | None = None
    fb_total_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    """One successful scrape: the per-instance rows keyed by (gpu index, GPU-instance ID)."""

    taken_at: float  # monotonic
    era: Era | None  # the era of the profiling rows; None if the scrape had none
    instances: Mapping[tuple[int, int], DcgmInstance]


def parse_dcgm_exposition(text: str, taken_at: float = 0.0) -> DcgmScrape:
    """Parse a dcgm-exporter ``/metrics`` body (Prometheus text format) into per-instance figures.

    Unknown metrics are skipped; a row with a non-integer ``gpu``/``GPU_I_ID`` or a value that is NaN, infinite
    or outside its range (a ratio above 1, a negative size) is dropped rather than trusted. A body the Prometheus
    text parser rejects raises :class:`DcgmError` naming the line.
    """
    cells: dict[tuple[int, int], dict[str, tuple[Era, float]]] = {}
    idents: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    eras: set[Era] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError) as exc:
        raise DcgmError(f"dcgm-exporter sent text that is not Prometheus exposition: {exc}") from exc
    for family in families:
        for sample in family.samples:
            spec = DCGM_FIELDS.get(sample.name)
            if spec is None:
                continue
            key = _instance_key(sample.labels)
            if key is None:
                continue
            value = _checked(spec, float(sample.value))
            if value is None:
                continue
            row = cells.setdefault(key, {})
            have = row.get(spec.quantity)
            if have is None or (have[0] == "legacy" and spec.era == "4.9"):
                row[spec.quantity] = (spec.era, value)
            if spec.quantity in _RATIOS:
                eras.add(spec.era)
            labels = sample.labels
            idents.setdefault(key, (labels.get("UUID") or labels.get("uuid"), labels.get("GPU_I_PROFILE")))
    instances: dict[tuple[int, int], DcgmInstance] = {}
    for key, row in cells.items():
        uuid, profile = idents[key]
        era: Era = "4.9" if any(e == "4.9" for e, _ in row.values()) else "legacy"
        instances[key] = DcgmInstance(
            gpu=key[0],
            gpu_instance_id=key[1],
            gpu_uuid=uuid,
            profile=profile,
            era=era,
            gr_engine_active=_get(row, "gr_engine_active"),
            sm_active=_get(row, "sm_active"),
            sm_occupancy=_get(row, "sm_occupancy"),
            tensor_active=_get(row, "tensor_active"),
            dram_active=_get(row, "dram_active"),
            fb_used_bytes=_get_int(row, "fb_used"),
            fb_free_bytes=_get_int(row, "fb_free"),
            fb_total_bytes=_get_int(row, "fb_total"),
        )
    scrape_era: Era | None = "4.9" if "4.9" in eras else ("legacy" if eras else None)
    return DcgmScrape(taken_at=taken_at, era=scrape_era, instances=instances)


def _instance_key(labels: Mapping[str, str]) -> tuple[int, int] | None:
    gpu, gi = labels.get("gpu"), labels.get("GPU_I_ID")
    if gpu is None or gi is None or not gpu.isdigit() or not gi.isdigit():
        return None
    return int(gpu), int(gi)


def _checked(spec: DcgmField, raw: float) -> float | None:
    if not math.isfinite(raw) or raw < 0:
        return None
    value = raw * spec.scale
    if spec.quantity in _RATIOS and value > 1.0 + 1e-9:
        return None
    return value


def _get(row: Mapping[str, tuple[Era, float]], quantity: str) -> float | None:
    cell = row.get(quantity)
    return None if cell is None else cell[1]


def _get_int(row: Mapping[str, tuple[Era, float]], quantity: str) -> int | None:
    cell = row.get(quantity)
    return None if cell is None else round(cell[1])


# ------------------------------------------------------------------------------------------------- HTTP client


async def fetch_text(url: str, timeout_s: float = 5.0, max_bytes: int = 16 * 1024 * 1024) -> str:
    """GET ``url`` (http or https) and return the body as text; DcgmError on any failure, with the URL in it.

    HTTP/1.1 with ``Connection: close``; a chunked body is decoded, a body past ``max_bytes`` is refused.
    """
    try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that meets a finished fetch,
        # and the scrape loop then outlives the daemon's stop (seen once in about ten CI runs at 0.1 s scrapes)
        async with asyncio.timeout(timeout_s):
            return await _fetch(url, max_bytes)
    except TimeoutError:
        raise DcgmError(f"dcgm-exporter at {url} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise DcgmError(f"cannot reach dcgm-exporter at {url}: {exc.strerror or exc}") from exc


def check_url(url: str) -> tuple[str, str, int, str]:
    """Split a dcgm-exporter URL into (scheme, host, port, path); ConfigError names what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"dcgm url {url!r}: expected http://HOST[:PORT]/PATH or https://...")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"dcgm url {url!r}: the port is not a number from 1 to 65535") from None
    path = parts.path or "/metrics"
    if parts.query:
        path = f"{path}?{parts.query}"
    return parts.scheme, parts.hostname, port, path


async def _fetch(url: str, max_bytes: int) -> str:
    scheme, host, port, path = check_url(url)
    context = ssl.create_default_context() if scheme == "https" else None
    reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=64 * 1024)
    try:
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nAccept: text/plain;version=0.0.4\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\nUser-Agent: flexmig\r\n\r\n".encode("ascii")
        )
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise DcgmError(f"dcgm-exporter at {url} sent no HTTP status line")
        if parts[1] != "200":
            raise DcgmError(f"dcgm-exporter at {url} answered HTTP {' '.join(parts[1:]).strip()}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader, max_bytes, url)
        else:
            length = headers.get("content-length")
            if length is not None:
                if not length.isdigit() or int(length) > max_bytes:
                    raise DcgmError(f"dcgm-exporter at {url}: body of {length} bytes refused (limit {max_bytes})")
                body = await reader.readexactly(int(length))
            else:
                body = await reader.read(max_bytes + 1)
                if len(body) > max_bytes:
                    raise DcgmError(f"dcgm-exporter at {url}: body over {max_bytes} bytes refused")
        return body.decode("utf-8", errors="replace")
    except asyncio.IncompleteReadError as exc:
        raise DcgmError(f"dcgm-exporter at {url} closed the connection mid-body") from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int, url: str) -> bytes:
    out = bytearray()
    while True:
        size_line = (await reader.readline()).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise DcgmError(f"dcgm-exporter at {url}: bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            return bytes(out)
        if len(out) + size > max_bytes:
            raise DcgmError(f"dcgm-exporter at {url}: body over {max_bytes} bytes refused")
        out += await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


# ------------------------------------------------------------------------------------------------- the source


class DcgmSource:
    """Scrapes one dcgm-exporter endpoint and keeps the last good scrape and the count of failures.

    ``max_age_s``: a scrape older than this is not joined any more (the exporter stopped answering), so stale
    activity never poses as fresh.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_age_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_url(url)
        self.url = url
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._last: DcgmScrape | None = None
        self.failures = 0
        self.last_error: str | None = None
        self.up = False

    async def scrape(self) -> DcgmScrape | None:
        """Scrape once; on failure count it, keep the previous scrape and return None (never raise)."""
        try:
            text = await fetch_text(self.url, self.timeout_s)
            scrape = parse_dcgm_exposition(text, self._clock())
        except DcgmError as exc:
            self.failures += 1
            self.last_error = str(exc)
            self.up = False
            return None
        self._last = scrape
        self.up = True
        self.last_error = None
        return scrape

    def fresh(self, now: float) -> DcgmScrape | None:
        """The last good scrape if it is younger than ``max_age_s`` at ``now``; else None."""
        last = self._last
        if last is None or now - last.taken_at > self.max_age_s:
            return None
        return last

    def last_scrape(self) -> DcgmScrape | None:
        """The last good scrape, however old."""
        return self._last
