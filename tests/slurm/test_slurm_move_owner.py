"""One host moves for one blocked job (:func:`flexmig.slurm.cluster_claims.move_owner`, wired into
:func:`flexmig.slurm.moving.choose_moves`), pure: each host's flexmigd sees the whole cluster's instance nodes and
jobs in Slurm, a waiting job that no host can serve is in every host's queue, and before the owner each host
checkpointed and requeued its own hook jobs for it, so that one 7g job drained a GPU on every host."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.plan.carving import Waiting
from flexmig.plan.types import Instance
from flexmig.slurm.carving_choice import CarvingHost
from flexmig.slurm.cluster_claims import move_owner
from flexmig.slurm.demand import SlurmRunning
from flexmig.slurm.gres import GresCount
from flexmig.slurm.instances import HostLayouts, hold_name
from flexmig.slurm.moves import MovePlan
from flexmig.slurm.moving import choose_moves
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation
from flexmig.slurm.settings import instance_node
from flexmig.slurm.squeue import SlurmJob

TOKEN = "flexmig:hook"
SEVEN = "7g.141gb"


@dataclass(frozen=True)
class Busy:
    """A running job on one instance: its ID, whether it opted into the hook, its time limit (seconds from 0)."""

    job_id: int
    hook: bool
    limit_s: float


@dataclass(frozen=True)
class View:
    """Slurm's view of a cluster: per host, per GPU, the instances ``(profile, start, busy or None)``."""

    hosts: dict[str, list[list[tuple[str, int, Busy | None]]]]

    def nodes(self) -> list[SlurmNode]:
        out = []
        for host, gpus in self.hosts.items():
            for g, insts in enumerate(gpus):
                for p, s, busy in insts:
                    state = "idle" if busy is None else "allocated"
                    gres = (GresCount("gpu", p, 1),)
                    out.append(SlurmNode(instance_node(host, g, s), state, frozenset(), "", gres, (), ("mig",), 8))
        return out

    def running(self) -> list[tuple[str, int, int, str, Busy]]:
        return [(h, g, s, p, b) for h, gpus in self.hosts.items() for g, insts in enumerate(gpus)
                for p, s, b in insts if b is not None]  # fmt: skip

    def jobs(self, waiting: Sequence[tuple[int, str]]) -> list[SlurmJob]:
        out = [_job(b.job_id, p, state="RUNNING", nodes=(instance_node(h, g, s),), requeue=b.hook,
                    comment=TOKEN if b.hook else "", start_s=0.0, time_limit_s=b.limit_s)
               for h, g, s, p, b in self.running()]  # fmt: skip
        return out + [_job(k, p) for k, p in waiting]

    def carving_host(self, host: str) -> tuple[CarvingHost, list[SlurmRunning]]:
        """``host``'s flexmigd's view: its layouts and busy instances (carving indices), every node of the cluster,
        the jobs its instance agents see running."""
        gpus = self.hosts[host]
        layouts = tuple(Layout.of(H200, [(p, s) for p, s, _ in insts]) for insts in gpus)
        hl = HostLayouts(H200, tuple(range(len(gpus))), layouts, frozenset())
        nodes = self.nodes()
        ours = tuple(n for n in nodes if n.name.startswith(f"{host}-gpu"))
        busy: dict[tuple[int, int], float | None] = {}
        running = []
        for h, g, s, p, b in self.running():
            if h != host:
                continue
            busy[(g, s)] = b.limit_s
            job = _job(b.job_id, p, state="RUNNING", nodes=(instance_node(h, g, s),), requeue=b.hook,
                       comment=TOKEN if b.hook else "", start_s=0.0, time_limit_s=b.limit_s)  # fmt: skip
            running.append(SlurmRunning(job, (Instance(g, s, H200.profile(p)),), b.hook, b.limit_s))
        ch = CarvingHost(H200, hl, busy, frozenset(), {n.name: n for n in nodes}, ours)
        return ch, running


