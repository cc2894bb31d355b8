"""What every part of the running daemon is to the daemon: a :class:`Component`, and the shared services it gets.

``flexmigd`` is a list of components (:func:`flexmig.wiring.wire` builds it, in order) and a supervisor that walks
the list (:class:`flexmig.daemon.Daemon`):

* **start**, in list order, before systemd hears READY: open what the component needs (the node, the first sweep,
  the metrics port, the journal and control socket); an exception stops the start-up;
* **run**, all at once under one TaskGroup: the component's loop, until cancelled (one without a loop waits to be
  cancelled). If it raises, the daemon stops, naming it, unless ``restart`` says it may run again (its state is on
  disk or nowhere: a broker connection, a scrape);
* **drain**, in reverse order, on SIGTERM, before the loops are cancelled: take no new work, let work in flight end;
* **close**, in reverse order, once every loop has ended, on every way out (a failed start, a stop asked during
  start-up): let go of what it holds; it must cope with a start that never happened or stopped half-way;
* **reload**, in list order, with each configuration a SIGHUP accepted: apply what it can of it (the schema marks
  the keys it cannot: ``restart``);
* **metrics**: the Prometheus families it adds to ``/metrics``, asked once, right after its own start, and
  registered then (:class:`~flexmig.wiring.metrics_endpoint.MetricsRegistry`): exported from then on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from flexmig.config import Config
from flexmig.metrics.collector import Extension

__all__ = ["Component", "Loop", "Off", "idle"]


class Component(Protocol):
    """One part of the running daemon (see the module docstring for when each method runs)."""

    @property
    def name(self) -> str:
        """The name its task carries (in logs, and in ``flexmig_task_restarts_total{task}``)."""
        ...

    @property
    def restart(self) -> bool:
        """True when :meth:`run` may run again after it failed (after a pause doubling from 1 s to 60 s)."""
        ...

    async def start(self) -> None:
        """Get ready to run, before READY."""
        ...

    async def run(self) -> None:
        """Its loop, until cancelled."""
        ...

    async def drain(self) -> None:
        """SIGTERM: start nothing new; let what is in flight end."""
        ...

    async def close(self) -> None:
        """Let go of what it holds (whether or not it started)."""
        ...

    def reload(self, config: Config) -> None:
        """Apply an accepted configuration reload."""
        ...

    def metrics(self) -> Sequence[Extension]:
        """The metric families it exports (written once per snapshot, or collected at every scrape), asked once
        its start is done."""
        ...


async def idle() -> None:
    """The run of a component without a loop: wait to be cancelled."""
    await asyncio.Event().wait()


class Loop:
    """A component that is only a loop: ``loop()`` under the name ``name`` (nothing to start, drain, close,
    reload or export)."""

    def __init__(self, name: str, loop: Callable[[], Awaitable[None]], *, restart: bool = False) -> None:
        self.name = name
        self.restart = restart
        self._loop = loop

    async def start(self) -> None:
        """Nothing to open."""

    async def run(self) -> None:
        """The loop."""
        await self._loop()

    async def drain(self) -> None:
        """Nothing in flight to wait for."""

    async def close(self) -> None:
        """Nothing held."""

    def reload(self, config: Config) -> None:
        """Nothing to apply."""

    def metrics(self) -> Sequence[Extension]:
        """No families of its own."""
        return ()


class Off:
    """An optional part that the configuration turns off (uvicorn's ``LifespanOff``): it opens, runs, drains,
    closes, reloads and exports nothing. :func:`flexmig.wiring.wire` puts one where a part's switch is off
    (``flexmig.wiring.SWITCHES``) and leaves it out of the list the daemon walks, so an off part has no task and no
    name in the logs or metrics, and nothing asks whether it is there."""

    restart = False

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:
        """Nothing to open."""

    async def run(self) -> None:
        """Nothing to run: wait to be cancelled."""
        await idle()

    async def drain(self) -> None:
        """Nothing in flight."""

    async def close(self) -> None:
        """Nothing held."""

    def reload(self, config: Config) -> None:
        """Nothing to apply (the switches are restart keys)."""

    def metrics(self) -> Sequence[Extension]:
        """No families."""
        return ()
