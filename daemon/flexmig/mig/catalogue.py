"""GPU models and their MIG GPU-instance profiles.

Why a catalogue of our own: the simulator must answer NVML's profile queries exactly as a driver does, and the
pure planner must reason about placements without a driver. Sources: NVIDIA MIG User Guide ("Supported MIG
Profiles", ``nvidia-smi mig -lgip``/``-lgipp`` transcripts; the H200 figures from NVIDIA/mig-parted issue #120).

Two traps this module keeps apart on purpose:

* the NVML profile *index* (``NVML_GPU_INSTANCE_PROFILE_3_SLICE`` = 2), which ``nvmlDeviceGetGpuInstanceProfileInfo``
  takes, and the published profile *ID* (9 for 3g), which every create/list/placement call takes;
* placements are counted in 8 *memory* slices, not 7 compute slices: a 3g instance has size 4, a 7g size 8.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = [
    "A100_40",
    "A100_80",
    "H100_80",
    "H200",
    "MODELS",
    "ComputeProfile",
    "GpuModel",
    "Offer",
    "Profile",
    "model_by_key",
    "model_by_name",
    "model_for",
]

# NVML_GPU_INSTANCE_PROFILE_* indices (pynvml constants; the values are part of the ABI).
_IDX_1_SLICE = 0
_IDX_2_SLICE = 1
_IDX_3_SLICE = 2
_IDX_4_SLICE = 3
_IDX_7_SLICE = 4
_IDX_1_SLICE_REV1 = 7  # +me: one slice with all media engines, one instance per GPU
_IDX_1_SLICE_REV2 = 9  # one compute slice, two memory slices

# Published GPU-instance profile IDs, as `nvidia-smi mig -lgip` prints them (same on all four models).
_ID_1G = 19
_ID_1G_ME = 20
_ID_1G_2M = 15
_ID_2G = 14
_ID_3G = 9
_ID_4G = 5
_ID_7G = 0


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """A compute-instance profile: ``c`` compute slices inside a GPU instance.

    flexmig always creates one compute instance spanning its GPU instance (as ``nvidia-smi mig -cgi ... -C``),
    but the simulator also accepts smaller ones so that foreign layouts read back faithfully.
    """

    index: int  # NVML_COMPUTE_INSTANCE_PROFILE_* (1 slice = 0, 2 = 1, 3 = 2, 4 = 3, 7 = 4)
    profile_id: int
    slices: int


def _ci(slices: int) -> ComputeProfile:
    index = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[slices]
    return ComputeProfile(index=index, profile_id=index, slices=slices)


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile of one GPU model, e.g. ``3g.71gb`` on an H200.

    ``name`` is what ``nvidia-smi`` shows (NVML's v2 profile name without its ``MIG `` prefix).
    ``starts`` are the allowed placement starts, in memory slices; every placement has ``memory_slices`` size.
    """

    name: str
    index: int
    profile_id: int
    compute_slices: int
    memory_slices: int
    memory_mib: int
    sm_count: int
    starts: tuple[int, ...]
    max_instances: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int

    @property
    def nvml_name(self) -> str:
        """The name NVML's v2 profile struct carries (``MIG 3g.71gb``)."""
        return f"MIG {self.name}"

    @property
    def is_media_variant(self) -> bool:
        """True for ``+me`` profiles: same geometry as their base profile, limited to one instance per GPU."""
        return self.name.endswith("+me")

    @property
    def compute_profiles(self) -> tuple[ComputeProfile, ...]:
        """Compute-instance profiles that fit in this GPU instance, smallest first."""
        return tuple(_ci(s) for s in (1, 2, 3, 4, 7) if s <= self.compute_slices)


