"""flexmigd with ``[mqtt] enabled`` against a real mosquitto: every event it emits reaches a subscriber exactly
once (after de-duplication) through a broker restart and a SIGKILL, the retained status and state, and bad
broker input that never stops sampling nor loses an event.

The daemon runs as a process (the real ``flexmigd``, or the same Daemon and signal handling with a churn loop
added, so instances keep coming and going on its simulated node). What it emitted is read from its log, one line
per event with the event's ID, and from its outbox; what arrived is read by a subscriber with a persistent
session. Every wait is bounded; no assertion is about speed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import jsonschema
import pytest

from flexmig.config import load_config, parse_config
from flexmig.daemon import Daemon
from flexmig.mqtt.events import Deduplicator, Event
from flexmig.mqtt.outbox import Outbox
from flexmig.mqtt.subscriber import SubscriberSettings, follow_events
from support.daemon import LOOPBACK_ANY, nvml_of, running, scrape, started, sweeps, values
from support.flexmigd import sample, short_base
from support.mosquitto import WAIT, Mosquitto, cancel, needs_mosquitto
from support.prometheus import http_get
from support.wait import free_port, until

pytestmark = [pytest.mark.integration, needs_mosquitto, pytest.mark.timeout(240)]

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
EVENT_LINE = re.compile(r"flexmig\.wiring\.mqtt: event (\w+) ([0-9a-f-]{36}):")
SPEC = "h200x2:3g.71gb@0"

# The daemon, with the same signal handling as flexmigd, and a scheduler that creates and destroys a 1g.18gb on
# GPU 1 every 0.3 s: instance_created/destroyed and fragmentation_above/below keep coming (3g@0 alone: a repack
# would make room for a 4g, recoverable 4/7 = 0.57; 3g@0 + 1g@4: a 2g, 2/7 = 0.29; against 0.5/0.3 with no wait).
CHURNING_DAEMON = """
import asyncio, logging, sys
from pathlib import Path
from flexmig.config import load_config
from flexmig.daemon import Daemon, serve
from flexmig.wiring.component import Loop

path = Path(sys.argv[1])
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
daemon = Daemon(load_config(path), sim_spec=sys.argv[2], sim_workload=False, config_path=path)

async def churn():
    nvml = daemon.backend.nvml
    while True:
        device = await daemon.worker.call(nvml.create_instance, 1, "1g.18gb", 4)
        await asyncio.sleep(0.3)
        await daemon.worker.call(nvml.destroy_instance, 1, device.gpu_instance_id)
        await asyncio.sleep(0.3)

daemon.add(Loop("churn", churn))
asyncio.run(serve(daemon))
"""


def write_config(path: Path, broker: str, outbox: Path, extra: str = "") -> Path:
    path.write_text(
        'node_name = "node-1"\n'
        "[sampling]\ninterval_s = 0.1\n"
        "[prometheus]\nenabled = false\n"
        f'[mqtt]\nenabled = true\nbroker = "{broker}"\noutbox = "{outbox}"\n{extra}'
        "[detect]\nunderuse_window_s = 1\nfragmentation_threshold = 0.5\nfragmentation_exit = 0.3\n"
        "fragmentation_window_s = 0\n"
    )
    path.chmod(0o600)
    return path


def emitted_ids(log: Path) -> list[str]:
    """Event IDs the daemon logged as emitted (stored in its outbox), in order."""
    return [m.group(2) for m in EVENT_LINE.finditer(log.read_text(errors="replace"))]


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        json.loads((SCHEMAS / name).read_text()), format_checker=jsonschema.FormatChecker()
    )


async def retained(port: int, topic: str) -> tuple[bytes, bool]:
    """The retained message on ``topic`` as a fresh subscriber sees it."""
    async with aiomqtt.Client("127.0.0.1", port, timeout=5) as client:
        await client.subscribe(topic, qos=1)
        async with asyncio.timeout(WAIT):
            async for message in client.messages:
                return bytes(message.payload), message.retain
    raise AssertionError(f"no retained message on {topic}")


class Watcher:
    """A subscriber with a persistent session: every delivery, the de-duplicated events, the statuses."""

    def __init__(self, broker: Mosquitto) -> None:
        self.port = broker.port
        self.settings = SubscriberSettings(
            broker=broker.address, node="node-1", client_id="watcher", backoff_initial_s=0.05, backoff_max_s=0.5
        )
        self.deliveries: list[str] = []
        self.events: list[Event] = []
        self.statuses: list[str] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Open the persistent session first, so events are queued for it from now on whatever its task does.
        async with aiomqtt.Client("127.0.0.1", self.port, identifier="watcher", clean_session=False) as c:
            await c.subscribe("flexmig/v1/node-1/events/#", qos=1)
        dedupe, deliveries = Deduplicator(), self.deliveries

        class Counting(Deduplicator):
            def first_time(self, event_id: str) -> bool:
                deliveries.append(event_id)
                return dedupe.first_time(event_id)

        self.task = asyncio.create_task(
            follow_events(
                self.settings, self.events.append, on_status=lambda n, s: self.statuses.append(s), dedupe=Counting()
            )
        )

    def ids(self) -> list[str]:
        return [e.id for e in self.events]


# ---------------------------------------------------------------------------------------------- nothing lost


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory (a control socket's path under it fits in 107 bytes), removed after."""
    with short_base("fm-mqtt-") as d:
        yield d


