"""SIGHUP at any moment of flexmigd's start-up is a reload request, never its death.

``systemctl reload`` (or a log rotation's ``kill -HUP``) may come while the daemon still imports its modules,
reads its configuration or opens NVML. The default action of SIGHUP is to terminate, so flexmigd takes SIGHUP
before anything else: the test watches the process from the moment it is spawned, checks that SIGHUP is handled
before the daemon has loaded its heavy modules (asyncio, ctypes for NVML, sqlite3 for the journal), and from then on
sends SIGHUP every 20 ms through the whole start-up; the daemon comes up, reloads, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.prometheus import http_get
from support.wait import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FLEXMIGD = Path(sys.executable).with_name("flexmigd")
HEAVY = ("/_asyncio.", "/_ctypes.", "/_sqlite3.")  # extension modules of asyncio, NVML's ctypes, the journal
_SIGHUP_BIT = 1 << (signal.SIGHUP - 1)


def sighup_handled(pid: int) -> bool | None:
    """Whether ``pid`` catches or ignores SIGHUP now (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = (ln.partition(":\t") for ln in text.splitlines())
    masks = {k: int(v, 16) for k, _, v in fields if k in ("SigCgt", "SigIgn")}
    if "SigCgt" not in masks:  # a zombie: it has exited
        return None
    return bool((masks["SigCgt"] | masks.get("SigIgn", 0)) & _SIGHUP_BIT)


def heavy_modules_loaded(pid: int) -> list[str]:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    return sorted({h for h in HEAVY if h in maps})


def start_flexmigd(tmp_path: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    config = tmp_path / "flexmig.toml"
    config.write_text(
        "[sampling]\ninterval_s = 0.5\n[control]\nenabled = false\n"
        f'[state]\ndirectory = "{tmp_path}"\njournal = "{tmp_path}/journal.sqlite3"\n'
    )
    config.chmod(0o600)
    log = tmp_path / "flexmigd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(FLEXMIGD), "--sim", "h200", "--config", str(config), "--metrics-addr", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NOTIFY_SOCKET": ""},
        )
    return proc, log


def up(port: int) -> bool:
    try:
        return b"flexmig_" in http_get(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
    except OSError:
        return False


@pytest.mark.parametrize("attempt", [1, 2])
def test_sighup_from_the_first_moment_of_start_up_never_kills_flexmigd(tmp_path: Path, attempt: int) -> None:
    port = free_port()
    proc, log = start_flexmigd(tmp_path, port)
    try:
        # 1. From the spawn on, find the moment SIGHUP stops being fatal, and what the daemon had loaded by then.
        deadline = time.monotonic() + 60
        loaded_before: list[str] = []
        while True:
            assert time.monotonic() < deadline, "SIGHUP never handled"
            loaded = heavy_modules_loaded(proc.pid)  # read before the status: loading only ever grows
            handled = sighup_handled(proc.pid)
            assert handled is not None, f"flexmigd exited {proc.poll()}: {log.read_text()[-2000:]}"
            if handled:
                loaded_before = loaded
                break
        assert loaded_before == [], f"SIGHUP was left fatal until after {loaded_before} were loaded"

        # 2. SIGHUP every 20 ms through the rest of the start-up, and a while after it.
        sent = 0
        deadline = time.monotonic() + 90
        after_up: int | None = None
        while after_up is None or sent < after_up + 25:
            assert time.monotonic() < deadline, f"flexmigd did not come up: {log.read_text()[-2000:]}"
            assert proc.poll() is None, f"flexmigd died ({proc.returncode}) after {sent} SIGHUP(s): {log.read_text()}"
            proc.send_signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.02)
            if after_up is None and sent % 10 == 0 and up(port):
                after_up = sent
        assert proc.poll() is None, f"flexmigd died after {sent} SIGHUP(s): {log.read_text()[-2000:]}"
        assert up(port)
        text = log.read_text()
        assert "configuration reloaded" in text, text[-2000:]
        assert "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()[-2000:]
