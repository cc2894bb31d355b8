"""The two forms of Slurm's instance nodes a test of the per-instance layout runs under, as pytest parameters:
static nodes from slurm.conf (every Slurm) and dynamic nodes (Slurm 23.11 and later, skipped before)."""

from __future__ import annotations

import pytest

from support.slurm import per_gpu_capable, slurm_version

NODE_FORMS = [
    pytest.param(True, id="static"),
    pytest.param(
        False, id="dynamic",
        marks=pytest.mark.skipif(not per_gpu_capable(), reason=f"dynamic nodes need Slurm 23.11+ ({slurm_version()})"),
    ),
]  # fmt: skip
"""``static`` True or False, for ``@pytest.mark.parametrize("static", NODE_FORMS)``."""
