"""Moves count the room of every host (:func:`flexmig.slurm.moving.other_hosts`, ``plan_moves(regions_on=...)``):
Slurm restarts a requeued job on a free instance of any host, so a host whose own GPUs have no room for its hook job
may still move it for a blocked job, the job's target on another host; the region stays on the mover's own GPUs and
only its own hook jobs move. Before, a host counted its own GPUs only and moved nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_slurm_move_owner import SEVEN, Busy, View, moves_of, views

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.slurm.gres import GresCount
from flexmig.slurm.moves import Blocked, Running, plan_moves
from flexmig.slurm.moving import other_hosts
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import instance_node


def test_a_hook_job_with_no_room_on_its_host_is_moved_to_room_on_another_host() -> None:
    # fm-a: one GPU, a long 1g hook job; fm-b: one GPU, a long 3g job that did not opt in, room for a 1g beside it.
    view = View({
        "fm-a": [[("1g.18gb", 6, Busy(101, True, 3600.0))]],
        "fm-b": [[("3g.71gb", 0, Busy(102, False, 3600.0))]],
    })  # fmt: skip
    plans = moves_of(view, [(200, SEVEN)])
    assert [m.job for m in plans["fm-a"].moves] == ["101"], plans["fm-a"].reason
    (move,) = plans["fm-a"].moves
    assert move.source[0] == "fm-a"
    assert move.target[0] == "fm-b"
    assert plans["fm-a"].region is not None
    assert plans["fm-a"].region.host == "fm-a"
    assert not plans["fm-b"].moves


def test_a_reserved_or_drained_instance_of_another_host_is_no_target() -> None:
    view = View({
        "fm-a": [[("1g.18gb", 6, Busy(101, True, 3600.0))]],
        "fm-b": [[("7g.141gb", 0, Busy(102, False, 3600.0))], [("1g.18gb", 0, None)]],
    })  # fmt: skip
    nodes = view.nodes()
    idle = instance_node("fm-b", 1, 0)
    lays, busy, closed = other_hosts("fm-a", nodes, H200, reserved={idle})
    assert ("fm-b", 1, 0) in closed
    assert [(r.place, r.hook) for r in busy] == [(("fm-b", 0, 0), False)]
    assert set(lays) == {"fm-b"}
    free = other_hosts("fm-a", nodes, H200, reserved=())[2]
    assert ("fm-b", 1, 0) not in free


def test_an_instance_its_host_is_retiring_is_left_out_as_free_room() -> None:
    gres = (GresCount("gpu", "3g.71gb", 1),)
    node = SlurmNode(instance_node("fm-b", 0, 0), "idle", frozenset({"DRAIN"}), "flexmig: retiring", gres, (),
                     ("mig",), 8)  # fmt: skip
    lays, busy, closed = other_hosts("fm-a", [node], H200, reserved=())
    assert lays == {"fm-b": [Layout.empty(H200)]}
    assert not busy
    assert not closed
    drained = SlurmNode(node.name, "idle", frozenset({"DRAIN"}), "an administrator's", gres, (), ("mig",), 8)
    assert other_hosts("fm-a", [drained], H200, reserved=())[2] == {("fm-b", 0, 0)}


def test_regions_only_on_the_named_host_targets_anywhere() -> None:
    hosts = {"a": [Layout.of(H200, [("1g.18gb", 6)])], "b": [Layout.of(H200, [("1g.18gb", 6)])]}
    running = [
        Running("x", ("a", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=12.5),
        Running("y", ("b", 0, 6), "1g.18gb", hook=True, moves=0, remaining_s=3000.0, cost_s=12.5),
    ]
    for host, mover in (("a", "x"), ("b", "y")):
        plan = plan_moves(H200, hosts, running, [Blocked("w", SEVEN)], regions_on=host)
        assert [m.job for m in plan.moves] == [mover]
        assert plan.region is not None
        assert plan.region.host == host
    with pytest.raises(ValueError, match="'c'"):
        plan_moves(H200, hosts, running, [Blocked("w", SEVEN)], regions_on="c")


@settings(max_examples=150, deadline=None)
@given(views(), st.lists(st.sampled_from(("7g.141gb", "4g.71gb", "3g.71gb")), min_size=1, max_size=3))
def test_a_host_moves_only_its_own_hook_jobs_out_of_its_own_gpus_to_room_that_is_free(
    view: View, profiles: list[str]
) -> None:
    plans = moves_of(view, [(500 + k, p) for k, p in enumerate(profiles)])
    for host, plan in plans.items():
        if not plan.moves:
            continue
        assert plan.region is not None
        assert plan.region.host == host
        hook = {str(b.job_id) for h, _, _, _, b in view.running() if h == host and b.hook}
        taken: set[tuple[str, int, int]] = set()
        for m in plan.moves:
            assert m.job in hook
            assert m.source[0] == host
            th, tg, ts = m.target
            end = ts + H200.profile(m.profile).memory_slices
            for p, s, b in view.hosts[th][tg]:  # nothing busy where the target is, and no target taken twice
                overlaps = s < end and ts < s + H200.profile(p).memory_slices
                assert not (overlaps and b is not None and (th, tg, s) != m.source), (m, view.hosts[th][tg])
            assert m.target not in taken
            taken.add(m.target)
