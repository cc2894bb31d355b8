"""``flexmig_hook``: the few lines a training script needs to be moved between MIG instances.

Its own distribution, ``flexmig-hook``, with no dependencies: a training environment installs it alone
(``pip install flexmig-hook``, or ``pip install ./hook`` from a checkout) and gets none of the daemon's packages.
The daemon's package re-exports it as ``flexmig.hook``, so jobs that import that keep working where flexmig is
installed. Standard library only::

    import flexmig_hook as hook

    h = hook.install()                    # reads FLEXMIG_* and installs the checkpoint-signal handler
    start = load(h.resume) + 1 if h.resume else 0
    for step in range(start, steps):
        train_one_step()
        if h.should_checkpoint():         # a flag the signal handler set; checked at a step boundary
            path = save_atomically(h.checkpoint_dir / f"step-{step}.ckpt")
            h.acknowledge(step, path)     # rank 0 writes {"step": N, "checkpoint": path} atomically
            sys.exit(0)                   # every rank exits 0; the daemon relaunches it elsewhere

Distributed jobs must agree on the step at which they stop (the signal reaches ranks at slightly different
moments): :func:`flexmig_hook.torch.should_checkpoint` all-reduces the flag. The protocol itself is documented in
docs/jobs.md ("Checkpoint hook protocol").

Fast moves: ``h.exit()`` instead of ``sys.exit(0)`` ends a rank that has acknowledged without the interpreter's
teardown (a second or more with torch loaded). With ``standby = true`` in the job's spec, the next generation is
started before the current one checkpoints; call :func:`install` *after* the expensive start-up (imports, building
the model and the optimizer on the CPU, opening data) and before anything that needs the world (the process
group, moving the model to the device): in a standby rank it returns only once flexmig hands over the
acknowledged checkpoint and the new rank, world size and rendezvous (:mod:`flexmig_hook.standby`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

from flexmig_hook.atomic import atomic_write_bytes, atomic_write_json, atomic_writer, fsync_dir, fsync_tree
from flexmig_hook.protocol import (
    ENV_ACK_PATH,
    ENV_ACK_WAIT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_SIGNAL,
    ENV_GENERATION,
    ENV_JOB,
    ENV_RESUME,
    ENV_RESUME_STEP,
    ENV_STANDBY_FD,
    Ack,
    AckError,
    FirstStep,
    HandoverError,
    first_step_path,
    parse_signal,
    read_ack,
)
from flexmig_hook.prune import prune_checkpoints

__all__ = [
    "Ack",
    "AckError",
    "HandoverError",
    "Hook",
    "HookEnv",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_writer",
    "fsync_dir",
    "fsync_tree",
    "install",
    "parse_signal",
    "read_ack",
]


@dataclass(frozen=True, slots=True)
class HookEnv:
    """What the daemon told this rank through its environment.

    ``job`` is None when the script runs outside flexmig (by hand); the hook then still honours the signal but
    writes no acknowledgement.
    """

    job: str | None
    checkpoint_dir: Path
    ack_path: Path | None
    resume: Path | None
    resume_step: int | None
    signal: signal.Signals
    rank: int
    world_size: int
    ack_wait_s: float | None = None
    standby_wait_s: float | None = None
    """How long this rank waited as a standby for its handover (None: it was not started as a standby)."""
    generation: int | None = None
    """The generation flexmig launched this rank as (``FLEXMIG_GENERATION``), None outside flexmig."""
    keep: int = 0
    """Checkpoints of a series to keep after an acknowledgement (``FLEXMIG_CHECKPOINT_KEEP``; 0: all)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HookEnv:
        """Read the hook variables (``os.environ`` by default); ValueError names a malformed variable."""
        env = os.environ if environ is None else environ
        sig_text = env.get(ENV_CHECKPOINT_SIGNAL, "SIGUSR1")
        try:
            sig = parse_signal(sig_text)
        except ValueError as exc:
            raise ValueError(f"{ENV_CHECKPOINT_SIGNAL}: {exc}") from None
        resume = env.get(ENV_RESUME) or None
        step_text = env.get(ENV_RESUME_STEP) or None
        return cls(
            job=env.get(ENV_JOB) or None,
            checkpoint_dir=Path(env.get(ENV_CHECKPOINT_DIR) or "checkpoints"),
            ack_path=Path(env[ENV_ACK_PATH]) if env.get(ENV_ACK_PATH) else None,
            resume=Path(resume) if resume else None,
            resume_step=_int(ENV_RESUME_STEP, step_text) if step_text else None,
            signal=sig,
            rank=_int("RANK", env.get("RANK", "0")),
            world_size=_int("WORLD_SIZE", env.get("WORLD_SIZE", "1")),
            ack_wait_s=_seconds(ENV_ACK_WAIT, env.get(ENV_ACK_WAIT) or None),
            generation=_generation(env.get(ENV_GENERATION)),
            keep=_int(ENV_CHECKPOINT_KEEP, env.get(ENV_CHECKPOINT_KEEP) or "0"),
        )


