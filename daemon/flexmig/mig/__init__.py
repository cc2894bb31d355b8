"""Pure MIG model: GPU models, profiles, placements and layouts. No I/O, no clock."""

from flexmig.mig.catalogue import (
    A100_40,
    A100_80,
    H100_80,
    H200,
    MODELS,
    ComputeProfile,
    GpuModel,
    Offer,
    Profile,
    model_by_key,
    model_by_name,
    model_for,
)
from flexmig.mig.enumerate import maximal_layouts
from flexmig.mig.layout import Layout, PlacedInstance
from flexmig.mig.need import fitting_profile, need_mib
from flexmig.mig.nodespec import NodeSpec, parse_node_spec

__all__ = [
    "A100_40",
    "A100_80",
    "H100_80",
    "H200",
    "MODELS",
    "ComputeProfile",
    "GpuModel",
    "Layout",
    "NodeSpec",
    "Offer",
    "PlacedInstance",
    "Profile",
    "fitting_profile",
    "maximal_layouts",
    "model_by_key",
    "model_by_name",
    "model_for",
    "need_mib",
    "parse_node_spec",
]
