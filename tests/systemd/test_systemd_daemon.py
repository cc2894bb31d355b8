"""flexmigd under a service manager: the notifications it sends, and a watchdog that stops when sampling hangs.

A :class:`NotifyReceiver` plays systemd's side of ``NOTIFY_SOCKET``; ``WATCHDOG_USEC`` is what ``WatchdogSec=``
would hand the daemon.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from flexmig.config import Config, PrometheusConfig, SamplingConfig
from flexmig.daemon import Daemon
from flexmig.sdnotify import NotifyReceiver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


def receive_until(rx: NotifyReceiver, key: str, log: list[dict[str, str]], timeout_s: float = 60.0) -> dict[str, str]:
    """Collect notifications into ``log`` until one carries ``key``; fail after ``timeout_s`` without one."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        msg = rx.receive(left)
        if msg is None:
            break
        log.append(msg)
        if key in msg:
            return msg
    raise AssertionError(f"no {key} within {timeout_s} s; got {log[-20:]}")


def test_flexmigd_sends_ready_with_status_then_watchdog_and_stopping_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "flexmig.toml"
    config.write_text(
        "[sampling]\ninterval_s = 0.1\n[prometheus]\nenabled = false\n[control]\nenabled = false\n"
        f'[state]\ndirectory = "{tmp_path}"\njournal = "{tmp_path}/journal.sqlite3"\n'
        f'[mqtt]\noutbox = "{tmp_path}/outbox.sqlite3"\n'
    )
    config.chmod(0o644)
    flexmigd = Path(sys.executable).with_name("flexmigd")
    with NotifyReceiver(f"@flexmig-test-{uuid.uuid4().hex}") as rx:
        env = dict(os.environ, NOTIFY_SOCKET=rx.env_value, WATCHDOG_USEC="1000000")
        proc = subprocess.Popen(
            [str(flexmigd), "--sim", SPEC, "--config", str(config)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        log: list[dict[str, str]] = []
        try:
            ready = receive_until(rx, "READY", log)
            assert ready["READY"] == "1"
            assert "2 GPU" in ready["STATUS"]
            receive_until(rx, "WATCHDOG", log)
            proc.send_signal(signal.SIGTERM)
            receive_until(rx, "STOPPING", log)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)


def drain(rx: NotifyReceiver, window_s: float) -> list[dict[str, str]]:
    """Every notification that arrives within the next ``window_s`` seconds."""
    out = []
    deadline = time.monotonic() + window_s
    while (left := deadline - time.monotonic()) > 0:
        msg = rx.receive(left)
        if msg is not None:
            out.append(msg)
    return out


class _Hang:
    """Holds the simulated library's lock from another thread: every NVML call blocks, as on a hung driver."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._held = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-nvml", daemon=True)

    def _run(self) -> None:
        with self._lock:
            self._held.set()
            self._release.wait(120)

    def __enter__(self) -> _Hang:
        self._thread.start()
        assert self._held.wait(30), "could not take the simulator's lock"
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(30)


def test_the_watchdog_stops_while_an_nvml_call_hangs_and_resumes_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = Config(
        sampling=SamplingConfig(interval_s=0.05, retention_s=60.0, stall_s=1.0),
        prometheus=PrometheusConfig(enabled=False),
    )
    with NotifyReceiver(str(tmp_path / "notify.sock")) as rx:
        monkeypatch.setenv("NOTIFY_SOCKET", rx.env_value)
        monkeypatch.setenv("WATCHDOG_USEC", "400000")  # a tick every 0.2 s
        monkeypatch.delenv("WATCHDOG_PID", raising=False)

        async def scenario() -> list[dict[str, str]]:
            daemon = Daemon(config, sim_spec=SPEC, sim_workload=False, metrics_addr=None)
            stop = asyncio.Event()
            task = asyncio.create_task(daemon.run(stop))
            log: list[dict[str, str]] = []
            try:
                await asyncio.to_thread(receive_until, rx, "READY", log)
                await asyncio.to_thread(receive_until, rx, "WATCHDOG", log)
                assert daemon.backend is not None and daemon.backend.node is not None
                # The simulator serialises every call on this lock; holding it is a hung NVML call.
                with _Hang(daemon.backend.node._state.lock):
                    stalled = await asyncio.to_thread(receive_until, rx, "STATUS", log, 30.0)
                    assert stalled["STATUS"].startswith("sampling loop stalled"), stalled
                    # Five more watchdog intervals with the call still hung: not one WATCHDOG=1.
                    during = await asyncio.to_thread(drain, rx, 1.0)
                    assert all("WATCHDOG" not in m for m in during), during
                    log.extend(during)
                await asyncio.to_thread(receive_until, rx, "WATCHDOG", log, 30.0)
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
            return log

        log = asyncio.run(scenario())
    stalled_at = next(i for i, m in enumerate(log) if m.get("STATUS", "").startswith("sampling loop stalled"))
    assert any(m.get("WATCHDOG") == "1" for m in log[:stalled_at]), "fed while sampling worked"
    assert log[-1] == {"WATCHDOG": "1"}, "fed again once the call returned"