def test_every_event_the_daemon_emits_arrives_once_through_a_broker_restart_a_sigkill_and_a_restart(
    tmp_path: Path, short_tmp: Path
) -> None:
    broker = Mosquitto(tmp_path).start()
    outbox = tmp_path / "outbox.sqlite3"
    config = write_config(tmp_path / "flexmig.toml", broker.address, outbox)
    churn_log, cli_log = tmp_path / "churning.log", tmp_path / "flexmigd.log"
    event_schema = validator("event.v1.schema.json")
    # The simulated daemons' private directories go under the test's own short directory, not /tmp: the SIGKILLed
    # one's stays behind.
    env = {**os.environ, "NOTIFY_SOCKET": "", "TMPDIR": str(short_tmp)}

    async def scenario() -> dict[str, object]:
        watcher = Watcher(broker)
        await watcher.start()
        with churn_log.open("wb") as log:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHURNING_DAEMON, str(config), SPEC, stderr=log, stdout=log, env=env
            )
        try:
            await until(lambda: "online" in watcher.statuses, what="the daemon to come online")
            await until(lambda: len(watcher.events) >= 10, what="10 events while the broker is up")

            broker.stop()
            before = len(emitted_ids(churn_log))
            await until(lambda: len(emitted_ids(churn_log)) >= before + 10, what="10 events while the broker is down")
            assert len(Outbox(outbox)) >= 10  # they wait on disk
            broker.start()  # same port, same persistence: the watcher's session survives

            after = len(emitted_ids(churn_log))
            await until(lambda: len(watcher.events) >= after + 5, what="the backlog and new events after the restart")
        finally:
            child.send_signal(signal.SIGKILL)
            await asyncio.wait_for(child.wait(), WAIT)
        statuses_at_kill = len(watcher.statuses)
        await until(lambda: watcher.statuses[statuses_at_kill - 1 :][-1] == "offline", what="the last will")
        killed_status = (await retained(broker.port, "flexmig/v1/node-1/status"))[0]
        churned = emitted_ids(churn_log)
        left = set(Outbox(outbox).ids())
        await until(lambda: set(churned) <= set(watcher.ids()) | left, what="every acknowledged event at the watcher")
        left = set(Outbox(outbox).ids()) - set(watcher.ids())

        # The real flexmigd on the same outbox sends what the killed one had left, then emits its own.
        with cli_log.open("wb") as log:
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flexmig.daemon", "--sim", SPEC, "--config", str(config),
                stderr=log, stdout=log, env=env,
            )  # fmt: skip
        try:
            await until(lambda: set(churned) <= set(watcher.ids()), what="the killed daemon's leftovers")
            await until(
                lambda: "underuse_started" in {m.group(1) for m in EVENT_LINE.finditer(cli_log.read_text())},
                what="flexmigd's own underuse event (the idle 3g on GPU 0; the fragmentation ones come first)",
            )
            await until(lambda: set(emitted_ids(cli_log)) <= set(watcher.ids()), what="flexmigd's events")
            state, state_retained = await retained(broker.port, "flexmig/v1/node-1/state")
        finally:
            cli.send_signal(signal.SIGTERM)
            rc = await asyncio.wait_for(cli.wait(), WAIT)
        await until(lambda: watcher.statuses[-1] == "offline", what="offline after SIGTERM")
        stopped_status = (await retained(broker.port, "flexmig/v1/node-1/status"))[0]
        await cancel(watcher.task)  # type: ignore[arg-type]
        return {
            "churned": churned, "left_at_kill": left, "from_cli": emitted_ids(cli_log), "watcher": watcher,
            "killed_status": killed_status, "stopped_status": stopped_status, "rc": rc, "state": state,
            "state_retained": state_retained, "outbox_after": Outbox(outbox).ids(),
        }  # fmt: skip

    try:
        r = asyncio.run(scenario())
    finally:
        broker.stop()
    watcher: Watcher = r["watcher"]  # type: ignore[assignment]
    churned, from_cli = r["churned"], r["from_cli"]
    assert isinstance(churned, list) and isinstance(from_cli, list)
    emitted = churned + from_cli
    received = watcher.ids()

    assert len(churned) >= 20, "the churning daemon should have emitted events throughout"
    assert {e.kind.value for e in watcher.events} >= {
        "instance_created", "instance_destroyed", "fragmentation_above", "fragmentation_below", "underuse_started",
    }  # fmt: skip
    assert len(received) == len(set(received))  # exactly once after de-duplication
    assert set(emitted) <= set(received)  # none lost: the SIGKILL left some in the outbox, the restart sent them
    # at most one event can be stored but not yet logged when SIGKILL lands between the two
    assert len(set(received) - set(emitted)) <= 1
    assert set(watcher.deliveries) == set(received)  # redeliveries, if any, were only duplicates
    assert r["outbox_after"] == []
    for event in watcher.events:
        event_schema.validate(event.to_dict())
        assert event.node == "node-1"

    assert r["killed_status"] == b"offline"  # the broker published the last will
    assert r["rc"] == 0 and r["stopped_status"] == b"offline"  # a clean stop says so itself
    assert "Traceback" not in cli_log.read_text()

    state = json.loads(r["state"])  # type: ignore[arg-type]
    assert r["state_retained"] is True
    validator("state.v1.schema.json").validate(state)
    assert [(g["index"], g["layout"]) for g in state["gpus"]] == [(0, "3g.71gb@0"), (1, "3g.71gb@0")]
    assert state["fragmentation"]["external_score"] == pytest.approx(0.2)
    # both lone 3g.71gb@0 would leave room for a 4g if moved to slice 4: recoverable 4 of 7 slices, fragmented
    assert state["fragmentation"]["recoverable_compute_slices"] == 8
    assert {f["kind"] for f in state["findings"]} == {"idle", "fragmentation"}


