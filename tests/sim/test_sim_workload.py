"""The synthetic workload that makes the demo node move: deterministic from its seed."""

from __future__ import annotations

from flexmig.sim import install, uninstall
from flexmig.sim.model import Activity

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"


def run(seed: int, times: tuple[float, ...] = (0.0, 40.0, 80.0)) -> list[list[tuple[int, int, Activity]]]:
    node = install(SPEC, clock=lambda: 0.0, seed=seed)
    try:
        seen: list[list[tuple[int, int, Activity]]] = []
        for t in times:
            node.step_workload(t)
            seen.append(
                [
                    (len(ci.processes), sum(p.memory_bytes for p in ci.processes), ci.activity)
                    for g in node.gpus()
                    for gi in g.gpu_instances
                    for ci in gi.compute_instances
                ]
            )
        return seen
    finally:
        uninstall()


def test_the_same_seed_gives_the_same_workload() -> None:
    assert run(7) == run(7)


def test_the_workload_moves_memory_and_activity_over_time() -> None:
    steps = run(7)
    assert steps[0] != steps[2]
    assert any(n for step in steps for n, _, _ in step)


def test_calling_more_often_changes_nothing_about_a_given_time() -> None:
    assert run(3, (0.0, 10.0, 20.0, 80.0))[-1] == run(3, (80.0,))[-1]


def test_memory_never_exceeds_an_instance() -> None:
    node = install(SPEC, clock=lambda: 0.0, seed=11)
    try:
        for t in range(0, 600, 7):
            node.step_workload(float(t))
            for g in node.gpus():
                for gi in g.gpu_instances:
                    used = sum(p.memory_bytes for ci in gi.compute_instances for p in ci.processes)
                    assert used <= gi.memory_bytes
    finally:
        uninstall()
