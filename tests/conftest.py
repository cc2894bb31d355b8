"""One rule for the whole test run: no process a test starts outlives the run; and the MQTT brokers tests share.

At start the pytest process becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): a process started on a
test's behalf by another process (a job's rank, launched in its own session by a flexmigd subprocess) stays in
this process tree when its parent exits, instead of moving to PID 1. At the end of the session every live
descendant is a leak (where no subreaper can be set, every live process running a script of this repository's
``examples/`` started during the session is one): they are listed, killed (their process group, with a bounded
wait), and the session ends with an error naming them.

Brokers (a real mosquitto on a free loopback port, :mod:`support.mosquitto`): ``broker`` (anonymous) and
``secured_broker`` (passwords and the README's ACL) are shared by one test module's tests; ``mosquitto`` starts a
test's own (``mosquitto()``, ``mosquitto(extra)``, ``mosquitto(secured=True)``), stopped when that test ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.mosquitto import Brokers, Mosquitto

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples") + os.sep
_PR_SET_CHILD_SUBREAPER = 36
# Helpers the standard library starts for the pytest process itself, which end with it.
_OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
_KILL_WAIT_S = 10.0


def _become_subreaper() -> bool:
    """True once orphaned descendants are re-parented to this process (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE and not any(h in " ".join(p.cmdline()) for h in _OWN_HELPERS)
    except psutil.Error:
        return False


def _examples_since(started: float) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = p.info["cmdline"] or []
        if p.info["create_time"] >= started and any(a.startswith(EXAMPLES) for a in cmdline):
            out.append(p)
    return out


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid}: {' '.join(p.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {p.pid}: (gone)"


def _kill(procs: list[psutil.Process]) -> None:
    """SIGKILL each process's group (never our own), then each process; wait for them, bounded."""
    own = os.getpgrp()
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            group = os.getpgid(p.pid)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            p.kill()
    psutil.wait_procs(procs, timeout=_KILL_WAIT_S)


def _reap_zombie_children() -> None:
    """Collect adopted children that exited (nothing else waits for them once the run is over)."""
    for child in psutil.Process().children():
        if child.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_test_run() -> Iterator[None]:
    """Fail the session (at its last teardown) if any process it started is still alive at the end."""
    started = time.time()
    subreaper = _become_subreaper()
    yield
    me = psutil.Process()
    leaked = [p for p in me.children(recursive=True) if _alive(p)]
    if not subreaper:
        seen = {p.pid for p in leaked}
        leaked += [p for p in _examples_since(started) if p.pid not in seen and _alive(p)]
    names = [_describe(p) for p in leaked]
    _kill(leaked)
    with contextlib.suppress(psutil.Error):
        _reap_zombie_children()
    assert not names, (
        "processes started by this test run (by any of its tests) were still alive at its end (now killed):\n"
        + "\n".join(names)
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """An anonymous mosquitto that one test module's tests share (stopped after the module)."""
    brokers = Brokers(tmp_path_factory.mktemp("broker"))
    try:
        yield brokers()
    finally:
        brokers.close()


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A mosquitto that refuses anonymous clients, knows ``support.mosquitto.PASSWORDS`` and applies the README's
    ACL, shared by one test module's tests (stopped after the module)."""
    brokers = Brokers(tmp_path_factory.mktemp("secured-broker"))
    try:
        yield brokers(secured=True)
    finally:
        brokers.close()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Brokers]:
    """Starts a test's own mosquittos (a fresh broker: no retained message or session from another test; or one
    with its own configuration); every one is stopped when the test ends."""
    brokers = Brokers(tmp_path)
    try:
        yield brokers
    finally:
        brokers.close()
