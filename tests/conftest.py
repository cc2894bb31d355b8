"""One rule for the whole test run: no process a test starts outlives the run; and the MQTT brokers tests share.

At start the pytest process becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): a process started on a
test's behalf by another process (a job's rank, launched in its own session by a flexmigd subprocess) stays in
this process tree when its parent exits, instead of moving to PID 1. At the end of the session every live
descendant is a leak (where no subreaper can be set, every live process running a script of this repository's
``examples/`` started during the session is one): they are listed, killed (their process group, with a bounded
wait), and the session ends with an error naming them. A subreaper must also reap what it adopts: after each test,
adopted children that have exited (a rank whose actuator a test killed, a daemon that double-forked) are reaped,
and children that an object of this process will still wait for (a ``Popen``, a multiprocessing process) are left
to it, so no exit status is taken from its owner.

The ``integration`` marker is kept accurate here too: a test that starts a process (subprocess, fork, spawn) or binds
a socket (a server: TCP, UDP or unix), in its body or in a fixture it sets up or tears down first or last, fails
unless it is marked ``integration`` (Python's audit events say what it did). ``make check`` runs the rest.

Brokers (a real mosquitto on a free loopback port, :mod:`support.mosquitto`): ``broker`` (anonymous) and
``secured_broker`` (passwords and the README's ACL) are shared by one test module's tests; ``mosquitto`` starts a
test's own (``mosquitto()``, ``mosquitto(extra)``, ``mosquitto(secured=True)``), stopped when that test ends.

The fault-injection seed (``FLEXMIG_FAULT_SEED``, tests/act/test_fault_kill.py) is drawn here, once, by the process
that runs the session (pytest-xdist's controller, whose workers inherit it), and printed at the end of a run that
used it: a worker has no terminal to print it on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import psutil
import pytest

import support.freshhome  # noqa: F401  (records what the home directory holds before any test runs)
from support.mosquitto import Brokers, Mosquitto
from support.reaper import reap_adopted_orphans

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples") + os.sep
_PR_SET_CHILD_SUBREAPER = 36
# Helpers the standard library starts for the pytest process itself, which end with it.
_OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
_KILL_WAIT_S = 10.0

# A run started in the background of a shell without job control inherits SIGINT ignored, and so would every
# process a test starts: the tests that stop a CLI with Ctrl-C would then wait for nothing. Ctrl-C is the default
# here (each xdist worker imports this file too), whatever started the run.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


# Audit events that start a process or open a server socket, and what the marker check calls them.
_INTEGRATION_EVENTS = {
    "subprocess.Popen": "starts a process",
    "os.fork": "forks",
    "os.forkpty": "forks",
    "os.posix_spawn": "starts a process",
    "os.spawn": "starts a process",
    "os.system": "starts a shell",
    "os.exec": "execs",
    "socket.bind": "binds a socket",
}
_running: list[pytest.Item] = []  # the test whose setup, call or teardown runs now
_started: dict[str, set[str]] = {}  # test node id -> what it did of _INTEGRATION_EVENTS
_fixtures: list[tuple[str, str]] = []  # (where it is defined, name) of the fixtures being set up now
_fixture_started: dict[tuple[str, str], set[str]] = {}  # the same, for fixtures (shared ones count for every user)


def _audit(event: str, args: tuple[object, ...]) -> None:
    what = _INTEGRATION_EVENTS.get(event)
    if what is not None and _running:
        _started.setdefault(_running[-1].nodeid, set()).add(what)
        if _fixtures:
            _fixture_started.setdefault(_fixtures[-1], set()).add(what)


def _done_by(item: pytest.Item) -> set[str]:
    """What ``item`` did of _INTEGRATION_EVENTS, itself or through the fixtures it uses (the nearest definition)."""
    did = set(_started.get(item.nodeid, ()))
    for name in getattr(item, "fixturenames", ()):
        defs = [key for key in _fixture_started if key[1] == name and item.nodeid.startswith(key[0])]
        if defs:
            did |= _fixture_started[max(defs, key=lambda key: len(key[0]))]
    return did


sys.addaudithook(_audit)


LONG_MODULES = (
    "tests/act/test_act_frameworks.py",
    "tests/slurm/test_slurm_flexmigd.py",
    "tests/daemon/test_daemon_actuator.py",
    "tests/act/test_act_torch.py",
    "tests/slurm/test_slurm_admin.py",
    "tests/cli/test_demo.py",
    "tests/daemon/test_daemon_malleable.py",
    "tests/cli/test_cli_width.py",
    "tests/act/test_unknown_ranks.py",
)
"""The modules of a few long tests (each keeps one worker busy for over a minute on CI's two cores: pytest
--durations), longest first. They run first: with ``--dist loadscope`` xdist hands out modules with the most tests
first, so these came last and the suite ended with one or two workers on them alone. A scheduling hint only (the
Makefile's ``--no-loadscope-reorder`` keeps this order); a module missing here runs all the same."""


def _long_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """:data:`LONG_MODULES` first, in that order; the others after them as collected (each module's tests together,
    in their order)."""
    root = Path(str(config.rootpath))
    rank: dict[str, int] = {}

    def key(item: pytest.Item) -> int:
        path = str(item.path)
        if path not in rank:
            try:
                rel = Path(path).relative_to(root).as_posix()
            except ValueError:
                rel = path
            rank[path] = LONG_MODULES.index(rel) if rel in LONG_MODULES else len(LONG_MODULES)
        return rank[path]

    items.sort(key=key)  # stable: the rest keep the collection's order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long modules first (:func:`_long_first`). ``FLEXMIG_INTEGRATION_ONLY_IN`` (directories apart by spaces,
    from the repository root): integration tests outside them are deselected, so that ``make driver-ids`` runs the
    fast tests and some rooms' integration tests in one run (one start of the workers, one queue for them)."""
    _long_first(config, items)
    rooms = os.environ.get("FLEXMIG_INTEGRATION_ONLY_IN", "").split()
    if not rooms:
        return
    root = Path(str(config.rootpath))
    where = tuple(str((root / r).resolve()) + os.sep for r in rooms)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        inside = str(Path(str(item.path)).resolve()).startswith(where)
        (keep if inside or item.get_closest_marker("integration") is None else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()
        reap_adopted_orphans()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Generator[None, object, object]:
    _fixtures.append((fixturedef.baseid, fixturedef.argname))
    try:
        return (yield)
    finally:
        _fixtures.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Fail, at its teardown, a test that started a process or a server without the ``integration`` marker."""
    report = yield
    did = _done_by(item) if report.when == "teardown" else set()
    if report.when == "teardown" and did and item.get_closest_marker("integration") is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} {', '.join(sorted(did))} but is not marked integration: add pytest.mark.integration "
            "(make check leaves such tests out)"
        )
    return report


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
    # A process on its way out is no leak: a rank's log writer ends once the rank the last test killed has gone
    # and it has read the end of its pipe, some milliseconds later. What still runs after the grace is one.
    with contextlib.suppress(psutil.Error):
        _, leaked = psutil.wait_procs(leaked, timeout=3.0)
    leaked = [p for p in leaked if _alive(p)]
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


_RUN_STARTED = time.time()
FAULT_SEED = "FLEXMIG_FAULT_SEED"
_fault_seed_used: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Draw the fault-injection seed once for the run, before pytest-xdist starts its workers (unless given)."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(FAULT_SEED, str(time.time_ns() % 1_000_000))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a run of a test that draws from the fault-injection seed (reports reach the controller from workers)."""
    if report.when == "call" and "test_fault_kill.py" in report.nodeid and not _fault_seed_used:
        _fault_seed_used.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault-injection seed where a failed run's reader looks: at the end."""
    if _fault_seed_used:
        value = os.environ.get(FAULT_SEED, "")
        terminalreporter.write_line(f"fault injection seed: {value} (replay with {FAULT_SEED}={value})")


_SLURM_USERS = contextlib.ExitStack()
_SLURM_TESTS = str(Path(__file__).resolve().parent / "slurm") + os.sep


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The Slurm tests' jobs run as ordinary users, as on a cluster: before the first integration test of
    tests/slurm, two unprivileged users are made for the run (useradd, in the chroot of a newer Slurm too), which
    every rig submits as (:data:`support.slurm.JOB_USERS`); they are removed when the session ends (each xdist worker
    has its own two). Made here rather than in a fixture, so that they count as that one test's processes (the
    marker check), and removed where no test runs."""
    if not str(item.path).startswith(_SLURM_TESTS) or item.get_closest_marker("integration") is None:
        return
    from support import slurm  # noqa: PLC0415 - only the Slurm tests need it

    if slurm.JOB_USERS or slurm.skip_reason() is not None:
        return
    users = _SLURM_USERS.enter_context(slurm.scratch_users(2))
    slurm.JOB_USERS[:] = [u.pw_name for u in users]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the Slurm tests' job users (every testbed stopped by now: none of their processes is left), in each
    process that made them. Then remove the empty job cgroups this run's daemons left (a test that kills its
    daemon or its ranks leaves the job's cgroup behind, empty): once, in the process that ran the run
    (pytest-xdist's controller, after every worker), and only those made since the run began, so that no other run's
    job loses its cgroup."""
    _SLURM_USERS.close()
    if hasattr(session.config, "workerinput"):
        return
    from flexmig.act.jobcgroups import BASE_NAME, cgroup2_root, own_cgroup  # noqa: PLC0415 - only here

    with contextlib.suppress(OSError):
        mounted = cgroup2_root(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup(Path("/proc/self/cgroup").read_text())
        if mounted is None or own is None or mounted[1] != "/":
            return
        base = mounted[0] / own.lstrip("/") / BASE_NAME
        for d in base.glob("job-*"):
            with contextlib.suppress(OSError):
                if d.stat().st_mtime >= _RUN_STARTED:
                    d.rmdir()  # EBUSY while a process is in it: then it stays
