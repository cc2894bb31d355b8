"""The candidate layouts of the static policy.

Per-GPU layouts (the *menu*), H200 names; every model has the same geometry:

==================  ==========================================  =====================
name                instances                                   compute / memory used
==================  ==========================================  =====================
``7g``              7g@0                                        7 / 8
``4g+3g``           4g@0, 3g@4                                  7 / 8
``3g+3g``           3g@0, 3g@4                                  6 / 8
``3g+2g+1g+1g``     2g@0, 1g@2, 1g@3, 3g@4                      7 / 8
``3g+1g.35+1g.35``  1g.35gb@0, 1g.35gb@2, 3g@4                  5 / 8
``2g+2g+2g+1g``     2g@0, 2g@2, 2g@4, 1g@6                      7 / 7
``7x1g``            1g@0 ... 1g@6                               7 / 7
==================  ==========================================  =====================

Node candidates: every menu layout on all GPUs (uniform), and mixes of ``7g`` on a quarter, a half or three
quarters of the GPUs with one other menu layout on the rest. A candidate is *eligible* only if every job of the
replay can be placed on it (on an otherwise idle node); the best eligible candidate (lowest mean completion time)
is the static policy's result. With jobs of the trace that ask for every GPU of the node as full GPUs, only the
all-``7g`` layout is eligible.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexmig.mig.catalogue import GpuModel
from flexmig.mig.layout import Layout

__all__ = ["MENU", "StaticCandidate", "candidates", "menu_layout"]

MENU: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    # name, ((compute slices, memory slices), start) per instance: resolved per model by geometry
    ("7g", ((7, 0),)),
    ("4g+3g", ((4, 0), (3, 4))),
    ("3g+3g", ((3, 0), (3, 4))),
    ("3g+2g+1g+1g", ((2, 0), (1, 2), (1, 3), (3, 4))),
    ("3g+1g.35+1g.35", ((-1, 0), (-1, 2), (3, 4))),
    ("2g+2g+2g+1g", ((2, 0), (2, 2), (2, 4), (1, 6))),
    ("7x1g", tuple((1, s) for s in range(7))),
)
"""Per-GPU layouts as (compute slices, start); -1 stands for the one-slice profile with two memory slices."""


@dataclass(frozen=True, slots=True)
class StaticCandidate:
    """A node layout: ``layouts[i]`` on GPU ``i``, named for people (``4x7g+4x4g+3g``)."""

    name: str
    layouts: tuple[Layout, ...]


def menu_layout(model: GpuModel, name: str) -> Layout:
    """The menu layout called ``name`` on ``model``."""
    for key, items in MENU:
        if key == name:
            placed = []
            for compute, start in items:
                if compute == -1:
                    profile = min(
                        (p for p in model.plain_profiles if p.compute_slices == 1 and p.memory_slices == 2),
                        key=lambda p: p.memory_mib,
                    )
                else:
                    profile = model.profile_for_slices(compute)
                placed.append((profile, start))
            return Layout.of(model, placed)
    raise KeyError(f"no static menu layout {name!r}; menu: {', '.join(k for k, _ in MENU)}")


def candidates(model: GpuModel, gpus: int) -> list[StaticCandidate]:
    """Every candidate node layout for ``gpus`` GPUs of ``model``, uniform ones first."""
    out: list[StaticCandidate] = []
    menu = {name: menu_layout(model, name) for name, _ in MENU}
    for name, lay in menu.items():
        out.append(StaticCandidate(f"{gpus}x{name}", (lay,) * gpus))
    counts = sorted({k for k in (gpus // 4, gpus // 2, (3 * gpus) // 4) if 0 < k < gpus})
    for name, lay in menu.items():
        if name == "7g":
            continue
        for k in counts:
            out.append(StaticCandidate(f"{k}x7g+{gpus - k}x{name}", (menu["7g"],) * k + (lay,) * (gpus - k)))
    return out
