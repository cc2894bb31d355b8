"""``wire()`` builds a whole daemon and touches nothing: no file, socket, thread or process until ``start``.

Every part the default and a full configuration enable is built (the simulated node, detection, MQTT with its
outbox and commands, sampling, dcgm-exporter, ``/metrics``, the actuator in mode act with its journal and control
socket, Slurm, the demo workload, the watchdog) with every path inside one empty directory: afterwards it is still
empty, and Python's audit events show no file opened there or elsewhere (imports aside), no directory made, no
SQLite database opened, no socket made, no thread and no process started.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flexmig.config import Config, StateConfig
from flexmig.daemon import Daemon
from flexmig.wiring.component import Off
from support.configs import EVERY_PART, every_part_on

# What building may not do. ``open`` is also raised when an import reads a module: those are left out below.
_WATCHED = frozenset(
    {
        "open",
        "os.mkdir",
        "os.rename",
        "os.remove",
        "os.chmod",
        "os.symlink",
        "os.truncate",
        "sqlite3.connect",
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "subprocess.Popen",
        "os.fork",
        "os.posix_spawn",
        "os.exec",
        "_thread.start_new_thread",
    }
)
_MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_seen: list[tuple[str, str]] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _seen is None or event not in _WATCHED:
        return
    if event == "open" and args and str(args[0]).endswith(_MODULE_SUFFIXES):
        return  # a function-local import reading its module
    _seen.append((event, repr(args[:2])))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside _recording()


@contextmanager
def _recording() -> Iterator[list[tuple[str, str]]]:
    global _seen  # noqa: PLW0603 - the one audit hook of this module reads it
    seen: list[tuple[str, str]] = []
    _seen = seen
    try:
        yield seen
    finally:
        _seen = None


@pytest.mark.parametrize("everything", [False, True], ids=["defaults", "everything-on"])
def test_wire_builds_a_whole_daemon_without_touching_anything(tmp_path: Path, everything: bool) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    d.chmod(0o555)  # read-only for anyone but root: a daemon that wrote here while built would fail for a user
    config = every_part_on(d) if everything else Config(state=StateConfig(directory=d, journal=d / "journal.sqlite3"))
    with _recording() as seen:
        daemon = Daemon(config, sim_spec="h200", sim_state=d / "sim.json", hostname="node-1")
    assert seen == [], "building the daemon touched the system"
    assert list(d.iterdir()) == []
    names = daemon.components.names
    if everything:
        assert names == EVERY_PART
    else:
        assert names == ("nvml", "detection", "sampling", "metrics", "actuator", "workload", "watchdog")
        off = [part.name for part in daemon.components.parts if isinstance(part, Off)]
        assert off == ["mqtt", "dcgm", "slurm", "mqtt-commands"], "the parts that are off are null parts"
        assert daemon.components.mqtt is None and daemon.components.slurm is None
