"""Asking and telling Slurm through its own commands (``squeue``, ``sinfo``, ``scontrol``, ``scancel``), off the
event loop, each bounded in time.

pyslurm has no release for Slurm 22.05, and slurmrestd is one more daemon to secure, so flexmig uses the CLI, with
``--json`` where Slurm has it. Every command is an argv list (never a shell), run with the configured
``SLURM_CONF``; a non-zero exit, a timeout or an unreadable answer is a SlurmError naming the command and the
first line Slurm printed.

Behaviour verified on Slurm 22.05.8 that this module relies on:

* with slurmctld down every command needs about 9 s to give up (``squeue --json`` then exits 0 with an error in
  its JSON; :mod:`flexmig.slurm.envelope` turns that into a SlurmError);
* ``scontrol delete nodename=N`` refuses while a job runs on N ("Requested nodes are busy");
* ``scontrol requeuehold J`` on a running job puts it back to PENDING (reason JobHeldUser when root asked) within
  a fraction of a second, ``restart_cnt`` counting up; ``scontrol release J`` then
  ``scontrol update jobid=J StartTime=now`` makes it start at the next scheduling pass instead of after the
  requeue delay (about 120 s);
* ``scancel --signal=USR1 --batch J`` signals only the batch script's process, not the steps it started;
* ``sdiag`` answers in milliseconds (no job lock): its job counters ("Jobs submitted: N", started, completed,
  canceled, failed) move whenever the queue does, so flexmig polls it often and reads the queue only when they
  moved, or every ``[slurm] interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flexmig.errors import SlurmError
from flexmig.slurm.node_brief import brief_format, parse_brief
from flexmig.slurm.nodes import SlurmNode, parse_scontrol_nodes, parse_sinfo
from flexmig.slurm.reservations import SlurmReservation, parse_reservations
from flexmig.slurm.squeue import SlurmJob, parse_squeue

__all__ = ["SlurmClient", "SlurmCommands"]

_MAX_OUTPUT = 64 * 1024 * 1024
_SEARCH = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin")


@dataclass(frozen=True, slots=True)
class SlurmCommands:
    """Where Slurm's commands are and which configuration they read.

    ``bin_dir`` None: found on ``PATH`` (and the usual sbin directories, where Debian puts ``slurmd``).
    ``conf`` None: Slurm's own default (``SLURM_CONF`` of the environment, else ``/etc/slurm/slurm.conf``).
    """

    bin_dir: Path | None = None
    conf: Path | None = None
    timeout_s: float = 30.0
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def path(self, name: str) -> str:
        """The absolute path of command ``name``; SlurmError when it is not installed."""
        if self.bin_dir is not None:
            candidate = self.bin_dir / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
            raise SlurmError(f"{candidate} does not exist or is not executable ([slurm] bin_dir)")
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SEARCH))
        if found is None:
            raise SlurmError(f"{name} is not installed (Debian: apt-get install slurm-client slurmd)")
        return found

    def env(self) -> dict[str, str]:
        """The environment the commands run with."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_"))}
        env.update(self.extra_env)
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        elif "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        env["LC_ALL"] = "C"
        return env


