"""What the job tests share (not a test module): the ``flexmig`` CLI as a subprocess, the example jobs' specs,
the torch example's training log and its invariants across moves, and finding or killing a job's ranks.

Used by ``test_act_torch.py`` (the actuator run standalone) and ``test_daemon_actuator.py`` (inside flexmigd).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from flexmig.act.journal import Journal, JournalError
from flexmig.hook.protocol import ENV_CHECKPOINT_DIR, ENV_JOB_ID
from support.toml import toml_value
from support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def flexmig(sock: Path, *args: str, check: bool = True, timeout_s: float = 300) -> str:
    """``flexmig jobs --socket SOCK ARGS...``; its stdout (asserting exit status 0 unless ``check`` is False)."""
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def write_spec(path: Path, text: str) -> Path:
    """A job spec file with the permissions the daemon accepts (owner-writable only)."""
    path.write_text(text)
    path.chmod(0o644)
    return path


def job_toml(
    name: str,
    argv: Sequence[str],
    base: Path,
    *,
    checkpoint_dir: Path | None = None,
    ranks: tuple[int, int, int] = (1, 1, 1),
    profile: str = "1g.18gb",
    env: Mapping[str, str] | None = None,
    hook: Mapping[str, Any] | None = None,
    user: str = "root",
    **top: Any,
) -> str:
    """A job spec's TOML: ``name`` running ``argv`` as ``user`` in ``base`` (its checkpoints in ``checkpoint_dir``,
    ``base/ckpt-NAME`` by default), ``ranks`` as (min, max, start) of ``profile``, then ``[hook]`` (last, so a test
    may append keys to it). ``top``: more top-level keys (``launcher = "torchrun"``)."""
    lines = [
        f"name = {toml_value(name)}",
        f"argv = {toml_value(list(argv))}",
        f"user = {toml_value(user)}",
        f"working_dir = {toml_value(str(base))}",
        f"checkpoint_dir = {toml_value(str(checkpoint_dir or base / f'ckpt-{name}'))}",
        *(f"{key} = {toml_value(value)}" for key, value in top.items()),
    ]
    if env:
        lines.append(f"env = {toml_value(dict(env))}")
    low, high, start = ranks
    lines += [
        "[ranks]",
        f"min = {low}",
        f"max = {high}",
        f"start = {start}",
        "[need]",
        f"profile = {toml_value(profile)}",
    ]
    lines += ["[hook]", *(f"{key} = {toml_value(value)}" for key, value in (hook or {}).items())]
    return "\n".join(lines) + "\n"


def ddp_spec(
    base: Path,
    name: str = "ddp",
    *,
    ranks: int = 2,
    min_ranks: int = 1,
    max_ranks: int = 4,
    launcher: str = "plain",
    profile: str = "1g.18gb",
) -> str:
    """The torch DDP example (``examples/train_ddp.py``) as a job spec, logging to base/train.log (1g.18gb ranks
    unless ``profile`` says otherwise); ``min_ranks`` below ``ranks`` makes it malleable. It keeps every checkpoint
    (``keep = 0``): :meth:`Training.check_resumed_exactly` loads each one."""
    return f"""\
