"""GPU-instance IDs as drivers hand them out, and an adversary that hands them out any legal way.

**What a driver does.** A GPU-instance ID is the resource manager's ``swizzId``: the buddy number of the *physical*
memory partition the instance owns (0 the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the eighths; the
``gpuSlice`` table of ``kmigmgrGetInvalidSwizzIdMask`` in NVIDIA/open-gpu-kernel-modules,
``src/nvidia/src/kernel/gpu/mig_mgr/kernel_mig_manager.c``). The placement NVML reports is a *virtual* span
chosen by the GPU's firmware, and the two differ per chip: one of the eight compute slots of each GPU is fused off
(seven compute slices over eight memory slices), and the firmware always shows that slot as virtual slice 7, the one
no 1g may start at. So a GPU maps its virtual slices onto physical ones by a buddy-tree symmetry that sends virtual
7 to its fused-off slot; here, ``physical = virtual XOR (7 XOR fused)``.

Checked against every published transcript we found (the rule reproduces each ID sequence below):

* DCGM issue #138 (https://github.com/NVIDIA/DCGM/issues/138), ``nvidia-smi mig -lgi`` of two A100-80GB with one
  layout: GPU 0 has 1g@2 = 9, 1g@3 = 10, 2g@0 = 3, 3g@4 = 2; GPU 1 has 13, 14, 5 and 1 (fused slot 7, then 3);
* dask-cuda issue #583 (https://github.com/rapidsai/dask-cuda/issues/583), seven ``-cgi 19`` on an A100-40GB:
  9, 7, 8, 11, 12, 13, 14 (fused slot 3);
* nvitop pull request #8 (https://github.com/XuehaiPan/nvitop/pull/8), three 2g.20gb per A100-80GB: 3, 5, 6 on one
  GPU and 3, 4, 5 on another;
* the NVIDIA MIG User Guide (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/), A100-40GB:
  ``-cgi 19,19,14,9`` gives 13, 11, 3 then INSUFFICIENT_RESOURCES; ``-cgi 9,19,14,19`` gives 2, 7, 4, 8;
  ``-cgi 14,19,19,19,19,19`` gives 5, 13, 7, 8, 9, 10. (Its first example lists GI 2 at 0:4 and GI 1 at 4:4 after
  creating 2 then 1, the reverse of its other examples; that one listing this rule does not reproduce.)

Where the caller gives no placement (``nvmlDeviceCreateGpuInstance``, ``nvidia-smi mig -cgi``), the driver walks
the buddy tree from the top and at each level enters the child with the fewest free compute slots that can still
hold the profile, the lower one on a tie (a best fit that keeps whole halves and quarters free): that is what turns
the commands above into those IDs. Destroying an instance frees its ID; the next instance on the same physical
slices gets it again.

**The adversary.** ``FLEXMIG_SIM_IDS=adversarial:SEED`` hands out any free ID of the instance's size class (1-2 for
a half, 3-6 for a quarter, 7-14 for an eighth), reusing the one freed last half of the time, and places an
instance created without a placement at any start that fits. The whole test suite runs once in this mode, so no
code above the driver can lean on a mapping between placements and IDs.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterable, Sequence
from typing import Protocol

from flexmig.errors import SimError

__all__ = [
    "IDS_ENV",
    "AdversarialIds",
    "DriverIds",
    "GiIdPolicy",
    "Occupant",
    "buddy_id",
    "class_ids",
    "default_fused_slot",
    "infer_fused_slot",
    "policy_from",
]

IDS_ENV = "FLEXMIG_SIM_IDS"
_SLOTS = 8  # memory slices, the leaves of the buddy tree


def buddy_id(start: int, size: int) -> int:
    """The swizzId of the physical block ``[start, start+size)``: 0; 1-2; 3-6; 7-14 for sizes 8, 4, 2, 1."""
    if size not in (1, 2, 4, 8) or start % size or not 0 <= start < _SLOTS:
        raise ValueError(f"no buddy block of size {size} starts at memory slice {start}")
    return _SLOTS // size - 1 + start // size


def class_ids(size: int) -> range:
    """Every ID an instance spanning ``size`` memory slices can have (its size class)."""
    first = _SLOTS // size - 1
    return range(first, first + _SLOTS // size)


def default_fused_slot(node_key: str, index: int) -> int:
    """The fused-off compute slot of GPU ``index`` of a simulated node: fixed by the node, different for each of
    up to eight GPUs (so one layout gets other IDs on the GPU next door, as on the nodes above)."""
    return (zlib.crc32(node_key.encode()) + 5 * index) % _SLOTS


def infer_fused_slot(instances: Iterable[tuple[int, int, int]], fallback: int) -> int:
    """The fused-off slot that explains recorded ``(start, size, id)`` triples, ``fallback`` when it explains them
    (or nothing does: IDs another rule handed out)."""
    triples = list(instances)

    def explains(fused: int) -> bool:
        mask = 7 ^ fused
        return all(buddy_id((start ^ mask) & ~(size - 1), size) == gi_id for start, size, gi_id in triples)

    if explains(fallback):
        return fallback
    return next((f for f in range(_SLOTS) if explains(f)), fallback)


class Occupant(Protocol):
    """What the policies need to know of an existing GPU instance."""

    @property
    def id(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def size(self) -> int: ...


class GiIdPolicy(Protocol):
    """How a simulated driver chooses a placement (when none is given) and an ID for a new GPU instance."""

    def choose_start(self, gpu: int, fused: int, size: int, fits: Sequence[int], taken: Sequence[Occupant]) -> int:
        """The start (virtual, as NVML reports it) for an instance of ``size`` created without a placement."""
        ...

    def assign(self, gpu: int, fused: int, size: int, start: int, taken: Sequence[Occupant]) -> int:
        """The ID of a new instance of ``size`` memory slices at ``start``."""
        ...

    def released(self, gpu: int, gi_id: int) -> None:
        """Instance ``gi_id`` of GPU ``gpu`` was destroyed."""
        ...


class DriverIds:
    """What drivers do: the ID is the buddy number of the physical block; best fit when no placement is given."""

    def _physical(self, fused: int, start: int, size: int) -> int:
        return (start ^ (7 ^ fused)) & ~(size - 1)

    def _free_slots(self, fused: int, taken: Sequence[Occupant]) -> set[int]:
        used: set[int] = set()
        for gi in taken:
            first = self._physical(fused, gi.start, gi.size)
            used.update(range(first, first + gi.size))
        return {s for s in range(_SLOTS) if s != fused and s not in used}

    def choose_start(self, gpu: int, fused: int, size: int, fits: Sequence[int], taken: Sequence[Occupant]) -> int:
        """Best fit down the buddy tree (see the module docstring)."""
        if not fits:
            raise ValueError("no start fits")
        free = self._free_slots(fused, taken)

        def key(start: int) -> tuple[int, ...]:
            phys = self._physical(fused, start, size)
            out: list[int] = []
            block = _SLOTS // 2
            while block >= size:
                first = phys & ~(block - 1)
                out += [sum(1 for s in range(first, first + block) if s in free), first]
                block //= 2
            return tuple(out)

        return min(fits, key=key)

    def assign(self, gpu: int, fused: int, size: int, start: int, taken: Sequence[Occupant]) -> int:
        """The buddy number of the physical block behind ``start``."""
        return buddy_id(self._physical(fused, start, size), size)

    def released(self, gpu: int, gi_id: int) -> None:
        """Nothing to remember: the ID follows the physical block."""


class AdversarialIds:
    """Any legal ID, seeded: a free one of the size class, the one freed last half of the time; any start."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)  # noqa: S311  # a reproducible adversary, not a secret
        self._freed: dict[int, list[int]] = {}

    def choose_start(self, gpu: int, fused: int, size: int, fits: Sequence[int], taken: Sequence[Occupant]) -> int:
        """Any start that fits."""
        return self._rng.choice(sorted(fits))

    def assign(self, gpu: int, fused: int, size: int, start: int, taken: Sequence[Occupant]) -> int:
        """A free ID of the size class; the last one freed on this GPU if it is free and the coin says so."""
        used = {gi.id for gi in taken}
        free = [i for i in class_ids(size) if i not in used]
        if not free:
            raise ValueError(f"no free GPU-instance ID of size {size} on GPU {gpu}")
        recent = [i for i in reversed(self._freed.get(gpu, [])) if i in free]
        if recent and self._rng.random() < 0.5:
            return recent[0]
        return self._rng.choice(free)

    def released(self, gpu: int, gi_id: int) -> None:
        """Remember the ID so it can be handed out again soon."""
        freed = self._freed.setdefault(gpu, [])
        freed.append(gi_id)
        del freed[:-16]


def policy_from(text: str | None) -> GiIdPolicy:
    """The policy named by ``text`` (``driver``, ``adversarial`` or ``adversarial:SEED``); None reads the
    environment variable ``FLEXMIG_SIM_IDS`` (unset: ``driver``). SimError names a bad value."""
    raw = os.environ.get(IDS_ENV, "") if text is None else text
    value = raw.strip()
    if value in ("", "driver"):
        return DriverIds()
    kind, _, seed = value.partition(":")
    if kind == "adversarial":
        if not seed:
            return AdversarialIds(0)
        if seed.isdigit() and len(seed) <= 18:
            return AdversarialIds(int(seed))
    where = IDS_ENV if text is None else "the GPU-instance ID mode"
    raise SimError(f"{where}={raw!r}: expected 'driver', 'adversarial' or 'adversarial:SEED' (SEED a number)")

