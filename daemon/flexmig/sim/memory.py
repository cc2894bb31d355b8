"""Memory a real driver shows on an idle device: reserved framebuffer and a few MiB in use with no process.

Published figures this follows (``nvidia-smi`` and ``nvidia-smi -q`` transcripts of idle devices):

* whole GPUs, ``FB Memory Usage``: H100 80GB HBM3 ``Reserved`` 328 to 516 MiB with ``Used`` 0 to 2 MiB;
  H200 ``Reserved`` 700 MiB, ``Used`` 1 MiB;
* idle MIG devices, the ``MIG devices:`` table's Memory-Usage: A100-SXM4-40GB 1g.5gb 3 MiB, 2g.10gb 7 MiB, 3g.20gb
  11 MiB (NVIDIA MIG User Guide); A100-SXM4-80GB 2g.20gb 13 MiB (nvitop pull request #8); H100 1g.10gb 12 MiB;
  the other profiles follow those at about 0.6 MiB per GiB of instance memory on Ampere and 1.2 on Hopper;
* BAR1 of MIG devices: the GPU's BAR1 split by memory slices, less 1 MiB (A100-40GB 3g 32767 of 65536 MiB, 2g
  16383, 1g 8191; H100 1g 16383 of 131072 MiB).

A MIG device reserves nothing of its own: the driver's reserve is carved out of the GPU before it is split (the
instance sizes above are already net of it), so the v1 ``nvmlMemory_t`` of an idle MIG device says the same few
MiB used as the v2 struct and as ``nvidia-smi``, not the reserve plus those MiB. So code that takes ``used == 0``
for idle is caught here as on hardware, and so is code that reads v1 and v2 differently on a MIG device.
"""

from __future__ import annotations

from flexmig.mig import GpuModel
from flexmig.sim.model import MIB
from flexmig.sim.state import SimGpuInstance

__all__ = [
    "bar1_total_bytes",
    "gi_bar1_total_bytes",
    "gpu_idle_used_bytes",
    "gpu_reserved_bytes",
    "idle_used_bytes",
]

_RESERVED_MIB = {"a100-40": 400, "a100-80": 450, "h100-80": 454, "h200": 700}
_BAR1_MIB = {"a100-40": 65536, "a100-80": 131072, "h100-80": 131072, "h200": 262144}
_IDLE_MIB_PER_GIB = {"Ampere": 0.6, "Hopper": 1.2}
_IDLE_MIB = {  # (model, profile) -> MiB an idle MIG device shows used, where a transcript says
    ("a100-40", "1g.5gb"): 3,
    ("a100-40", "2g.10gb"): 7,
    ("a100-40", "3g.20gb"): 11,
    ("a100-80", "2g.20gb"): 13,
    ("h100-80", "1g.10gb"): 12,
}


def gpu_reserved_bytes(model: GpuModel) -> int:
    """Framebuffer the driver reserves on a whole GPU (``nvidia-smi -q``, FB Memory Usage, Reserved)."""
    return _RESERVED_MIB.get(model.key, 450) * MIB


def gpu_idle_used_bytes() -> int:
    """What an idle GPU without MIG shows as used (1 MiB in every transcript above)."""
    return MIB


def idle_used_bytes(gi: SimGpuInstance) -> int:
    """What an idle MIG device of this GPU instance shows as used: a few MiB, never 0."""
    published = _IDLE_MIB.get((gi.gpu.model.key, gi.profile.name))
    if published is not None:
        return published * MIB
    per_gib = _IDLE_MIB_PER_GIB.get(gi.gpu.model.architecture, 1.0)
    return max(3, round(per_gib * gi.profile.memory_mib / 1024)) * MIB


def bar1_total_bytes(model: GpuModel) -> int:
    """BAR1 aperture of a whole GPU (``nvidia-smi -q``, BAR1 Memory Usage, Total)."""
    return _BAR1_MIB.get(model.key, 65536) * MIB


def gi_bar1_total_bytes(gi: SimGpuInstance) -> int:
    """BAR1 aperture of a MIG device: the GPU's split by memory slices, less 1 MiB, as published."""
    model = gi.gpu.model
    return bar1_total_bytes(model) * gi.profile.memory_slices // model.memory_slices - MIB
