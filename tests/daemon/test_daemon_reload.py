"""SIGHUP reloads flexmigd's configuration file; a bad file is refused and the daemon keeps running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flexmig import __version__
from support.wait import free_port, wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


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
            wait_for_text(log_path, f"flexmigd {__version__} up", proc=proc)
            config.write_text("[sampling]\ninterval_s = 0.5\n")
            proc.send_signal(signal.SIGHUP)
            wait_for_text(log_path, "configuration reloaded: sampling.interval_s", proc=proc)

            config.write_text("[sampling]\ninterval_s = 'fast'\n")
            proc.send_signal(signal.SIGHUP)
            text = wait_for_text(log_path, "configuration reload refused", proc=proc)
            assert "sampling.interval_s" in text.split("configuration reload refused", 1)[1]
            assert proc.poll() is None
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                assert b"flexmig_mig_memory_total_bytes" in resp.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
