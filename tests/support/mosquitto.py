"""A real mosquitto (Debian package) for tests: started on a free loopback port, stopped by the test, and the
bounded-wait helpers the MQTT tests share. Not a test module: imported by ``test_mqtt_*`` and ``test_daemon_mqtt*``.
"""

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
WAIT = 30.0  # the bound on every wait against the broker, in seconds
needs_mosquitto = pytest.mark.skipif(not os.path.exists(MOSQUITTO), reason="mosquitto is not installed (make debs)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mosquitto:
    """A mosquitto on 127.0.0.1 with its own configuration, persistence and log under ``workdir``."""

    def __init__(self, workdir: Path, extra: str = "", port: int | None = None):
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
        self.proc = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited: {self.proc.stderr.read().decode(errors='replace')}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {WAIT} s")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: mosquitto saves its persistent sessions
            try:
                self.proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT)
        if self.proc is not None:
            self.proc.stderr.close()
        self.proc = None


async def until(predicate, what, limit=WAIT):
    """Wait until ``predicate()`` is true, at most ``limit`` seconds (AssertionError naming ``what`` after)."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit} s waiting for {what}")
        await asyncio.sleep(0.02)


async def cancel(*tasks):
    """Cancel ``tasks`` and wait (bounded) for each to finish."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(t, WAIT)
