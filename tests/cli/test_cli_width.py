"""``flexmig status``, ``status --watch`` and ``inventory`` at 80 columns, from real output: no line wider than the
terminal, no column dropped, no name cut (every UUID, profile, pid and job name the JSON has is there in full).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.flexmigd import ActNode, act_node, short_base
from support.jobs import counter_spec, flexmig, write_spec
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
WIDTH = 80
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def cli(*args: str, width: int = WIDTH) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", *args],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": str(width)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def assert_fits(text: str, width: int = WIDTH) -> None:
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, f"{len(long)} line(s) wider than {width}:\n" + "\n".join(long)


def words(text: str) -> set[str]:
    return set(re.split(r"[\s,()\[\]]+", text))


def test_inventory_fits_80_columns_with_every_uuid_profile_and_placement(tmp_path: Path) -> None:
    text = cli("inventory", "--sim", SPEC)
    assert_fits(text)
    doc = json.loads(cli("inventory", "--sim", SPEC, "--json"))
    shown = words(text)
    for gpu in doc["gpus"]:
        assert gpu["uuid"] in shown and f"GPU {gpu['index']}: {gpu['name']}" in text
        for dev in gpu["mig_devices"]:
            assert dev["uuid"] in shown
        for gi in gpu["gpu_instances"]:
            assert gi["profile_name"] in shown and f"{gi['start']}:{gi['size']}" in shown


def test_status_fits_80_columns_with_jobs_of_long_names_and_every_instance() -> None:
    long_name = "a-training-job-with-a-rather-long-name-of-64-characters-xxxxxxxx"
    assert len(long_name) == 64
    with short_base() as base, act_node(base, "h200") as node:
        for name in ("short", long_name):
            flexmig(node.sock, "submit", str(write_spec(base / f"{name}.toml", counter_spec(base, name))))
        wait_until(lambda: _jobs_sampled(node) == 2, what="both jobs in a sweep")
        text = cli("status", "--socket", str(node.sock))
        doc = json.loads(cli("status", "--socket", str(node.sock), "--json"))
        for name in ("short", long_name):
            flexmig(node.sock, "stop", name, "--force")
    assert_fits(text)
    shown = words(text)
    assert {"short", long_name} <= shown
    for gpu in doc["gpus"]:
        assert gpu["uuid"] in shown
        for inst in gpu["instances"]:
            assert inst["uuid"] in shown and inst["profile"] in shown
            assert all(str(p["pid"]) in shown for p in inst["processes"] or ())
    assert "recent actions" in text and "jobs" in text


def _jobs_sampled(node: ActNode) -> int:
    doc = json.loads(cli("status", "--socket", str(node.sock), "--json"))
    return sum(1 for g in doc["gpus"] for i in g["instances"] if i.get("job") and i.get("processes"))


@contextlib.contextmanager
def in_a_terminal(argv: list[str], columns: int, rows: int = 40) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``argv`` with a pseudo-terminal of ``columns`` x ``rows`` as its stdin, stdout and stderr."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env={**env, "TERM": "xterm-256color"}
    )
    os.close(follower)
    try:
        yield proc, leader
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(leader)


def read_for(fd: int, seconds: float, until: bytes | None = None, count: int = 1) -> bytes:
    """What ``fd`` gives for ``seconds`` (or until it closes; with ``until``: until that was seen ``count`` times)."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or out.count(until) < count):
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return out


def test_status_watch_is_a_live_view_on_the_alternate_screen_that_fits_80x24_and_ends_on_ctrl_c() -> None:
    argv = [sys.executable, "-m", "flexmig.cli.main", "status", "--sim", SPEC, "--watch", "0.5"]
    with in_a_terminal(argv, WIDTH, rows=24) as (proc, fd):
        # Ctrl-C once the view has refreshed: a SIGINT while Python still imports would end it as any program then
        shown = read_for(fd, 60.0, until=b"Ctrl-C to quit", count=3)
        proc.send_signal(signal.SIGINT)
        shown += read_for(fd, 30.0)  # until it closes the terminal: a view left unread would block its last write
        assert proc.wait(20) == 0
    raw = shown.decode(errors="replace")
    # The alternate screen, as nvitop and htop use: each refresh replaces the view, none reaches the scrollback, and
    # the terminal is given back as it was.
    assert raw.startswith("\x1b[?1049h") and raw.rstrip().endswith("\x1b[?1049l"), repr(raw[:40] + raw[-40:])
    frames = [_ANSI.sub("", f) for f in raw.split("\x1b[H") if "Ctrl-C to quit" in f]
    assert len(frames) >= 2, f"refreshed in place: {len(frames)} frame(s)"
    for frame in frames:
        rows = frame.rstrip().split("\r\n")
        assert len(rows) <= 24, f"{len(rows)} rows:\n" + "\n".join(rows)
        assert all(len(r.rstrip()) <= WIDTH for r in rows), rows
        assert "source sim:" in rows[0] and "GPU 0: NVIDIA H200" in frame and "GPU 1: NVIDIA H200" in frame
