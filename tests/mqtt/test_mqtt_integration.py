"""The MQTT publisher against a real mosquitto (Debian package) on loopback: nothing lost, last will, bad input.

Each test starts its own broker (the ``mosquitto`` fixture: a free port, a generated configuration, stopped at the
test's end), so no retained message or session crosses tests. Every wait is bounded; none of the assertions is
about speed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from flexmig.mqtt.events import Deduplicator, Event, EventFactory, EventKind
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings, PublisherStats
from flexmig.mqtt.subscriber import SubscriberSettings, follow_events
from support.mosquitto import WAIT, Brokers, cancel, needs_mosquitto
from support.wait import free_port, until

pytestmark = [pytest.mark.integration, needs_mosquitto]


def fast(node: str = "node-1", **kw: Any) -> PublisherSettings:
    return PublisherSettings(node=node, backoff_initial_s=0.05, backoff_max_s=0.5, connect_timeout_s=5, **kw)


def sub_settings(address: str, **kw: Any) -> SubscriberSettings:
    return SubscriberSettings(broker=address, node="node-1", backoff_initial_s=0.05, backoff_max_s=0.5, **kw)


async def retained_status(address: str, limit: float = WAIT) -> str:
    """The retained status of node-1 as a fresh subscriber sees it."""
    statuses: list[str] = []
    task = asyncio.create_task(
        follow_events(sub_settings(address), lambda e: None, on_status=lambda n, s: statuses.append(s))
    )
    try:
        await until(lambda: statuses, limit, "a retained status")
    finally:
        await cancel(task)
    return statuses[0]


# ---------------------------------------------------------------------------------------------- nothing lost
def test_every_event_arrives_exactly_once_though_the_broker_restarts_midway(tmp_path: Path, mosquitto: Brokers) -> None:
    broker = mosquitto()

    async def scenario() -> tuple[list[str], list[Event], list[str], PublisherStats]:
        outbox = Outbox(tmp_path / "outbox.sqlite")
        pub = MqttPublisher(fast(broker=broker.address), outbox)
        received: list[Event] = []
        deliveries: list[str] = []
        statuses: list[str] = []
        dedupe = Deduplicator()

        class Counting(Deduplicator):
            def first_time(self, event_id: str) -> bool:
                deliveries.append(event_id)
                return dedupe.first_time(event_id)

        sub = asyncio.create_task(
            follow_events(
                sub_settings(broker.address, client_id="test-subscriber"),  # persistent session
                received.append,
                on_status=lambda n, s: statuses.append(s),
                dedupe=Counting(),
            )
        )
        runner = asyncio.create_task(pub.run())
        await until(lambda: statuses and statuses[-1] == "online", what="the publisher to come online")
        fac = EventFactory("node-1")
        emitted: list[str] = []

        async def emit(n: int) -> None:
            for _ in range(n):
                e = fac.make(EventKind.INSTANCE_CREATED, {"gpu": 0, "start": 0, "profile": "1g.18gb", "uuid": None})
                pub.emit(e)
                emitted.append(e.id)
                await asyncio.sleep(0.01)

        await emit(30)
        broker.stop()
        await until(lambda: not pub.connected, what="the publisher to notice the broker is gone")
        await emit(30)  # the broker is down: these wait in the outbox
        assert len(outbox) >= 30
        broker.start()  # same port, same persistence directory
        await emit(30)
        await until(lambda: len(received) == len(emitted), what=f"{len(emitted)} events at the subscriber")
        await until(lambda: len(outbox) == 0, what="the outbox to drain")
        assert not runner.done()
        await cancel(runner, sub)
        return emitted, received, deliveries, pub.stats()

    emitted, received, deliveries, stats = asyncio.run(scenario())
    assert [e.id for e in received] == emitted  # every ID, once each, in order
    assert len(set(deliveries)) == len(emitted)  # redeliveries, if any, were only duplicates
    assert stats.sent_total >= len(emitted)


def test_the_retained_state_is_the_latest_document(tmp_path: Path, mosquitto: Brokers) -> None:
    broker = mosquitto()

    async def scenario() -> list[tuple[Any, bool]]:
        pub = MqttPublisher(fast(broker=broker.address), Outbox(tmp_path / "o.sqlite"))
        runner = asyncio.create_task(pub.run())
        for i in range(5):
            pub.set_state({"schema_version": 1, "sweep": i})
        await until(
            lambda: pub._state_sent is not None and json.loads(pub._state_sent)["sweep"] == 4, what="state sent"
        )
        await cancel(runner)
        got: list[tuple[Any, bool]] = []
        async with aiomqtt.Client("127.0.0.1", broker.port, timeout=5) as client:
            await client.subscribe("flexmig/v1/node-1/state", qos=1)
            async with asyncio.timeout(WAIT):
                async for message in client.messages:
                    got.append((json.loads(bytes(message.payload)), message.retain))
                    break
        return got

    assert asyncio.run(scenario()) == [({"schema_version": 1, "sweep": 4}, True)]


def test_a_clean_stop_says_offline(tmp_path: Path, mosquitto: Brokers) -> None:
    broker = mosquitto()

    async def scenario() -> str:
        pub = MqttPublisher(fast(broker=broker.address), Outbox(tmp_path / "o.sqlite"))
        runner = asyncio.create_task(pub.run())
        await until(lambda: pub.connected, what="connection")
        assert await retained_status(broker.address) == "online"
        await cancel(runner)
        return await retained_status(broker.address)

    assert asyncio.run(scenario()) == "offline"


def test_each_connection_is_one_info_line_with_the_broker_the_client_id_and_the_queue(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mosquitto: Brokers
) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.mqtt.publisher")
    broker = mosquitto()

    async def scenario() -> None:
        pub = MqttPublisher(fast(broker=broker.address), Outbox(tmp_path / "o.sqlite"))
        fac = EventFactory("node-1")
        for i in range(3):
            pub.emit(fac.make(EventKind.GPU_LOST, {"gpu": i, "uuid": None, "reason": f"gpu {i}"}))
        runner = asyncio.create_task(pub.run())
        await until(lambda: len(pub.outbox) == 0, what="the outbox to drain")
        broker.stop()
        await until(lambda: not pub.connected, what="the publisher to notice the broker is gone")
        broker.start()
        await until(lambda: pub.connected, what="the reconnection")
        await cancel(runner)

    asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "connected to" in r.getMessage()]
    assert lines == [
        f"MQTT connected to {broker.address} as flexmig-node-1; 3 event(s) queued",
        f"MQTT connected to {broker.address} as flexmig-node-1; 0 event(s) queued",
    ]


# ---------------------------------------------------------------------------------------------- last will
CHILD = """
import asyncio, sys
from flexmig.detect import DetectSettings, DetectState, Observation, observe
from flexmig.mqtt.events import EventFactory, events_from_report
from flexmig.mqtt.publisher import MqttPublisher, PublisherSettings, PublisherStats
from flexmig.mqtt.state import state_document
from flexmig.mqtt.outbox import Outbox
from flexmig.mig import H200, Layout

