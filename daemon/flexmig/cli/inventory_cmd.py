"""``flexmig inventory``: the node's GPUs, MIG instances, MIG devices and processes, as NVML reports them."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from flexmig.cli.table import Row, output_width, render_rows, wrap
from flexmig.errors import ConfigError, NvmlUnavailableError
from flexmig.nvml import GpuInfo, Inventory, Nvml
from flexmig.sim import install, uninstall

__all__ = ["register", "render_table", "render_text", "run"]

EXAMPLE_SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
_GIB = 1 << 30


def register(sub: Any) -> None:
    """Add the ``inventory`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "inventory", help="show GPUs, MIG instances, MIG devices and processes", description=__doc__
    )
    p.add_argument(
        "--sim",
        metavar="SPEC",
        help=f"read a simulated node instead of the driver, e.g. {EXAMPLE_SPEC} "
        "(grammar: MODEL[xCOUNT][@DRIVER][:LAYOUT])",
    )
    p.add_argument(
        "--sim-state",
        metavar="FILE",
        type=Path,
        help="with --sim: restore the simulated node from FILE if it exists, and save it there",
    )
    p.add_argument("--json", action="store_true", help="print JSON for programs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read the inventory (from the driver, or from a simulated node with ``--sim``) and print it."""
    if args.sim_state is not None and args.sim is None:
        raise ConfigError("--sim-state FILE needs --sim SPEC")
    inventory = read_inventory(args.sim, args.sim_state)
    if args.json:
        source = f"sim:{args.sim}" if args.sim else "nvml"
        print(json.dumps({"source": source, **dataclasses.asdict(inventory)}, indent=2))
    else:
        render_table(inventory)
    return 0


def read_inventory(sim: str | None, sim_state: Path | None = None) -> Inventory:
    """The inventory of the real node, or of a simulated one installed for the duration of the read."""
    if sim is None:
        return _read()
    install(sim, state_path=sim_state)
    try:
        return _read()
    finally:
        uninstall()


def _read() -> Inventory:
    try:
        nvml = Nvml.open()
    except NvmlUnavailableError as exc:
        raise NvmlUnavailableError(
            f"{exc}.\nNo NVIDIA driver was found on this machine. To look at a simulated MIG node instead, run:\n"
            f"  flexmig inventory --sim {EXAMPLE_SPEC}\n"
            "(SPEC is MODEL[xCOUNT][@DRIVER][:LAYOUT] with MODEL one of a100-40, a100-80, h100-80, h200; "
            "see docs/simulator.md)"
        ) from exc
    with nvml:
        return nvml.inventory()


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / _GIB:.1f}"


def render_table(inventory: Inventory) -> None:
    """Print the inventory for people (``nvidia-smi``-like), fitted to the output's width."""
    Console(highlight=False, soft_wrap=True).print(render_text(inventory, output_width()))


def render_text(inventory: Inventory, width: int | None) -> Text:
    """The inventory as text, every line at most ``width`` wide; each MIG device's UUID on a line of its own."""
    out = Text()

    def line(text: str, style: str = "") -> None:
        for piece in wrap(text, width):
            out.append(piece + "\n", style=style)

    line(
        f"driver {inventory.driver_version or 'n/a'}, NVML {inventory.nvml_version or 'n/a'}, "
        f"{len(inventory.gpus)} GPU(s)"
    )
    for issue in inventory.errors:
        line(f"! {issue.call} on {issue.target}: {issue.name} ({issue.code})", "yellow")
    for gpu in inventory.gpus:
        if gpu.lost:
            mig = "GPU IS LOST"
        elif gpu.mig_current is None:
            mig = "no MIG"
        else:
            mig = f"MIG {'on' if gpu.mig_current else 'off'}"
            if gpu.mig_pending is not None and gpu.mig_pending != gpu.mig_current:
                mig += f" (pending {'on' if gpu.mig_pending else 'off'})"
        line(f"GPU {gpu.index}: {gpu.name or 'n/a'}  {_gib(gpu.memory_total_bytes)} GiB  {mig}", "bold")
        line(f"  {gpu.uuid or 'uuid n/a'}")
        rows = _mig_rows(gpu)
        if rows:
            headers = ("MIG", "GI", "CI", "profile", "slices", "memory GiB", "processes")
            for text in render_rows(headers, rows, width):
                out.append(text + "\n")
        for issue in gpu.errors:
            line(f"  ! {issue.call} on {issue.target}: {issue.name} ({issue.code})", "yellow")
    out.rstrip()
    return out


def _mig_rows(gpu: GpuInfo) -> list[Row]:
    """One row per MIG device, and one per GPU instance without compute instances (no MIG device)."""
    gis = {gi.id: gi for gi in gpu.gpu_instances}
    shown: set[int] = set()
    rows = []
    for dev in gpu.mig_devices:
        gi = gis.get(dev.gpu_instance_id)
        shown.add(dev.gpu_instance_id)
        procs = (
            "n/a"
            if dev.processes is None
            else ", ".join(f"{p.pid} ({_gib(p.used_memory_bytes)} GiB)" for p in dev.processes) or "-"
        )
        rows.append(
            Row(
                (
                    str(dev.index),
                    str(dev.gpu_instance_id),
                    str(dev.compute_instance_id),
                    gi.profile_name or str(gi.profile_id) if gi else "?",
                    f"{gi.start}:{gi.size}" if gi else "?",
                    f"{_gib(dev.memory_used_bytes)}/{_gib(dev.memory_total_bytes)}",
                    procs,
                ),
                [dev.uuid],
            )
        )
    for gi in gpu.gpu_instances:
        if gi.id not in shown:  # a GI without compute instances is no MIG device
            name = gi.profile_name or str(gi.profile_id)
            rows.append(Row(("-", str(gi.id), "-", name, f"{gi.start}:{gi.size}", "-", "-"), ["(no MIG device)"]))
    return rows
