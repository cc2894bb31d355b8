"""The node-spec grammar for simulated nodes: ``MODEL[xCOUNT][@DRIVER][:LAYOUT]``.

* MODEL is one of ``a100-40``, ``a100-80``, ``h100-80``, ``h200``;
* COUNT (default 1) is the number of GPUs, 1 to 64;
* DRIVER is the driver version the simulated node runs, ``BRANCH[.MINOR[.PATCH]]`` (``550.90``); the simulator says
  which it models and what each offers (``flexmig.sim.drivers``). Without it, the simulator's default release;
* LAYOUT is ``+``-joined ``PROFILE@START`` items (PROFILE as ``nvidia-smi`` names it, START in memory slices),
  created on every GPU, each with one compute instance spanning it. No LAYOUT: MIG enabled, no instances.
  A LAYOUT of ``-`` means MIG disabled on every GPU.

Examples: ``h200x8``, ``a100-40x2:3g.20gb@4+2g.10gb@0+1g.5gb@2``, ``a100-80x2@470.82.01:3g.40gb@0``. Errors point
at the bad item with a caret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flexmig.errors import LayoutError, NodeSpecError
from flexmig.mig.catalogue import MODELS, GpuModel, model_by_key
from flexmig.mig.layout import Layout

__all__ = ["MAX_GPUS", "NodeSpec", "parse_node_spec"]

MAX_GPUS = 64
_HEAD = re.compile(r"^(?P<model>[a-z0-9-]+?)(?:x(?P<count>\d+))?(?:@(?P<driver>\d{3}(?:\.\d{1,3}){0,2}))?$")
_ITEM = re.compile(r"^(?P<profile>[0-9a-z.+]+)@(?P<start>\d+)$")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A parsed node spec: ``count`` GPUs of ``model``, each with ``layout`` (None: MIG disabled), on driver
    ``driver`` (None: the simulator's default)."""

    model: GpuModel
    count: int
    layout: Layout | None
    driver: str | None = None

    def __str__(self) -> str:
        head = f"{self.model.key}x{self.count}" + (f"@{self.driver}" if self.driver else "")
        if self.layout is None:
            return f"{head}:-"
        return f"{head}:{self.layout.spec()}" if len(self.layout) else head


def _fail(spec: str, pos: int, why: str) -> NodeSpecError:
    return NodeSpecError(f"bad node spec {spec!r}: {why}\n  {spec}\n  {' ' * pos}^")


def parse_node_spec(spec: str) -> NodeSpec:
    """Parse ``spec``; NodeSpecError points at the first bad item and says what was expected."""
    text = spec.strip()
    head, sep, tail = text.partition(":")
    m = _HEAD.match(head)
    if not m:
        at = head.find("@")
        if at >= 0:
            raise _fail(text, at + 1, "expected a driver version BRANCH[.MINOR[.PATCH]] after '@', e.g. 550.90.07")
        raise _fail(text, 0, f"expected MODEL[xCOUNT][@DRIVER] with MODEL one of {_models()}")
    try:
        model = model_by_key(m.group("model"))
    except KeyError:
        raise _fail(text, 0, f"unknown GPU model {m.group('model')!r}; expected one of {_models()}") from None
    count = int(m.group("count") or 1)
    driver = m.group("driver")
    if not 1 <= count <= MAX_GPUS:
        raise _fail(text, m.start("count"), f"GPU count must be 1..{MAX_GPUS}, not {count}")
    if not sep:
        return NodeSpec(model, count, Layout.empty(model), driver)
    if tail == "":
        raise _fail(text, len(head) + 1, "empty LAYOUT after ':' (omit the ':' for no instances)")
    if tail == "-":
        return NodeSpec(model, count, None, driver)
    layout = Layout.empty(model)
    pos = len(head) + 1
    for item in _items(tail):
        im = _ITEM.match(item)
        if im is None:
            raise _fail(text, pos, f"expected PROFILE@START, got {item!r}")
        try:
            profile = model.profile(im.group("profile"))
        except KeyError as exc:
            raise _fail(text, pos, str(exc.args[0])) from None
        try:
            layout = layout.place(profile, int(im.group("start")))
        except LayoutError as exc:
            raise _fail(text, pos, str(exc)) from None
        pos += len(item) + 1
    return NodeSpec(model, count, layout, driver)


def _items(tail: str) -> list[str]:
    """Split LAYOUT at ``+``, gluing the ``me@N`` of a ``1g.18gb+me@N`` item back onto its profile."""
    out: list[str] = []
    for part in tail.split("+"):
        if part.startswith("me") and out and "@" not in out[-1]:
            out[-1] = f"{out[-1]}+{part}"
        else:
            out.append(part)
    return out


def _models() -> str:
    return ", ".join(m.key for m in MODELS)
