"""``flexmig layouts MODEL``: every maximal valid MIG layout of a GPU model. ``flexmig layouts --export mig-parted``:
the node's current layout as an NVIDIA mig-parted configuration (``version: v1``, ``mig-configs:``), which
``nvidia-mig-parted apply -f FILE -c NAME`` re-creates, and which flexmig takes as its baseline layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flexmig.cli.inventory_cmd import read_inventory
from flexmig.errors import ConfigError, FlexmigError
from flexmig.mig import MODELS, GpuModel, maximal_layouts, model_by_key, model_by_name
from flexmig.mig.migparted import GpuState, export_spec, to_yaml
from flexmig.nvml import Inventory

__all__ = ["export_mig_parted", "register"]


def register(sub: Any) -> None:
    """Add the ``layouts`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "layouts", help="list the maximal valid MIG layouts of a GPU model", description=__doc__
    )
    p.add_argument("model", nargs="?", choices=[m.key for m in MODELS], help="GPU model")
    p.add_argument("--all-profiles", action="store_true", help="include the +me media variants")
    p.add_argument("--json", action="store_true", help="print JSON for programs")
    p.add_argument(
        "--export",
        choices=["mig-parted"],
        help="write this node's current layout as a mig-parted configuration (YAML, on stdout) instead",
    )
    p.add_argument(
        "--name",
        default="current",
        help="with --export: the configuration's name, as mig-parted -c takes it (default %(default)s)",
    )
    p.add_argument("--sim", metavar="SPEC", help="with --export: a simulated node instead of the driver")
    p.add_argument("--sim-state", metavar="FILE", type=Path, help="with --sim: the simulated node's state file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the layouts, one per line: slice map, instance count, node-spec notation (or, with ``--export``,
    the node's configuration)."""
    if args.export is not None:
        if args.model is not None:
            raise ConfigError("--export writes this node's layout: give no MODEL")
        sys.stdout.write(export_mig_parted(read_inventory(args.sim, args.sim_state), args.name, args.sim))
        return 0
    if args.sim or args.sim_state:
        raise ConfigError("--sim and --sim-state go with --export")
    if args.model is None:
        raise ConfigError("give a GPU model (one of " + ", ".join(m.key for m in MODELS) + "), or --export mig-parted")
    try:
        model = model_by_key(args.model)
    except KeyError as exc:
        raise FlexmigError(str(exc.args[0])) from None
    layouts = maximal_layouts(model, model.profiles if args.all_profiles else None)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "spec": lay.spec(),
                        "slice_map": lay.slice_map(),
                        "instances": [{"profile": i.profile.name, "start": i.start} for i in lay],
                    }
                    for lay in layouts
                ],
                indent=2,
            )
        )
        return 0
    print(f"{len(layouts)} maximal layouts of {model.name} (memory slices 0-7; digits = compute slices)")
    for lay in layouts:
        print(f"  {lay.slice_map()}  {len(lay)} inst  {lay.spec()}")
    return 0


def export_mig_parted(inventory: Inventory, name: str, sim: str | None = None) -> str:
    """The node's layout as a mig-parted configuration called ``name`` (YAML), with a header saying where it
    came from; GPU instances without a compute instance are no MIG devices, so they are left out (and noted)."""
    if not name or any(ord(c) < 0x20 for c in name) or len(name) > 128:
        raise ConfigError(f"--name {name!r}: 1-128 characters, no control characters")
    states = []
    notes = []
    for gpu in inventory.gpus:
        model = model_by_name(gpu.name or "")
        devices: list[str] = []
        for gi in gpu.gpu_instances:
            profile = gi.profile_name or f"profile {gi.profile_id}"
            if not gi.compute_instances:
                notes.append(f"GPU {gpu.index}: {profile} at slice {gi.start} has no compute instance (no MIG device)")
            whole = _compute_slices(model, profile)
            for ci in gi.compute_instances:
                devices.append(profile if whole in (None, ci.size) else f"{ci.size}c.{profile}")
        if model is None:
            notes.append(f"GPU {gpu.index} ({gpu.name or 'n/a'}): no PCI device ID known to flexmig, so no filter")
        states.append(GpuState(gpu.index, model, bool(gpu.mig_current), tuple(devices)))
    source = f"the simulated node {sim}" if sim else "this node"
    header = [f"mig-parted configuration of {source}, written by flexmig layouts --export mig-parted.",
              f"Apply it with: nvidia-mig-parted apply -f FILE -c {name}", *notes]  # fmt: skip
    return to_yaml(export_spec(states, name), header)


def _compute_slices(model: GpuModel | None, profile: str) -> int | None:
    """Compute slices of a GPU instance of ``profile`` (None when flexmig has no table for it)."""
    if model is None:
        return None
    try:
        return model.profile(profile).compute_slices
    except KeyError:
        return None