name = "{name}"
argv = ["{sys.executable}", "{ROOT}/examples/train_ddp.py", "--steps", "100000", "--step-time", "0.03",
        "--lr", "0.005", "--log", "{base}/train.log"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt"
launcher = "{launcher}"
env = {{ OMP_NUM_THREADS = "1" }}
[ranks]
min = {min_ranks}
max = {max_ranks}
start = {ranks}
[need]
profile = "{profile}"
[hook]
ack_timeout_s = 120
exit_timeout_s = 60
keep = 0
"""


def counter_spec(
    base: Path,
    name: str,
    *,
    profile: str = "1g.18gb",
    ranks: int = 1,
    max_ranks: int | None = None,
    step_time: float = 0.01,
    ack_timeout_s: float = 30,
    python: str = sys.executable,
) -> str:
    """The stdlib example (``examples/hook_minimal.py``) as a job spec, logging to base/NAME.log (``max_ranks``
    above ``ranks``: it may be re-split up to that many), run by ``python`` (this interpreter by default)."""
    return f"""\
name = "{name}"
argv = ["{python}", "{ROOT}/examples/hook_minimal.py", "--step-time", "{step_time}",
        "--log", "{base}/{name}.log", "--log-every", "1"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt-{name}"
[ranks]
min = {ranks}
max = {max_ranks or ranks}
start = {ranks}
[need]
profile = "{profile}"
[hook]
ack_timeout_s = {ack_timeout_s}
exit_timeout_s = 30
"""


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a job's log (empty before the job wrote any)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class Training:
    """The training log of ``examples/train_ddp.py`` (rank 0 writes it) and waits on it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.log_path = base / "train.log"

    def log(self) -> list[dict[str, Any]]:
        """Every line so far."""
        return log_lines(self.log_path)

    def wait_for(self, n_starts: int, steps_after: int, timeout_s: float = 120) -> dict[str, Any]:
        """Wait for the n-th start event and ``steps_after`` steps after it; returns that start."""

        def reached() -> dict[str, Any] | None:
            log = self.log()
            starts = [i for i, e in enumerate(log) if e["event"] == "start"]
            if len(starts) >= n_starts:
                i = starts[n_starts - 1]
                if sum(1 for e in log[i:] if e["event"] == "step") >= steps_after:
                    return log[i]
            return None

        try:
            start: dict[str, Any] = wait_until(
                reached, timeout_s, f"start {n_starts} of the training and {steps_after} steps after it"
            )
            return start
        except AssertionError:
            raise AssertionError(
                f"training did not reach start {n_starts} + {steps_after} steps: {self.log()[-3:]}"
            ) from None

    def check_resumed_exactly(self, torch: Any, moves: int) -> None:
        """After ``moves`` moves: each start resumed at the acknowledged step + 1 with the checkpoint's exact
        parameters, every step ran once, and the loss fell across every move and overall."""
        log = self.log()
        checkpoints = [e for e in log if e["event"] == "checkpoint"]
        starts = [e for e in log if e["event"] == "start"]
        assert len(checkpoints) == moves and len(starts) == moves + 1
        for ckpt, start in zip(checkpoints, starts[1:], strict=True):
            assert start["step"] == ckpt["step"] + 1, "resumes at the acknowledged step + 1"
            assert start["params"] == ckpt["params"], "parameters are exactly the checkpoint's"
            saved = torch.load(ckpt["path"], map_location="cpu", weights_only=True)
            flat = [float(v) for t_ in saved["model"].values() for v in t_.reshape(-1).tolist()]
            assert flat == start["params"]
        steps = [e["step"] for e in log if e["event"] == "step"]
        assert steps == list(range(len(steps))), "every step ran exactly once across the moves"
        loss = {e["step"]: e["loss"] for e in log if e["event"] == "step"}
        for ckpt in checkpoints:
            k = ckpt["step"]
            before = sum(loss[s] for s in range(k - 2, k + 1)) / 3
            after = sum(loss[s] for s in range(k + 1, k + 4)) / 3
            assert after < before, f"loss rose across the move at step {k}: {before} -> {after}"
        assert loss[steps[-1]] < loss[0] / 2


def job_uid(journal: Path, name: str) -> str | None:
    """The job's current submission ID from the journal (None if there is no such job)."""
    return job_uids(journal, name).get(name)


def job_uids(journal: Path, *names: str) -> dict[str, str]:
    """Job name -> current submission ID from the journal, for ``names`` (every job when none is named)."""
    if not journal.exists():
        return {}
    try:
        j = Journal(journal)
    except JournalError:  # a test's broken or planted journal: its ranks are found by their paths instead
        return {}
    try:
        return {rec.name: rec.uid for rec in j.jobs() if not names or rec.name in names}
    finally:
        j.close()


def kill_ranks(journal: Path, *names: str, base: Path | None = None, timeout_s: float = 10.0) -> list[int]:
    """Test clean-up (jobs outlive their daemon): SIGKILL the ranks of the named jobs (every job in ``journal``
    when none is named), and with ``base`` every process that runs in, or names on its command line or in its
    checkpoint directory, a path under ``base``; then wait for them to be gone or zombies (bounded). Returns their pids.

    Each rank leads its own session, so its whole process group goes (a launcher's workers too); a process in
    the caller's own group is killed alone."""
    uids = set(job_uids(journal, *names).values())
    found = [p for p in psutil.process_iter(["pid", "status"]) if _belongs(p, uids, base)]
    own_group = os.getpgrp()
    for p in found:
        with contextlib.suppress(psutil.Error, OSError):
            group = os.getpgid(p.pid)
            if group == p.pid and group != own_group:
                os.killpg(group, signal.SIGKILL)
            p.kill()
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in found if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes still alive {timeout_s} s after SIGKILL: {[p.pid for p in left]}"
    return [p.pid for p in found]


def _belongs(p: psutil.Process, uids: set[str], base: Path | None) -> bool:
    """True for a live process of one of the jobs ``uids``, or one that runs under ``base`` (never ourselves)."""
    try:
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid in _self_and_ancestors():
            return False
        env = p.environ()
        if env.get(ENV_JOB_ID) in uids:
            return True
        if base is None:
            return False
        under = str(base.resolve())
        paths = [p.cwd(), env.get(ENV_CHECKPOINT_DIR, "")]
        return any(x == under or x.startswith(under + os.sep) for x in paths) or any(
            under + os.sep in a for a in p.cmdline()
        )
    except (psutil.Error, OSError):
        return False


def _self_and_ancestors() -> set[int]:
    me = psutil.Process()
    return {me.pid, *(a.pid for a in me.parents())}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
