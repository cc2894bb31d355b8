"""Starting and stopping the node's slurmd as a dynamic node with a given ``Gres=``.

Re-registering a node with other GPU GRES works without restarting slurmctld only for a dynamic node (verified
on Slurm 22.05.8): stop slurmd, ``scontrol delete nodename=N``, rewrite gres.conf, start ``slurmd -Z --conf
"Gres=..."``. A static node (one with a ``NodeName=`` line in slurm.conf) whose gres.conf is rewritten goes
INVAL+DRAIN ("gres/gpu count reported lower than configured") and keeps its old GPU bitmap until slurmctld
restarts, so flexmig refuses to manage a static node.

:class:`ProcessSlurmd` runs slurmd itself (it daemonizes: flexmigd's exit or crash leaves it, and the jobs, alone)
and stops it through its pid file. Commands are argv lists; the ``--conf`` value is built from validated pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from flexmig.errors import SlurmError
from flexmig.slurm.client import SlurmCommands

__all__ = ["ProcessSlurmd", "SlurmdControl", "check_node_conf", "dynamic_conf"]

# One NodeName parameter of a dynamic node: KEY=VALUE, no spaces or quotes in the value.
_PARAM = re.compile(r"^[A-Za-z][A-Za-z]*=[A-Za-z0-9_.,:@/+\-]+$")
_STOP_S = 20.0


def check_node_conf(extra: str, source: str = "[slurm] slurmd_conf") -> tuple[str, ...]:
    """The ``KEY=VALUE`` words of ``extra`` (``CPUs=64 RealMemory=500000 Feature=mig``); SlurmError naming
    ``source`` for anything else, and for a ``Gres=`` (flexmig writes that one)."""
    words = tuple(extra.split())
    for w in words:
        if not _PARAM.match(w):
            raise SlurmError(f"{source}: {w!r} is not a KEY=VALUE node parameter (no spaces or quotes in values)")
        if w.split("=", 1)[0].lower() == "gres":
            raise SlurmError(f"{source}: leave Gres= out, flexmig sets it from the node's MIG instances")
    return words


def dynamic_conf(gres: str, extra: Sequence[str]) -> str:
    """The ``--conf`` value of ``slurmd -Z``: the site's parameters plus ``Gres=``."""
    return " ".join([*extra, f"Gres={gres}"])


class SlurmdControl(Protocol):
    """How flexmig restarts the node's slurmd (a process of its own, or a systemd unit)."""

    async def running(self) -> bool:
        """True while slurmd runs."""
        ...

    async def stop(self) -> None:
        """Stop slurmd (jobs on the node must be gone: the node is drained and idle)."""
        ...

    async def start(self, gres: str) -> None:
        """Start slurmd as a dynamic node advertising ``gres``."""
        ...


@dataclass
class ProcessSlurmd:
    """slurmd run by flexmig: ``slurmd -Z -N NODE --conf "... Gres=..."``, stopped by its pid file."""

    node: str
    pid_file: Path
    commands: SlurmCommands
    extra: tuple[str, ...] = ()
    name_node: bool = True
    stop_timeout_s: float = _STOP_S
    started: list[int] = field(default_factory=list)

    def _pid(self) -> int | None:
        try:
            text = self.pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: PTH123
                state = f.read().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            return False
        if state == b"Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return False
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:  # noqa: PTH123 - a recycled pid is not our slurmd
                return f.read().strip().startswith(b"slurmd")
        except OSError:
            return False

    async def running(self) -> bool:
        """True while the pid file names a live slurmd."""
        pid = self._pid()
        return pid is not None and self._alive(pid)

    async def stop(self) -> None:
        """SIGTERM slurmd, SIGKILL after the timeout; returns once it is gone."""
        pid = self._pid()
        if pid is None or not self._alive(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while self._alive(pid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
            await asyncio.sleep(0.05)

    async def start(self, gres: str) -> None:
        """Run ``slurmd -Z`` (it daemonizes once it has read its configuration); SlurmError if it fails."""
        argv = [self.commands.path("slurmd"), "-Z"]
        if self.name_node:
            argv += ["-N", self.node]
        argv += ["--conf", dynamic_conf(gres, self.extra)]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.commands.env(),
        )
        try:
            async with asyncio.timeout(self.commands.timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SlurmError(
                f"slurmd -Z -N {self.node}: did not daemonize within {self.commands.timeout_s:g} s"
            ) from None
        if proc.returncode != 0:
            text = out.decode("utf-8", "replace").strip().splitlines()
            raise SlurmError(f"slurmd -Z -N {self.node}: exit status {proc.returncode}: {text[-1] if text else ''}")
        deadline = time.monotonic() + 5
        while not await self.running():
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmd for {self.node} started but wrote no pid to {self.pid_file}")
            await asyncio.sleep(0.05)
        pid = self._pid()
        if pid is not None:
            self.started.append(pid)
