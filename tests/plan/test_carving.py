"""Carving free MIG instances around busy ones (:func:`flexmig.plan.carving.carve`, the decision for one Slurm node
per MIG instance): only idle instances are destroyed, what is created is legal and for a waiting job, nothing is
carved for a job a free instance serves, a held region is left to its job, and a job at the head of an idle node's
queue (or of an emptied held region) is served in the same round."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import KEEP_FREE_SLICES, Carving, Hold, Waiting, carve

PROFILES = ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
NOW = 1000.0


@st.composite
def layouts(draw: st.DrawFn) -> tuple[Layout, ...]:
    """One to three GPUs, each with the instances of a random sequence of placements that were legal in turn."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        lay = Layout.empty(H200)
        for name, start in draw(st.lists(st.tuples(st.sampled_from(PROFILES), st.integers(0, 7)), max_size=8)):
            if lay.can_place(H200.profile(name), start):
                lay = lay.place(H200.profile(name), start)
        out.append(lay)
    return tuple(out)


@dataclass(frozen=True)
class Case:
    """A node as :func:`carve` takes it."""

    layouts: tuple[Layout, ...]
    busy: dict[tuple[int, int], float | None]
    queue: list[Waiting]
    hold: Hold | None
    registering: frozenset[tuple[int, int]]
    pinned: frozenset[tuple[int, int]]
    hold_after_s: float


