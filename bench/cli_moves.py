"""The job's own pause in a move, as an operator sees it: ``flexmig jobs migrate`` against ``flexmigd``.

``flexmigd`` runs as a process on a simulated H200 of four free 1g.18gb instances without the synthetic workload;
the job has 2 ranks with ``[hook] standby = true`` (the torch DDP example, or the stdlib one) and is migrated
``--moves`` times through the CLI, each time onto the other pair of free instances (a move keeps the layout, so
they exist). Each figure is the job's own downtime as flexmigd exports it (``flexmig_job_downtime_seconds``,
logged as ``job_resumed``): from the job's last step before the checkpoint to its first step after the move,
printed beside flexmig's share (old ranks exited to new ranks started). Median and worst, with the load average.

Run: ``.venv/bin/python bench/cli_moves.py [--moves 5] [--examples stdlib,torch]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.flexmigd import ActNode, act_node, short_base  # noqa: E402
from support.jobs import counter_spec, ddp_spec, log_lines, write_spec  # noqa: E402

SPEC = "h200:1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3"
RESUMED = re.compile(
    r"job_resumed job j generation (\d+) after migrate #\d+: job downtime ([0-9.]+) s .*flexmig's share ([0-9.]+) s"
)


def stepping(log: Path, generation: int) -> bool:
    """Generation ``generation`` (its start line) has logged a few steps."""
    events = log_lines(log)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    return len(starts) >= generation and sum(e["event"] == "step" for e in events[starts[generation - 1] :]) >= 5


def until(what: str, predicate: Callable[[], bool], timeout_s: float = 120) -> None:
    """Wait (bounded) until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def resumed(node: ActNode, generation: int) -> tuple[float, float] | None:
    """(job downtime, flexmig's share) of the move that started ``generation``, once flexmigd logged it."""
    for m in RESUMED.finditer(node.log.read_text()):
        if int(m.group(1)) == generation:
            return float(m.group(2)), float(m.group(3))
    return None


def reported(node: ActNode, generation: int) -> bool:
    """The move that started ``generation`` has its job-side figure."""
    return resumed(node, generation) is not None


def run(example: str, moves: int) -> list[tuple[float, float]]:
    """(job downtime, flexmig's share) of each move of ``example``."""
    with short_base("fm-bench-") as base, act_node(base, SPEC, sim_workload=False) as node:
        if example == "torch":
            text, log = ddp_spec(base, "j"), base / "train.log"
        else:
            text, log = counter_spec(base, "j", ranks=2), base / "j.log"
        text = text.replace("[hook]\n", "[hook]\nstandby = true\n")
        cli = [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(node.sock)]
        subprocess.run([*cli, "submit", str(write_spec(base / "j.toml", text))], check=True, capture_output=True)
        until("the job's first steps", lambda: stepping(log, 1))
        out: list[tuple[float, float]] = []
        for i in range(moves):
            time.sleep(2)  # the job trains a while between moves, as it would
            done = subprocess.run([*cli, "migrate", "j"], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            gen = i + 2
            until("the job's report", partial(reported, node, gen), 60)
            got = resumed(node, gen)
            assert got is not None
            out.append(got)
            until("the next generation's steps", partial(stepping, log, gen))
        return out


def main() -> int:
    """Run the moves and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=5, help="moves per example (default 5)")
    ap.add_argument("--examples", default="stdlib,torch", help="stdlib, torch or both (default)")
    args = ap.parse_args()
    for example in args.examples.split(","):
        figures = run(example, args.moves)
        job = [a for a, _ in figures]
        share = [b for _, b in figures]
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        print(
            f"{example}: job downtime median {statistics.median(job):.3f} s, worst {max(job):.3f} s "
            f"(each {', '.join(f'{x:.2f}' for x in job)}); flexmig's share median {statistics.median(share):.3f} s; "
            f"load average {load}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
