"""SIGHUP reloads flexmigd's configuration file; a bad file is refused and the daemon keeps running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_text(path: Path, text: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path.name} within {timeout_s} s:\n{path.read_text(errors='replace')}")


def test_sighup_applies_a_good_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    config = tmp_path / "flexmig.toml"
    config.write_text("[sampling]\ninterval_s = 1.0\n")
    config.chmod(0o600)
    log_path = tmp_path / "flexmigd.log"
    port = free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flexmig.daemon",
                "--sim",
                "h200:3g.71gb@0",
                "--config",
                str(config),
                "--metrics-addr",
                f"127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NOTIFY_SOCKET": ""},
        )
        try:
            wait_for_text(log_path, "flexmigd 0.1.0 up")
            config.write_text("[sampling]\ninterval_s = 0.5\n")
            proc.send_signal(signal.SIGHUP)
            wait_for_text(log_path, "configuration reloaded: sampling.interval_s")

            config.write_text("[sampling]\ninterval_s = 'fast'\n")
            proc.send_signal(signal.SIGHUP)
            text = wait_for_text(log_path, "configuration reload refused")
            assert "sampling.interval_s" in text.split("configuration reload refused", 1)[1]
            assert proc.poll() is None
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                assert b"flexmig_mig_memory_total_bytes" in resp.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
