"""The NVIDIA driver's MIG capability minors: which ``/dev/nvidia-caps/nvidia-capN`` guards which GPU or compute
instance.

On hardware the driver publishes the table in ``/proc/driver/nvidia-caps/mig-minors``, one ``NAME MINOR`` line
per capability: ``config 1``, ``monitor 2``, then ``gpuG/giI/access M`` and ``gpuG/giI/ciC/access M`` for every GPU
instance ID ``I`` (0-14) and compute instance ID ``C`` (0-7) a GPU could have, in that order, nine minors per GPU
instance (so ``gpu0/gi2/access`` is 21 and ``gpu0/gi2/ci0/access`` 22). Slurm's gres.conf names both files of an
instance in ``MultipleFiles``. A simulated node has no driver: :func:`render_mig_minors` writes the same table,
and the stand-in devices are made to match. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from flexmig.errors import SlurmError

__all__ = ["MIG_MINORS_PATH", "MigMinors", "parse_mig_minors", "render_mig_minors"]

MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
_GI_PER_GPU = 15
_CI_PER_GI = 8
_LINE = re.compile(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access$")


@dataclass(frozen=True, slots=True)
class MigMinors:
    """Capability minors by ``(gpu, gi)`` for GPU instances and ``(gpu, gi, ci)`` for compute instances."""

    gpu_instances: Mapping[tuple[int, int], int]
    compute_instances: Mapping[tuple[int, int, int], int]

    def of(self, gpu: int, gi: int, ci: int) -> tuple[int, int]:
        """The two minors of compute instance ``ci`` in GPU instance ``gi`` of GPU ``gpu``; SlurmError if absent."""
        try:
            return self.gpu_instances[(gpu, gi)], self.compute_instances[(gpu, gi, ci)]
        except KeyError:
            raise SlurmError(f"no capability minor for gpu{gpu}/gi{gi}/ci{ci} in the MIG minors table") from None


def parse_mig_minors(text: str, source: str = MIG_MINORS_PATH) -> MigMinors:
    """Read the table; SlurmError names ``source`` and the line for anything that is not ``NAME MINOR``."""
    gis: dict[tuple[int, int], int] = {}
    cis: dict[tuple[int, int, int], int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, _, minor = line.strip().partition(" ")
        if not minor.strip().isdigit():
            raise SlurmError(f"{source}:{number}: expected 'NAME MINOR', got {line.strip()[:60]!r}")
        m = _LINE.match(name)
        if m is None:
            continue  # config, monitor, and whatever later drivers add
        gpu, gi = int(m.group(1)), int(m.group(2))
        if m.group(3) is None:
            gis[(gpu, gi)] = int(minor)
        else:
            cis[(gpu, gi, int(m.group(3)))] = int(minor)
    return MigMinors(gis, cis)


def render_mig_minors(gpus: int) -> str:
    """The table the driver would publish for ``gpus`` GPUs (for a simulated node)."""
    if not 0 < gpus <= 64:
        raise ValueError(f"gpus must be 1-64, not {gpus}")
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(gpus):
        for gi in range(_GI_PER_GPU):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(_CI_PER_GI):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"