# ---------------------------------------------------------------------------------------------- bad input


def mqtt_problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("flexmig.mqtt.publisher") and r.levelno >= 30]


async def churn_and_watch_sampling(daemon: Daemon, changes: int = 4) -> tuple[float, float]:
    """Create and destroy an instance ``changes`` times, then watch the publisher fail to connect twice more; returns
    flexmig_sweeps_total at the first of those failed attempts and at the second, so a test can see sampling went on
    while the publisher retried (nothing here waits for a sweep in between)."""
    nvml = nvml_of(daemon)
    for _ in range(changes // 2):
        device = await daemon.worker.call(nvml.create_instance, 1, "1g.18gb", 4)
        await sweeps(daemon, 2)
        await daemon.worker.call(nvml.destroy_instance, 1, device.gpu_instance_id)
        await sweeps(daemon, 2)
    assert daemon.components.mqtt is not None
    publisher = daemon.components.mqtt.publisher
    seen = publisher.stats().connect_failures_total
    await until(
        lambda: publisher.stats().connect_failures_total > seen, what="a failed connection attempt of the publisher"
    )
    before = values(await scrape(daemon), "flexmig_sweeps_total")[0]
    seen = publisher.stats().connect_failures_total
    await until(lambda: publisher.stats().connect_failures_total > seen, what="the publisher's next attempt")
    return before, values(await scrape(daemon), "flexmig_sweeps_total")[0]


def daemon_config(broker: str, outbox: Path, extra: str = "") -> str:
    return (
        'node_name = "node-1"\n[sampling]\ninterval_s = 0.05\n'
        f'[mqtt]\nenabled = true\nbroker = "{broker}"\noutbox = "{outbox}"\n{extra}'
    )


def event_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m.group(2) for r in caplog.records if (m := EVENT_LINE.search(f"{r.name}: {r.getMessage()}"))]


