"""The node's slurmd, run by its own service manager: flexmig decides what it registers and asks for restarts.

slurmd runs under its own systemd unit (Debian's ``slurmd.service``, with flexmig's drop-in
``systemd/slurmd.service.d/flexmig.conf``: ``slurmd -D -s -Z -N ${FLEXMIG_SLURMD_NODE} --conf
${FLEXMIG_SLURMD_CONF}``, the two variables read from the environment file flexmig writes). It is never flexmigd's
child: Slurm's cgroup/v2 plugin expects slurmd under systemd with ``Delegate=yes``, and flexmigd's own sandbox would
be inherited by the jobs. To register the node with other GRES flexmig writes that file and asks for a restart:

* ``systemd`` (:class:`SystemdSlurmd`): ``systemctl start|stop|restart UNIT``;
* ``hook`` (:class:`HookSlurmd`): a site command run as ``HOOK start|stop|restart`` with the environment file's path
  in ``FLEXMIG_SLURMD_ENV`` and both values in the environment (the testbed's hook is
  :mod:`flexmig.slurm.standin`, a stand-in for the unit where systemd is not PID 1).

Re-registering a node with other GPU GRES works without restarting slurmctld only for a dynamic node (verified on
Slurm 22.05.8): stop slurmd, ``scontrol delete nodename=N``, rewrite gres.conf, start ``slurmd -Z --conf
"Gres=..."``. A slurmd started again with the *same* GRES while jobs run (after a crash, ``kill -9``) re-registers
the node with its jobs: they run on and complete (verified), so a crashed slurmd is restarted at once, with no
drain. Whether slurmd runs, stopped or crashed is read from its pid file (``SlurmdPidFile``): slurmd removes it when
it stops cleanly and leaves it when it is killed; under systemd, which removes a stale pid file itself, a crash is
``systemctl is-failed``. An administrator's ``systemctl stop slurmd`` is a clean stop: flexmig leaves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from flexmig.errors import SlurmError
from flexmig.slurm.client import SlurmCommands
from flexmig.slurm.gres import parse_gres
from flexmig.slurm.supply import atomic_write

__all__ = [
    "ENV_CONF",
    "ENV_MODE",
    "ENV_NODE",
    "HookSlurmd",
    "SlurmdControl",
    "SlurmdState",
    "SystemdSlurmd",
    "check_node_conf",
    "dynamic_conf",
    "gres_slices",
    "read_env_file",
    "render_env_file",
]

ENV_NODE = "FLEXMIG_SLURMD_NODE"
ENV_CONF = "FLEXMIG_SLURMD_CONF"
ENV_MODE = "FLEXMIG_SLURMD_MODE"
"""``static`` in the environment file of a static node's slurmd (``[slurm] instance_nodes = static``)."""
SlurmdState = Literal["running", "stopped", "crashed"]

# One NodeName parameter of a dynamic node: KEY=VALUE, no spaces or quotes in the value.
_PARAM = re.compile(r"^[A-Za-z][A-Za-z]*=[A-Za-z0-9_.,:@/+\-]+$")
_ENV_LINE = re.compile(r'^([A-Z_]+)="([A-Za-z0-9_.,:@/+=\- ]*)"$')


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


def gres_slices(gres: str) -> int:
    """The compute slices of the MIG devices a ``Gres=`` value lists (``gpu:3g.71gb:1`` -> 3; a MIG profile's name
    starts with its compute slices); 0 for none."""
    total = 0
    for g in parse_gres(gres, where="Gres="):
        m = re.match(r"([0-9]{1,2})g\.", g.type or "")
        if g.name == "gpu" and m is not None:
            total += int(m.group(1)) * g.count
    return total


def dynamic_conf(gres: str, extra: Sequence[str], per_slice: Sequence[tuple[str, int]] = ()) -> str:
    """The ``--conf`` value of ``slurmd -Z``: the site's parameters, those it gives per compute slice multiplied
    by the slices of ``gres`` (``[slurm] slurmd_conf_per_slice``, one node per instance), plus ``Gres=``."""
    slices = max(1, gres_slices(gres)) if per_slice else 0
    return " ".join([*extra, *(f"{name}={value * slices}" for name, value in per_slice), f"Gres={gres}"])


def render_env_file(node: str, conf: str, *, static: bool = False) -> str:
    """The environment file the slurmd unit reads (systemd's ``EnvironmentFile=`` syntax, values quoted);
    ``static``: the node is a static one of slurm.conf (``slurmd -N`` without ``-Z``; ``--conf`` is not read)."""
    for value in (node, conf):
        if not re.fullmatch(r"[A-Za-z0-9_.,:@/+=\- ]*", value):
            raise SlurmError(f"refusing to write {value!r} into slurmd's environment file")
    return (
        "# written by flexmigd: what slurmd registers (the flexmig drop-in of slurmd.service reads it)\n"
        f'{ENV_NODE}="{node}"\n{ENV_CONF}="{conf}"\n' + (f'{ENV_MODE}="static"\n' if static else "")
    )


def read_env_file(text: str) -> dict[str, str]:
    """The variables of an environment file written by :func:`render_env_file`."""
    out: dict[str, str] = {}
    for line in text.splitlines()[:64]:
        m = _ENV_LINE.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


class SlurmdControl(Protocol):
    """How flexmig starts, stops and watches the node's slurmd."""

    async def state(self) -> SlurmdState:
        """``running``, ``stopped`` (cleanly, or never started) or ``crashed``."""
        ...

    async def running(self) -> bool:
        """True while slurmd runs."""
        ...

    async def stop(self) -> None:
        """Stop slurmd (its jobs run on: slurmstepd outlives it)."""
        ...

    async def start(self, gres: str) -> None:
        """(Re)start slurmd as a dynamic node advertising ``gres``."""
        ...

    def registered_conf(self) -> str | None:
        """The ``--conf`` value slurmd was last started with (None: flexmig never wrote one)."""
        ...


