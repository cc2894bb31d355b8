"""``python -m flexmig.actuatord``: the actuator as a standalone service (executor, supervisor, control socket).

For tests, demos and nodes that want only the job actuator; ``flexmigd`` runs the same :class:`Actuator` inside
its TaskGroup. Example on a simulated node::

    python -m flexmig.actuatord --mode act --sim 'h200:1g.18gb@0+1g.18gb@1' --sim-state /tmp/fm/sim.json \\
        --state-dir /tmp/fm --allow-dir /tmp/fm
    flexmig jobs --socket /tmp/fm/control.sock submit /tmp/fm/job.toml
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flexmig.act.events import LoggingSink
from flexmig.act.journal import StepEvent
from flexmig.act.service import Actuator
from flexmig.errors import BackgroundTaskError, FlexmigError
from flexmig.jobspec.spec import JobPolicy
from flexmig.nvml import NvmlWorker
from flexmig.storage.lock import LOCK_NAME, DirectoryLock
from flexmig.tasks import FATAL_TASK, describe
from flexmig.wiring.backend import open_backend

__all__ = ["main", "parse_args", "run"]

log = logging.getLogger("flexmig.actuatord")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The service's command line."""
    p = argparse.ArgumentParser(prog="python -m flexmig.actuatord", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("observe", "advise", "act"), default="observe", help="default: observe")
    p.add_argument("--state-dir", type=Path, required=True, help="journal, rank logs and (default) the socket")
    p.add_argument("--socket", type=Path, default=None, help="control socket (default STATE_DIR/control.sock)")
    p.add_argument("--socket-mode", type=lambda s: int(s, 8), default=0o600, help="octal, default 600")
    p.add_argument("--allow-dir", type=Path, action="append", default=[], help="directory jobs may use (repeatable)")
    p.add_argument("--ack-timeout", type=float, default=300.0, help="default checkpoint ack timeout, seconds")
    p.add_argument(
        "--ack-dir", type=Path, default=None, help="acknowledgements here (mode 1733) instead of checkpoint dirs"
    )
    p.add_argument("--sim", metavar="SPEC", default=None, help="run on a simulated node (node-spec grammar)")
    p.add_argument("--sim-state", type=Path, default=None, help="simulator state file (survives restarts)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def run(args: argparse.Namespace, on_step: Callable[[StepEvent], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT."""
    state: Path = args.state_dir
    lock = DirectoryLock.acquire(state / LOCK_NAME, f"state directory {state}")  # one actuator per state
    try:
        return await _run_locked(args, state, on_step)
    finally:
        lock.release()


async def _run_locked(args: argparse.Namespace, state: Path, on_step: Callable[[StepEvent], None] | None) -> int:
    backend = open_backend(args.sim or None, False, sim_state=args.sim_state, sim_workload=False)
    worker = NvmlWorker()
    act = Actuator.build(
        mode=args.mode,
        nvml=backend.nvml,
        offload=worker.call,
        devices=backend.devices,
        journal_path=state / "journal.sqlite3",
        logs_dir=state / "logs",
        policy=JobPolicy(tuple(args.allow_dir), default_ack_timeout_s=args.ack_timeout),
        events=LoggingSink(),
        on_step=on_step,
        ack_dir=args.ack_dir,
    )
    stop = asyncio.Event()
    died: list[str] = []

    def on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A spawned task's death stops the service, as it stops flexmigd (:mod:`flexmig.tasks`)."""
        task, exc = context.get(FATAL_TASK), context.get("exception")
        if task is None or not isinstance(exc, BaseException):
            loop.default_exception_handler(context)
            return
        died.append(f"background task {task!r} died: {describe(exc)}")
        log.error("%s", died[-1], exc_info=exc)
        stop.set()

    asyncio.get_running_loop().set_exception_handler(on_exception)
    try:
        summary = await act.start()
        log.info("reconciled: %s", summary)
        control = act.control_server(args.socket or state / "control.sock", args.socket_mode)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with asyncio.TaskGroup() as tg:
            server = tg.create_task(control.serve(lambda: log.info("control socket ready at %s", control.path)))
            await stop.wait()
            server.cancel()
    finally:
        await act.close()
        worker.shutdown()
        with contextlib.suppress(Exception):
            backend.close()
    if died:
        raise BackgroundTaskError(died[0])
    return 0


def main(argv: Sequence[str] | None = None, on_step: Callable[[StepEvent], None] | None = None) -> int:
    """Entry point; ``on_step`` is called after every journal commit (tests crash the service there)."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(run(args, on_step))
    except BackgroundTaskError as exc:
        print(f"flexmig.actuatord: error: {exc}", file=sys.stderr)
        return 1
    except FlexmigError as exc:
        print(f"flexmig.actuatord: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
