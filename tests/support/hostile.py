"""The actuator on a simulated node, in this process, running jobs that attack it (not a test module).

:class:`Rig` is the real Actuator (journal, supervisor, executor, jobs API) over the real ``flexmig.nvml`` on the
simulated library (:class:`support.simact.SimActuator`), under a world-traversable base directory; jobs are real
processes (``support/hostile_job.py``, ``/usr/bin/yes``, ``/usr/bin/env``) run as the user their spec names. The rig
records every background task that died (what would stop flexmigd: :data:`flexmig.tasks.FATAL_TASK`) in
:attr:`Rig.deaths`. :func:`scratch_user` makes an unprivileged user with ``useradd`` and removes it after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

from flexmig.act.events import MemorySink
from flexmig.tasks import FATAL_TASK
from support.simact import SimActuator
from support.wait import until

HOSTILE = Path(__file__).resolve().with_name("hostile_job.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may lie where an unprivileged user cannot read
WAIT_S = 30.0


@contextlib.contextmanager
def scratch_user(prefix: str = "fmh") -> Iterator[pwd.struct_passwd]:
    """A fresh unprivileged user (``useradd --system``, no home, no shell), removed after."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=60)


@contextlib.contextmanager
def base_dir(prefix: str = "fm-hostile-") -> Iterator[Path]:
    """A short, world-traversable directory (pytest's are 0700), removed after with everything in it."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Rig(SimActuator):
    """``async with Rig(base) as rig:`` the actuator (mode act) on a simulated H200 under ``base``."""

    def __init__(
        self, base: Path, spec: str = "h200", *, rank_logs: Any = None, events: MemorySink | None = None
    ) -> None:
        super().__init__(base, spec, events=events, rank_logs=rank_logs)
        self.deaths: list[str] = []

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()

        def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if FATAL_TASK in context:
                self.deaths.append(f"{context[FATAL_TASK]}: {context.get('exception')!r}")
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        return await super().__aenter__()

    # ------------------------------------------------------------------------------------------ helpers
    def job(
        self,
        argv: list[str],
        *,
        name: str = "evil",
        user: str | None = None,
        work: Path | None = None,
        checkpoint_dir: Path | None = None,
        ack_timeout_s: float = 20,
    ) -> Path:
        """Write a spec running ``argv`` as ``user`` (the daemon's own by default) and return its path."""
        user = user or pwd.getpwuid(os.geteuid()).pw_name
        work = work or self.base
        ckpt = checkpoint_dir or work / f"{name}.ckpt"
        quoted = ", ".join(f'"{a}"' for a in argv)
        text = (
            f'name = "{name}"\nargv = [{quoted}]\nuser = "{user}"\nworking_dir = "{work}"\n'
            f'checkpoint_dir = "{ckpt}"\n[need]\nprofile = "1g.18gb"\n'
            f"[hook]\nack_timeout_s = {ack_timeout_s}\nexit_timeout_s = 5\n"
        )
        path = self.base / f"{name}-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text)
        path.chmod(0o644)
        return path

    def hostile(self, mode: str, *extra: str, **kw: Any) -> Path:
        """A spec running ``support/hostile_job.py MODE EXTRA...`` (see there) under the system's Python."""
        return self.job([SYSTEM_PYTHON, str(HOSTILE), mode, *extra], **kw)

    async def until(self, what: str, pred: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        """``pred()`` until truthy (:func:`support.wait.until`), naming ``what`` when it is not within the bound."""
        return await until(pred, timeout_s, what)

    def record(self, name: str = "evil") -> Any:
        return self.act.journal.get_job(name)

    def alive(self, name: str = "evil") -> list[int]:
        return [h.proc.pid for h in self.act.supervisor.alive(name)]
