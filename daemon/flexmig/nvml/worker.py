"""The one thread every NVML call runs on.

NVML calls block (ctypes; a GPU-instance create can take seconds on hardware), and MIG reconfiguration steps must
never interleave with each other or with a sweep that holds handles about to be invalidated. So a process owns
exactly one :class:`NvmlWorker` (a single-thread executor) and every layer that talks to NVML (sampling, the
simulator's workload, the actuator, whose :class:`~flexmig.act.migops.Offload` is :meth:`NvmlWorker.call`) goes
through it. The event loop stays free for scrapes, MQTT and signals meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["NvmlWorker"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class NvmlWorker:
    """A single worker thread for blocking NVML work, with per-call CPU accounting."""

    def __init__(self, name: str = "flexmig-nvml") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def call(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``fn(*args, **kwargs)`` on the NVML thread and return its result (or raise its exception)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def call_timed(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> tuple[_T, float]:
        """Like :meth:`call`, also returning the CPU seconds the NVML thread spent in it (``time.thread_time``)."""

        def timed() -> tuple[_T, float]:
            start = time.thread_time()
            return fn(*args, **kwargs), time.thread_time() - start

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, timed)

    def shutdown(self) -> None:
        """Finish the call in progress (an NVML call cannot be interrupted) and stop the thread."""
        self._pool.shutdown(wait=True, cancel_futures=True)
