"""Driver releases the simulated node can be: what each one offers and which entry points it has.

A node spec names one with ``@VERSION`` (``h200@550.90``, ``a100-80x2@470.82.01:3g.40gb@0``); without it the node
runs :data:`DEFAULT_VERSION`. Where releases differ in a way flexmig can trip over, the simulator answers as that
release does:

* **entry points**: a symbol the release's ``libnvidia-ml`` lacks is not there, so pynvml raises
  ``FunctionNotFound`` for it (pynvml itself calls ``..._v3``/``...V`` symbols by default: on 470 its
  ``nvmlDeviceGetComputeRunningProcesses`` and ``nvmlDeviceGetGpuInstanceProfileInfo`` fail so). The first branch
  of each is the first ``nvml.h`` that declares it, read from NVIDIA/go-nvml's copies of the header per CUDA
  release (``pkg/nvml/nvml.h``, CUDA 11.0 to 13.0) with CUDA's driver branches (11.4 = 470, 11.6 = 510,
  11.8 = 520, 12.0 = 525, 12.2 = 535, 12.3 = 545, 12.4 = 550, 12.8 = 570, 13.0 = 580);
* **profiles**: ``1g+me`` (``NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1``) from 470 and ``1g`` with two memory slices
  (``1_SLICE_REV2``: 1g.10gb, 1g.20gb, 1g.35gb) from 525, the branches whose headers first name them; older A100-80
  drivers offer no profile 15 (NVIDIA/mig-parted issue #97); Hopper's ``1_SLICE_REV1`` compute profile from 525;
* **models**: A100 from 470 (the oldest branch modelled), H100 from 520 (CUDA 11.8 brought Hopper), H200 from 550;
* **memory**: the total an A100 reports, 81251 MiB (A100-SXM4-80GB on 495.29.05) and 40536 MiB (A100 40GB on
  460.73.01) on the old branches, 81920 and 40960 MiB from 510 on (545.23.08 on the same 80GB machine;
  NVIDIA/mig-parted issue #31, NVIDIA/k8s-device-plugin issue #253). Which branch changed it between 495 and 535 is
  not published: 510 is assumed.

Profile memory sizes, SM and engine counts are the catalogue's on every release (no transcript shows them change).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from flexmig.errors import SimError
from flexmig.mig import GpuModel, Profile

__all__ = ["DEFAULT_VERSION", "FIRST_BRANCH", "DriverRelease", "driver_release"]

DEFAULT_VERSION = "570.124.06"
_OLDEST = 470
# CUDA release of each driver branch, as nvmlSystemGetCudaDriverVersion encodes it (1000 * major + 10 * minor).
_CUDA = {
    470: 11040,
    495: 11050,
    510: 11060,
    515: 11070,
    520: 11080,
    525: 12000,
    530: 12010,
    535: 12020,
    545: 12030,
    550: 12040,
    555: 12050,
    560: 12060,
    565: 12070,
    570: 12080,
    575: 12090,
    580: 13000,
}
# A full version per branch, for a spec that names only the branch (published releases of each).
_FULL = {
    470: "470.82.01",
    495: "495.29.05",
    510: "510.47.03",
    515: "515.65.01",
    520: "520.61.05",
    525: "525.85.12",
    530: "530.30.02",
    535: "535.129.03",
    545: "545.23.08",
    550: "550.90.07",
    555: "555.42.06",
    560: "560.35.03",
    565: "565.57.01",
    570: "570.124.06",
    575: "575.57.08",
    580: "580.65.06",
}
# The first driver branch whose nvml.h declares each entry point the simulator implements (absent: 470 or older).
FIRST_BRANCH: dict[str, int] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": 510,
    "nvmlDeviceGetGpuInstanceProfileInfoV": 510,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": 510,
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": 510,
    "nvmlDeviceGetMemoryInfo_v2": 510,
    "nvmlGpuInstanceGetComputeInstanceProfileInfoV": 510,
    "nvmlDeviceGetDefaultEccMode": 515,
    "nvmlGpmMetricsGet": 520,
    "nvmlGpmQueryDeviceSupport": 520,
    "nvmlGpmSampleAlloc": 520,
    "nvmlGpmSampleFree": 520,
    "nvmlGpmSampleGet": 520,
    "nvmlDeviceGetGpuMaxPcieLinkGeneration": 525,
    "nvmlGpmMigSampleGet": 525,
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement": 525,
    "nvmlGpuInstanceGetComputeInstancePossiblePlacements": 525,
    "nvmlDeviceGetConfComputeMemSizeInfo": 535,
    "nvmlDeviceGetCurrentClocksEventReasons": 535,
    "nvmlDeviceGetSupportedClocksEventReasons": 535,
    "nvmlDeviceGetC2cModeInfoV": 545,
    "nvmlDeviceGetDriverModel_v2": 555,
    "nvmlDeviceGetTemperatureV": 570,
    "nvmlDeviceGetGpuInstanceProfileInfoByIdV": 580,
}
_MODEL_SINCE = {"a100-40": 470, "a100-80": 470, "h100-80": 520, "h200": 550}
_OLD_TOTAL_MIB = {"a100-40": 40536, "a100-80": 81251}  # before branch 510 (assumed; see the module docstring)
_VERSION = re.compile(r"^(\d{3})(?:\.(\d{1,3}))?(?:\.(\d{1,3}))?$")


@dataclass(frozen=True, slots=True)
class DriverRelease:
    """One driver release: its version strings and what it offers."""

    version: str  # nvmlSystemGetDriverVersion, e.g. "550.90.07"
    branch: int  # 550

    @property
    def facts(self) -> int:
        """The modelled branch whose facts apply: this one, or the newest modelled one before it."""
        return max(b for b in _CUDA if b <= self.branch)

    @property
    def cuda_version(self) -> int:
        """nvmlSystemGetCudaDriverVersion: 12040 for CUDA 12.4."""
        return _CUDA[self.facts]

    @property
    def nvml_version(self) -> str:
        """nvmlSystemGetNVMLVersion: the CUDA major version, then the driver version (``12.550.90.07``)."""
        return f"{self.cuda_version // 1000}.{self.version}"

    def has(self, entry_point: str) -> bool:
        """Whether this release's libnvidia-ml exports ``entry_point``."""
        return FIRST_BRANCH.get(entry_point, _OLDEST) <= self.branch

    def missing(self, entry_points: Iterable[str]) -> frozenset[str]:
        """Those of ``entry_points`` this release lacks."""
        return frozenset(name for name in entry_points if not self.has(name))

    def offers(self, model: GpuModel, profile: Profile) -> bool:
        """Whether this release offers GPU-instance ``profile`` of ``model``."""
        if profile.is_media_variant:
            return self.branch >= 470
        if profile.compute_slices == 1 and profile.memory_slices == 2:
            return self.branch >= 525
        return True

    @property
    def ci_rev1(self) -> bool:
        """Whether Hopper's one-slice REV1 compute-instance profile exists (``..._PROFILE_1_SLICE_REV1``)."""
        return self.branch >= 525

    def memory_total_mib(self, model: GpuModel) -> int:
        """The whole GPU's memory as this release reports it."""
        if self.branch < 510:
            return _OLD_TOTAL_MIB.get(model.key, model.memory_mib)
        return model.memory_mib

    def check(self, model: GpuModel) -> None:
        """SimError when this release does not drive ``model``."""
        since = _MODEL_SINCE.get(model.key, _OLDEST)
        if self.branch < since:
            raise SimError(f"driver {self.version} does not support the {model.name} (branch {since} or later does)")


def driver_release(text: str | None) -> DriverRelease:
    """The release a node spec names (``550``, ``550.90``, ``550.90.07``); None: :data:`DEFAULT_VERSION`.

    SimError names a version the simulator does not model (older than branch 470, or not a driver version).
    """
    if text is None:
        text = DEFAULT_VERSION
    m = _VERSION.match(text.strip())
    if m is None:
        raise SimError(f"driver version {text!r}: expected BRANCH[.MINOR[.PATCH]], e.g. 550.90.07")
    branch = int(m.group(1))
    if branch < _OLDEST:
        raise SimError(f"driver version {text!r}: the simulator models driver branches {_OLDEST} and later")
    full = text.strip()
    known = _FULL.get(branch, "")
    if m.group(3) is None and (known.startswith(full + ".") or full == str(branch)) and known:
        full = known  # "550" or "550.90": the published release of that name
    return DriverRelease(full, branch)
