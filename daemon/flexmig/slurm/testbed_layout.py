"""Which Slurm nodes the testbed's flexmigds register (``flexmig slurm testbed --layout``), from the Slurm that runs
it: by default one node per MIG instance, the mode flexmig is best in, as that Slurm can have it (dynamic nodes with
their own ``Port=`` from 23.11, static ``State=FUTURE`` nodes of slurm.conf before). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.errors import SlurmError
from flexmig.slurm.sitecheck import PER_GPU_SINCE, slurm_version

__all__ = ["LAYOUTS", "TestbedLayout", "choose_layout"]

LAYOUTS = ("instance", "gpu", "node")
"""``--layout``'s values: one Slurm node per MIG instance (the default), per GPU, or per host (whole node)."""


@dataclass(frozen=True, slots=True)
class TestbedLayout:
    """The testbed's fields for a layout, and the one line that says which it is."""

    node_per_gpu: bool
    node_per_instance: bool
    static_nodes: bool
    line: str


def choose_layout(layout: str, version: str, hosts: int = 1) -> TestbedLayout:
    """The layout ``layout`` (one of :data:`LAYOUTS`) on the Slurm whose ``slurmd -V`` printed ``version``, for
    ``hosts`` simulated hosts; SlurmError naming the option where that Slurm cannot do it."""
    if layout not in LAYOUTS:
        raise SlurmError(f"--layout {layout!r}: one of {', '.join(LAYOUTS)}")
    found = slurm_version(version)
    if found is None:
        raise SlurmError(f"cannot read Slurm's version from slurmd -V: {version.strip()[:80]!r}")
    text = f"{found[0]}.{found[1]:02d}.{found[2]}"
    dynamic = found[:2] >= PER_GPU_SINCE
    if layout == "instance" and dynamic:
        return TestbedLayout(False, True, False, f"layout: one dynamic Slurm node per MIG instance (Slurm {text})")
    if layout == "instance":
        return TestbedLayout(
            False, True, True,
            f"layout: one static Slurm node per MIG instance, State=FUTURE in slurm.conf (Slurm {text} has no "
            "dynamic node with its own port)",
        )  # fmt: skip
    if layout == "gpu" and not dynamic:
        raise SlurmError(
            f"--layout gpu: one dynamic node per GPU needs Slurm 23.11 or later (a dynamic node's own Port=), this "
            f"is Slurm {text}; use --layout instance (static instance nodes) or --layout node"
        )
    if layout == "gpu":
        return TestbedLayout(True, False, False, f"layout: one dynamic Slurm node per GPU (Slurm {text})")
    if hosts > 1 and not dynamic:
        raise SlurmError(
            f"--layout node --hosts {hosts}: on Slurm {text} a whole host's dynamic node listens on slurm.conf's one "
            "SlurmdPort (its own Port= needs 23.11), so one machine holds one such host; use --layout instance (the "
            "default) or --hosts 1"
        )
    return TestbedLayout(False, False, False, f"layout: one dynamic Slurm node per host, the whole node (Slurm {text})")
