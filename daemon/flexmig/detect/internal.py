"""Internal fragmentation and oversized jobs: slices an instance holds beyond what its job uses.

**Internal fragmentation** of an instance of profile ``p`` over a window:

* compute slices needed ``= ceil(activity * compute_slices(p))``, at least 1 while a process runs, 0 with none
  (activity: p95, else mean; unknown activity leaves the compute figure unknown unless no process runs);
* memory slices needed ``= ceil(memory_used / (memory_total / memory_slices(p)))``, 0 with no process;
* internal fragmentation = held minus needed, for compute and for memory slices.

Worked example (H200 ``3g.71gb``, three compute and four memory slices): p95 activity 0.40 and 20 GiB used of
69.5 GiB give ``ceil(1.2) = 2`` compute slices and ``ceil(20 / 17.4) = 2`` memory slices needed, so one compute
slice and two memory slices are held beyond use.

**Oversized**: a job (at least one process, activity and memory known) is oversized when a smaller plain profile
of the same model, with no more compute or memory slices and fewer of one, holds its p95 SM use
(``activity * SMs(p)``) and its memory with ``margin`` headroom: ``SMs * (1 + margin) <= SMs(q)`` and
``memory_used * (1 + margin) <= memory(q)``. The smallest such profile is suggested. In the example above, with
the default 25% margin, ``0.40 * 60 * 1.25 = 30`` SMs and 25 GiB fit a ``2g.35gb`` (32 SMs, 32.25 GiB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexmig.detect.usage import InstanceUsage
from flexmig.mig import GpuModel, Profile
from flexmig.mig.fastinit import fast_init

__all__ = ["InternalFragmentation", "internal_fragmentation", "smaller_profile", "smaller_profiles"]

_MIB = 1024 * 1024


@fast_init
@dataclass(frozen=True, slots=True)
class InternalFragmentation:
    """Slices one instance holds and what its job needs of them, over one window (None: unknown)."""

    gpu: int
    start: int
    profile: str
    compute_held: int
    memory_held: int
    compute_needed: int | None
    memory_needed: int | None

    @property
    def compute_idle(self) -> int | None:
        """Compute slices held beyond use."""
        return None if self.compute_needed is None else self.compute_held - self.compute_needed

    @property
    def memory_idle(self) -> int | None:
        """Memory slices held beyond use."""
        return None if self.memory_needed is None else self.memory_held - self.memory_needed


def internal_fragmentation(usage: InstanceUsage, profile: Profile) -> InternalFragmentation:
    """The internal fragmentation of the instance ``usage`` describes (``profile``: its profile)."""
    idle = usage.processes == 0
    compute: int | None
    activity = usage.activity
    if idle:
        compute = 0
    elif activity is None:
        compute = None
    else:
        compute = min(profile.compute_slices, max(1, math.ceil(round(activity * profile.compute_slices, 9))))
    memory: int | None
    total = usage.memory_total_bytes or profile.memory_mib * _MIB
    if idle:
        memory = 0
    elif usage.memory_used_bytes is None:
        memory = None
    else:
        per_slice = total / profile.memory_slices
        memory = min(profile.memory_slices, max(1, math.ceil(round(usage.memory_used_bytes / per_slice, 9))))
    return InternalFragmentation(
        usage.gpu, usage.start, profile.name, profile.compute_slices, profile.memory_slices, compute, memory
    )


def smaller_profile(usage: InstanceUsage, model: GpuModel, profile: Profile, margin: float) -> Profile | None:
    """The smallest plain profile smaller than ``profile`` that holds the job of ``usage`` with ``margin`` headroom,
    or None (no job, unknown figures, or nothing smaller fits)."""
    return smaller_profiles(usage, model, profile, margin)[0]


def smaller_profiles(
    usage: InstanceUsage, model: GpuModel, profile: Profile, margin: float
) -> tuple[Profile | None, Profile | None]:
    """:func:`smaller_profile` with ``margin`` and with none, in one pass over the model's profiles (detection asks
    both of every instance at every sweep)."""
    activity = usage.activity
    if not usage.processes or activity is None or usage.memory_used_bytes is None:
        return None, None
    sms, used = activity * profile.sm_count, usage.memory_used_bytes
    sms_m, memory_m = sms * (1 + margin), used * (1 + margin)
    sms, memory = sms * (1 + 0.0), used * (1 + 0.0)  # the same products at margin 0, to the last bit
    with_margin: list[Profile] = []
    without: list[Profile] = []
    size = (profile.compute_slices, profile.memory_slices)
    for q in model.profiles:  # the plain ones (``model.plain_profiles``), asked last: the numbers rule most out
        if q.compute_slices > size[0] or q.memory_slices > size[1] or (q.compute_slices, q.memory_slices) == size:
            continue
        room = q.memory_mib * _MIB
        if sms_m <= q.sm_count and memory_m <= room and not q.is_media_variant:
            with_margin.append(q)
        if sms <= q.sm_count and memory <= room and not q.is_media_variant:
            without.append(q)
    return min(with_margin, key=_size, default=None), min(without, key=_size, default=None)


def _size(q: Profile) -> tuple[int, int, str]:
    return q.compute_slices, q.memory_slices, q.name
