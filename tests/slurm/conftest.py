"""The Slurm tests' jobs run as ordinary users, as on a cluster: two unprivileged users made for the run (useradd, in
the chroot of a newer Slurm too) and removed after. Every rig (``support.slurm``) submits as the first; the second
is another user of the node (a hostile one, where a test says so).

The users are made when the first integration test of this directory sets up (in that test's name, which starts
processes anyway: tests/conftest.py holds every test to its marker), and removed when the session ends (each xdist
worker has its own two)."""

from __future__ import annotations

import contextlib

import pytest

from support import slurm

_USERS = contextlib.ExitStack()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Make the run's job users before the first integration test that may submit jobs."""
    if slurm.JOB_USERS or item.get_closest_marker("integration") is None or slurm.skip_reason() is not None:
        return
    users = _USERS.enter_context(slurm.scratch_users(2))
    slurm.JOB_USERS[:] = [u.pw_name for u in users]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the run's job users (after every testbed stopped: their processes are gone)."""
    slurm.JOB_USERS.clear()
    _USERS.close()