async def main(address, outbox_path):
    pub = MqttPublisher(PublisherSettings(node="node-1", broker=address, keepalive_s=60), Outbox(outbox_path))
    asyncio.create_task(pub.run())
    fac = EventFactory("node-1")
    layouts = [Layout.of(H200, [("3g.71gb", 0)]), Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4)])]
    state, t = DetectState(), 0
    while True:  # a simulated node whose instances come and go, one sweep every 20 ms
        t += 1
        node = {0: layouts[t % 2], 1: layouts[(t // 3) % 2]}
        state, report = observe(state, Observation(now=1e9 + t, layouts=node), DetectSettings())
        for event in events_from_report(report, fac):
            pub.emit(event)
            print(event.id, flush=True)  # after emit: the event is in the outbox
        pub.set_state(state_document("node-1", report, node))
        await asyncio.sleep(0.02)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_killing_the_publisher_with_sigkill_leaves_status_offline_and_loses_no_event(
    tmp_path: Path, mosquitto: Brokers
) -> None:
    broker = mosquitto()
    outbox_path = tmp_path / "child-outbox.sqlite"

    async def scenario() -> tuple[list[str], set[str], set[str], int | None, str]:
        # The watcher's persistent session exists before the child starts: the broker keeps every event for it from
        # the first one on, however late the watcher itself gets to subscribe.
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="watcher", clean_session=False) as c:
            await c.subscribe("flexmig/v1/node-1/events/#", qos=1)
        received: list[Event] = []
        statuses: list[str] = []
        sub = asyncio.create_task(
            follow_events(
                sub_settings(broker.address, client_id="watcher"),
                received.append,
                on_status=lambda n, s: statuses.append(s),
            )
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, broker.address, str(outbox_path), stdout=asyncio.subprocess.PIPE
        )
        assert child.stdout is not None
        printed: list[str] = []
        try:
            await until(lambda: "online" in statuses, what="the child to come online")
            while len(printed) < 40:
                line = await asyncio.wait_for(child.stdout.readline(), WAIT)
                assert line, "the child exited early"
                printed.append(line.decode().strip())
        finally:
            child.send_signal(signal.SIGKILL)
            await asyncio.wait_for(child.wait(), WAIT)
        # whatever it printed after that is also in its outbox or delivered; read the rest of its output
        rest = await asyncio.wait_for(child.stdout.read(), WAIT)
        printed += [x for x in rest.decode().split() if x]
        await until(lambda: statuses[-1] == "offline", what="the last will")
        left = set(Outbox(outbox_path).ids())
        # every event the child emitted is either still in its outbox or reaches the subscriber
        await until(lambda: set(printed) <= left | {e.id for e in received}, what="the acknowledged events")
        await cancel(sub)
        return printed, {e.id for e in received}, left, child.returncode, await retained_status(broker.address)

    printed, delivered, left, rc, retained = asyncio.run(scenario())
    assert rc == -signal.SIGKILL
    assert retained == "offline"
    assert len(printed) >= 40
    assert set(printed) <= delivered | left  # nothing emitted was lost


# ---------------------------------------------------------------------------------------------- bad input
def run_beside_a_sampler(pub: MqttPublisher, n_events: int = 10) -> tuple[list[str], list[int], bool]:
    """Run the publisher while a stand-in sampling loop ticks 100 times and emits ``n_events``; returns the
    emitted IDs, the publisher's count of failed connection attempts as each tick saw it, and whether the
    publisher was still running at the end."""

    async def scenario() -> tuple[list[str], list[int], bool]:
        runner = asyncio.create_task(pub.run())
        fac = EventFactory("node-1")
        ids: list[str] = []
        failures: list[int] = []
        for i in range(100):
            failures.append(pub.stats().connect_failures_total)
            if i % (100 // n_events) == 0:
                e = fac.make(EventKind.GPU_LOST, {"gpu": 0, "uuid": None, "reason": "test"})
                pub.emit(e)
                ids.append(e.id)
            await asyncio.sleep(0.015)
        alive = not runner.done()
        await cancel(runner)
        return ids, failures, alive

    return asyncio.run(asyncio.wait_for(scenario(), WAIT))


def retried_between_ticks(failures: list[int]) -> bool:
    """True when the failed attempts went on while the loop ticked: the count rose between ticks at least twice
    (so the retries and the ticks took turns, rather than one blocking the other)."""
    return sum(1 for a, b in itertools.pairwise(failures) if b > a) >= 2


def mqtt_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "flexmig.mqtt.publisher" and r.levelno >= logging.WARNING]


def test_an_unreachable_broker_gives_one_clear_line_and_keeps_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.mqtt.publisher")
    port = free_port()  # nothing listens there
    pub = MqttPublisher(fast(broker=f"127.0.0.1:{port}"), Outbox(tmp_path / "o.sqlite"))
    ids, failures, alive = run_beside_a_sampler(pub)
    (record,) = mqtt_records(caplog)
    assert f"MQTT broker 127.0.0.1:{port} is unreachable" in record.getMessage()
    assert str(tmp_path / "o.sqlite") in record.getMessage()
    assert alive and retried_between_ticks(failures), failures
    assert pub.outbox.ids() == ids
    assert pub.stats().connect_failures_total > 1  # it kept retrying, quietly


def test_bad_credentials_give_one_clear_line_and_keep_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mosquitto: Brokers
) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.mqtt.publisher")
    passwd = tmp_path / "passwd"
    passwd.write_text("flexmig:right\n")
    subprocess.run(["mosquitto_passwd", "-U", str(passwd)], check=True, timeout=WAIT)
    broker = mosquitto(f"allow_anonymous false\npassword_file {passwd}\n")
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-right\n")
    wrong.chmod(0o600)
    pub = MqttPublisher(
        fast(broker=broker.address, username="flexmig", password_file=wrong), Outbox(tmp_path / "o.sqlite")
    )
    ids, failures, alive = run_beside_a_sampler(pub)
    (record,) = mqtt_records(caplog)
    assert f"MQTT broker {broker.address} refused the login of user 'flexmig'" in record.getMessage()
    assert "not-right" not in caplog.text  # never the password
    assert alive and retried_between_ticks(failures), failures
    assert pub.outbox.ids() == ids

    right = tmp_path / "right.password"
    right.write_text("right\n")
    right.chmod(0o600)
    good = MqttPublisher(
        fast(broker=broker.address, username="flexmig", password_file=right), Outbox(tmp_path / "o.sqlite")
    )

    async def drain() -> None:
        runner = asyncio.create_task(good.run())
        await until(lambda: len(good.outbox) == 0, what="the right password to drain the outbox")
        await cancel(runner)

    asyncio.run(drain())
    assert good.stats().sent_total == len(ids)


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "no port", "[::1", "host:port:extra"])
def test_a_malformed_broker_address_gives_one_clear_line_and_keeps_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, address: str
) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.mqtt.publisher")
    pub = MqttPublisher(fast(broker=address), Outbox(tmp_path / "o.sqlite"))
    ids, failures, alive = run_beside_a_sampler(pub)
    (record,) = mqtt_records(caplog)
    assert record.levelno == logging.ERROR
    assert f"malformed broker address {address!r}" in record.getMessage()
    assert alive and set(failures) == {0}, "publishing is off: it never tries to connect"
    assert pub.outbox.ids() == ids