def test_an_unreachable_broker_gives_one_clear_line_and_the_daemon_samples_on_and_keeps_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()  # nothing listens there
    cfg = parse_config(daemon_config(f"127.0.0.1:{port}", tmp_path / "outbox.sqlite3"), "flexmig.toml")

    async def scenario() -> tuple[float, float, dict[str, list[tuple[dict[str, str], float]]], list[str]]:
        async with running(SPEC, cfg) as daemon:
            before, after = await churn_and_watch_sampling(daemon)
            series = await scrape(daemon)
            assert daemon.components.mqtt is not None
            return before, after, series, daemon.components.mqtt.outbox.ids()

    before, after, series, stored = asyncio.run(scenario())
    (problem,) = mqtt_problems(caplog)
    assert f"MQTT broker 127.0.0.1:{port} is unreachable" in problem
    assert after > before  # sampling went on while the publisher retried
    emitted = event_lines(caplog)
    assert len(emitted) == 4 and stored == emitted  # created, destroyed, created, destroyed: all in the outbox
    assert values(series, "flexmig_mqtt_connected") == [0.0]
    assert values(series, "flexmig_mqtt_outbox_events") == [4.0]
    assert values(series, "flexmig_mqtt_connect_failures_total")[0] >= 1
    assert values(series, "flexmig_mqtt_events_emitted_total", kind="instance_created") == [2.0]
    assert Outbox(tmp_path / "outbox.sqlite3").ids() == emitted  # on disk, for the next run


def test_bad_credentials_give_one_clear_line_and_the_daemon_samples_on_and_keeps_every_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    passwd = tmp_path / "passwd"
    passwd.write_text("flexmig:right\n")
    subprocess.run(["mosquitto_passwd", "-U", str(passwd)], check=True, timeout=WAIT)
    broker = Mosquitto(tmp_path, extra=f"allow_anonymous false\npassword_file {passwd}\n").start()
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-right\n")
    wrong.chmod(0o600)
    extra = f'username = "flexmig"\npassword_file = "{wrong}"\n'
    cfg = parse_config(daemon_config(broker.address, tmp_path / "outbox.sqlite3", extra), "flexmig.toml")

    async def scenario() -> tuple[float, float, list[str]]:
        async with running(SPEC, cfg) as daemon:
            before, after = await churn_and_watch_sampling(daemon)
            assert daemon.components.mqtt is not None
            return before, after, daemon.components.mqtt.outbox.ids()

    try:
        before, after, stored = asyncio.run(scenario())
    finally:
        broker.stop()
    (problem,) = mqtt_problems(caplog)
    assert f"MQTT broker {broker.address} refused the login of user 'flexmig'" in problem
    assert "not-right" not in caplog.text  # never the password
    assert after > before
    assert stored == event_lines(caplog) and len(stored) == 4


def test_a_malformed_broker_address_at_start_keeps_sampling_and_every_event_until_a_reload_fixes_it(
    tmp_path: Path,
) -> None:
    """flexmigd starts on a file whose only problem is ``mqtt.broker``: one error line names the file, line and
    key; it samples and detects on and stores its events; a SIGHUP with a valid address publishes them all."""
    broker = Mosquitto(tmp_path).start()
    outbox = tmp_path / "outbox.sqlite3"
    config = write_config(tmp_path / "flexmig.toml", "broker-without-port", outbox)
    port = free_port()
    log = tmp_path / "flexmigd.log"
    check = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "config", "check", str(config)],
        capture_output=True, text=True, timeout=WAIT, check=False,
    )  # fmt: skip

    async def scenario() -> dict[str, object]:
        watcher = Watcher(broker)
        await watcher.start()
        with log.open("wb") as out:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flexmig.daemon", "--sim", SPEC, "--config", str(config),
                "--metrics-addr", f"127.0.0.1:{port}", stderr=out, stdout=out, env={**os.environ, "NOTIFY_SOCKET": ""},
            )  # fmt: skip
        try:
            await until(lambda: len(emitted_ids(log)) >= 1, what="an event while publishing is off")
            # The first sweep's events may come before the metrics server is up: wait for the daemon to say so.
            await until(lambda: " up: " in log.read_text(), what="flexmigd up, its metrics served")
            sweeps_before = sweeps_total(port)
            await until(lambda: sweeps_total(port) >= sweeps_before + 5, what="sampling to go on")
            stored = Outbox(outbox).ids()
            before_fix = emitted_ids(log)
            assert watcher.events == [] and child.returncode is None
            write_config(config, broker.address, outbox)
            child.send_signal(signal.SIGHUP)
            await until(lambda: set(before_fix) <= set(watcher.ids()), what="the stored events after the fix")
            await until(lambda: len(Outbox(outbox)) == 0, what="the outbox to drain")
        finally:
            child.send_signal(signal.SIGTERM)
            rc = await asyncio.wait_for(child.wait(), WAIT)
        await cancel(watcher.task)  # type: ignore[arg-type]
        return {"stored": stored, "before_fix": before_fix, "received": watcher.ids(), "rc": rc}

    try:
        r = asyncio.run(scenario())
    finally:
        broker.stop()
    text = log.read_text()
    assert check.returncode == 2, "flexmig config check still calls it an error"
    assert f"{config}:8: mqtt.broker: 'broker-without-port' is not host:port" in check.stdout + check.stderr
    off = [line for line in text.splitlines() if "MQTT publishing is off" in line]
    assert len(off) == 1, off
    assert off[0].endswith(
        f"{config}:8: mqtt.broker: 'broker-without-port' is not host:port (write IPv6 hosts in brackets: "
        f"[::1]:9400); MQTT publishing is off until it is fixed (SIGHUP after fixing); events wait in the outbox "
        f"{outbox}"
    )
    assert " ERROR " in off[0]
    assert r["stored"] == r["before_fix"], "every event emitted while off waited in the outbox"
    assert isinstance(r["before_fix"], list) and isinstance(r["received"], list)
    assert set(r["before_fix"]) <= set(r["received"])
    assert f"MQTT broker address fixed by the reload: publishing to {broker.address}" in text
    assert "configuration reloaded: mqtt.broker" in text and "at next restart: mqtt.broker" not in text
    assert r["rc"] == 0 and "Traceback" not in text


