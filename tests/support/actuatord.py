"""One way to run ``python -m flexmig.actuatord`` in tests: a child process on a simulated node under a base directory,
serving its control socket there (not a test module).

``with actuatord(base) as node:`` starts it in mode ``act`` on ``h200`` (its simulated state in ``base/sim.json``,
journal and logs in ``base``, job specs allowed from ``base``), waits until its control socket answers (the process
exiting first is an error with its log's tail), and on the way out stops it (SIGTERM, then SIGKILL) and kills any rank
left. ``harness`` runs a script of the test's instead of the module (one that wraps ``flexmig.actuatord.main``, to
crash it at a chosen step); ``start`` may be called again after the process died, on the same journal and node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flexmig.act.client import ControlClient, ControlError
from support.jobs import kill_ranks
from support.wait import wait_until

__all__ = ["Actuatord", "actuatord"]

START_S = 30.0


class Actuatord:
    """``flexmig.actuatord`` as a child process on a simulated node under ``base``."""

    def __init__(
        self,
        base: Path,
        spec: str = "h200",
        *,
        sim_state: bool = True,
        harness: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.base = base
        self.spec = spec
        self.sim_state = sim_state
        self.harness = harness
        self.args = args
        self.sock = base / "control.sock"
        self.journal = base / "journal.sqlite3"
        self.log_path = base / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """The command line of one start."""
        head = [sys.executable, str(self.harness)] if self.harness else [sys.executable, "-m", "flexmig.actuatord"]
        state = ["--sim-state", str(self.base / "sim.json")] if self.sim_state else []
        return [
            *head, "--mode", "act", "--sim", self.spec, *state, "--state-dir", str(self.base),
            "--allow-dir", str(self.base), "--log-level", "WARNING", *self.args,
        ]  # fmt: skip

    def start(self, env: Mapping[str, str] | None = None) -> None:
        """Start it and wait until its control socket answers."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, cwd=self.base
            )
        proc = self.proc

        def serving() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"actuatord exited {proc.returncode}: {self.tail()}")
            self.call("jobs.list")
            return True

        try:
            wait_until(serving, START_S, "actuatord's control socket", not_yet=(ControlError,))
        except AssertionError:
            raise AssertionError(f"actuatord did not come up: {self.tail()}") from None

    def tail(self, chars: int = 3000) -> str:
        """The end of its log."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def call(self, op: str, timeout_s: float = 60, **args: Any) -> Any:
        """Send one control request and return its answer (ControlError if refused)."""
        return ControlClient(self.sock, timeout_s=timeout_s).call(op, **args)

    def wait_killed(self) -> None:
        """Until the process died of SIGKILL (a harness killed it)."""
        assert self.proc is not None
        assert self.proc.wait(timeout=60) == -signal.SIGKILL, self.tail()

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not ended 20 s later (its ranks keep running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextmanager
def actuatord(base: Path, spec: str = "h200", **options: Any) -> Iterator[Actuatord]:
    """A started :class:`Actuatord` (``options`` as its constructor's), stopped with its ranks killed on the way out."""
    node = Actuatord(base, spec, **options)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        kill_ranks(node.journal, base=base)
