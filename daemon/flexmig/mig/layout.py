"""The layout of one GPU: which MIG instances sit where.

A layout is an immutable value. Instances are identified by their start (memory slice), which is unique on a
GPU because placements never overlap; GPU-instance IDs belong to the driver and never appear here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from flexmig.errors import LayoutError
from flexmig.mig.catalogue import GpuModel, Profile

__all__ = ["Layout", "PlacedInstance"]


@dataclass(frozen=True, slots=True, order=True)
class PlacedInstance:
    """A GPU instance of ``profile`` occupying memory slices ``[start, start + profile.memory_slices)``."""

    start: int
    profile: Profile

    @property
    def end(self) -> int:
        """One past the last memory slice held."""
        return self.start + self.profile.memory_slices

    @property
    def slices(self) -> range:
        """The memory slices held."""
        return range(self.start, self.end)

    def spec(self) -> str:
        """``3g.71gb@4``: the node-spec notation of this instance."""
        return f"{self.profile.name}@{self.start}"


@dataclass(frozen=True, slots=True)
class Layout:
    """The MIG instances of one GPU of ``model``, sorted by start. Build it with :meth:`of` or :meth:`place`."""

    model: GpuModel
    instances: tuple[PlacedInstance, ...] = ()

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def empty(cls, model: GpuModel) -> Layout:
        """A GPU with MIG enabled and no instances."""
        return cls(model, ())

    @classmethod
    def of(cls, model: GpuModel, items: Iterable[tuple[str | Profile, int]]) -> Layout:
        """A layout from ``(profile or profile name, start)`` pairs, placed in the given order.

        Raises LayoutError naming the first item that breaks a rule.
        """
        layout = cls.empty(model)
        for prof, start in items:
            p = model.profile(prof) if isinstance(prof, str) else prof
            layout = layout.place(p, start)
        return layout

    def place(self, profile: Profile, start: int) -> Layout:
        """This layout plus ``profile`` at ``start``; LayoutError says why it cannot be placed."""
        why = self.why_not(profile, start)
        if why:
            raise LayoutError(f"cannot place {profile.name}@{start} on {self.model.key}: {why}")
        inst = PlacedInstance(start, profile)
        return Layout(self.model, tuple(sorted((*self.instances, inst), key=lambda i: i.start)))

    def remove(self, start: int) -> Layout:
        """This layout without the instance starting at ``start``; LayoutError if there is none."""
        kept = tuple(i for i in self.instances if i.start != start)
        if len(kept) == len(self.instances):
            raise LayoutError(f"no instance starts at memory slice {start} on this {self.model.key}")
        return Layout(self.model, kept)

    # -------------------------------------------------------------------------------------------- queries
    def at(self, start: int) -> PlacedInstance | None:
        """The instance starting at ``start``, if any."""
        for i in self.instances:
            if i.start == start:
                return i
        return None

    def __iter__(self) -> Iterator[PlacedInstance]:
        return iter(self.instances)

    def __len__(self) -> int:
        return len(self.instances)

    def used_memory_slices(self) -> frozenset[int]:
        """Memory slices held by some instance."""
        return frozenset(s for i in self.instances for s in i.slices)

    def free_memory_slices(self) -> tuple[int, ...]:
        """Memory slices held by no instance, ascending."""
        used = self.used_memory_slices()
        return tuple(s for s in range(self.model.memory_slices) if s not in used)

    def used_compute_slices(self) -> int:
        """Compute slices held by instances."""
        return sum(i.profile.compute_slices for i in self.instances)

    def free_compute_slices(self) -> int:
        """Compute slices no instance holds (some may be unusable: see ``detect`` for stranded capacity)."""
        return self.model.compute_slices - self.used_compute_slices()

    def count(self, profile: Profile) -> int:
        """Instances of exactly this profile."""
        return sum(1 for i in self.instances if i.profile == profile)

    def why_not(self, profile: Profile, start: int) -> str:
        """Empty when ``profile`` can be created at ``start`` now; otherwise the rule it breaks, in words."""
        if profile not in self.model.profiles:
            return f"{profile.name} is not a profile of {self.model.key}"
        if start not in profile.starts:
            allowed = ",".join(str(s) for s in profile.starts)
            return f"{profile.name} may start only at memory slice {{{allowed}}}"
        used = self.used_memory_slices()
        clash = [s for s in range(start, start + profile.memory_slices) if s in used]
        if clash:
            return f"memory slice {clash[0]} is already held by another instance"
        if self.count(profile) >= profile.max_instances:
            return f"at most {profile.max_instances} {profile.name} instance(s) per GPU"
        if len(self.instances) >= self.model.max_instances:
            return f"at most {self.model.max_instances} instances per GPU"
        if self.used_compute_slices() + profile.compute_slices > self.model.compute_slices:
            return "not enough free compute slices"
        return ""

    def can_place(self, profile: Profile, start: int) -> bool:
        """True when ``profile`` can be created at ``start`` now."""
        return not self.why_not(profile, start)

    def placements(self, profile: Profile) -> tuple[int, ...]:
        """Starts at which ``profile`` could be created now."""
        return tuple(s for s in profile.starts if self.can_place(profile, s))

    def creatable(self, profile: Profile) -> int:
        """How many instances of ``profile`` alone could still be created now (NVML's remaining capacity).

        All placements of one profile have the same size and aligned starts, so taking the lowest free start
        each time packs the most (earliest end first is optimal for equal-length intervals).
        """
        layout = self
        n = 0
        while True:
            starts = layout.placements(profile)
            if not starts:
                return n
            layout = layout.place(profile, starts[0])
            n += 1

    def capacity(self) -> dict[str, int]:
        """For every profile of the model, how many could still be created now."""
        return {p.name: self.creatable(p) for p in self.model.profiles}

    def violations(self) -> list[str]:
        """Every placement rule this layout breaks (empty for a layout the hardware accepts)."""
        out: list[str] = []
        rebuilt = Layout.empty(self.model)
        for inst in self.instances:
            why = rebuilt.why_not(inst.profile, inst.start)
            if why:
                out.append(f"{inst.spec()}: {why}")
            else:
                rebuilt = rebuilt.place(inst.profile, inst.start)
        return out

    def spec(self) -> str:
        """``3g.71gb@0+2g.35gb@4+1g.18gb@6``: the node-spec notation (empty for no instances)."""
        return "+".join(i.spec() for i in self.instances)

    def slice_map(self) -> str:
        """One character per memory slice, for people: instances as their compute size, free as ``.``.

        ``33332211`` would be a 3g at 0, a 2g at 4 and 1g instances at 6 and 7 (were that allowed).
        """
        cells = ["."] * self.model.memory_slices
        for inst in self.instances:
            for s in inst.slices:
                cells[s] = str(inst.profile.compute_slices)
        return "".join(cells)
