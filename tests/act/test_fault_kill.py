"""Fault injection: the actuator SIGKILLed at random points of migrations and re-splits, and again at a random point
of the reconciliation that follows; after a clean start the job runs exactly once, from an intact checkpoint, and
no MIG instance is leaked or missing.

The points are drawn from a seed, printed at the end of the run (``FLEXMIG_FAULT_SEED=N`` replays a run;
``FLEXMIG_FAULT_KILLS`` sets how many moves are tried, 20 by default). The actuator runs as ``python -m
flexmig.actuatord`` on a simulated node whose state file survives the kill (the rig of ``test_act_crash``); a harness
SIGKILLs it right after its k-th journalled step event once the test has armed it (just before the move is asked), so
the first run dies in the move and the second in the reconciliation that finishes it, when it has that many steps
left. Each kind of move is drawn for a job without and with standby ranks (``[hook] standby = true``: the next
generation starts on the targets before the checkpoint request, and is handed over at the launch).
"""

from __future__ import annotations

import os
import random
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_act_crash import Node, check_runs_exactly_once_from_its_checkpoint, job_spec, request_in_background

from flexmig.act.journal import Journal
from support.flexmigd import short_base

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.timeout(600)]

HARNESS = textwrap.dedent(
    """
    import os, signal, sys
    from flexmig.actuatord import main
    after, arm = int(os.environ.get("TEST_KILL_AFTER", "0")), os.environ["TEST_KILL_ARM"]
    seen = 0

    def on_step(ev):
        global seen
        if after and os.path.exists(arm):
            seen += 1
            if seen == after:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.exit(main(sys.argv[1:], on_step=on_step))
    """
)
# (name, node spec, request, ranks at submit, the job's instances after the move, the layout after it, standby)
MOVES: list[tuple[str, str, dict[str, Any], int, list[tuple[int, int]], str, bool]] = [
    ("migrate", "h200", {"op": "jobs.migrate"}, 2, [(0, 2), (0, 3)], "1g.18gb@2+1g.18gb@3", False),
    (
        "resplit",
        "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3+3g.71gb@4",
        {"op": "jobs.resplit", "ranks": 1, "profile": "2g.35gb"},
        2,
        [(0, 0)],
        "2g.35gb@0+1g.18gb@2+1g.18gb@3+3g.71gb@4",
        False,
    ),
    ("migrate-standby", "h200", {"op": "jobs.migrate"}, 2, [(0, 2), (0, 3)], "1g.18gb@2+1g.18gb@3", True),
    # 2g.35gb@2 is free room: created up front, so its rank starts as a standby before the request.
    (
        "resplit-standby",
        "h200",
        {"op": "jobs.resplit", "ranks": 1, "profile": "2g.35gb"},
        2,
        [(0, 2)],
        "2g.35gb@2",
        True,
    ),
]
# Step events (intent and done) of each move: the migration's 2 creates, 6 move steps and 2 destroys; the in-place
# re-split's 9 steps (checkpoint 4, layout, 2 destroys, 1 create, launch); with standby one step more (``standby``);
# the re-split with standby: 1 create, 7 move steps, 2 destroys.
STEPS = {"migrate": 20, "resplit": 18, "migrate-standby": 22, "resplit-standby": 20}


class KillNode(Node):
    """The crash rig, killed after the k-th step event once armed."""

    def __init__(self, base: Path, spec: str) -> None:
        super().__init__(base, spec)
        (base / "harness.py").write_text(HARNESS)
        self.arm = base / "armed"

    def start_killing(self, after: int) -> bool:
        """Start, to be killed after ``after`` armed step events (0: never); True if it came up, False if it
        was killed on the way (in its reconciliation)."""
        try:
            self.start(extra_env={"TEST_KILL_AFTER": str(after), "TEST_KILL_ARM": str(self.arm)})
        except (AssertionError, RuntimeError):  # it did not come up, or it was seen to exit on the way
            if self.proc is not None and self.proc.poll() == -signal.SIGKILL:
                return False
            raise
        return True

    def settled(self) -> bool:
        """The move is over: no plan of the journal unfinished."""
        j = Journal(self.base / "journal.sqlite3")
        try:
            return not j.unfinished_plans()
        finally:
            j.close()


@pytest.fixture(scope="module")
def seed() -> int:
    """The run's seed: drawn once for the run by tests/conftest.py (which prints it at the end), or given."""
    text = os.environ.get("FLEXMIG_FAULT_SEED") or str(time.time_ns() % 1_000_000)
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"FLEXMIG_FAULT_SEED must be an integer, not {text!r}") from None


def kills(seed: int) -> list[tuple[int, str, int, int]]:
    """The draws: (index, move, kill in the move after k step events, kill in the reconciliation after k)."""
    rng = random.Random(seed)
    n = int(os.environ.get("FLEXMIG_FAULT_KILLS", "20"))
    return [
        (i, m, rng.randint(1, STEPS[m]), rng.randint(1, 12))
        for i, m in enumerate(rng.choice(list(STEPS)) for _ in range(n))
    ]


def test_sigkill_at_random_points_of_moves_and_of_their_recovery(seed: int) -> None:
    with short_base("fm-kill-") as top:  # unix socket paths hold 107 bytes: pytest's (xdist's) paths are too long
        outcomes = _kill_and_recover(seed, top)
    draws = kills(seed)
    in_moves, in_recoveries = sum(k for k, _ in outcomes), sum(r for _, r in outcomes)
    print(f"\nseed {seed}: {len(draws)} moves, killed in {in_moves} of them and in {in_recoveries} recoveries: {draws}")
    assert in_moves == len(draws), f"seed {seed}: too few draws landed in a move ({outcomes})"


def _kill_and_recover(seed: int, top: Path) -> list[tuple[bool, bool]]:
    """Each draw: a move killed after some step, its recovery killed after some step; (killed, killed again)."""
    outcomes: list[tuple[bool, bool]] = []
    for i, move, in_move, in_recovery in kills(seed):
        name, spec, request, ranks, slots, layout, standby = next(m for m in MOVES if m[0] == move)
        base = top / f"{i}-{name}"
        base.mkdir()
        base.chmod(0o755)
        node = KillNode(base, spec)
        where = f"seed {seed}, draw {i}: {name} killed after step {in_move}, recovery after step {in_recovery}"
        try:
            assert node.start_killing(in_move), where
            assert node.call("jobs.submit", path=str(job_spec(base, ranks=ranks, standby=standby)))["ok"], where
            node.wait_steps()
            node.arm.touch()
            args = {k: v for k, v in request.items() if k != "op"}
            request_in_background(node, request["op"], name="counter", **args)
            deadline = time.monotonic() + 60
            while node.proc is not None and node.proc.poll() is None:
                if node.record().generation > 1 and node.settled():
                    break  # the move had fewer steps than the draw: it finished unhurt, which is fine too
                assert time.monotonic() < deadline, f"{where}: neither killed nor finished"
                time.sleep(0.05)
            killed = node.proc is not None and node.proc.poll() == -signal.SIGKILL
            node.stop()
            recovered = node.start_killing(in_recovery)
            if not recovered:  # killed again, in the middle of its reconciliation
                node.start_killing(0)
            outcomes.append((killed, not recovered))
            check_runs_exactly_once_from_its_checkpoint(node, slots)
            node.stop()
            assert node.layout() == layout, f"{where}: no instance leaked or missing"
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
        finally:
            node.stop()
            node.kill_ranks()
    return outcomes
