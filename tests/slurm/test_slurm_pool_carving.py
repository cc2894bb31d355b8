"""A pool job's parts are carved on one GPU of a host of several (:mod:`flexmig.slurm.pool_carving`): the GPU where
they cost the least carving now, never one part on each GPU (a pool node's instances share a GPU; before, a part took
an idle 1g on each GPU and the pool waited for ever). Pure."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Carving, Waiting, carve
from flexmig.slurm.pool_carving import carve_pools, first_pool

BUSY_3G_2G = Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)])
KW: dict[str, Any] = {"now_s": 100.0, "hold": None, "registering": frozenset(), "pinned": frozenset(),
                      "hold_after_s": 900.0, "hold_when_idle": True, "numbers": (0, 1)}  # fmt: skip


def parts(n: int, job: int = 42, profile: str = "1g.18gb") -> list[Waiting]:
    return [Waiting(f"slurm-{job}#{k}", profile, alone=False) for k in range(1, n + 1)]


def served_on(c: Carving, job: str) -> set[int]:
    """The GPUs the carving ``c`` makes instances on for ``job``'s parts."""
    return {g for g, _, name in c.create if name.partition("#")[0] == job}


def test_an_idle_1g_on_each_gpu_does_not_serve_a_two_part_pool_the_gpu_with_room_is_carved() -> None:
    """GPU 0: 3g and 2g busy, 1g idle; GPU 1: 2g busy, 3g and 1g idle. The plain carving gives each part one of the
    idle 1g instances (one per GPU) and carves nothing: the pool never forms. Placed on one GPU, the parts take
    GPU 1's idle 1g and a 1g carved from its idle 3g."""
    layouts = [BUSY_3G_2G, BUSY_3G_2G]
    busy = {(0, 0): 3600.0, (0, 4): 3600.0, (1, 4): 3600.0}
    plain = carve(H200, layouts, busy, parts(2), **KW)
    assert not plain.create and not plain.destroy  # the old behaviour: both parts "served", across two GPUs
    c = carve_pools(H200, layouts, busy, parts(2), pools={"slurm-42"}, **KW)
    assert c.destroy == ((1, 0),) and [(g, p.profile.name) for g, p, _ in c.create] == [(1, "1g.18gb")], c
    # the job's other part is GPU 1's idle 1g: both of its instances on GPU 1


def test_a_one_device_job_and_a_host_of_one_gpu_carve_as_before() -> None:
    layouts = [BUSY_3G_2G, BUSY_3G_2G]
    busy = {(0, 0): 3600.0, (0, 4): 3600.0, (1, 4): 3600.0}
    one = [Waiting("slurm-7", "1g.18gb")]
    assert carve_pools(H200, layouts, busy, one, pools=(), **KW) == carve(H200, layouts, busy, one, **KW)
    single = {**KW, "numbers": (0,)}
    got = carve_pools(H200, [BUSY_3G_2G], {}, parts(2), pools={"slurm-42"}, **single)
    assert got == carve(H200, [BUSY_3G_2G], {}, parts(2), **single)


def test_the_first_pool_job_is_found_with_its_parts_and_a_job_of_several_nodes_is_none() -> None:
    q = [Waiting("slurm-1", "2g.35gb"), *parts(2, 5), *parts(3, 6)]
    assert first_pool(q, {"slurm-5", "slurm-6"}) == ("slurm-5", parts(2, 5))
    assert first_pool(q, set()) is None


LAYOUTS = (
    Layout.of(H200, [("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]),
    Layout.of(H200, [("3g.71gb", 0), ("3g.71gb", 4)]),
    Layout.of(H200, [("1g.18gb", s) for s in range(7)]),
    Layout.of(H200, [("7g.141gb", 0)]),
    Layout.of(H200, [("4g.71gb", 0), ("1g.18gb", 5)]),
    Layout.empty(H200),
)


@given(
    st.lists(st.sampled_from(LAYOUTS), min_size=2, max_size=3),
    st.data(),
    st.integers(2, 4),
    st.sampled_from(("1g.18gb", "2g.35gb")),
)
@settings(max_examples=200, deadline=None)
def test_a_pool_jobs_parts_are_never_carved_on_two_gpus_and_the_carving_stays_valid(
    layouts: list[Layout], data: st.DataObject, n: int, profile: str
) -> None:
    busy = {}
    for g, lay in enumerate(layouts):
        for i in lay:
            if data.draw(st.booleans()):
                busy[(g, i.start)] = 600.0
    queue = [Waiting("slurm-3", "1g.18gb"), *parts(n, 42, profile), Waiting("slurm-50", "2g.35gb")]
    kw = {**KW, "numbers": tuple(range(len(layouts)))}
    c = carve_pools(H200, layouts, busy, queue, pools={"slurm-42"}, **kw)
    assert len(served_on(c, "slurm-42")) <= 1, c
    after = list(layouts)
    for g, start in c.destroy:  # only idle instances destroyed, and every creation fits what is left
        assert (g, start) not in busy
        after[g] = after[g].remove(start)
    for g, placed, _ in c.create:
        after[g] = after[g].place(placed.profile, placed.start)
