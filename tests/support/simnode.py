"""What the rooms that install the simulated library in the test process share (not a test module).

:func:`uninstall_after` (autouse in tests/nvml and tests/sim, through their conftest.py): whatever a test installed
under pynvml is taken away when it ends, so a test's fixture only says what it installs. :class:`HandClock`: a
clock the test moves by hand, shared by the simulator's GPM counters and the windows that read them.
:func:`nvml_session`, :func:`gpu`, :func:`mig`: a node with pynvml initialised on it, and its handles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
import pytest

from flexmig.sim import SimNode, install, uninstall

__all__ = ["HandClock", "gpu", "mig", "nvml_session", "uninstall_after"]


@pytest.fixture(autouse=True)
def uninstall_after() -> Iterator[None]:
    """After each test: the simulated library off pynvml (a no-op when none is installed)."""
    yield
    uninstall()


def nvml_session(spec: str) -> Iterator[SimNode]:
    """For a fixture to ``yield from``: the node ``spec`` installed, with pynvml initialised on it for the test
    (shut down after it; the room uninstalls the node)."""
    node = install(spec)
    N.nvmlInit()
    yield node
    N.nvmlShutdown()


def gpu(i: int = 0) -> Any:
    """The pynvml handle of GPU ``i``."""
    return N.nvmlDeviceGetHandleByIndex(i)


def mig(node: SimNode, i: int = 0, g: int = 0) -> Any:
    """The pynvml handle of MIG device ``i`` of GPU ``g``."""
    return N.nvmlDeviceGetHandleByUUID(node.mig_uuids(g)[i])


class HandClock:
    """A clock the test moves by hand (``clock.t += 1``)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