@dataclass(frozen=True, slots=True)
class Offer:
    """A GPU-instance profile as a GPU's driver lists it (``nvidia-smi mig -lgip``): its published ID, its memory
    and how many instances of it the GPU holds. What a driver offers differs between releases (older A100
    drivers list no ``1g.20gb``), so the catalogue is cut down to it wherever a GPU says."""

    profile_id: int
    memory_mib: int
    instances: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A MIG-capable GPU model with its profile table."""

    key: str  # our short name, used in node specs: a100-40, a100-80, h100-80, h200
    name: str  # as nvmlDeviceGetName reports it
    architecture: str
    memory_mib: int
    sm_count: int
    profiles: tuple[Profile, ...]
    compute_slices: int = 7
    memory_slices: int = 8
    max_instances: int = 7
    power_limit_w: int = 400
    gpm: bool = False  # GPU Performance Monitoring (Hopper and newer): per-instance activity from NVML

    def profile(self, name: str) -> Profile:
        """The profile called ``name`` (``3g.71gb``; a leading ``MIG `` is accepted). KeyError names the choices."""
        wanted = name.removeprefix("MIG ").strip()
        for p in self.profiles:
            if p.name == wanted:
                return p
        choices = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"{self.key} has no MIG profile {wanted!r}; profiles: {choices}")

    def profile_by_id(self, profile_id: int) -> Profile:
        """The profile with published ID ``profile_id``."""
        for p in self.profiles:
            if p.profile_id == profile_id:
                return p
        raise KeyError(f"{self.key} has no MIG profile with ID {profile_id}")

    def profile_name(self, profile_id: int) -> str | None:
        """The name of the profile with published ID ``profile_id``; None when this model has none (what a GPU
        instance is called when NVML gives no name for its profile)."""
        return next((p.name for p in self.profiles if p.profile_id == profile_id), None)

    def profile_by_index(self, index: int) -> Profile:
        """The profile at NVML profile index ``index``."""
        for p in self.profiles:
            if p.index == index:
                return p
        raise KeyError(f"{self.key} has no MIG profile at index {index}")

    def profile_for_slices(self, compute_slices: int) -> Profile:
        """The plain (non-variant) profile with ``compute_slices`` compute slices and the fewest memory slices."""
        fits = [p for p in self.profiles if p.compute_slices == compute_slices and not p.is_media_variant]
        if not fits:
            raise KeyError(f"{self.key} has no {compute_slices}g profile")
        return min(fits, key=lambda p: p.memory_slices)

    @property
    def plain_profiles(self) -> tuple[Profile, ...]:
        """Profiles without the ``+me`` media variants: what the planner hands out."""
        return tuple(p for p in self.profiles if not p.is_media_variant)

    def offering(self, offers: Iterable[Offer]) -> GpuModel:
        """This model as one driver offers it: only the profiles it lists (by ID), with the memory and instance
        counts it gives; placements stay the catalogue's (they are the hardware's). Profiles the catalogue lacks
        are left out: nothing could place them."""
        by_id = {o.profile_id: o for o in offers}
        kept = tuple(
            replace(p, memory_mib=o.memory_mib, max_instances=o.instances)
            for p in self.profiles
            if (o := by_id.get(p.profile_id)) is not None
        )
        return replace(self, profiles=kept)


def _profiles(
    mem_gb: dict[str, str],
    mem_mib: dict[str, int],
    sms: dict[str, int],
    ce7: int,
    dec: dict[str, int],
    *,
    jpeg: dict[str, int] | None = None,
) -> tuple[Profile, ...]:
    """Build the seven profiles shared by A100/H100/H200 geometry; only names, memory, SMs and engines differ."""
    rows = (
        # key, index, id, compute, memory slices, starts, max instances
        ("1g", _IDX_1_SLICE, _ID_1G, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        ("1g+me", _IDX_1_SLICE_REV1, _ID_1G_ME, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        ("1g2m", _IDX_1_SLICE_REV2, _ID_1G_2M, 1, 2, (0, 2, 4, 6), 4),
        ("2g", _IDX_2_SLICE, _ID_2G, 2, 2, (0, 2, 4), 3),
        ("3g", _IDX_3_SLICE, _ID_3G, 3, 4, (0, 4), 2),
        ("4g", _IDX_4_SLICE, _ID_4G, 4, 4, (0,), 1),
        ("7g", _IDX_7_SLICE, _ID_7G, 7, 8, (0,), 1),
    )
    out = []
    for key, index, pid, comp, mem, starts, max_inst in rows:
        base = key.removesuffix("+me").removesuffix("2m")
        g = base[:-1]
        name = f"{g}g.{mem_gb[key]}gb" + ("+me" if key.endswith("+me") else "")
        out.append(
            Profile(
                name=name,
                index=index,
                profile_id=pid,
                compute_slices=comp,
                memory_slices=mem,
                memory_mib=mem_mib[key],
                sm_count=sms[key],
                starts=starts,
                max_instances=max_inst,
                copy_engines=ce7 if comp == 7 else comp,
                decoders=dec[key],
                encoders=0,
                jpegs=jpeg[key] if jpeg is not None else (1 if key in ("1g+me", "7g") else 0),
                ofas=1 if key in ("1g+me", "7g") else 0,
            )
        )
    return tuple(out)


_A100_SM = {"1g": 14, "1g+me": 14, "1g2m": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}
_HOPPER_SM = {"1g": 16, "1g+me": 16, "1g2m": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}
_A100_DEC = {"1g": 0, "1g+me": 1, "1g2m": 1, "2g": 1, "3g": 2, "4g": 2, "7g": 5}
# Hopper engines as `nvidia-smi mig -lgip` prints them on H100/H200 (and the MIG User Guide's H200 table):
# NVDEC 1/1/1/2/3/4/7 and JPEG 1/1/1/2/3/4/7 for 1g/1g+me/1g.2m/2g/3g/4g/7g; OFA only on 1g+me and 7g.
_HOPPER_DEC = {"1g": 1, "1g+me": 1, "1g2m": 1, "2g": 2, "3g": 3, "4g": 4, "7g": 7}
_HOPPER_JPEG = dict(_HOPPER_DEC)

A100_40 = GpuModel(
    key="a100-40",
    name="NVIDIA A100-SXM4-40GB",
    architecture="Ampere",
    memory_mib=40960,
    sm_count=108,
    power_limit_w=400,
    profiles=_profiles(
        {"1g": "5", "1g+me": "5", "1g2m": "10", "2g": "10", "3g": "20", "4g": "20", "7g": "40"},
        {"1g": 4864, "1g+me": 4864, "1g2m": 9856, "2g": 9856, "3g": 19968, "4g": 19968, "7g": 40192},
        _A100_SM,
        7,
        _A100_DEC,
    ),
)
A100_80 = GpuModel(
    key="a100-80",
    name="NVIDIA A100-SXM4-80GB",
    architecture="Ampere",
    memory_mib=81920,
    sm_count=108,
    power_limit_w=400,
    profiles=_profiles(
        {"1g": "10", "1g+me": "10", "1g2m": "20", "2g": "20", "3g": "40", "4g": "40", "7g": "80"},
        {"1g": 9728, "1g+me": 9728, "1g2m": 19968, "2g": 19968, "3g": 40192, "4g": 40192, "7g": 80384},
        _A100_SM,
        7,
        _A100_DEC,
    ),
)
H100_80 = GpuModel(
    key="h100-80",
    name="NVIDIA H100 80GB HBM3",
    architecture="Hopper",
    memory_mib=81559,
    sm_count=132,
    power_limit_w=700,
    gpm=True,
    profiles=_profiles(
        {"1g": "10", "1g+me": "10", "1g2m": "20", "2g": "20", "3g": "40", "4g": "40", "7g": "80"},
        {"1g": 9984, "1g+me": 9984, "1g2m": 20096, "2g": 20096, "3g": 40448, "4g": 40448, "7g": 81152},
        _HOPPER_SM,
        8,
        _HOPPER_DEC,
        jpeg=_HOPPER_JPEG,
    ),
)
H200 = GpuModel(
    key="h200",
    name="NVIDIA H200",
    architecture="Hopper",
    memory_mib=143771,
    sm_count=132,
    power_limit_w=700,
    gpm=True,
    profiles=_profiles(
        {"1g": "18", "1g+me": "18", "1g2m": "35", "2g": "35", "3g": "71", "4g": "71", "7g": "141"},
        {"1g": 16384, "1g+me": 16384, "1g2m": 33024, "2g": 33024, "3g": 71168, "4g": 71168, "7g": 143104},
        _HOPPER_SM,
        8,
        _HOPPER_DEC,
        jpeg=_HOPPER_JPEG,
    ),
)

MODELS: tuple[GpuModel, ...] = (A100_40, A100_80, H100_80, H200)


def model_by_key(key: str) -> GpuModel:
    """The model with short name ``key`` (``h200``); KeyError lists the known keys."""
    for m in MODELS:
        if m.key == key:
            return m
    raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(m.key for m in MODELS)}")


def model_by_name(name: str) -> GpuModel | None:
    """The model whose NVML name is ``name`` (``NVIDIA H200``), or None for a GPU we have no table for."""
    for m in MODELS:
        if m.name == name:
            return m
    return None


def model_for(name: str | None, offers: Iterable[Offer] | None) -> GpuModel | None:
    """The model of a GPU called ``name`` as its driver offers it (``offers``, None when the driver would not say:
    then the catalogue's), or None for a GPU we have no table for."""
    model = model_by_name(name) if name else None
    if model is None or offers is None:
        return model
    return model.offering(offers)