def sweeps_total(port: int) -> float:
    """flexmig_sweeps_total from flexmigd's /metrics."""
    value = sample(http_get(f"http://127.0.0.1:{port}/metrics").decode(), "flexmig_sweeps_total")
    return value if value is not None else -1.0


def test_any_other_problem_beside_a_malformed_broker_address_still_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "flexmig.toml"
    config.write_text(daemon_config("broker-without-port", tmp_path / "outbox.sqlite3", "keepalive_s = 1\n"))
    config.chmod(0o600)
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--config", str(config)],
        capture_output=True, text=True, timeout=WAIT, env={**os.environ, "NOTIFY_SOCKET": ""}, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{config}:6: mqtt.broker: 'broker-without-port' is not host:port" in proc.stderr
    assert f"{config}:8: mqtt.keepalive_s: 1 is out of range" in proc.stderr
    assert not (tmp_path / "outbox.sqlite3").exists()  # nothing started, nothing written


def test_a_malformed_broker_address_in_a_reload_is_one_clear_line_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outbox = tmp_path / "outbox.sqlite3"
    path = tmp_path / "flexmig.toml"
    path.write_text(daemon_config(f"127.0.0.1:{free_port()}", outbox))
    path.chmod(0o600)

    async def scenario() -> tuple[bool, float, float, list[str]]:
        daemon = Daemon(
            load_config(path), sim_spec=SPEC, sim_workload=False, config_path=path, metrics_addr=LOOPBACK_ANY
        )
        async with started(daemon):
            path.write_text(daemon_config("[::1:1883", outbox))
            ok = daemon.reload()
            before, after = await churn_and_watch_sampling(daemon, changes=2)
            assert daemon.components.mqtt is not None
            return ok, before, after, daemon.components.mqtt.outbox.ids()

    ok, before, after, stored = asyncio.run(scenario())
    refused = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
    assert not ok
    assert len(refused) == 1 and "mqtt.broker" in refused[0] and str(path) in refused[0]
    assert after > before
    assert stored == event_lines(caplog) and len(stored) == 2


def test_an_outbox_that_cannot_be_opened_stops_the_start_up_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "flexmig.toml"
    missing = tmp_path / "no-such-dir" / "outbox.sqlite3"
    config.write_text(daemon_config("127.0.0.1:1883", missing))
    config.chmod(0o600)
    proc = subprocess.run(
        [sys.executable, "-m", "flexmig.daemon", "--sim", "h200", "--config", str(config)],
        capture_output=True, text=True, timeout=WAIT, env={**os.environ, "NOTIFY_SOCKET": ""}, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"outbox {missing}: cannot open" in proc.stderr


def test_a_reload_says_mqtt_changes_wait_for_the_next_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="flexmig.daemon")
    path = tmp_path / "flexmig.toml"
    path.write_text(daemon_config("127.0.0.1:1883", tmp_path / "outbox.sqlite3"))
    path.chmod(0o600)
    daemon = Daemon(load_config(path), sim_spec="h200", config_path=path)
    mqtt = daemon.components.mqtt
    assert mqtt is not None
    asyncio.run(mqtt.start())  # the publisher exists once its component started
    try:
        path.write_text(daemon_config("127.0.0.1:1884", tmp_path / "outbox.sqlite3"))
        assert daemon.reload()
        assert any("at next restart: mqtt.broker" in r.getMessage() for r in caplog.records)
        assert mqtt.publisher.settings.broker == "127.0.0.1:1883"  # the running publisher is kept
    finally:
        asyncio.run(mqtt.close())
