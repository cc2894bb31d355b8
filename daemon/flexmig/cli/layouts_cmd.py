"""``flexmig layouts MODEL``: every maximal valid MIG layout of a GPU model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flexmig.errors import FlexmigError
from flexmig.mig import MODELS, maximal_layouts, model_by_key

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``layouts`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "layouts", help="list the maximal valid MIG layouts of a GPU model", description=__doc__
    )
    p.add_argument("model", choices=[m.key for m in MODELS], help="GPU model")
    p.add_argument("--all-profiles", action="store_true", help="include the +me media variants")
    p.add_argument("--json", action="store_true", help="print JSON for programs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the layouts, one per line: slice map, instance count, node-spec notation."""
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
