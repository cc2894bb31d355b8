"""The Slurm decision gauges keep one series per Slurm node flexmig decides for: with ``node_per_gpu`` an 8-GPU host
has eight GPU nodes, and a gauge that showed only the last one decided would hide the other seven."""

from __future__ import annotations

from flexmig.metrics.slurm import SlurmMetrics
from support.metrics_rig import sampled_node

DECISION = (
    "flexmig_slurm_drain_estimate_seconds",
    "flexmig_slurm_reregistration_gain_slice_seconds",
    "flexmig_slurm_reregistration_cost_slice_seconds",
    "flexmig_slurm_reregistration_wanted",
)


def decision_series(m: SlurmMetrics) -> dict[str, dict[str, float]]:
    """Each decision family's value by its ``slurm_node`` label."""
    snap = sampled_node()
    out: dict[str, dict[str, float]] = {}
    for family in m.collect(snap):
        if family.name in DECISION:
            for s in family.samples:
                assert s.labels["Hostname"] == snap.hostname
                out.setdefault(family.name, {})[s.labels["slurm_node"]] = s.value
    return out


def test_no_decision_no_series() -> None:
    assert decision_series(SlurmMetrics()) == {}


def test_each_gpu_node_keeps_its_own_decision() -> None:
    m = SlurmMetrics()
    m.decided("n1-gpu0", drain_s=30.0, gain=900.0, cost=40.0, go=True)
    m.decided("n1-gpu1", drain_s=0.0, gain=0.0, cost=0.0, go=False)
    got = decision_series(m)
    assert got["flexmig_slurm_reregistration_wanted"] == {"n1-gpu0": 1.0, "n1-gpu1": 0.0}
    assert got["flexmig_slurm_drain_estimate_seconds"] == {"n1-gpu0": 30.0, "n1-gpu1": 0.0}
    # a later decision of one node replaces its own figures only
    m.decided("n1-gpu1", drain_s=12.0, gain=600.0, cost=20.0, go=True)
    got = decision_series(m)
    assert got["flexmig_slurm_reregistration_gain_slice_seconds"] == {"n1-gpu0": 900.0, "n1-gpu1": 600.0}
    assert got["flexmig_slurm_reregistration_cost_slice_seconds"] == {"n1-gpu0": 40.0, "n1-gpu1": 20.0}
    assert got["flexmig_slurm_reregistration_wanted"] == {"n1-gpu0": 1.0, "n1-gpu1": 1.0}
