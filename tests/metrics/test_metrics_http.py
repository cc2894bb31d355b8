"""The metrics HTTP server: prometheus_client's answers, within bounds on connections, time and size."""

from __future__ import annotations

import contextlib
import gzip
import resource
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS

from flexmig.errors import FlexmigError
from flexmig.metrics.server import FD_RESERVE, MetricsServer, connection_cap
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("flexmig_test_things", "Things counted", registry=reg).inc(3)
    return reg


@contextlib.contextmanager
def serving(registry: CollectorRegistry, **kw: float) -> Iterator[MetricsServer]:
    server = MetricsServer(registry, "127.0.0.1", 0, **kw)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    with serving(registry) as s:
        yield s


def get(server: MetricsServer, path: str = "/metrics", **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def half_open(server: MetricsServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port or 0), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return s


def closed_by_server(s: socket.socket, timeout_s: float = 5.0) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_the_answer_is_prometheus_clients_own(server: MetricsServer, registry: CollectorRegistry) -> None:
    status, headers, body = get(server)
    assert status == 200 and body == generate_latest(registry)
    assert headers["Connection"] == "close" and int(headers["Content-Length"]) == len(body)
    status, headers, body = get(server, Accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith(OPENMETRICS) and body.endswith(b"# EOF\n")
    status, headers, body = get(server, **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == generate_latest(registry)
    status, headers, body = get(server, "/metrics?name[]=nothing")
    assert status == 200 and b"flexmig_test_things" not in body


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n", b"431"),
    ],
)
def test_bad_requests_get_their_status_and_the_server_goes_on(server: MetricsServer, raw: bytes, code: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port or 0), timeout=5) as s:
        s.sendall(raw)
        answer = s.recv(100)
    assert answer.startswith(b"HTTP/1.1 " + code), answer
    assert get(server)[0] == 200


def test_a_head_that_trickles_in_is_cut_at_the_header_timeout(registry: CollectorRegistry) -> None:
    with serving(registry, header_timeout_s=0.5) as server:
        s = half_open(server)
        for _ in range(3):  # a header line every 0.2 s does not extend the deadline
            time.sleep(0.2)
            s.sendall(b"X-Slow: 1\r\n")
        assert closed_by_server(s)
        assert server.stats.timed_out == 1
        s.close()


def test_at_the_cap_the_oldest_half_open_connection_makes_room_for_a_scraper(registry: CollectorRegistry) -> None:
    with serving(registry, max_connections=8) as server:
        assert server.stats.limit == 8
        slow = [half_open(server) for _ in range(8)]
        wait_until(lambda: server.stats.open == 8, what="all eight held", every_s=0.01)
        status, _, body = get(server)  # the ninth: a scraper, answered at once
        assert status == 200 and b"flexmig_test_things" in body
        assert closed_by_server(slow[0]), "the oldest half-open connection was evicted"
        assert not closed_by_server(slow[-1], 0.2), "the newer ones are still held"
        assert server.stats.evicted == 1 and server.stats.open <= 8
        for s in slow:
            s.close()


def test_at_the_cap_a_slow_head_is_evicted_before_a_connection_that_has_not_sent_yet(
    registry: CollectorRegistry,
) -> None:
    # A client whose connection was just accepted has not had its turn to send; under a flood of reconnecting slow
    # clients it must not be the one pushed out (the slowloris test once lost a probe that way).
    with serving(registry, max_connections=4) as server:
        silent = socket.create_connection(("127.0.0.1", server.port or 0), timeout=5)
        wait_until(lambda: server.stats.open == 1, what="the silent one held", every_s=0.01)
        slow = [half_open(server), half_open(server)]
        assert get(server)[0] == 200  # read after both slow heads: the server has seen their first bytes
        slow.append(half_open(server))
        wait_until(lambda: server.stats.open == 4, what="four held", every_s=0.01)
        assert get(server)[0] == 200  # the fifth, at the cap of four
        assert closed_by_server(slow[0]), "the oldest slow head was evicted"
        assert not closed_by_server(silent, 0.2), "the older connection that sent nothing yet is held"
        assert server.stats.evicted == 1
        for s in (silent, *slow):
            s.close()


def test_the_cap_leaves_a_reserve_of_descriptors_under_a_low_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = sum(1 for _ in Path("/proc/self/fd").iterdir())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + FD_RESERVE + 64 + 10, hard))
        assert connection_cap(64) in (9, 10, 11), "what is left after the reserve and one backlog"
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 100, hard))
        assert connection_cap(64) == 4, "never fewer than 4"
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert connection_cap(64) == 64


def test_a_taken_port_is_a_clear_error(server: MetricsServer, registry: CollectorRegistry) -> None:
    other = MetricsServer(registry, "127.0.0.1", server.port or 0)
    with pytest.raises(FlexmigError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+: .*dcgm-exporter"):
        other.start()


def test_stop_closes_everything_and_may_be_called_twice(registry: CollectorRegistry) -> None:
    server = MetricsServer(registry, "127.0.0.1", 0)
    server.start()
    s = half_open(server)
    wait_until(lambda: server.stats.open == 1, what="the connection is held", every_s=0.01)
    server.stop()
    server.stop()
    assert closed_by_server(s)
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port or 0), timeout=2)