class SlurmClient:
    """The Slurm commands flexmig runs, as coroutines."""

    def __init__(self, commands: SlurmCommands | None = None) -> None:
        self.commands = commands or SlurmCommands()
        self._nodes_by_scontrol = False
        self.last_nodes: tuple[SlurmNode, ...] = ()
        """The nodes of the last :meth:`nodes` answer (empty before the first)."""
        self._jobs_s: deque[float] = deque(maxlen=5)
        self.on_jobs_read: Callable[[float], None] | None = None
        self.last_job_count = 0
        """How many jobs the last :meth:`jobs` listed (what a read of the queue costs slurmctld grows with it)."""
        """Told how long each :meth:`jobs` took (the metrics)."""

    async def run(self, name: str, args: Sequence[str], *, timeout_s: float | None = None) -> bytes:
        """Run Slurm command ``name`` with ``args``; its standard output. SlurmError on failure or timeout."""
        argv = [self.commands.path(name), *args]
        shown = " ".join([name, *args])
        limit = self.commands.timeout_s if timeout_s is None else timeout_s
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.commands.env(),
                start_new_session=True,
            )
        except OSError as exc:
            raise SlurmError(f"{shown}: cannot run {argv[0]}: {exc.strerror}") from None
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise SlurmError(f"{shown}: no answer within {limit:g} s (is slurmctld up?)") from None
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
            raise
        if len(out) > _MAX_OUTPUT:
            raise SlurmError(f"{shown}: answer larger than {_MAX_OUTPUT // (1024 * 1024)} MiB; refused")
        if proc.returncode != 0:
            raise SlurmError(f"{shown}: exit status {proc.returncode}: {_first_line(err) or _first_line(out)}")
        return out

    # -------------------------------------------------------------------------------------------- reading
    async def jobs(self, *, finished: bool = False) -> tuple[SlurmJob, ...]:
        """The jobs waiting or holding resources (``squeue --json``), what flexmig decides on; with ``finished``
        every job slurmctld knows, the finished ones it still keeps (``MinJobAge``, 300 s by default) included
        (``--states=all``). 22.05 prints them all either way; from 23.02 on, a busy cluster's finished jobs are
        most of the answer, so they are left out unless asked for."""
        started = time.monotonic()
        jobs = parse_squeue(await self.run("squeue", ["--json", "--states=all"] if finished else ["--json"]))
        took = time.monotonic() - started
        self._jobs_s.append(took)
        self.last_job_count = len(jobs)
        if self.on_jobs_read is not None:
            self.on_jobs_read(took)
        return jobs

    @property
    def jobs_read_s(self) -> float:
        """What reading the queue costs: the quickest of the last five :meth:`jobs` (Slurm's answer and its
        parsing; a moment's load on this machine does not count, a big queue or a slow slurmctld does); 0 before
        the first."""
        return min(self._jobs_s, default=0.0)

    async def nodes(self) -> tuple[SlurmNode, ...]:
        """Every node: ``sinfo --json`` on Slurm 22.05, ``scontrol --json show nodes`` on 23.02 and later (whose
        ``sinfo --json`` no longer lists nodes one by one; which one is learnt from the first answer). The answer
        is kept as :attr:`last_nodes`."""
        found = None
        if not self._nodes_by_scontrol:
            found = parse_sinfo(await self.run("sinfo", ["--json"]))
            self._nodes_by_scontrol = found is None
        if found is None:
            found = parse_scontrol_nodes(await self.run("scontrol", ["--json", "show", "nodes"]))
        self.last_nodes = found
        return found

    async def node_brief(self, name: str) -> SlurmNode | None:
        """Node ``name`` as ``sinfo --all -N -h -n NAME -O ...`` shows it (hidden partitions too), asking slurmctld
        for that node alone: its state, GRES, partitions, CPUs and reason; None when sinfo lists it in no partition.
        What a change's polls and simple checks read (:mod:`flexmig.slurm.node_brief`)."""
        return parse_brief(await self.run("sinfo", ["--all", "-N", "-h", "-n", name, "-O", brief_format()]), name)

    async def node_records(self) -> int:
        """How many nodes slurmctld's node table holds, FUTURE placeholders included (``scontrol --future -o show
        nodes``, one line a node): what slurm.conf's ``MaxNodeCount`` bounds."""
        text = (await self.run("scontrol", ["--future", "-o", "show", "nodes"])).decode("utf-8", "replace")
        return sum(1 for line in text.splitlines() if line.startswith("NodeName="))

    async def node(self, name: str) -> SlurmNode | None:
        """Node ``name``, None when slurmctld does not know it (a dynamic node that is not registered)."""
        return next((n for n in await self.nodes() if n.name == name), None)

    # -------------------------------------------------------------------------------------------- telling
    async def drain(self, node: str, reason: str) -> None:
        """``scontrol update nodename=N state=drain reason=...``: no new job starts on N."""
        await self.run("scontrol", ["update", f"nodename={node}", "state=drain", f"reason={reason}"])

    async def update_node(self, node: str, values: Mapping[str, str]) -> None:
        """``scontrol update nodename=N KEY=VALUE...`` (each pair one argument: no shell, any text is one value)."""
        await self.run("scontrol", ["update", f"nodename={node}", *(f"{k}={v}" for k, v in values.items())])

    async def resume(self, node: str) -> None:
        """``scontrol update nodename=N state=resume``: undo a drain."""
        await self.run("scontrol", ["update", f"nodename={node}", "state=resume"])

    async def delete_node(self, node: str) -> bool:
        """``scontrol delete nodename=N`` (dynamic nodes); False when N was not registered anyway.

        22.05.8 says only "failed to delete nodes N" for a node it does not know, so absence is checked first.
        """
        if await self.node_brief(node) is None and await self.node(node) is None:
            return False
        await self.run("scontrol", ["delete", f"nodename={node}"])
        return True

    async def future_node(self, node: str) -> bool:
        """``scontrol update nodename=N state=future``: a static node of slurm.conf leaves service (hidden, no longer
        pinged) until its slurmd registers again; False when N was not listed anyway. Slurm refuses it while a job
        runs on N ("Invalid node state transition", verified on 22.05.8 and 24.11.5)."""
        if await self.node_brief(node) is None and await self.node(node) is None:
            return False
        await self.run("scontrol", ["update", f"nodename={node}", "state=future"])
        return True

    async def future_record(self, node: str) -> str | None:
        """The ``Gres=`` slurm.conf gives node ``node`` as slurmctld knows it, FUTURE nodes included (``scontrol
        --future -o show node N``); None when slurmctld has no such node."""
        try:
            text = (await self.run("scontrol", ["--future", "-o", "show", "node", node])).decode("utf-8", "replace")
        except SlurmError as exc:
            if "not found" in str(exc).lower():
                return None
            raise
        for line in text.splitlines():
            words = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if words.get("NodeName") == node:
                return words.get("Gres", "")
        return None

    async def reservations(self) -> tuple[SlurmReservation, ...]:
        """Every reservation (``scontrol show reservation --oneliner``)."""
        return parse_reservations(await self.run("scontrol", ["show", "reservation", "--oneliner"]))

    async def create_reservation(self, name: str, node: str, start_in_s: float, duration_s: float) -> None:
        """A reservation ``name`` of ``node`` starting ``start_in_s`` from now for ``duration_s``: root's, for no
        job (``IGNORE_JOBS``: the jobs running on the node may run into it)."""
        await self.run(
            "scontrol",
            ["create", "reservation", f"reservationname={name}", f"nodes={node}", f"starttime={_when(start_in_s)}",
             f"duration={_duration(duration_s)}", "users=root", "flags=ignore_jobs"],
        )  # fmt: skip

    async def move_reservation(self, name: str, start_in_s: float, duration_s: float) -> None:
        """Move reservation ``name`` to start ``start_in_s`` from now, lasting ``duration_s``."""
        await self.run(
            "scontrol",
            [
                "update",
                f"reservationname={name}",
                f"starttime={_when(start_in_s)}",
                f"duration={_duration(duration_s)}",
            ],
        )

    async def delete_reservation(self, name: str) -> bool:
        """``scontrol delete reservation=NAME``; False when it did not exist."""
        if not any(r.name == name for r in await self.reservations()):
            return False
        await self.run("scontrol", ["delete", f"reservation={name}"])
        return True

    async def counters(self) -> tuple[int, ...]:
        """``sdiag``'s job counters (submitted, started, completed, canceled, failed): they move when the queue
        does."""
        text = (await self.run("sdiag", [])).decode("utf-8", "replace")
        out: list[int] = []
        for key in ("Jobs submitted:", "Jobs started:", "Jobs completed:", "Jobs canceled:", "Jobs failed:"):
            line = next((x for x in text.splitlines() if x.strip().startswith(key)), None)
            value = line.split(":", 1)[1].strip() if line else ""
            if not value.isdigit():
                raise SlurmError(f"sdiag: no {key[:-1]!r} counter in its answer")
            out.append(int(value))
        return tuple(out)

    async def backfill_cycle_start(self) -> float | None:
        """When the backfill scheduler's last cycle began (``sdiag``'s "Last cycle when", epoch seconds; None before
        its first cycle). 22.05 sets it right after the cycle cleared the previous cycle's planned nodes."""
        text = (await self.run("sdiag", [])).decode("utf-8", "replace")
        part = text.split("Backfilling stats", 1)
        if len(part) < 2:
            return None
        for line in part[1].splitlines()[:40]:
            if line.strip().startswith("Last cycle when:"):
                stamp = line.rsplit("(", 1)[-1].rstrip(")").strip()
                return float(stamp) if stamp.isdigit() else None
        return None

    async def config(self) -> dict[str, str]:
        """``scontrol show config`` as ``{key: value}``."""
        text = (await self.run("scontrol", ["show", "config"])).decode("utf-8", "replace")
        out: dict[str, str] = {}
        for line in text.splitlines()[:5000]:
            key, sep, value = line.partition("=")
            if sep and key.strip() and " " not in key.strip():
                out[key.strip()] = value.strip()
        return out

    async def signal_batch(self, job_id: int, sig: str = "USR1") -> None:
        """``scancel --signal=SIG --batch J``: signal the job's batch script only."""
        await self.run("scancel", [f"--signal={sig}", "--batch", str(job_id)])

    async def requeue_hold(self, job_id: int) -> None:
        """``scontrol requeuehold J``: stop the job and put it back in the queue, held."""
        await self.run("scontrol", ["requeuehold", str(job_id)])

    async def release(self, job_id: int) -> None:
        """``scontrol release J`` then ``StartTime=now``, so the requeue delay does not apply."""
        await self.run("scontrol", ["release", str(job_id)])
        await self.run("scontrol", ["update", f"jobid={job_id}", "StartTime=now"])


def _when(start_in_s: float) -> str:
    """Slurm's relative time: ``now`` or ``now+N`` (seconds)."""
    n = max(0, round(start_in_s))
    return "now" if n == 0 else f"now+{n}"


def _duration(seconds: float) -> str:
    """``H:MM:SS`` (at least a minute: Slurm rounds reservations to minutes)."""
    n = max(60, round(seconds))
    return f"{n // 3600}:{n % 3600 // 60:02d}:{n % 60:02d}"


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
