"""The ``/metrics`` answer: rendered once per snapshot and shared by every scraper, gzipped when asked.

A scrape used to render every family afresh through prometheus_client: on a node of 112 MIG devices, 54 ms of CPU
and 897 KB per scrape, paid again by every Prometheus (and every curl) that asked, although the figures change
once per sweep. :class:`Exposition` splits the answer in two:

* the **snapshot part**: every family computed from the published snapshot alone (the node's, its GPUs' and
  instances', detection's), written by :func:`~flexmig.metrics.collector.write_snapshot` at the node's detail
  level. It is rendered at most once per snapshot and format, on the first scrape that wants it, and its gzip
  member is compressed once too: a second, fourth or sixteenth scraper of the same sweep costs a dictionary lookup;
* the **live part**: the families of state that changes between sweeps (actions, the MQTT publisher, the metrics
  server's own connections, the ``process_*`` series), a few dozen series whatever the node's size, collected at
  every scrape (prometheus_client families, written through the same writer), so an action that completed is
  counted in the next scrape, not the next sweep.

The body is the snapshot part followed by the live part (and ``# EOF`` for OpenMetrics). With ``Accept-Encoding:
gzip`` it is two gzip members, the cached one and the live one: RFC 1952 lets a gzip file hold several members,
and Go's reader (Prometheus) and Python's read them as one stream. Content negotiation is prometheus_client's own
(:func:`prometheus_client.exposition.choose_encoder`: OpenMetrics when asked, else the classic text format), and so
are the answers to other methods and ``name[]`` filters, which are rendered afresh and never cached.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.process_collector import ProcessCollector

from flexmig.metrics.collector import live_metrics, write_snapshot
from flexmig.metrics.exposition import Writer
from flexmig.metrics.families import Level
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["Exposition"]

_EOF = "# EOF\n"
_GZIP_LEVEL = 1  # this text is repetitive: level 1 packs it to a tenth in half the CPU of zlib's default


class Exposition:
    """A WSGI application that answers scrapes of ``latest()``'s snapshot (see the module docstring).

    ``extensions`` are the node's extra families (:class:`~flexmig.metrics.collector.SnapshotFamilies` join the
    cached part, :class:`~flexmig.metrics.collector.SnapshotMetrics` the live one); ``detail`` is the level of the
    families written (``[prometheus] detail``); ``process_metrics`` adds prometheus_client's ``process_*`` series.
    :attr:`renders` counts the snapshot parts rendered, for the benchmark and the tests.
    """

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        extensions: Sequence[object] = (),
        *,
        detail: Level = "standard",
        process_metrics: bool = True,
    ) -> None:
        self._latest = latest
        self._extensions = tuple(extensions)
        self.detail: Level = detail
        self._process = ProcessCollector(registry=None) if process_metrics else None
        self.renders = 0
        self._snapshot: Snapshot | None = None
        self._parts: dict[tuple[bool, bool], bytes] = {}

    # ------------------------------------------------------------------------------------------ rendering
    def _snapshot_part(self, snap: Snapshot | None, openmetrics: bool, compressed: bool) -> bytes:
        """The snapshot part in one format (gzip member if ``compressed``), rendered once per snapshot."""
        if snap is not self._snapshot:
            self._snapshot, self._parts = snap, {}
        key = (openmetrics, compressed)
        got = self._parts.get(key)
        if got is None:
            if compressed:
                got = gzip.compress(self._snapshot_part(snap, openmetrics, False), _GZIP_LEVEL)
            else:
                got = self._render(snap, openmetrics, None).encode()
                self.renders += 1
            self._parts[key] = got
        return got

    def _render(self, snap: Snapshot | None, openmetrics: bool, names: frozenset[str] | None) -> str:
        if snap is None:
            return ""
        out = Writer(self.detail)
        write_snapshot(snap, out, self._extensions)
        if names is not None:
            out = out.only(names)
        return out.openmetrics() if openmetrics else out.text()

    def _live_part(self, snap: Snapshot | None, openmetrics: bool, names: frozenset[str] | None) -> bytes:
        """The families of state that changes between sweeps, written afresh (a few dozen series)."""
        out = Writer(self.detail)
        if snap is not None:
            out.add_metrics(live_metrics(snap, self._extensions))
        if self._process is not None:
            out.add_metrics(self._process.collect())
        if names is not None:
            out = out.only(names)
        return (out.openmetrics() if openmetrics else out.text()).encode()

    def body(self, *, openmetrics: bool, compressed: bool = False, names: Iterable[str] | None = None) -> bytes:
        """The whole exposition in one format (gzip when ``compressed``); ``names`` restricts it to those sample
        names (prometheus_client's ``name[]``; not cached)."""
        snap = self._latest()
        wanted = None if names is None else frozenset(names)
        end = _EOF.encode() if openmetrics else b""
        if wanted is not None:
            raw = self._render(snap, openmetrics, wanted).encode() + self._live_part(snap, openmetrics, wanted) + end
            return gzip.compress(raw, _GZIP_LEVEL) if compressed else raw
        head = self._snapshot_part(snap, openmetrics, compressed)
        tail = self._live_part(snap, openmetrics, None) + end
        return head + (gzip.compress(tail, _GZIP_LEVEL) if compressed else tail)

    # ------------------------------------------------------------------------------------------------ WSGI
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """Answer one request as prometheus_client's WSGI application does (methods, negotiation, gzip)."""
        method = environ["REQUEST_METHOD"]
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET")])
            return [b""]
        if method != "GET":
            status = "405 Method Not Allowed"
            start_response(status, [("Allow", "OPTIONS,GET")])
            return [f"# HTTP {status}: {method}; use OPTIONS or GET\n".encode()]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [])
            return [b""]
        _encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        compressed = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or "")
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        headers = [("Content-Type", content_type)]
        if compressed:
            headers.append(("Content-Encoding", "gzip"))
        body = self.body(openmetrics=openmetrics, compressed=compressed, names=names)
        start_response("200 OK", headers)
        return [body]
