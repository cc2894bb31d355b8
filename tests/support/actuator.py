"""A live actuator for tests that fuzz it: a simulated node, the real Actuator and its control server on an event
loop in a background thread, and one real job (``examples/hook_minimal.py``) running on it.

Hypothesis tests are synchronous, so the rig lives in its own thread for a whole test module (one per module):
tests talk to it over the control socket or the broker, and read its ground truth with :meth:`LiveNode.truth`.
Not a test module; imported by ``test_fuzz_control`` and ``test_fuzz_commands``/``test_commands_mosquitto``.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import sys
import tempfile
import textwrap
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from flexmig.act.control import ControlServer
from flexmig.act.events import MemorySink
from support.simact import SimActuator
from support.wait import until

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "examples" / "hook_minimal.py"
WAIT = 60.0
T = TypeVar("T")


class LiveNode:
    """``with LiveNode("h200") as node:`` a simulated node with the actuator (mode ``act``) and job ``counter``."""

    def __init__(self, spec: str = "h200", *, job: str = "counter", ranks: int = 1) -> None:
        self.spec = spec
        self.job_name = job
        self.ranks = ranks
        # World-traversable and short (unix socket paths are limited to 107 bytes).
        self.base = Path(tempfile.mkdtemp(prefix="fm-live-"))
        self.base.chmod(0o755)
        self.socket = self.base / "control.sock"
        self.events = MemorySink()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-node", daemon=True)

    # ----------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> LiveNode:
        self.thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.loop.is_running():
                self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT)
            self.loop.close()
            shutil.rmtree(self.base, ignore_errors=True)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT) -> T:
        """Run ``coro`` on the rig's loop and return its result (bounded)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.sim = SimActuator(self.base, self.spec, events=self.events)
        await self.sim.start()
        self.node, self.act = self.sim.node, self.sim.act
        self.control: ControlServer = self.act.control_server(self.socket)
        await self.control.start()
        answer = await self.control.dispatch(
            f'{{"op": "jobs.submit", "args": {{"path": "{self.write_job()}"}}}}'.encode()
        )
        assert answer["ok"], answer
        await until(lambda: len(self.act.supervisor.alive(self.job_name)) == self.ranks, what="the job's ranks")

    async def _stop(self) -> None:
        await self.sim.stop(before_close=self.control.close)

    def write_job(self) -> Path:
        """The spec of the job the rig runs (a checkpointing counter)."""
        name, base = self.job_name, self.base
        user = pwd.getpwuid(os.geteuid()).pw_name
        path = base / f"{name}.toml"
        path.write_text(
            textwrap.dedent(
                f"""\
                name = "{name}"
                argv = ["{sys.executable}", "{MINIMAL}", "--log", "{base}/{name}.ckpt/{name}.log"]
                user = "{user}"
                working_dir = "{base}"
                checkpoint_dir = "{base}/{name}.ckpt"
                [ranks]
                min = 1
                max = 2
                start = {self.ranks}
                [need]
                profile = "1g.18gb"
                [hook]
                ack_timeout_s = 10
                exit_timeout_s = 5
                """
            )
        )
        path.chmod(0o644)
        return path

    # ----------------------------------------------------------------------------------------- truth
    def truth(self) -> dict[str, Any]:
        """What an action would change: every GPU's layout, the pids on each instance, the jobs' records, the
        number of journalled plans' actions."""
        return self.call(self._truth())

    async def _truth(self) -> dict[str, Any]:
        gpus = {}
        for g in self.node.gpus():
            gpus[g.index] = {
                "layout": g.layout.spec() if g.layout is not None else None,
                "pids": {
                    f"{gi.profile.name}@{gi.start}": sorted(p.pid for ci in gi.compute_instances for p in ci.processes)
                    for gi in g.gpu_instances
                },
            }
        jobs = {r.name: (r.state, r.generation, tuple(s.key for s in r.slots), r.uid) for r in self.act.journal.jobs()}
        alive = sorted(h.proc.pid for h in self.act.supervisor.alive(self.job_name))
        return {
            "gpus": gpus,
            "jobs": jobs,
            "alive": alive,
            "actions": len(self.act.journal.recent_actions(1000)),
            "events": len(self.events.events),
        }

    def set_mode(self, mode: str) -> None:
        """Switch the actuator's mode (as a configuration reload does)."""

        async def switch() -> None:
            self.act.set_mode(mode)  # type: ignore[arg-type]

        self.call(switch())
