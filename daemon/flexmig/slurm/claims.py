"""Which GPU node of a host serves which pending job, and the order the GPU nodes plan in (``[slurm] node_per_gpu``).

The policy of a host of several GPU nodes: :class:`Claims` keeps two GPU nodes from changing for the same job, and
:func:`round_order` says which node plans first. The daemon's round (:class:`flexmig.wiring.slurm.SlurmComponent`)
and the offline model (``bench/slurm_model.py``) both call these.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from flexmig.act.journal import ActionRow
from flexmig.plan.reregistration import changes_instances
from flexmig.slurm.agent_read import SlurmRound
from flexmig.slurm.change import KIND

__all__ = ["Claims", "round_order"]


class Claims:
    """Which GPU node's change serves which pending job (``[slurm] node_per_gpu``): a job one GPU node claimed is
    left out of its siblings' queues until the claim lapses.

    A node claims the jobs its verdict newly serves (:attr:`flexmig.plan.reregistration.Verdict.newly_served`) when
    its round carried out a change, committed one, or keeps a committed one; the claim holds ``hold_s`` after the
    last round that made it (the job then pends for a few seconds until Slurm starts it on the new instances), and
    ends at once when the node abandons its change. Jobs no change claims are every GPU node's.
    """

    def __init__(self, hold_s: float, clock: Callable[[], float]) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._by_job: dict[str, tuple[str, float]] = {}

    def taken(self, node: str) -> frozenset[str]:
        """The jobs another GPU node than ``node`` claims now."""
        now = self.clock()
        self._by_job = {job: c for job, c in self._by_job.items() if c[1] > now}
        return frozenset(job for job, (owner, _) in self._by_job.items() if owner != node)

    def update(self, node: str, served: Sequence[str], *, acting: bool, abandoned: bool = False) -> None:
        """After ``node``'s round: claim the jobs its change serves (``served``) when it carried out, committed or
        keeps a change (``acting``); drop its claims when it abandoned its change."""
        if abandoned:
            self._by_job = {job: c for job, c in self._by_job.items() if c[0] != node}
            return
        if acting:
            until = self.clock() + self.hold_s
            for job in served:
                self._by_job[job] = (node, until)

    def update_from(self, node: str, rnd: SlurmRound, *, advise: bool = False) -> None:
        """:meth:`update` from what ``node``'s round did: a change carried out, committed (``change_waiting``) or
        kept (flexmig's reservation exists and the verdict still goes), or abandoned (or cancelled: the node
        reopened as it was). In mode advise (``advise``) a change the verdict goes for claims its jobs as mode act
        would carry it out or commit it, so that the GPU nodes' published plans do not count the same job twice."""
        v, read = rnd.verdict, rnd.read
        cancelled = rnd.result is not None and any(r.outcome == "cancelled" for r in rnd.result.results)
        abandoned = cancelled or any(what == "change_abandoned" for what, _ in rnd.events)
        going = v is not None and read is not None and v.go and changes_instances(rnd.plan) and not cancelled
        acting = going and (
            advise
            or rnd.result is not None
            or (read is not None and read.mine is not None)
            or any(what == "change_waiting" for what, _ in rnd.events)
        )
        self.update(node, v.newly_served if v is not None else (), acting=acting, abandoned=abandoned)

    def owners(self) -> set[str]:
        """The GPU nodes that hold a claim now."""
        return {owner for owner, _ in self._by_job.values()}

    def restore(self, rows: Sequence[ActionRow], now_wall: float) -> int:
        """At start: the claims of the changes the journal shows carried out less than ``hold_s`` ago (wall time
        ``now_wall``), so that a change made just before a restart keeps its jobs from the siblings while they pend
        until Slurm starts them (a waiting change claims its jobs again in its first round). Returns how many
        jobs were claimed."""
        now = self.clock()
        n = 0
        for row in sorted(rows, key=lambda r: r.finished_s or 0.0):
            serves = row.payload.get("serves")
            node = row.payload.get("node")
            if row.kind != KIND or row.state != "done" or not row.finished_s or not isinstance(node, str):
                continue
            if not isinstance(serves, list):
                continue  # a journal written before changes named their jobs
            left = self.hold_s - max(0.0, now_wall - row.finished_s)
            if left <= 0:
                continue
            for job in serves:
                if isinstance(job, str):
                    self._by_job[job] = (node, now + left)
                    n += 1
        return n


def round_order(
    nodes: Sequence[tuple[str, int | None]], *, waiting: Collection[str], claiming: Collection[str],
    busy: Collection[str], empty_at: Mapping[str, float] | None = None,
) -> list[str]:  # fmt: skip
    """The order in which the GPU nodes ``(node, gpu)`` of a host plan in a round (``node_per_gpu``): those whose
    change waits in flexmig's reservation first (``waiting``: it claims its jobs again in its first round after a
    restart), then those whose change has claimed jobs (they keep them), then those no job ran on at their last look
    (an idle node changes at once, so it serves a waiting job soonest), then the busy ones by when they were expected
    to be empty at their last look (``empty_at``, any one clock: the one that empties first closes for the shortest
    while, so it claims the waiting jobs), then by GPU."""
    soon = empty_at or {}

    def key(ng: tuple[str, int | None]) -> tuple[bool, bool, bool, float, int]:
        node, gpu = ng
        idle = node not in busy
        return (node not in waiting, node not in claiming, not idle, 0.0 if idle else soon.get(node, 0.0),
                -1 if gpu is None else gpu)  # fmt: skip

    return [node for node, _ in sorted(nodes, key=key)]
