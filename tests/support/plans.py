"""Small planner inputs written by hand, for the planner's and validate_plan's cases on H200 nodes (not a test module).

The profiles by short name, a queued request, a node's layouts and a running job, with the defaults the planner's
cases are worked out for (a job that runs 1000 s, one that has 10000 s left and was last moved long ago); each
case says where it differs.
"""

from __future__ import annotations

from flexmig.mig import H200, Layout, Profile
from flexmig.plan import Instance, JobRequest, RankNeed, RunningJob

P1 = H200.profile("1g.18gb")
P1M = H200.profile("1g.35gb")
P2 = H200.profile("2g.35gb")
P3 = H200.profile("3g.71gb")
P4 = H200.profile("4g.71gb")
P7 = H200.profile("7g.141gb")


def req(
    name: str,
    profile: Profile,
    ranks: int = 1,
    *,
    t: float = 0.0,
    runtime: float = 1000.0,
    elastic: bool = False,
    movable: bool = True,
) -> JobRequest:
    """A queued request, submitted at ``t``; an elastic one may run as 1..ranks*(the profile's compute slices)."""
    return JobRequest(
        name,
        RankNeed(profile=profile.name),
        ranks=ranks,
        min_ranks=1 if elastic else ranks,
        max_ranks=ranks * profile.compute_slices if elastic else ranks,
        submitted_s=t,
        expected_runtime_s=runtime,
        movable=movable,
    )


def node(*gpus: list[tuple[Profile, int]]) -> tuple[Layout, ...]:
    """Layouts from lists of (profile, start) per GPU."""
    return tuple(Layout.of(H200, items) for items in gpus)


def running(
    name: str,
    *instances: tuple[int, int, Profile],
    remaining: float | None = 10_000.0,
    last_moved: float | None = -10_000.0,
    movable: bool = True,
    nominal: JobRequest | None = None,
) -> RunningJob:
    """A running job on ``instances`` ((gpu, start, profile) triples), by default the request it started from."""
    insts = tuple(Instance(g, s, p) for g, s, p in instances)
    return RunningJob(
        name,
        insts,
        nominal or req(name, insts[0].profile, ranks=len(insts)),
        movable=movable,
        last_moved_s=last_moved,
        remaining_s=remaining,
    )
