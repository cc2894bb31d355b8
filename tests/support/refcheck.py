"""flexmig's side of the reference check: the replay's baselines on the jobs the reference simulator also gets.

Shared by tests/replay/test_replay_reference.py and bench/reference.py, so the test and the benchmark compare the same
thing. ``support.refsim`` (the reference) shares no code with ``flexmig``; this module is the bridge.
"""

from __future__ import annotations

from dataclasses import replace

from flexmig.mig import H200, Layout
from flexmig.plan import Discipline
from flexmig.replay.costs import REPLAY_SETTINGS
from flexmig.replay.engine import replay
from flexmig.replay.managers import FluidManager, LayoutManager, Manager
from flexmig.replay.repack import RepackManager
from flexmig.replay.run import Prepared
from support.refsim import RefJob

__all__ = ["POLICIES", "STATIC_LAYOUT", "ours", "ref_jobs"]

POLICIES = ("static", "drain", "fluid", "repack")
"""The baselines both implementations have."""

STATIC_LAYOUT = [(0, "7g.141gb")]
"""Static's layout on every GPU, as the reference takes it: one 7g (the only one the traces' 8-GPU jobs allow)."""


def ref_jobs(prep: Prepared) -> list[RefJob]:
    """The prepared jobs as the reference simulator takes them."""
    return [RefJob(j.name, j.arrival_s, j.runtime_s, j.profile.name, j.ranks) for j in prep.jobs]


def ours(prep: Prepared, policy: str, discipline: Discipline) -> dict[str, tuple[float, float]]:
    """Start and end of every completed job under the replay's implementation of ``policy`` (H200 nodes)."""
    settings = replace(REPLAY_SETTINGS, discipline=discipline)
    gpus = prep.spec.count
    manager: Manager
    if policy == "static":
        seven = H200.profile(STATIC_LAYOUT[0][1])
        manager = LayoutManager("static", H200, [Layout.of(H200, [(seven, STATIC_LAYOUT[0][0])])] * gpus, settings)
    elif policy == "drain":
        manager = LayoutManager("drain", H200, [Layout.empty(H200)] * gpus, settings)
    elif policy == "fluid":
        manager = FluidManager(H200, gpus, discipline)
    elif policy == "repack":
        manager = RepackManager(H200, gpus, discipline)
    else:
        raise ValueError(f"no reference for policy {policy!r}")
    run = replay(prep.jobs, manager, 7 * gpus, prep.mix())
    return {r.name: (r.start_s, r.end_s) for r in run.records if r.start_s is not None and r.end_s is not None}