def _generation(text: str | None) -> int | None:
    """``FLEXMIG_GENERATION`` as a number; None when unset or not one (it is the daemon's, never worth failing on)."""
    return int(text) if text is not None and text.isdigit() else None


def _seconds(name: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}: expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 86400:
        raise ValueError(f"{name}: {text!r} is not between 0 and 86400 seconds")
    return value


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {text!r}") from None


class Hook:
    """One rank's side of the checkpoint protocol: a request flag, the resume point, the acknowledgement.

    The signal handler only sets a flag (nothing else is safe inside a handler), so a request is seen at the next
    step boundary through :meth:`should_checkpoint`. Build it with :func:`install`.
    """

    def __init__(self, env: HookEnv) -> None:
        self.env = env
        self._requested = threading.Event()
        self._boundary_s: float | None = None
        """When the job last called :meth:`should_checkpoint`: the end of its latest step (wall clock)."""
        self._first_reported = False

    # ---------------------------------------------------------------------------------------------- reading
    @property
    def job(self) -> str | None:
        """The job's name, None outside flexmig."""
        return self.env.job

    @property
    def checkpoint_dir(self) -> Path:
        """Where checkpoints go (``FLEXMIG_CHECKPOINT_DIR``; ``./checkpoints`` outside flexmig)."""
        return self.env.checkpoint_dir

    @property
    def resume(self) -> Path | None:
        """The checkpoint to resume from (``FLEXMIG_RESUME``), None on a first start."""
        return self.env.resume

    @property
    def rank(self) -> int:
        """This process's rank (``RANK``, 0 when unset)."""
        return self.env.rank

    # ------------------------------------------------------------------------------------------- signalling
    def install_handler(self) -> None:
        """Install the handler for the checkpoint signal; must run in the main thread."""
        signal.signal(self.env.signal, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._requested.set()

    def request(self) -> None:
        """Raise the checkpoint flag by hand (what the signal handler does); useful for tests and drills."""
        self._requested.set()

    def should_checkpoint(self) -> bool:
        """True once a checkpoint was requested; call it at step boundaries. It stays true until :meth:`clear`.

        Each call marks a step boundary: the acknowledgement carries the last one (``step_done_s``), and the first
        one of a resumed generation is reported to flexmig (:meth:`report_first_step`), which tells from the two
        how long the job itself was down in a move."""
        self._boundary_s = time.time()
        if not self._first_reported:
            self.report_first_step()
        return self._requested.is_set()

    def report_first_step(self) -> None:
        """Tell flexmig this resumed generation completed its first step (done by the first
        :meth:`should_checkpoint`; call it yourself only if the job checks for requests less than once a step).
        Rank 0 of a generation that resumes under flexmig writes the report once; anything else does nothing. A
        report that cannot be written is skipped: it only measures, the job goes on."""
        self._first_reported = True
        env = self.env
        if env.rank != 0 or env.ack_path is None or env.resume is None or env.generation is None:
            return
        report = FirstStep(generation=env.generation, step_done_s=self._boundary_s or time.time())
        with contextlib.suppress(OSError):
            atomic_write_json(first_step_path(env.ack_path), report.to_json(), mode=0o644)

    def clear(self) -> None:
        """Forget a request (for jobs that checkpoint and carry on instead of exiting)."""
        self._requested.clear()

    # ---------------------------------------------------------------------------------------- acknowledging
    @property
    def from_standby(self) -> bool:
        """True when this rank was started as a standby and handed the world by flexmig."""
        return self.env.standby_wait_s is not None

    def exit(self, status: int = 0) -> NoReturn:
        """End this rank now, without the interpreter's teardown (a second or more once torch is loaded).

        Call it after the checkpoint is complete (written atomically, so fsynced) and acknowledged: it flushes
        ``sys.stdout``, ``sys.stderr`` and the ``logging`` handlers, then calls ``os._exit``. ``atexit``
        functions and finalizers do not run, so flush or close anything else of the job's own first (a metrics
        writer, a log file opened without line buffering); the checkpoint itself is safe by then.
        """
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):
            logging.shutdown()
        os._exit(status)

    def acknowledge(self, step: int, checkpoint: str | os.PathLike[str]) -> None:
        """Tell the daemon the checkpoint of ``step`` is safely on disk. Only rank 0 writes; others return.

        Call it after the checkpoint file is complete (written atomically), then exit 0. With ``[hook] keep`` in
        the job's spec (``FLEXMIG_CHECKPOINT_KEEP``) it then removes the older checkpoints of the same series
        beyond that many (:func:`flexmig_hook.prune.prune_checkpoints`); the one acknowledged always stays.
        Outside flexmig (no ``FLEXMIG_ACK_PATH``) it does nothing. Under Slurm (``FLEXMIG_ACK_WAIT_S`` set by
        flexmig's TaskProlog) it then waits up to that long for flexmig to requeue the job, which ends this
        process; it returns only if that does not happen in time.
        """
        if self.env.rank != 0 or self.env.ack_path is None:
            return
        ack = Ack(step=int(step), checkpoint=str(Path(checkpoint).absolute()), step_done_s=self._boundary_s)
        atomic_write_json(self.env.ack_path, ack.to_json(), mode=0o644)
        if self.env.keep > 0:
            prune_checkpoints(Path(ack.checkpoint), ack.step, self.env.keep)
        if self.env.ack_wait_s:
            threading.Event().wait(self.env.ack_wait_s)