# ---------------------------------------------------------------------------------------------- the CLI
def test_flexmig_events_prints_each_event_once_as_json(tmp_path: Path, mosquitto: Brokers) -> None:
    broker = mosquitto()

    async def scenario() -> tuple[list[Event], int | None, str, str]:
        # Open the CLI's persistent session first, so the broker queues events for it however slowly it starts.
        async with aiomqtt.Client("127.0.0.1", broker.port, identifier="cli-test", clean_session=False) as c:
            await c.subscribe("flexmig/v1/node-1/events/#", qos=1)
        pub = MqttPublisher(fast(broker=broker.address), Outbox(tmp_path / "o.sqlite"))
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flexmig.cli.main", "events", "--broker", broker.address, "--node", "node-1",
            "--json", "--count", "3", "--timeout", str(WAIT), "--client-id", "cli-test",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        runner = asyncio.create_task(pub.run())
        fac = EventFactory("node-1")
        events = [fac.make(EventKind.GPU_LOST, {"gpu": i, "uuid": None, "reason": f"gpu {i}"}) for i in range(3)]
        for e in events:
            pub.emit(e)
        out, err = await asyncio.wait_for(cli.communicate(), WAIT + 10)
        await cancel(runner)
        return events, cli.returncode, out.decode(), err.decode()

    events, rc, out, err = asyncio.run(scenario())
    assert rc == 0, err
    lines = [Event.from_json(line) for line in out.splitlines()]
    assert [e.id for e in lines] == [e.id for e in events]


