"""A real mosquitto (Debian package) for tests: started on a free loopback port, stopped by whoever started it, and
the bounded-wait helpers the MQTT tests share. The fixtures ``broker``, ``secured_broker`` and ``mosquitto`` (in
``conftest.py``) start them through :class:`Brokers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from support.wait import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
WAIT = 30.0  # the bound on every wait against the broker, in seconds
needs_mosquitto = pytest.mark.skipif(not os.path.exists(MOSQUITTO), reason="mosquitto is not installed (make debs)")

#: The accounts of a secured broker (user -> password).
PASSWORDS = {
    "node-1": "node-pass-Zq8",
    "node-2": "node-pass-Yr2",
    "node-3": "node-pass-Vt6",
    "operator": "op-pass-Xk3",
    "viewer": "view-pass-Wm5",
}

#: The ACL of the README's Security section, for node "node-1" (test_commands_mosquitto checks the README has it).
ACL = """\
# The node reads its own commands and writes its results, status, state and events.
pattern read flexmig/v1/%u/commands/+
pattern write flexmig/v1/%u/commands/result
pattern write flexmig/v1/%u/status
pattern write flexmig/v1/%u/state
pattern write flexmig/v1/%u/events/#

# Operators send commands to any node and read everything.
user operator
topic write flexmig/v1/+/commands/+
topic read flexmig/v1/#

# Everyone else with an account only reads.
user viewer
topic read flexmig/v1/#
"""


def secured_config(workdir: Path) -> str:
    """The configuration lines of a mosquitto that refuses anonymous clients, knows :data:`PASSWORDS` and applies
    :data:`ACL` (its password and ACL files are written under ``workdir``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    passwd = workdir / "passwd"
    passwd.write_text("".join(f"{user}:{password}\n" for user, password in PASSWORDS.items()))
    subprocess.run(["mosquitto_passwd", "-U", str(passwd)], check=True, timeout=WAIT)
    acl = workdir / "flexmig.acl"
    acl.write_text(ACL)
    return f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl}\nset_tcp_nodelay true\n"


class Mosquitto:
    """A mosquitto on 127.0.0.1 with its own configuration, persistence and log under ``workdir``."""

    def __init__(self, workdir: Path, extra: str = "", port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = workdir / f"mosquitto-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "user root\n"  # as root, mosquitto would drop to user mosquitto and could not write under tmp_path
            f"persistence true\npersistence_location {self.dir}/\n"
            f"log_dest file {self.dir}/mosquitto.log\n" + (extra or "allow_anonymous true\n")
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        """Start it (again, on the same port and persistence) and wait until it accepts connections."""
        proc = self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                assert proc.stderr is not None
                raise RuntimeError(f"mosquitto exited: {proc.stderr.read().decode(errors='replace')}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {WAIT} s")

    def stop(self) -> None:
        """SIGTERM (mosquitto saves its persistent sessions), SIGKILL after :data:`WAIT`; nothing if not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None

    def log(self) -> str:
        """Everything the broker logged so far (connections, refused logins: the broker's own account)."""
        path = self.dir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Brokers:
    """Starts mosquittos under ``workdir`` (``brokers()``, ``brokers(extra)``, ``brokers(secured=True)``) and stops
    every one it started at :meth:`close`: the factory behind the broker fixtures."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Mosquitto] = []

    def __call__(self, extra: str = "", *, secured: bool = False, port: int | None = None) -> Mosquitto:
        """A started mosquitto: anonymous, or with ``extra`` configuration lines instead, or ``secured`` (passwords
        and the ACL, then ``extra``)."""
        if secured:
            extra = secured_config(self.workdir / "secured") + extra
        broker = Mosquitto(self.workdir, extra=extra, port=port)
        self.started.append(broker)
        return broker.start()

    def close(self) -> None:
        """Stop every broker started here (bounded)."""
        for broker in self.started:
            broker.stop()


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait (bounded) for each to finish."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(t, WAIT)