@st.composite
def nodes(draw: st.DrawFn) -> Case:
    """A node: its layouts, each instance busy (with a limit or none), registering, pinned or free; a queue; and
    maybe a hold of one of the queue's jobs on a placement of its profile."""
    lays = draw(layouts())
    busy: dict[tuple[int, int], float | None] = {}
    registering: set[tuple[int, int]] = set()
    pinned: set[tuple[int, int]] = set()
    for g, lay in enumerate(lays):
        for inst in lay:
            kind = draw(st.sampled_from(("busy", "busy", "free", "free", "registering", "pinned")))
            w = (g, inst.start)
            if kind == "busy":
                busy[w] = draw(st.one_of(st.none(), st.floats(1.0, 5000.0)))
            elif kind == "registering":
                registering.add(w)
            elif kind == "pinned":
                pinned.add(w)
    queue = [
        Waiting(
            f"j{i}",
            draw(st.sampled_from(PROFILES)),
            draw(st.one_of(st.none(), st.floats(10.0, 3000.0))),
            draw(st.floats(0.0, 2000.0)),
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    hold: Hold | None = None
    if draw(st.booleans()) and len(queue) > 0:
        job = draw(st.sampled_from(queue))
        profile = H200.profile(job.profile)
        hold = Hold(job.name, draw(st.integers(0, len(lays) - 1)), draw(st.sampled_from(profile.starts)),
                    job.profile, NOW + draw(st.floats(0.0, 3000.0)))  # fmt: skip
    return Case(lays, busy, queue, hold, frozenset(registering), frozenset(pinned),
                draw(st.sampled_from((0.0, 900.0))))  # fmt: skip


def run(n: Case) -> Carving:
    return carve(H200, n.layouts, n.busy, n.queue, now_s=NOW, hold=n.hold, registering=n.registering,
                 pinned=n.pinned, hold_after_s=n.hold_after_s)  # fmt: skip


def after(n: Case, c: Carving) -> list[Layout]:
    """The layouts once the carving's destroys and creates are done, in that order (Layout refuses an illegal
    one)."""
    lays = list(n.layouts)
    for g, start in c.destroy:
        lays[g] = lays[g].remove(start)
    for g, inst, _ in c.create:
        lays[g] = lays[g].place(inst.profile, inst.start)
    return lays


@given(n=nodes())
def test_only_idle_instances_are_destroyed_and_what_is_created_is_legal(n: Case) -> None:
    """No busy, registering or pinned instance is destroyed; the new layouts break no placement rule."""
    c = run(n)
    kept = set(n.busy) | n.registering | n.pinned
    assert not kept & set(c.destroy)
    assert len(set(c.destroy)) == len(c.destroy)
    for lay in after(n, c):
        assert lay.violations() == []


@given(n=nodes())
def test_each_new_instance_is_for_a_distinct_waiting_job_of_its_profile(n: Case) -> None:
    c = run(n)
    profiles = {j.name: j.profile for j in n.queue}
    names = [job for _, _, job in c.create]
    assert len(names) == len(set(names))
    for _, inst, job in c.create:
        assert profiles[job] == inst.profile.name


@given(n=nodes())
def test_nothing_is_carved_for_jobs_that_free_instances_serve(n: Case) -> None:
    """Without a hold before, no more instances of a profile are created than its waiting jobs outnumber its free
    ones that the round keeps (outside the region a job holds after the round: those are kept for it; a free one
    destroyed to carve a bigger profile for a job ahead in the queue serves nobody: see the next test)."""
    if n.hold is not None:
        return
    c = run(n)
    taken = set(n.busy) | n.pinned | set(c.destroy)
    for p in PROFILES:
        free = sum(
            1
            for g, lay in enumerate(n.layouts)
            for i in lay
            if i.profile.name == p and (g, i.start) not in taken and not (c.hold and c.hold.covers(H200, g, i))
        )
        waiting = sum(1 for j in n.queue if j.profile == p)
        made = sum(1 for _, i, _ in c.create if i.profile.name == p)
        assert made <= max(0, waiting - free)


def test_a_free_instance_a_job_ahead_needs_the_room_of_is_carved_again_for_the_job_behind() -> None:
    # Found by the property above before it counted destroyed instances: two GPUs with a free 1g.18gb@0 each and the
    # queue 1g, 2g, 2g, 3g, 1g. The 3g job, ahead of the second 1g job, fits only where GPU 1's free 1g is (both 2g
    # jobs took the upper halves): it gets that room, and the 1g job behind it a new 1g, not the destroyed one.
    one = Layout.empty(H200).place(H200.profile("1g.18gb"), 0)
    profiles = ("1g.18gb", "2g.35gb", "2g.35gb", "3g.71gb", "1g.18gb")
    queue = [Waiting(f"j{k}", p, None, 0.0) for k, p in enumerate(profiles)]
    c = carve(H200, (one, one), {}, queue, now_s=NOW)
    assert c.destroy == ((1, 0),)
    assert [(g, i.profile.name, i.start, job) for g, i, job in c.create] == [
        (0, "2g.35gb", 4, "j1"), (1, "2g.35gb", 4, "j2"), (1, "3g.71gb", 0, "j3"), (0, "1g.18gb", 6, "j4"),
    ]  # fmt: skip
    case = Case((one, one), {}, queue, None, frozenset(), frozenset(), 0.0)
    assert all(lay.violations() == [] for lay in after(case, c))


@given(n=nodes())
def test_a_held_region_is_left_to_its_job(n: Case) -> None:
    """A hold names a waiting job and a placement of its profile; no instance created for a job after it in the
    queue overlaps it (one before it may have been carved there first: it comes first)."""
    c = run(n)
    if c.hold is None:
        return
    h = c.hold
    order = [j.name for j in n.queue]
    assert h.job in order
    assert Layout.empty(H200).can_place(H200.profile(h.profile), h.start)
    region = h.slices(H200)
    for g, inst, job in c.create:
        if order.index(job) > order.index(h.job) and g == h.gpu:
            assert inst.end <= region.start or region.stop <= inst.start


@given(n=nodes())
def test_the_head_of_an_idle_nodes_queue_is_served_in_the_round(n: Case) -> None:
    """No busy, registering or pinned instance and no hold: the first waiting job gets a free instance of its
    profile or a new one at once (an idle node changes in seconds), unless a free instance of
    ``KEEP_FREE_SLICES`` or more goes to a job behind it that asks for its profile (see the tests of ``keep_free``
    below)."""
    if not n.queue:
        return
    behind = {j.profile for j in n.queue[1:]}
    kept = [i for lay in n.layouts for i in lay if i.profile.compute_slices >= KEEP_FREE_SLICES]
    if any(i.profile.name in behind and i.profile.name != n.queue[0].profile for i in kept):
        return
    c = run(replace(n, busy={}, registering=frozenset(), pinned=frozenset(), hold=None))
    head = n.queue[0]
    free = any(i.profile.name == head.profile for lay in n.layouts for i in lay)
    assert free or any(job == head.name for _, _, job in c.create)


@given(n=nodes())
def test_an_emptied_held_region_serves_its_job_in_the_round(n: Case) -> None:
    """The held job first in the queue and nothing but idle instances in its region: it is served now (a free
    instance of its profile, or a new one), and the hold is gone."""
    h = n.hold
    if h is None:
        return
    region = h.slices(H200)
    inside = {(h.gpu, i.start) for i in n.layouts[h.gpu] if i.start < region.stop and region.start < i.end}
    c = run(replace(
        n, queue=[j for j in n.queue if j.name == h.job], busy={w: v for w, v in n.busy.items() if w not in inside},
        registering=n.registering - inside, pinned=n.pinned - inside,
    ))  # fmt: skip
    assert c.hold is None
    assert any(job == h.job for _, _, job in c.create) or not c.create


def test_an_instance_not_on_the_node_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no instance at GPU 0, memory slice 3"):
        carve(H200, (Layout.empty(H200),), {(0, 3): 10.0}, [], now_s=0.0)


def test_a_7g_job_holds_the_gpu_whose_jobs_end_first_and_small_ones_fill_what_is_free() -> None:
    """Two GPUs of 1g instances; the 7g job waited past the threshold and holds GPU 1 (its jobs' limits end
    sooner); a later 1g job takes a free instance on GPU 0, not one in the held region."""
    one = Layout.of(H200, [("1g.18gb", s) for s in range(7)])
    busy = {**{(0, s): 900.0 for s in range(4)}, **{(1, s): 100.0 for s in range(3)}}
    queue = [Waiting("big", "7g.141gb", 600.0, 1000.0), Waiting("small", "1g.18gb", 3000.0, 5.0)]
    c = carve(H200, (one, one), busy, queue, now_s=0.0)
    assert c.hold == Hold("big", 1, 0, "7g.141gb", 100.0)
    assert c.create == () and c.destroy == ()
    again = carve(H200, (one, one), {w: v for w, v in busy.items() if w[0] == 0}, queue, now_s=100.0, hold=c.hold)
    assert again.hold is None
    assert [(g, i.spec(), job) for g, i, job in again.create] == [(1, "7g.141gb@0", "big")]
    assert sorted(again.destroy) == [(1, s) for s in range(7)]


def test_the_reasons_name_the_gpus_by_their_own_numbers() -> None:
    """A host whose carving leaves GPU 0 out (its layouts are GPUs 1 and 3): the reasons say GPU 3, not index 1."""
    one = Layout.of(H200, [("1g.18gb", s) for s in range(7)])
    busy = {**{(0, s): 900.0 for s in range(7)}, **{(1, s): 100.0 for s in range(6)}}
    queue = [Waiting("big", "7g.141gb", 600.0, 1000.0), Waiting("small", "2g.35gb", 60.0, 5.0)]
    c = carve(H200, (one, one), busy, queue, now_s=0.0, numbers=(1, 3))
    assert c.reasons == ("big: blocked; holds 7g.141gb@0 on GPU 3",)
    free = carve(H200, (one, Layout.empty(H200)), {}, queue[1:], now_s=0.0, numbers=(1, 3))
    assert free.reasons == ("small: 2g.35gb@4 carved on GPU 3",)


BUSY_2G = Layout.of(H200, [("2g.35gb", 0), ("2g.35gb", 2), ("2g.35gb", 4), ("1g.18gb", 6)])
"""Three busy 2g instances and a 1g one that no job runs on."""


def test_a_job_that_fits_nowhere_holds_at_once_when_no_waiting_job_can_use_the_idle_slices() -> None:
    """The 1g.18gb idles and no 1g job waits: the 7g job at the head holds the GPU at once (not after
    ``hold_after_s``), so the 3g job behind it is not carved into the 2g instances as they end; with
    ``hold_when_idle`` off it waits for its turn as before."""
    busy = {(0, 0): 300.0, (0, 2): 200.0, (0, 4): 100.0}
    queue = [Waiting("big", "7g.141gb", 600.0, 5.0), Waiting("mid", "3g.71gb", 600.0, 1.0)]
    c = carve(H200, (BUSY_2G,), busy, queue, now_s=0.0)
    assert c.hold == Hold("big", 0, 0, "7g.141gb", 300.0)
    assert c.reasons == ("big: blocked; holds 7g.141gb@0 on GPU 0 (no waiting job can use the idle slices)",)
    assert c.create == () and c.destroy == ()
    assert carve(H200, (BUSY_2G,), busy, queue, now_s=0.0, hold_when_idle=False) == Carving((), (), None, ())


def test_no_hold_at_once_while_a_waiting_job_can_be_served_or_no_slice_idles() -> None:
    busy = {(0, 0): 300.0, (0, 2): 200.0, (0, 4): 100.0}
    queue = [Waiting("big", "7g.141gb", 600.0, 5.0), Waiting("small", "1g.18gb", 60.0, 1.0)]
    served = carve(H200, (BUSY_2G,), busy, queue, now_s=0.0)
    assert served.hold is None and served.create == ()  # the small job takes the free 1g: nothing idles for want
    full = carve(H200, (BUSY_2G,), {**busy, (0, 6): 50.0}, queue[:1], now_s=0.0)
    assert full.hold is None  # every slice busy: a hold would idle what ends first


@given(n=nodes())
def test_a_hold_before_its_time_only_when_nothing_waiting_could_use_an_idle_slice(n: Case) -> None:
    """No job has waited ``hold_after_s`` (10,000 s here): a new hold comes only in a round that, without the rule,
    would serve no job and create nothing while some compute slice (not an administrator's) runs no job."""
    n = replace(n, hold_after_s=10_000.0)
    c = run(n)
    if c.hold is None or (n.hold is not None and n.hold.job == c.hold.job):
        return
    assert c.create == () and c.destroy == ()
    plain = carve(H200, n.layouts, n.busy, n.queue, now_s=NOW, hold=n.hold, registering=n.registering,
                  pinned=n.pinned, hold_after_s=n.hold_after_s, hold_when_idle=False)  # fmt: skip
    assert plain.hold is None and plain.create == ()
    used = sum(i.profile.compute_slices for g, lay in enumerate(n.layouts) for i in lay
               if (g, i.start) in n.busy or (g, i.start) in n.pinned)  # fmt: skip
    assert used < H200.compute_slices * len(n.layouts)


@given(n=nodes())
def test_a_7g_job_behind_busy_instances_holds_at_once_when_a_slice_idles(n: Case) -> None:
    """Only 7g jobs wait, every GPU runs, registers or pins something, and no 7g instance is free or registering:
    nothing can be served, so the first 7g job holds at once when some slice idles and some GPU has no pinned
    instance, else nobody holds."""
    if not all(any(w[0] == g for w in (*n.busy, *n.registering, *n.pinned)) for g in range(len(n.layouts))):
        return
    if any(i.profile.name == "7g.141gb" and (g, i.start) not in n.busy and (g, i.start) not in n.pinned
           for g, lay in enumerate(n.layouts) for i in lay):  # fmt: skip
        return  # a free (or registering) 7g serves the first job
    queue = [Waiting("big0", "7g.141gb", 600.0, 1.0), Waiting("big1", "7g.141gb", 600.0, 0.5)]
    c = carve(H200, n.layouts, n.busy, queue, now_s=NOW, registering=n.registering, pinned=n.pinned,
              hold_after_s=10_000.0)  # fmt: skip
    assert c.create == () and c.destroy == ()
    used = sum(i.profile.compute_slices for g, lay in enumerate(n.layouts) for i in lay
               if (g, i.start) in n.busy or (g, i.start) in n.pinned)  # fmt: skip
    idles = used < H200.compute_slices * len(n.layouts)
    unpinned = any(not any(w[0] == g for w in n.pinned) for g in range(len(n.layouts)))
    assert (c.hold is not None) == (idles and unpinned), (c, idles, unpinned)
    assert c.hold is None or c.hold.job == "big0"


WHOLE = Layout.of(H200, [("7g.141gb", 0)])
"""A GPU of one 7g.141gb instance, free: its job just ended."""


def test_a_free_7g_goes_to_a_waiting_7g_job_not_to_an_older_jobs_carving() -> None:
    """The queue 3g, 2g, 7g (Slurm's order) on a GPU whose 7g instance just freed: the 7g job takes it (Slurm starts
    it there the moment it looks) and the older jobs wait; strictly in priority order (``keep_free=False``) the 3g
    and 2g jobs are carved out of it and the 7g job needs the whole GPU drained again."""
    queue = [Waiting("mid", "3g.71gb", 600.0, 30.0), Waiting("two", "2g.35gb", 600.0, 20.0),
             Waiting("big", "7g.141gb", 600.0, 10.0)]  # fmt: skip
    assert carve(H200, (WHOLE,), {}, queue, now_s=0.0) == Carving((), (), None, ())
    before = carve(H200, (WHOLE,), {}, queue, now_s=0.0, keep_free=False)
    assert before.destroy == ((0, 0),)
    assert [job for _, _, job in before.create] == ["mid", "two"]


def test_a_free_1g_is_still_carved_into_a_bigger_instance_for_an_older_job() -> None:
    """The smallest instances are re-made from any idle slice: two free 1g instances become the 2g an older job asks
    for, though a 1g job waits behind it."""
    ones = Layout.of(H200, [("1g.18gb", s) for s in range(7)])
    busy = {(0, s): 300.0 for s in (0, 1, 2, 3, 6)}
    queue = [Waiting("two", "2g.35gb", 600.0, 30.0), Waiting("one", "1g.18gb", 600.0, 10.0)]
    c = carve(H200, (ones,), busy, queue, now_s=0.0)
    assert sorted(c.destroy) == [(0, 4), (0, 5)]
    assert [(i.spec(), job) for _, i, job in c.create] == [("2g.35gb@4", "two")]


def test_a_part_of_a_job_of_several_nodes_keeps_no_free_instance() -> None:
    """A job of two 3g nodes, one of them busy: Slurm does not start it on the free 3g alone, so the 1g job before it
    is carved out of that 3g as the priority order says (the job of two waits for two 3g instances)."""
    lay = Layout.of(H200, [("3g.71gb", 0), ("3g.71gb", 4)])
    queue = [Waiting("one", "1g.18gb", 60.0, 5.0), Waiting("pair#1", "3g.71gb", 300.0, 9.0, alone=False),
             Waiting("pair#2", "3g.71gb", 300.0, 9.0, alone=False)]  # fmt: skip
    c = carve(H200, (lay,), {(0, 0): 600.0}, queue, now_s=0.0)
    assert c.destroy == ((0, 4),)
    assert [(i.spec(), job) for _, i, job in c.create] == [("1g.18gb@6", "one")]
    alone = [queue[0], Waiting("three", "3g.71gb", 300.0, 9.0)]
    assert carve(H200, (lay,), {(0, 0): 600.0}, alone, now_s=0.0).destroy == ()


@given(n=nodes())
def test_a_free_instance_of_two_or_more_slices_is_destroyed_only_when_no_job_waits_for_it(n: Case) -> None:
    """Without a hold: of the free instances of a profile of ``KEEP_FREE_SLICES`` or more compute slices, no more are
    destroyed than there are more of them than waiting jobs of that profile (the rest serve those jobs). The
    property fails with ``keep_free=False`` (the policy before)."""
    if n.hold is not None:
        return
    c = run(n)
    for p in PROFILES:
        if H200.profile(p).compute_slices < KEEP_FREE_SLICES:
            continue
        free = [(g, i.start) for g, lay in enumerate(n.layouts) for i in lay
                if i.profile.name == p and (g, i.start) not in n.busy and (g, i.start) not in n.pinned]  # fmt: skip
        waiting = sum(1 for j in n.queue if j.profile == p)
        assert len(set(free) & set(c.destroy)) <= max(0, len(free) - waiting)
