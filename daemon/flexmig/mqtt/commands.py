"""The MQTT command listener: operators ask a node to migrate, re-split or stop a job (or plan now) through the broker.

Off by default: the listener exists only with ``[mqtt] enabled = true`` and ``commands_enabled = true``, and it
refuses to start without broker credentials (``username`` and ``password_file``), or without TLS to a broker that
is not on loopback unless ``allow_plaintext_password = true`` says so. Its own login proves nothing about who else
may publish, so at every connection it first checks, as an anonymous client and as the node's own account, that
neither can publish commands (:mod:`flexmig.mqtt.command_guard`): if one can, one error line says so and commands
stay off until flexmigd restarts. Topics under ``<prefix>/<node>/``:

* ``commands/<verb>`` (in, QoS 1): one JSON object per command, checked by :mod:`flexmig.mqtt.command_schema`;
  the verb is the topic's last level, so broker ACLs can grant verbs one by one.
* ``commands/result`` (out, QoS 1, not retained): one JSON result per command, carrying the command's ``id``.

A valid command is forwarded as a control request line to the same dispatcher as the control socket
(:meth:`flexmig.act.control.ControlServer.dispatch`), so the same argument checks and the same mode rules apply: in
``observe`` and ``advise`` nothing is executed. Retained commands are refused (they would run again at every
reconnect), repeated IDs are not run twice, and the session is clean, so commands sent while the daemon was away
are not run later. Every refusal is one log line naming the topic and why, and a result message (an empty payload
is no command: it is how a retained message is cleared, and is ignored); nothing a publisher sends ends the
listener.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiomqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from flexmig.act.control import MAX_DEADLINE_S
from flexmig.config import HostPort
from flexmig.errors import BrokerAclError, ConfigError
from flexmig.mqtt.broker import (
    ConnectionFailure,
    ConnectionSettings,
    check_node_topics,
    client_arguments,
    connection_fields,
    reconnect_forever,
    refused_login,
)
from flexmig.mqtt.cancellation import honour_cancel
from flexmig.mqtt.command_guard import CommandGuard, command_topics
from flexmig.mqtt.command_schema import VERBS, Command, CommandRefusedError, parse_command, printable, result_document
from flexmig.mqtt.droplog import DropLog
from flexmig.mqtt.events import Deduplicator
from flexmig.mqtt.publisher import topic_for

if TYPE_CHECKING:
    from flexmig.config import Config

__all__ = ["CommandListener", "CommandSettings", "CommandStats", "Dispatch", "command_listener"]

log = logging.getLogger(__name__)

Dispatch = Callable[[bytes], Awaitable[Mapping[str, Any]]]
"""Runs one control request line and answers ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...,
"type": ...}`` without raising: :meth:`flexmig.act.control.ControlServer.dispatch`."""


# -------------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSettings(ConnectionSettings):
    """Where the listener connects and its limits (the login and retry fields are :class:`ConnectionSettings`');
    :meth:`from_config` builds it from ``[mqtt]``.

    Construction refuses (ConfigError naming the ``mqtt.*`` key) anonymous connections (``username`` and
    ``password_file`` are both needed), and a password sent without TLS to a broker off this machine unless
    ``allow_plaintext_password``.
    """

    node: str
    broker: HostPort
    topic_prefix: str = "flexmig/v1"
    client_id: str = ""
    """Empty: ``flexmig-<node>-commands`` (the publisher uses ``flexmig-<node>``; the broker allows one each)."""
    allow_plaintext_password: bool = False
    publish_timeout_s: float = 10.0
    max_pending: int = 16
    """Commands accepted but not yet run; more are refused as Busy (commands run one at a time)."""
    max_wait_s: float = 900.0
    """Longest a command may wait to begin, counted from its arrival (``control.max_wait_s``): it waits here behind
    the commands before it, then in the daemon behind the action in flight; past it, it is dropped unrun
    (:mod:`flexmig.act.deadline`) and its result says so."""
    max_unsent_results: int = 1000
    """Results waiting for the broker (while it is away, or slower than the commands come); past this many the
    oldest are dropped, counted (``CommandStats.results_dropped``) and logged at most once a minute."""
    refusal_log_limit: int = 100
    """At most this many refusal lines per ``refusal_log_window_s``; the rest are counted in the next line."""
    refusal_log_window_s: float = 60.0

    def __post_init__(self) -> None:
        check_node_topics(self.node, self.topic_prefix)
        if self.client_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.client_id):
            raise ConfigError(f"MQTT client ID {self.client_id!r}: 1-64 of [A-Za-z0-9._-]")
        if self.username is None or self.password_file is None:
            raise ConfigError(
                "mqtt.commands_enabled: commands need broker credentials (mqtt.username and mqtt.password_file); "
                "an anonymous connection could be anyone's"
            )
        if not self.tls and not self.broker.is_loopback() and not self.allow_plaintext_password:
            raise ConfigError(
                f"mqtt.commands_enabled: the password would cross the network in clear to {self.broker}; "
                "set mqtt.tls = true (or mqtt.allow_plaintext_password = true)"
            )
        ConnectionSettings.__post_init__(self)  # the TLS pair, the backoff
        if self.max_pending < 1 or self.max_unsent_results < 1 or self.refusal_log_limit < 1:
            raise ConfigError("MQTT commands: max_pending, max_unsent_results and refusal_log_limit must be >= 1")
        if not 0 < self.max_wait_s <= MAX_DEADLINE_S:
            raise ConfigError(f"MQTT commands: max_wait_s must be above 0 and at most {MAX_DEADLINE_S:g}")

    @property
    def identifier(self) -> str:
        """The listener's MQTT client ID."""
        return self.client_id or f"flexmig-{self.node}-commands"

    @property
    def base(self) -> str:
        """``<prefix>/<node>/commands``."""
        return topic_for(self.topic_prefix, self.node, "commands")

    @classmethod
    def from_config(
        cls, config: Config, node: str, trusted_uids: Collection[int] | None = None, **limits: Any
    ) -> CommandSettings:
        """Settings from the daemon's validated configuration (``limits`` overrides the fields after TLS)."""
        m = config.mqtt
        return cls(
            node=node,
            broker=m.broker,
            topic_prefix=m.topic_prefix,
            client_id=f"{m.client_id}-commands" if m.client_id else "",
            allow_plaintext_password=m.allow_plaintext_password,
            max_wait_s=config.control.max_wait_s,
            **connection_fields(m, trusted_uids),
            **limits,
        )


@dataclass(frozen=True, slots=True)
class CommandStats:
    """Counters of the listener (for metrics and ``flexmig status``)."""

    connected: bool
    received: int
    refused: int
    """Refused before running: bad payload or topic, retained, duplicate ID, busy."""
    completed: int
    """Forwarded and answered ok."""
    failed: int
    """Forwarded and answered with an error (the daemon refused it: mode, job state, arguments)."""
    pending: int
    results_dropped: int = 0
    """Results dropped unsent, oldest first, because ``max_unsent_results`` were already waiting."""
    off: str | None = None
    """Why commands are off until flexmigd restarts (the broker let strangers publish them), or None."""


@dataclass
class _RefusalLog:
    """One log line per refusal, at most ``limit`` per ``window_s``; the suppressed ones are counted."""

    logger: logging.Logger
    limit: int
    window_s: float
    clock: Callable[[], float]
    _start: float = field(default=-1e300)
    _lines: int = 0
    _suppressed: int = 0

    def line(self, message: str) -> None:
        now = self.clock()
        if now - self._start >= self.window_s:
            self._start, self._lines = now, 0
        if self._lines >= self.limit:
            self._suppressed += 1
            return
        if self._suppressed:
            message += f" ({self._suppressed} earlier refusal(s) not logged)"
            self._suppressed = 0
        self._lines += 1
        self.logger.warning("%s", message)


# -------------------------------------------------------------------------------------------------- listener
class CommandListener:
    """Receives commands from the broker, validates them, runs them through ``dispatch`` one at a time, and
    publishes each result. Start :meth:`run` as a task of the daemon's TaskGroup; cancel it to stop."""

    def __init__(
        self,
        settings: CommandSettings,
        dispatch: Dispatch,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.settings = settings
        self._dispatch = dispatch
        self._wall = wall
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not cryptography)
        self._log = logger or log
        self._refusals = _RefusalLog(self._log, settings.refusal_log_limit, settings.refusal_log_window_s, clock)
        self._clock = clock
        self._queue: asyncio.Queue[tuple[str, Command, float]] = asyncio.Queue(settings.max_pending)
        self._results: deque[bytes] = deque()
        self._results_dropped = 0
        self._drops = DropLog(self._log)
        self._results_ready = asyncio.Event()
        self._seen = Deduplicator(10_000)
        self._connected = False
        self._guard: CommandGuard | None = None
        self.off: str | None = None
        """Why commands are off for good (the broker let strangers publish them), or None."""
        self._last_failure: str | None = None
        self._received = self._refused = self._completed = self._failed = 0
        self.filter = f"{settings.base}/+"
        self.result_topic = f"{settings.base}/result"

    def stats(self) -> CommandStats:
        """Counters as of now."""
        return CommandStats(
            self._connected,
            self._received,
            self._refused,
            self._completed,
            self._failed,
            self._queue.qsize(),
            self._results_dropped,
            self.off,
        )

    # ------------------------------------------------------------------------------------------ the loops
    async def run(self) -> None:
        """Listen until cancelled; broker, network, TLS and credential trouble is logged and retried with backoff."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._worker())
            await self._connect_forever()

    async def _connect_forever(self) -> None:
        await reconnect_forever(self.settings, self._session, self._connection_failed, self._rng)

    def _connection_failed(self, failure: ConnectionFailure) -> None:
        text = self._describe(failure.error)
        if text != self._last_failure:  # the same failure again is not logged again
            self._log.warning("MQTT commands: %s; retrying with backoff", text)
            self._last_failure = text

    async def _session(self, connected: Callable[[], None]) -> None:
        """One connection: subscribe, then serve messages and publish results until the connection ends."""
        s = self.settings
        client = aiomqtt.Client(
            **client_arguments(s, s.broker, s.identifier, tls_what="TLS files"),
            # MQTT 5: a clean start with no session expiry, so commands sent while we were away are not run later.
            protocol=aiomqtt.ProtocolVersion.V5,
            clean_start=True,
            # Few, small messages that someone waits for: no Nagle delay on results.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        # retainAsPublished: a live delivery of a retained publish keeps its flag, so every retained command is
        # refused (3.1.1 clears the flag on live deliveries). noLocal: our own results do not come back.
        options = SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True)
        if self.off is not None:  # the broker let strangers command: not again until flexmigd restarts
            await asyncio.Event().wait()
        guard = CommandGuard(s, s.broker, s.identifier, command_topics(s.base, VERBS), timeout_s=s.connect_timeout_s)
        async with client:
            await client.subscribe(self.filter, options=options, timeout=s.connect_timeout_s)
            honour_cancel()
            self._guard = guard
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._publish_results(client))
                    tasks.create_task(self._guarded(guard, connected))
                    async for message in client.messages:
                        self._receive(message)
                    raise aiomqtt.MqttError("the broker closed the connection")
            except* BrokerAclError as refused:
                self.off = str(refused.exceptions[0])
                self._log.error("%s", self.off)
            finally:
                self._connected = False
                self._guard = None

    async def _guarded(self, guard: CommandGuard, connected: Callable[[], None]) -> None:
        """Accept commands once the guard has found the command topics closed to strangers; end the session (with
        BrokerAclError) if it finds them open, then or later."""
        await guard.check()
        self._connected = True
        connected()
        self._last_failure = None
        s = self.settings
        others = guard.other_listeners
        if others is None:
            doors = "the broker runs on another machine: only the listener flexmig uses was probed"
        else:
            doors = f"nor anonymous clients on its {len(others)} other listener(s)" if others else "no other listener"
        self._log.info(
            "MQTT commands: listening on %s as %s (results on %s; anonymous clients and the node's own account "
            "cannot publish commands; %s)",
            self.filter,
            s.identifier,
            self.result_topic,
            doors,
        )
        await guard.watch()

    async def _publish_results(self, client: aiomqtt.Client) -> None:
        timeout = self.settings.publish_timeout_s
        while True:
            self._results_ready.clear()
            while self._results:
                # Taken off before it is sent, so that a drop of the oldest while this one is in flight never takes
                # another; put back first unless the broker has acknowledged it.
                result = self._results.popleft()
                try:
                    await client.publish(self.result_topic, result, qos=1, timeout=timeout)
                except BaseException:
                    self._results.appendleft(result)
                    raise
                honour_cancel()
            await self._results_ready.wait()

    async def _worker(self) -> None:
        """Run accepted commands one at a time, outside the connection: a broker that goes away does not cancel
        a migration halfway; its result is published once the broker is back."""
        while True:
            topic, command, arrived = await self._queue.get()
            answer: Mapping[str, Any]
            left = self.settings.max_wait_s - (self._clock() - arrived)
            try:
                if self.off is not None:
                    answer = {"ok": False, "error": self.off, "type": "CommandRefused"}
                elif left <= 0:  # the daemon would drop it at once: so say so here, and run nothing
                    answer = {"ok": False, "error": self._expired(command), "type": "RequestExpiredError"}
                else:
                    answer = await self._dispatch(command.control_line(left))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # dispatch never raises by contract; a bug must still not end the listener
                self._log.exception("MQTT command %s on %s: the dispatcher failed", command.id, topic)
                answer = {"ok": False, "error": f"internal error: {exc!r}", "type": "InternalError"}
            honour_cancel()
            if answer.get("ok"):
                self._completed += 1
                self._log.info("MQTT command %s %s on %s: done", command.id, command.verb, topic)
            else:
                self._failed += 1
                self._refusals.line(
                    f"MQTT command {command.id} {command.verb} on {topic} refused by the daemon: "
                    f"{answer.get('error')} ({answer.get('type')})"
                )
            self._post(command.id, command.verb, answer)

    # ------------------------------------------------------------------------------------------ messages
    def _receive(self, message: aiomqtt.Message) -> None:
        topic = message.topic.value
        raw = message.payload
        payload = bytes(raw) if isinstance(raw, bytes | bytearray) else str(raw or "").encode()
        if self._guard is not None and self._guard.seen(topic, payload):
            return  # one of the guard's own probes got through: the guard ends the listening
        if topic == self.result_topic:
            return  # our own results come back on the filter: not commands
        self._received += 1
        verb = topic[len(self.settings.base) + 1 :] if topic.startswith(self.settings.base + "/") else ""
        shown = printable(topic, 160)
        if not payload:  # no command: how a retained message is cleared (the broker passes the clearing on)
            self._log.debug("MQTT commands: ignored an empty message on %s", shown)
            return
        try:
            command = parse_command(verb, payload)
        except CommandRefusedError as exc:
            self._refuse(shown, exc.command_id, verb, str(exc), "CommandRefused")
            return
        if message.retain:
            self._refuse(
                shown,
                command.id,
                verb,
                "retained commands are refused (they would run again at every reconnect); clear it by publishing "
                "an empty retained message on this topic",
                "CommandRefused",
            )
            return
        if not self._seen.first_time(command.id):
            self._refuse(
                shown, command.id, verb, f"id {command.id} was already received; not run again", "DuplicateCommand"
            )
            return
        if self._guard is None or not self._guard.passed:
            self._refuse(
                shown,
                command.id,
                verb,
                "not accepting commands yet: checking that the broker keeps others off the command topics; send it "
                "again once the daemon logs 'MQTT commands: listening'",
                "Busy",
            )
            return
        try:
            self._queue.put_nowait((shown, command, self._clock()))
        except asyncio.QueueFull:
            self._refuse(
                shown, command.id, verb, f"{self.settings.max_pending} commands are already waiting; try later", "Busy"
            )
            return
        self._log.info("MQTT command %s %s on %s: accepted %s", command.id, verb, shown, dict(command.args))

    def _refuse(self, shown_topic: str, command_id: str | None, verb: str, why: str, kind: str) -> None:
        self._refused += 1
        who = f"MQTT command {command_id}" if command_id else "MQTT command"
        self._refusals.line(f"{who} on {shown_topic} refused: {why}")
        self._post(command_id, verb, {"ok": False, "error": why, "type": kind})

    def _post(self, command_id: str | None, verb: str | None, answer: Mapping[str, Any]) -> None:
        doc = result_document(self.settings.node, command_id, verb, answer, self._wall())
        self._results.append(json.dumps(doc, separators=(",", ":"), default=str).encode())
        excess = len(self._results) - self.settings.max_unsent_results
        if excess > 0:
            for _ in range(excess):
                self._results.popleft()
            self._results_dropped += excess
            self._drops.dropped(
                "results",
                excess,
                f"MQTT command results not sent on {self.result_topic} (more than "
                f"{self.settings.max_unsent_results} waiting for the broker): oldest dropped",
            )
        self._results_ready.set()

    # ------------------------------------------------------------------------------------------ helpers
    def _expired(self, command: Command) -> str:
        return (
            f"{command.op} dropped: it could not begin within {self.settings.max_wait_s:g} s of its arrival "
            "(control.max_wait_s; it waited behind the commands before it); nothing was done"
        )

    def _describe(self, exc: BaseException) -> str:
        s = self.settings
        text = str(exc) or type(exc).__name__
        if refused_login(exc):
            return (
                f"broker {s.broker} refused the login of user {s.username!r} ({text}): check mqtt.username and "
                "mqtt.password_file"
            )
        if isinstance(exc, ConfigError):
            return f"cannot connect to {s.broker}: {text}"
        return f"broker {s.broker}: {text}"


def command_listener(
    config: Config,
    node: str,
    dispatch: Dispatch,
    *,
    trusted_uids: Collection[int] | None = None,
    logger: logging.Logger | None = None,
) -> CommandListener | None:
    """The daemon's listener, or None unless ``[mqtt] enabled`` and ``commands_enabled`` are both true.

    Raises ConfigError when commands are enabled without credentials, or with a password in clear off-machine.
    """
    if not (config.mqtt.enabled and config.mqtt.commands_enabled):
        return None
    settings = CommandSettings.from_config(config, node, trusted_uids)
    return CommandListener(settings, dispatch, logger=logger)
