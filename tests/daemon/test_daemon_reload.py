"""SIGHUP reloads flexmigd's configuration file; a bad file is refused and the daemon keeps running."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import pytest

from flexmig import __version__
from support.flexmigd import running_daemon
from support.wait import wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_sighup_applies_a_good_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    config = tmp_path / "flexmig.toml"
    config.write_text("[sampling]\ninterval_s = 1.0\n")
    config.chmod(0o600)
    with running_daemon(tmp_path, "h200:3g.71gb@0", config) as d:
        proc, log_path = d.proc, d.log
        wait_for_text(log_path, f"flexmigd {__version__} up", proc=proc)
        config.write_text("[sampling]\ninterval_s = 0.5\n")
        proc.send_signal(signal.SIGHUP)
        wait_for_text(log_path, "configuration reloaded: sampling.interval_s", proc=proc)

        config.write_text("[sampling]\ninterval_s = 'fast'\n")
        proc.send_signal(signal.SIGHUP)
        text = wait_for_text(log_path, "configuration reload refused", proc=proc)
        assert "sampling.interval_s" in text.split("configuration reload refused", 1)[1]
        assert proc.poll() is None
        with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=10) as resp:
            assert b"flexmig_mig_memory_total_bytes" in resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
