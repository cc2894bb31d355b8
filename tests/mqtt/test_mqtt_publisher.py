"""The publisher's parts that need no broker: settings, topics, backoff and the one-line-per-failure log."""

import logging
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytest import LogCaptureFixture

from flexmig.config import MqttConfig, parse_config
from flexmig.errors import ConfigError
from flexmig.mqtt.broker import backoff_delay
from flexmig.mqtt.publisher import PublisherSettings, _FailureLog, topic_for


def test_topics_live_under_prefix_and_node() -> None:
    assert topic_for("flexmig/v1", "gpu-node-3", "events/gpu_lost") == "flexmig/v1/gpu-node-3/events/gpu_lost"


def test_the_client_id_is_stable_per_node() -> None:
    assert PublisherSettings(node="n7").identifier == "flexmig-n7"
    assert PublisherSettings(node="n7", client_id="custom").identifier == "custom"


@pytest.mark.parametrize("node", ["a/b", "+", "#", "", "x y"])
def test_a_node_name_with_topic_syntax_is_refused(node: str) -> None:
    with pytest.raises(ConfigError, match="node name"):
        PublisherSettings(node=node)


@pytest.mark.parametrize("prefix", ["flexmig/+", "flexmig//v1", "/flexmig", "a/#"])
def test_a_topic_prefix_with_wildcards_or_empty_levels_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="topic prefix"):
        PublisherSettings(node="n1", topic_prefix=prefix)


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        PublisherSettings(node="n1", tls=True, tls_cert=Path("/etc/c.pem"))


def test_settings_come_from_the_daemon_configuration() -> None:
    cfg = parse_config(
        '[mqtt]\nenabled = true\nbroker = "broker.example:8883"\ntls = true\nusername = "node"\n', "x.toml"
    ).mqtt
    assert isinstance(cfg, MqttConfig)
    s = PublisherSettings.from_config(cfg, node="n1")
    assert (s.broker, s.tls, s.username, s.identifier) == ("broker.example:8883", True, "node", "flexmig-n1")


@given(st.integers(1, 10_000), st.floats(0.01, 10.0), st.floats(10.0, 600.0), st.integers(0, 2**32))
def test_backoff_is_bounded_and_never_below_half_its_step(failures: int, initial: float, cap: float, seed: int) -> None:
    d = backoff_delay(failures, initial, cap, random.Random(seed))
    step = min(cap, initial * 2 ** min(failures - 1, 32))
    assert step / 2 <= d <= step <= cap


def test_backoff_grows_exponentially_up_to_its_cap() -> None:
    rng = random.Random(1)
    steps = [backoff_delay(n, 1.0, 60.0, rng) for n in range(1, 10)]
    assert steps[0] <= 1.0 and 32.0 <= steps[-1] <= 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_failure_is_logged_once_then_counted(caplog: LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="t")
    clock = Clock()
    flog = _FailureLog(logging.getLogger("t"), repeat_s=600, clock=clock)
    for _ in range(50):
        flog.failure("unreachable", "broker is unreachable")
        clock.now += 1
    assert [r.getMessage() for r in caplog.records] == ["broker is unreachable"]
    clock.now += 600
    flog.failure("unreachable", "broker is unreachable")
    assert caplog.records[-1].getMessage() == "broker is unreachable (49 more since 600 s ago)"


def test_a_different_failure_or_one_after_a_success_is_logged_at_once(caplog: LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="t")
    flog = _FailureLog(logging.getLogger("t"), repeat_s=600, clock=Clock())
    flog.failure("unreachable", "down")
    flog.failure("auth", "refused")
    flog.failure("auth", "refused again")  # the same kind within repeat_s: counted, not logged
    flog.reset()  # a success came between (the publisher connected)
    flog.failure("auth", "refused after a success")
    assert [r.getMessage() for r in caplog.records] == ["down", "refused", "refused after a success"]
