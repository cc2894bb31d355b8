"""``repack``: the node re-packed for free at every event, whole instances only: the ideal a MIG policy could reach
without spreading a job or giving it less than it asked for.

A set of jobs can run together when the instances they ask for (each rank one instance of its nominal profile) can
be packed into the node's GPUs, each GPU holding a layout the hardware accepts; where each instance sits is chosen
anew, at no cost, whenever a job starts. No job migrates, re-splits or waits for a reconfiguration. This is the
strongest rival that keeps MIG's one-instance-per-rank rule: any placement policy of whole instances (static, drain,
flex without spreading) can at best match it, while flex may beat it by spreading jobs over smaller instances.

Packing: a multiset of profiles fits on ``G`` GPUs when some GPU can host a part of it that includes one instance
of its largest profile and the rest fits on ``G - 1`` GPUs (GPUs are alike, so the largest instance may as well go
on the first); a GPU can host exactly the sub-multisets of its maximal layouts' instances. Answers are memoised.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence

from flexmig.mig.catalogue import GpuModel, Profile
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout
from flexmig.plan.queue import Reservation, admit
from flexmig.plan.shapes import nominal_shape
from flexmig.plan.types import Discipline, JobRequest
from flexmig.replay.managers import Grant, RunView

__all__ = ["Packer", "RepackManager"]

Counts = tuple[int, ...]


class Packer:
    """Whether multisets of plain-profile instances fit on ``gpus`` GPUs of ``model`` (memoised)."""

    def __init__(self, model: GpuModel, gpus: int) -> None:
        self.model = model
        self.gpus = gpus
        self.profiles: tuple[Profile, ...] = tuple(
            sorted(model.plain_profiles, key=lambda p: (-p.compute_slices, -p.memory_slices))
        )
        self.index = {p.profile_id: i for i, p in enumerate(self.profiles)}
        vectors: set[Counts] = set()
        for lay in maximal_layouts(model):
            vectors.add(self.counts(i.profile for i in lay))
        # Drop vectors another one dominates: they never host anything the other cannot.
        self.maximal: tuple[Counts, ...] = tuple(
            sorted(
                (
                    v
                    for v in vectors
                    if not any(w != v and all(a <= b for a, b in zip(v, w, strict=True)) for w in vectors)
                ),
                reverse=True,
            )
        )
        self._memo: dict[tuple[Counts, int], bool] = {}

    def counts(self, profiles: Iterable[Profile]) -> Counts:
        """The count vector of ``profiles`` (in :attr:`profiles` order)."""
        out = [0] * len(self.profiles)
        for p in profiles:
            out[self.index[p.profile_id]] += 1
        return tuple(out)

    def fits(self, demand: Counts) -> bool:
        """True when ``demand`` packs onto the node's GPUs."""
        return self._fits(demand, self.gpus)

    def _fits(self, d: Counts, g: int) -> bool:
        first = next((i for i, n in enumerate(d) if n), None)
        if first is None:
            return True
        if g == 0:
            return False
        key = (d, g)
        got = self._memo.get(key)
        if got is not None:
            return got
        got = False
        compute = sum(n * p.compute_slices for n, p in zip(d, self.profiles, strict=True))
        if compute <= g * self.model.compute_slices:
            for c in self.maximal:
                if c[first] == 0:
                    continue
                rest = tuple(max(0, a - b) for a, b in zip(d, c, strict=True))
                if self._fits(rest, g - 1):
                    got = True
                    break
        self._memo[key] = got
        return got


def _add(a: Counts, b: Counts) -> Counts:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def _sub(a: Counts, b: Counts) -> Counts:
    return tuple(x - y for x, y in zip(a, b, strict=True))


class RepackManager:
    """The node as whole instances re-packed for free at every event (see the module docstring)."""

    def __init__(self, model: GpuModel, gpus: int, discipline: Discipline = "easy") -> None:
        self.model = model
        self.packer = Packer(model, gpus)
        self.discipline: Discipline = discipline
        self._held: dict[str, Counts] = {}
        self._used: Counts = (0,) * len(self.packer.profiles)

    def layouts(self) -> tuple[Layout, ...]:
        """No fixed layouts: they are re-packed at will."""
        return ()

    def _need(self, job: JobRequest) -> Counts:
        shape = nominal_shape(self.model, job)
        return self.packer.counts([shape.profile] * shape.ranks)

    def placeable(self, job: JobRequest) -> bool:
        """Its instances pack onto the empty node."""
        return self.packer.fits(self._need(job))

    def release(self, job: str) -> None:
        """``job`` ended."""
        got = self._held.pop(job, None)
        if got is not None:
            self._used = _sub(self._used, got)

    def fragmentation(self, weights: Mapping[str, float]) -> float:
        """Free re-packing leaves no placement it could not fix: 0."""
        return 0.0

    def schedule(self, now_s: float, queue: Sequence[JobRequest], running: Mapping[str, RunView]) -> list[Grant]:
        """The shared discipline over the re-packed node."""
        if not queue:
            return []
        grants: list[Grant] = []
        ends = sorted((now_s + v.remaining_s, name) for name, v in running.items())
        mgr = self
        at_t: list[Counts] = []  # the head and the jobs still running at its reserved start

        class _Pack:
            def shape_key(self, job: JobRequest) -> Hashable:
                return mgr._need(job)

            def try_place(self, job: JobRequest, reservation: Reservation | None) -> bool:
                need = mgr._need(job)
                if not mgr.packer.fits(_add(mgr._used, need)):
                    return False
                guarded = reservation is not None and reservation.start_s != float("inf") and at_t
                runs = job.expected_runtime_s
                if guarded and reservation is not None and (runs is None or now_s + runs > reservation.start_s):
                    if not mgr.packer.fits(_add(at_t[0], need)):
                        return False
                    at_t[0] = _add(at_t[0], need)
                mgr._held[job.name] = need
                mgr._used = _add(mgr._used, need)
                grants.append(Grant(job.name, "start", 1.0, 0.0, nominal_shape(mgr.model, job).compute_slices))
                if runs is not None:
                    bisect.insort(ends, (now_s + runs, job.name))
                return True

            def try_narrow(self, job: JobRequest, reservation: Reservation | None) -> bool:
                return False  # jobs run at their nominal compute here

            def exhausted(self) -> bool:
                smallest = (0,) * (len(mgr.packer.profiles) - 1) + (1,)
                return not mgr.packer.fits(_add(mgr._used, smallest))

            def shadow(self, job: JobRequest) -> Reservation | None:
                need = mgr._need(job)
                left = mgr._used
                i = 0
                while i < len(ends):
                    t = ends[i][0]
                    while i < len(ends) and ends[i][0] == t:
                        left = _sub(left, mgr._held.get(ends[i][1], (0,) * len(left)))
                        i += 1
                    if mgr.packer.fits(_add(left, need)):
                        at_t[:] = [_add(left, need)]
                        return Reservation(job.name, max(t, now_s), None, job)
                return None

        def duration(job: JobRequest) -> float | None:
            return job.expected_runtime_s

        admit(sorted(queue, key=lambda r: r.submitted_s), _Pack(), now_s, duration, discipline=self.discipline)
        return grants