def _job(job_id: int, profile: str, **kw: object) -> SlurmJob:
    base = SlurmJob(
        job_id=job_id, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources",
        partitions=("mig",), nodes=(), node_count=1, gpus_per_node=(GresCount("gpu", profile, 1),), held=(),
        requeue=False, comment="", priority=100, submit_s=float(job_id), start_s=None, time_limit_s=None,
        restart_count=0,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def moves_of(view: View, waiting: Sequence[tuple[int, str]], reservations: Sequence[SlurmReservation] = ()
             ) -> dict[str, MovePlan]:  # fmt: skip
    """Each host's move plan for the same look at Slurm."""
    jobs = view.jobs(waiting)
    queue = [Waiting(f"slurm-{k}", p, 600.0, 0.0) for k, p in waiting]
    out = {}
    for host in view.hosts:
        ch, running = view.carving_host(host)
        out[host] = choose_moves(host, ch, running, queue, hold=None, max_moves_per_job=2, jobs=jobs,
                                 reservations=reservations, hook_token=TOKEN)  # fmt: skip
    return out


def two_hosts(first_limit_s: float = 3600.0, second_limit_s: float = 3600.0) -> View:
    """Two hosts of two H200s: on each, a long 1g hook job on GPU 0 and a long 1g job that did not opt in on GPU 1
    (so the 7g's only movable region on a host is its GPU 0, and its hook job can restart on GPU 1)."""
    return View({
        "fm-a": [[("1g.18gb", 6, Busy(101, True, 3600.0))], [("1g.18gb", 6, Busy(102, False, first_limit_s))]],
        "fm-b": [[("1g.18gb", 6, Busy(103, True, 3600.0))], [("1g.18gb", 6, Busy(104, False, second_limit_s))]],
    })  # fmt: skip


def test_a_7g_that_no_host_can_serve_gets_moves_from_one_host_not_both() -> None:
    plans = moves_of(two_hosts(), [(200, SEVEN)])
    movers = [h for h, p in plans.items() if p.moves]
    assert len(movers) == 1, {h: p.reason for h, p in plans.items()}
    (mover,) = movers
    other = next(h for h in plans if h != mover)
    assert f"host {mover} moves for it" in plans[other].reason, plans[other].reason
    assert [m.job for m in plans[mover].moves] == ["101" if mover == "fm-a" else "103"]


def test_the_owner_is_the_host_whose_region_is_free_soonest_once_its_hook_jobs_leave() -> None:
    # the same, except that the jobs that stay on host b end sooner: b's GPU 1 empties first
    view = View({
        "fm-a": [[("1g.18gb", 6, Busy(101, True, 3600.0))], [("1g.18gb", 6, Busy(102, False, 3600.0))]],
        "fm-b": [[("1g.18gb", 6, Busy(103, True, 3600.0)), ("1g.18gb", 5, Busy(105, False, 900.0))],
                 [("1g.18gb", 6, Busy(104, False, 3600.0))]],
    })  # fmt: skip
    jobs = view.jobs([(200, SEVEN)])
    # b's GPU 0 frees once 103 leaves and 105 ends (900 s); a's GPU 0 at once once 101 leaves: a owns the moves
    assert move_owner(Waiting("slurm-200", SEVEN), view.nodes(), jobs, (), H200, hook_token=TOKEN,
                      max_moves=2) == "fm-a"  # fmt: skip
    plans = moves_of(view, [(200, SEVEN)])
    assert [h for h, p in plans.items() if p.moves] == ["fm-a"]


def test_a_host_that_holds_a_region_keeps_the_moves_of_its_job() -> None:
    view = two_hosts()
    jobs = view.jobs([(200, SEVEN)])
    free = move_owner(Waiting("slurm-200", SEVEN), view.nodes(), jobs, (), H200, hook_token=TOKEN, max_moves=2)
    other = "fm-b" if free == "fm-a" else "fm-a"
    hold = SlurmReservation(hold_name(other), 0.0, 3600.0, (instance_node(other, 0, 6),), frozenset(), "ACTIVE")
    assert move_owner(Waiting("slurm-200", SEVEN), view.nodes(), jobs, (hold,), H200, hook_token=TOKEN,
                      max_moves=2) == other  # fmt: skip
    plans = moves_of(view, [(200, SEVEN)], (hold,))
    assert [h for h, p in plans.items() if p.moves] == [other]


def test_a_host_with_room_now_owns_the_job_and_no_host_moves() -> None:
    view = View({
        "fm-a": [[("1g.18gb", 6, Busy(101, True, 3600.0))], [("1g.18gb", 6, Busy(102, False, 3600.0))]],
        "fm-b": [[("1g.18gb", 6, None)], [("1g.18gb", 6, Busy(104, False, 3600.0))]],  # an idle 1g: carve a 7g
    })  # fmt: skip
    assert move_owner(Waiting("slurm-200", SEVEN), view.nodes(), view.jobs([(200, SEVEN)]), (), H200,
                      hook_token=TOKEN, max_moves=2) == "fm-b"  # fmt: skip
    assert not any(p.moves for p in moves_of(view, [(200, SEVEN)]).values())


def test_a_job_moved_as_often_as_allowed_does_not_count_as_movable() -> None:
    view = two_hosts()
    jobs = [j if j.job_id != 101 else _job(101, "1g.18gb", state="RUNNING", nodes=j.nodes, requeue=True,
                                           comment=TOKEN, start_s=0.0, time_limit_s=3600.0, restart_count=2)
            for j in view.jobs([(200, SEVEN)])]  # fmt: skip
    assert move_owner(Waiting("slurm-200", SEVEN), view.nodes(), jobs, (), H200, hook_token=TOKEN,
                      max_moves=2) == "fm-b"  # fmt: skip


# ------------------------------------------------------------------------------------------------- the property

LAYOUTS = (
    (("1g.18gb", 6),),
    (("3g.71gb", 4),),
    (("1g.18gb", 0), ("2g.35gb", 2), ("3g.71gb", 4)),
    (("3g.71gb", 0), ("3g.71gb", 4)),
    (("4g.71gb", 0),),
    (("1g.18gb", 5), ("1g.18gb", 6)),
)


@st.composite
def views(draw: st.DrawFn) -> View:
    """Two or three hosts of one or two H200s, each instance idle or running a job that opted in or not."""
    next_id = 100
    hosts: dict[str, list[list[tuple[str, int, Busy | None]]]] = {}
    for h in range(draw(st.integers(2, 3))):
        gpus = []
        for _ in range(draw(st.integers(1, 2))):
            insts: list[tuple[str, int, Busy | None]] = []
            for p, s in draw(st.sampled_from(LAYOUTS)):
                what = draw(st.sampled_from(("idle", "hook", "stays", "hook", "stays")))
                busy = None if what == "idle" else Busy(next_id, what == "hook", draw(st.sampled_from((600.0, 3600.0))))
                next_id += 1
                insts.append((p, s, busy))
            gpus.append(insts)
        hosts[f"fm-h{h}"] = gpus
    return View(hosts)


@settings(max_examples=150, deadline=None)
@given(views(), st.lists(st.sampled_from(("7g.141gb", "4g.71gb", "3g.71gb")), min_size=1, max_size=3))
def test_at_most_one_host_moves_for_one_waiting_job(view: View, profiles: list[str]) -> None:
    waiting = [(500 + k, p) for k, p in enumerate(profiles)]
    plans = moves_of(view, waiting)
    movers: dict[str, list[str]] = {}
    for host, plan in plans.items():
        if plan.moves:
            assert plan.waiting is not None
            movers.setdefault(plan.waiting, []).append(host)
    assert all(len(hosts) == 1 for hosts in movers.values()), movers
