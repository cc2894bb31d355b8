"""The /metrics answer (flexmig.metrics.scrape): one render per snapshot shared by every scraper, gzip as two
members, live families fresh at every scrape, the library's negotiation and filters."""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Callable
from typing import Any

import pytest

from flexmig.metrics.actions import ActionMetrics
from flexmig.metrics.findings import FindingsMetrics
from flexmig.metrics.scrape import Exposition
from flexmig.telemetry.snapshot import Snapshot
from support.event_samples import act_events, facts
from support.metrics_rig import sampled_node

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return sampled_node()


def get(app: Exposition, **environ: str) -> tuple[str, dict[str, str], bytes]:
    got: list[Any] = []

    def start(status: str, headers: list[tuple[str, str]]) -> Callable[[bytes], None]:
        got.append((status, dict(headers)))
        return lambda _data: None

    env = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", **environ}
    body = b"".join(app(env, start))
    return got[0][0], got[0][1], body


def test_every_scrape_of_one_snapshot_shares_one_render_per_format(snapshot: Snapshot) -> None:
    app = Exposition(lambda: snapshot, [FindingsMetrics()], process_metrics=False)
    first = [get(app)[2] for _ in range(16)]
    assert app.renders == 1 and len(set(first)) == 1
    for _ in range(16):
        get(app, HTTP_ACCEPT=OPENMETRICS)
    assert app.renders == 2, "one more for OpenMetrics"


def test_a_new_snapshot_is_rendered_at_the_next_scrape(snapshot: Snapshot) -> None:
    latest = [snapshot]
    app = Exposition(lambda: latest[0], process_metrics=False)
    before = get(app)[2]
    latest[0] = dataclasses.replace(snapshot, taken_at=snapshot.taken_at + 1.0)
    after = get(app)[2]
    assert app.renders == 2 and before != after
    assert b"flexmig_last_sweep_timestamp_seconds" in after


def test_gzip_is_two_members_that_read_as_the_plain_body(snapshot: Snapshot) -> None:
    app = Exposition(lambda: snapshot, [FindingsMetrics()], process_metrics=False)
    _, headers, packed = get(app, HTTP_ACCEPT=OPENMETRICS, HTTP_ACCEPT_ENCODING="gzip, deflate")
    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed) == get(app, HTTP_ACCEPT=OPENMETRICS)[2]
    assert packed.count(b"\x1f\x8b\x08") >= 2, "the cached member and the live one"
    assert app.renders == 1


def test_an_action_is_counted_by_the_next_scrape_of_the_same_snapshot(snapshot: Snapshot) -> None:
    actions = ActionMetrics()
    app = Exposition(lambda: snapshot, [actions], process_metrics=False)
    assert b'flexmig_actions_total{Hostname="node-1",action="migrate",outcome="completed"} 0.0' in get(app)[2]
    for e in act_events():
        actions.record(e, facts(e.action_id or 0).downtime_s if e.kind == "action_completed" else None)
    body = get(app)[2]
    assert b'flexmig_actions_total{Hostname="node-1",action="migrate",outcome="completed"} 1.0' in body
    assert app.renders == 1, "the snapshot part was not rendered again"


def test_the_answer_is_negotiated_and_filtered_as_prometheus_client_does(snapshot: Snapshot) -> None:
    app = Exposition(lambda: snapshot, process_metrics=False)
    status, headers, body = get(app, HTTP_ACCEPT=OPENMETRICS)
    assert status == "200 OK" and headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    status, headers, body = get(app)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4") and b"# EOF" not in body
    _, _, body = get(app, QUERY_STRING="name[]=flexmig_sweeps_total")
    lines = [ln for ln in body.decode().splitlines() if not ln.startswith("#")]
    assert lines == ['flexmig_sweeps_total{Hostname="node-1"} 3.0']
    assert get(app, REQUEST_METHOD="POST")[0] == "405 Method Not Allowed"
    assert app.renders == 2, "a filtered scrape is rendered apart and not kept"


def test_before_the_first_sweep_only_the_process_is_exported() -> None:
    _, _, body = get(Exposition(lambda: None))
    assert b"flexmig_" not in body and b"process_cpu_seconds_total" in body
