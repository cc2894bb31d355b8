"""flexmig.mig.fastinit: the faster __init__ builds the very objects the dataclass-generated one builds."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexmig.detect.hysteresis import Switch
from flexmig.detect.internal import InternalFragmentation
from flexmig.detect.usage import InstanceUsage
from flexmig.mig.fastinit import fast_init
from flexmig.nvml.cache import MigHandle
from flexmig.nvml.types import GpmActivity, GpuSample, MigDeviceSample, ProcessInfo
from flexmig.telemetry.ring import WindowStats
from flexmig.telemetry.snapshot import GpuSnapshot, InstanceActivity, InstanceSnapshot, ProcessSnapshot

DECORATED = (
    ProcessInfo, GpmActivity, MigDeviceSample, GpuSample, MigHandle, ProcessSnapshot, InstanceActivity,
    InstanceSnapshot, GpuSnapshot, WindowStats, InternalFragmentation, Switch, InstanceUsage,
)  # fmt: skip


def _twin(cls: type[Any]) -> type[Any]:
    """The same fields under a plain ``@dataclass(frozen=True, slots=True)``: the generated __init__ to compare with."""
    spec = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in dataclasses.fields(cls)]  # fmt: skip
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True, slots=True)


def _state(obj: object) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", DECORATED, ids=lambda c: c.__name__)
def test_the_fast_init_takes_the_same_parameters_and_defaults_and_stays_frozen(cls: type[Any]) -> None:
    twin = _twin(cls)
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    # distinct values, one per field (a field stored in another's slot shows), that InstanceUsage's checks pass
    args = [0.001 + i / 100 for i in range(len(required))]
    got, want = cls(*args), twin(*args)
    assert _state(got) == _state(want)  # positional, defaults filled in
    kwargs = {f.name: 0.5 + i / 100 for i, f in enumerate(fields)}
    assert _state(cls(**kwargs)) == _state(twin(**kwargs))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, fields[0].name, None)
    with pytest.raises(TypeError):
        cls(*args, *[None] * (len(fields) - len(args) + 1))  # one argument too many
    if required:
        with pytest.raises(TypeError):
            cls(*args[:-1])  # one too few
    assert cls.__init__.__code__.co_varnames[: len(fields) + 1] == ("self", *(f.name for f in fields))


def test_post_init_still_runs() -> None:
    with pytest.raises(ValueError, match="window_s must be > 0"):
        InstanceUsage(0, 0, "1g.18gb", 1.0, 0.0, None, None, None, None, None)
    with pytest.raises(ValueError, match=re.escape("activity_p95=2.0 is not a ratio")):
        InstanceUsage(0, 0, "1g.18gb", 1.0, 1.0, None, 2.0, None, None, None)


def test_default_factories_give_a_fresh_value_each_time() -> None:
    @fast_init
    @dataclass(frozen=True, slots=True)
    class Bag:
        name: str
        items: list[int] = field(default_factory=list)
        size: int = 3

    a, b = Bag("a"), Bag("b", size=4)
    assert (a.items, a.size, b.size) == ([], 3, 4)
    assert a.items is not b.items
    assert Bag("c", [1]).items == [1]


def test_only_frozen_slotted_dataclasses_of_plain_fields_are_taken() -> None:
    @dataclass(slots=True)
    class Mutable:
        x: int

    @dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        x: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        x: int
        scale: dataclasses.InitVar[int] = 1

    @dataclass(frozen=True, slots=True)
    class Computed:
        x: int
        y: int = field(init=False, default=0)

    for cls in (Mutable, NoSlots, KeywordOnly, WithInitVar, Computed):
        with pytest.raises(TypeError, match=cls.__qualname__):
            fast_init(cls)