def events_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "events", *args],
        capture_output=True, text=True, timeout=WAIT + 30, check=False,
    )  # fmt: skip


def test_flexmig_events_exits_1_with_one_line_when_the_broker_was_never_reached() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    out = events_cli("--broker", address, "--timeout", "2")
    assert out.returncode == 1
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"flexmig events: cannot reach the MQTT broker {address}: ") and "--timeout 2 s" in line


def test_flexmig_events_exits_0_at_its_timeout_once_the_broker_was_reached(mosquitto: Brokers) -> None:
    broker = mosquitto()
    out = events_cli("--broker", broker.address, "--timeout", "2")
    assert (out.returncode, out.stderr) == (0, "")


# ---------------------------------------------------------------------------------------------- TLS
def make_ca_and_server_cert(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (openssl, EC keys: fast)."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def ssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=WAIT)

    ssl("req", "-x509", *ec, "-keyout", d / f"{name}-ca.key", "-out", d / f"{name}-ca.crt", "-days", "1",
        "-subj", f"/CN={name} test CA")  # fmt: skip
    ssl("req", *ec, "-keyout", d / f"{name}-server.key", "-out", d / f"{name}-server.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", d / f"{name}-server.csr", "-CA", d / f"{name}-ca.crt", "-CAkey", d / f"{name}-ca.key",
        "-CAcreateserial", "-out", d / f"{name}-server.crt", "-days", "1", "-extfile", d / "san.ext")  # fmt: skip
    return d / f"{name}-ca.crt", d / f"{name}-server.crt", d / f"{name}-server.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_events_travel_over_tls_and_a_wrong_ca_gives_one_clear_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mosquitto: Brokers
) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.mqtt.publisher")
    ca, cert, key = make_ca_and_server_cert(tmp_path / "pki", "good")
    other_ca, _, _ = make_ca_and_server_cert(tmp_path / "pki", "other")
    broker = mosquitto(f"allow_anonymous true\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n")
    wrong = MqttPublisher(fast(broker=broker.address, tls=True, tls_ca=other_ca), Outbox(tmp_path / "o.sqlite"))
    ids, failures, alive = run_beside_a_sampler(wrong, n_events=5)
    (record,) = mqtt_records(caplog)
    assert f"MQTT TLS handshake with {broker.address} failed" in record.getMessage()
    assert alive and retried_between_ticks(failures), failures
    assert wrong.outbox.ids() == ids

    async def scenario() -> None:
        received: list[Event] = []
        statuses: list[str] = []
        sub = asyncio.create_task(
            follow_events(
                sub_settings(broker.address, tls=True, tls_ca=ca),
                received.append,
                on_status=lambda n, st: statuses.append(st),
            )
        )
        good = MqttPublisher(fast(broker=broker.address, tls=True, tls_ca=ca), Outbox(tmp_path / "o.sqlite"))
        runner = asyncio.create_task(good.run())
        # the retained "online" reaches the subscriber only once it has subscribed (events first, then status)
        await until(lambda: "online" in statuses, what="the subscriber to see the node online over TLS")
        e = EventFactory("node-1").make(EventKind.GPU_LOST, {"gpu": 1, "uuid": None, "reason": "tls"})
        good.emit(e)
        await until(lambda: e.id in {r.id for r in received}, what="the event over TLS")
        await until(lambda: len(good.outbox) == 0, what="the outbox to drain over TLS")
        await cancel(runner, sub)

    asyncio.run(scenario())