def _pid(path: Path) -> int | None:
    try:
        with open(path, "rb") as f:  # noqa: PTH123 - small, bounded read
            text = f.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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


@dataclass
class _Unit:
    """What both service managers share: the environment file, the pid file, bounded commands."""

    node: str
    env_file: Path
    pid_file: Path
    commands: SlurmCommands
    extra: tuple[str, ...] = ()
    per_slice: tuple[tuple[str, int], ...] = ()
    static: bool = False
    """A static node of slurm.conf (``[slurm] instance_nodes = static``): started without ``-Z``."""
    wait_s: float = 20.0
    started: list[int] = field(default_factory=list)
    last_output: list[str] = field(default_factory=lambda: [""])

    def registered_conf(self) -> str | None:
        """The ``--conf`` value in the environment file (None when there is none)."""
        try:
            text = self.env_file.read_text()[:65536]
        except OSError:
            return None
        return read_env_file(text).get(ENV_CONF)

    def write_env(self, gres: str) -> None:
        """Write what slurmd must register: the node name and ``--conf`` (with ``Gres=``)."""
        self.env_file.parent.mkdir(parents=True, exist_ok=True)
        conf = dynamic_conf(gres, self.extra, self.per_slice)
        atomic_write(self.env_file, render_env_file(self.node, conf, static=self.static))

    def pid(self) -> int | None:
        """The live slurmd's pid, or None."""
        pid = _pid(self.pid_file)
        return pid if pid is not None and _alive(pid) else None

    async def running(self) -> bool:
        """True while the pid file names a live slurmd."""
        return self.pid() is not None

    async def run(self, argv: Sequence[str], what: str, extra_env: dict[str, str] | None = None) -> int:
        """Run ``argv`` bounded by the command timeout; its exit status (SlurmError if it cannot run or hangs)."""
        env = {**self.commands.env(), **(extra_env or {})}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise SlurmError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from None
        try:
            async with asyncio.timeout(self.commands.timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise SlurmError(f"{what}: no answer within {self.commands.timeout_s:g} s") from None
        self.last_output = out.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return proc.returncode if proc.returncode is not None else -1

    async def wait_until(self, alive: bool, what: str) -> None:
        """Until slurmd runs (``alive``) or is gone; SlurmError after ``wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while (self.pid() is not None) != alive:
            if loop.time() > deadline:
                raise SlurmError(
                    f"{what}: slurmd {'did not start' if alive else 'did not stop'} within {self.wait_s:g} s"
                )
            await asyncio.sleep(0.05)
        if alive and (pid := self.pid()) is not None:
            self.started.append(pid)


@dataclass
class HookSlurmd(_Unit):
    """slurmd restarted through a site command: ``HOOK start|stop|restart`` (exit status 0 on success)."""

    hook: tuple[str, ...] = ()

    def _env(self) -> dict[str, str]:
        conf = self.registered_conf() or ""
        env = {"FLEXMIG_SLURMD_ENV": str(self.env_file), ENV_NODE: self.node, ENV_CONF: conf}
        return {**env, ENV_MODE: "static"} if self.static else env

    async def _call(self, verb: str) -> None:
        if not self.hook:
            raise SlurmError("[slurm] slurmd_hook is empty: name the command that starts and stops slurmd")
        what = f"{' '.join(self.hook)} {verb}"
        rc = await self.run([*self.hook, verb], what, self._env())
        if rc != 0:
            raise SlurmError(f"{what}: exit status {rc}: {self.last_output[0]}")

    async def state(self) -> SlurmdState:
        """From the pid file: live slurmd, none (clean stop), or a dead one's (a crash)."""
        if self.pid() is not None:
            return "running"
        return "crashed" if _pid(self.pid_file) is not None else "stopped"

    async def stop(self) -> None:
        """``HOOK stop``, until slurmd is gone."""
        if self.pid() is None:
            return
        await self._call("stop")
        await self.wait_until(False, "stopping slurmd")

    async def start(self, gres: str) -> None:
        """Write the environment file, ``HOOK restart``, until slurmd runs."""
        self.write_env(gres)
        await self._call("restart")
        await self.wait_until(True, "starting slurmd")


@dataclass
class SystemdSlurmd(_Unit):
    """slurmd as a systemd unit (``systemctl``), with flexmig's drop-in reading the environment file."""

    unit: str = "slurmd.service"

    async def _systemctl(self, *args: str) -> int:
        return await self.run(["systemctl", *args], f"systemctl {' '.join(args)}")

    async def state(self) -> SlurmdState:
        """Running (pid file), else ``failed`` in systemd's eyes (a crash), else stopped."""
        if self.pid() is not None:
            return "running"
        return "crashed" if await self._systemctl("is-failed", "--quiet", self.unit) == 0 else "stopped"

    async def stop(self) -> None:
        """``systemctl stop UNIT`` (the unit's ``KillMode=process`` leaves the jobs' slurmstepd running)."""
        if await self._systemctl("stop", self.unit) != 0:
            raise SlurmError(f"systemctl stop {self.unit}: {self.last_output[0]}")
        await self.wait_until(False, f"systemctl stop {self.unit}")

    async def start(self, gres: str) -> None:
        """Write the environment file, ``systemctl restart UNIT`` (``reset-failed`` first), until slurmd runs."""
        self.write_env(gres)
        await self._systemctl("reset-failed", self.unit)
        if await self._systemctl("restart", self.unit) != 0:
            raise SlurmError(f"systemctl restart {self.unit}: {self.last_output[0]}")
        await self.wait_until(True, f"systemctl restart {self.unit}")