def install(environ: Mapping[str, str] | None = None, *, handler: bool = True) -> Hook:
    """Read the hook environment and (by default) install the checkpoint-signal handler; returns the Hook.

    In a standby rank (``FLEXMIG_STANDBY_FD`` set) it first tells flexmig the rank is ready and blocks until
    flexmig hands over the new world and the checkpoint to resume from; those land in ``os.environ`` (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``FLEXMIG_RESUME``...), so ``init_process_group`` and the
    rest of the script read them as in any other rank. If the move is cancelled instead, the rank ends here.
    So call it after the job's expensive start-up and before anything that needs the world.
    """
    env = dict(os.environ if environ is None else environ)
    waited: float | None = None
    fd_text = env.pop(ENV_STANDBY_FD, None)
    if fd_text:
        from flexmig_hook.standby import abandon, wait_for_handover  # noqa: PLC0415 - standby ranks only

        t0 = time.monotonic()
        world = wait_for_handover(_int(ENV_STANDBY_FD, fd_text))
        if world is None:
            abandon()
        waited = time.monotonic() - t0
        env.update(world or {})
        if environ is None:
            os.environ.pop(ENV_STANDBY_FD, None)
            os.environ.update(world or {})
    h = Hook(_with_wait(HookEnv.from_environ(env), waited))
    if handler:
        h.install_handler()
    return h


def _with_wait(env: HookEnv, waited: float | None) -> HookEnv:
    return env if waited is None else replace(env, standby_wait_s=waited)
