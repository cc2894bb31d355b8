"""Pure detection: telemetry windows and layouts -> fragmentation figures and underuse findings. No I/O, no clock.

Entry point: :func:`observe` once per sweep, carrying :class:`DetectState` between sweeps. The figures alone
(:func:`node_fragmentation`, :func:`stranded_capacity`, :func:`internal_fragmentation`) are usable on their own.
"""

from flexmig.detect.capacity import StrandedCapacity, arrangements, repacked_capacity, stranded_capacity
from flexmig.detect.demand import DemandMix, demand_from_requests
from flexmig.detect.findings import (
    EndedFinding,
    Finding,
    FragmentationFinding,
    InstanceChange,
    OversizedFinding,
    UnderuseFinding,
)
from flexmig.detect.fragmentation import GpuFragmentation, NodeFragmentation, gpu_fragmentation, node_fragmentation
from flexmig.detect.hysteresis import Signal, Switch
from flexmig.detect.internal import InternalFragmentation, internal_fragmentation, smaller_profile, smaller_profiles
from flexmig.detect.settings import (
    DEFAULT_DEMAND,
    DetectSettings,
    FragmentationSettings,
    UnderuseSettings,
)
from flexmig.detect.tracker import DetectState, Observation, Report, observe, underuse_signal
from flexmig.detect.usage import InstanceKey, InstanceUsage

__all__ = [
    "DEFAULT_DEMAND",
    "DemandMix",
    "DetectSettings",
    "DetectState",
    "EndedFinding",
    "Finding",
    "FragmentationFinding",
    "FragmentationSettings",
    "GpuFragmentation",
    "InstanceChange",
    "InstanceKey",
    "InstanceUsage",
    "InternalFragmentation",
    "NodeFragmentation",
    "Observation",
    "OversizedFinding",
    "Report",
    "Signal",
    "StrandedCapacity",
    "Switch",
    "UnderuseFinding",
    "UnderuseSettings",
    "arrangements",
    "demand_from_requests",
    "gpu_fragmentation",
    "internal_fragmentation",
    "node_fragmentation",
    "observe",
    "repacked_capacity",
    "smaller_profile",
    "smaller_profiles",
    "stranded_capacity",
    "underuse_signal",
]
