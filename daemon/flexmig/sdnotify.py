"""sd_notify(3) without libsystemd: READY, STATUS, WATCHDOG, STOPPING and RELOADING for a ``Type=notify`` unit.

The protocol is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named in ``$NOTIFY_SOCKET`` (a leading
``@`` means the Linux abstract namespace). Outside systemd the variable is unset and every call is a no-op that
returns False, so the daemon needs no "am I under systemd" branch.

:class:`Watchdog` feeds ``WATCHDOG=1`` only while a heartbeat (the monotonic time of the last completed sampling
sweep) is fresh, so a wedged NVML call stops the pings and systemd restarts the daemon after ``WatchdogSec=``.
:class:`NotifyReceiver` is the other end of the socket, for tests and for supervisors that are not systemd.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path

__all__ = [
    "SYSTEMD_ENV_KEYS",
    "Heartbeat",
    "Notifier",
    "NotifyReceiver",
    "Watchdog",
    "parse_message",
    "watchdog_timeout_s",
]

_log = logging.getLogger(__name__)

#: The variables systemd hands the main process; a job launcher removes them from a job's environment.
SYSTEMD_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _socket_address(value: str) -> str | None:
    """The ``connect()`` address for a ``$NOTIFY_SOCKET`` value; None for kinds we do not speak (``vsock:``)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdog_timeout_s(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """The watchdog timeout systemd asked for (``WatchdogSec=``), in seconds, or None when there is none.

    Reads ``WATCHDOG_USEC``; when ``WATCHDOG_PID`` is set it must be ``pid`` (default: this process), because the
    variables may have been inherited by a child that is not the service's main process. Malformed or
    non-positive values count as no watchdog. Ping at half this interval, as sd_watchdog_enabled(3) advises.
    """
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    target = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    if target and (not target.isdigit() or int(target) != (os.getpid() if pid is None else pid)):
        return None
    return int(usec) / 1_000_000


def _clean(value: str) -> str:
    """One line of text: a newline in a STATUS would start a new assignment (``READY=1``, ``MAINPID=``)."""
    return " ".join(value.replace("\0", " ").splitlines())


class Notifier:
    """Sends notifications to the service manager; every method is a no-op returning False without a socket.

    Sending never raises: a service manager that went away (or a full socket queue) is logged once at debug
    level and reported as False, because a notification must never take the daemon down.
    """

    def __init__(self, notify_socket: str | None, watchdog_timeout_s: float | None = None) -> None:
        self._address = _socket_address(notify_socket) if notify_socket else None
        self._sock: socket.socket | None = None
        #: The ``WatchdogSec=`` systemd asked for (seconds), read when the notifier was made; None: no watchdog.
        self.watchdog_timeout_s = watchdog_timeout_s

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None, *, unset: bool = False) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET``, with the watchdog timeout of ``$WATCHDOG_USEC``/``$WATCHDOG_PID``.

        With ``unset`` the systemd variables are then removed from ``env`` (sd_notify's ``unset_environment``).
        It is off by default because later readers of the environment would find no watchdog; job launchers
        should rather build each job's environment without :data:`SYSTEMD_ENV_KEYS`.
        """
        env = os.environ if env is None else env
        value = env.get("NOTIFY_SOCKET")
        timeout = watchdog_timeout_s(env)
        if unset:
            for key in SYSTEMD_ENV_KEYS:
                env.pop(key, None)
        return cls(value, timeout)

    @property
    def enabled(self) -> bool:
        """True when there is a socket to send to."""
        return self._address is not None

    def notify(self, *assignments: str, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram; keyword arguments become ``KEY=value`` lines."""
        if self._address is None:
            return False
        lines = [_clean(a) for a in assignments] + [f"{k}={_clean(str(v))}" for k, v in fields.items()]
        payload = "\n".join(lines).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            _log.debug("sd_notify to %r failed: %s", self._address, exc)
            self.close()
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: start-up is complete (send it after the first inventory)."""
        return self.notify("READY=1", **({"STATUS": status} if status is not None else {}))

    def status(self, text: str) -> bool:
        """``STATUS=...``: a one-line summary that ``systemctl status`` shows."""
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the daemon is alive. Prefer :class:`Watchdog`, which pings only while sampling works."""
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown began (on SIGTERM, before rolling back the action in flight)."""
        return self.notify("STOPPING=1", **({"STATUS": status} if status is not None else {}))

    def reloading(self, monotonic_usec: int | None = None) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC`` (on SIGHUP); send :meth:`ready` when the reload is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 if monotonic_usec is None else monotonic_usec
        return self.notify("RELOADING=1", MONOTONIC_USEC=usec)

    def close(self) -> None:
        """Close the socket (a later call opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __repr__(self) -> str:
        return f"Notifier({self._address!r}, watchdog_timeout_s={self.watchdog_timeout_s!r})"


class Heartbeat:
    """The monotonic time of the last completed sampling sweep; the sampling loop calls :meth:`beat`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last: float | None = None

    def beat(self, now: float | None = None) -> None:
        """Record a completed sweep (``now`` defaults to the clock)."""
        self.last = self._clock() if now is None else now

    def __call__(self) -> float | None:
        return self.last


class Watchdog:
    """Feeds the systemd watchdog only while the heartbeat is fresh.

    ``heartbeat()`` returns the monotonic time of the last completed sweep (None before the first); it is fresh
    when ``clock() - heartbeat() <= max_age_s``. :meth:`tick` pings when fresh and otherwise stays silent, so
    systemd kills and restarts a daemon whose sampling loop is wedged. On the change to stale it sends one
    STATUS line saying so, and logs it; on recovery it logs that too.
    """

    def __init__(
        self,
        notifier: Notifier,
        heartbeat: Callable[[], float | None],
        *,
        timeout_s: float | None,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.heartbeat = heartbeat
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.clock = clock
        self.pings = 0
        self.ticks = 0
        self.stalled = False

    @property
    def interval_s(self) -> float | None:
        """Seconds between two ticks: half the timeout; None when systemd asked for no watchdog."""
        return None if self.timeout_s is None else self.timeout_s / 2

    def fresh(self) -> bool:
        """True when the last sweep finished at most ``max_age_s`` ago."""
        last = self.heartbeat()
        return last is not None and self.clock() - last <= self.max_age_s

    def tick(self) -> bool:
        """Ping if the heartbeat is fresh; returns whether a ping was sent."""
        self.ticks += 1
        last = self.heartbeat()
        if last is not None and self.clock() - last <= self.max_age_s:
            if self.stalled:
                _log.warning("sampling loop recovered; feeding the watchdog again")
                self.stalled = False
            if self.notifier.watchdog():
                self.pings += 1
                return True
            return False
        if not self.stalled and last is not None:
            self.stalled = True
            age = self.clock() - last
            _log.error("sampling loop stalled for %.1f s; no longer feeding the watchdog", age)
            self.notifier.status(f"sampling loop stalled for {age:.0f} s; watchdog not fed")
        return False

    async def run(self) -> None:
        """Tick every :attr:`interval_s` until cancelled; returns at once when there is no watchdog."""
        interval = self.interval_s
        if interval is None or not self.notifier.enabled:
            return
        while True:
            self.tick()
            await asyncio.sleep(interval)


def parse_message(data: bytes) -> dict[str, str]:
    """The assignments of one notification datagram (``b"READY=1\\nSTATUS=x"`` -> ``{"READY": "1", ...}``)."""
    out: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


class NotifyReceiver:
    """A bound notification socket: the service manager's side, for tests and non-systemd supervisors.

    ``address`` is a filesystem path, or ``@name`` for an abstract socket; :attr:`env_value` is what to put in
    the child's ``NOTIFY_SOCKET``. Use as a context manager; :meth:`receive` waits at most ``timeout_s``.
    """

    def __init__(self, address: str | Path) -> None:
        self.env_value = str(address)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        bind_to = _socket_address(self.env_value)
        if bind_to is None:
            self._sock.close()
            raise ValueError(f"not a unix socket address: {self.env_value!r}")
        self._sock.bind(bind_to)

    def receive(self, timeout_s: float) -> dict[str, str] | None:
        """The next notification, or None when none came within ``timeout_s``."""
        self._sock.settimeout(max(timeout_s, 0.001))  # 0 would mean non-blocking, not "wait no longer"
        try:
            data = self._sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return None
        return parse_message(data)

    def close(self) -> None:
        """Close and, for a path socket, unlink it."""
        self._sock.close()
        if self.env_value.startswith("/"):
            with contextlib.suppress(FileNotFoundError):
                Path(self.env_value).unlink()

    def __enter__(self) -> NotifyReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
