"""The compute-instance profiles a GPU instance offers (``nvidia-smi mig -lcip``), as the simulated driver answers.

One per size that fits the GPU instance (``1c``, ``2c``, ``3c``, ``4c``, ``7c``; the profile ID equals the NVML
index, ``NVML_COMPUTE_INSTANCE_PROFILE_*``), placed aligned to its size inside the instance, with its share of the
instance's SMs. Hopper adds a second one-slice profile, ``NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1`` (index and
ID 7): in a GPU instance of two memory slices it takes the SMs a ``1g`` with two memory slices has (26 on H100 and
H200, against 16 for the plain ``1c``). The issue that asked for it quotes ``1c.2g.20gb`` REV1 with 26 SMs on an
H100 2g; NVIDIA/go-nvlib pull request #85 says a ``1_SLICE_REV2`` GPU instance takes ``1_SLICE`` and
``1_SLICE_REV1`` compute instances, the latter with "a higher SM count", and a plain ``1_SLICE`` instance only
``1_SLICE``. The header declares the index from CUDA 12.0 (driver branch 525) on.

Assumed (no published ``-lcipp``): a REV1 compute instance is the only one in its GPU instance (its SMs are more
than one slice's), so it occupies every compute slot of the instance, and its placement reports that span.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig import GpuModel, Profile

__all__ = ["CI_1_SLICE_REV1", "CiShape", "ci_shape", "ci_shape_for_slices", "ci_shapes"]

CI_1_SLICE_REV1 = 7  # NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1
_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # slices -> NVML_COMPUTE_INSTANCE_PROFILE_* index (= profile ID)
_SIZES = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}  # GI compute slices -> CI sizes


@dataclass(frozen=True, slots=True)
class CiShape:
    """One compute-instance profile inside one GPU-instance profile."""

    index: int  # NVML index and profile ID
    slices: int  # sliceCount: compute slices, as the name says (1c, 2c, ...)
    span: int  # compute slots it takes inside the GPU instance
    sm_count: int
    starts: tuple[int, ...]  # allowed starts, in compute slots of the GPU instance

    @property
    def instance_count(self) -> int:
        """How many fit in an empty GPU instance (``instanceCount``)."""
        return len(self.starts)


def _starts(gi_slices: int, slices: int) -> tuple[int, ...]:
    """Aligned to their size like GPU-instance placements; 3-slice instances sit at 0 and 4 as the 3g profile does."""
    if slices == gi_slices:
        return (0,)
    if slices == 3:
        return tuple(s for s in (0, 4) if s + 3 <= gi_slices)
    return tuple(range(0, gi_slices - slices + 1, slices))


def _per_slice_sms(model: GpuModel) -> int:
    return model.profile_for_slices(1).sm_count


def ci_shapes(model: GpuModel, profile: Profile, *, rev1: bool) -> dict[int, CiShape]:
    """Every compute-instance profile a GPU instance of ``profile`` offers, by index; ``rev1``: the driver has the
    Hopper one-slice REV1 profile (branch 525 and later)."""
    g = profile.compute_slices
    out: dict[int, CiShape] = {}
    for slices in _SIZES[g]:
        sms = profile.sm_count * slices // g
        if slices == 1 and g == 1 and profile.memory_slices == 2 and model.architecture == "Hopper":
            sms = _per_slice_sms(model)  # the plain 1c of a 1g with two memory slices: one slice's SMs
        out[_INDEX[slices]] = CiShape(_INDEX[slices], slices, slices, sms, _starts(g, slices))
    if rev1 and model.architecture == "Hopper" and profile.memory_slices == 2 and not profile.is_media_variant:
        wide = next((p for p in model.profiles if p.compute_slices == 1 and p.memory_slices == 2), None)
        if wide is not None:
            out[CI_1_SLICE_REV1] = CiShape(CI_1_SLICE_REV1, 1, g, wide.sm_count, (0,))
    return out


def ci_shape(model: GpuModel, profile: Profile, index: int, *, rev1: bool) -> CiShape | None:
    """The compute-instance profile at NVML ``index`` in a GPU instance of ``profile``, None if it offers none."""
    return ci_shapes(model, profile, rev1=rev1).get(index)


def ci_shape_for_slices(model: GpuModel, profile: Profile, slices: int) -> CiShape:
    """The plain compute-instance profile of ``slices`` compute slices (KeyError if the instance has none)."""
    return ci_shapes(model, profile, rev1=False)[_INDEX[slices]]
