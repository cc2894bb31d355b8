"""Settings objects are built from the schema: every key of ``[planner]`` and ``[detect]`` reaches its component's
settings, and a key that names no setting is a schema bug found at the first build."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexmig.config import Config, DemandMixConfig, DetectConfig, PlannerConfig
from flexmig.config.fields import doc_field
from flexmig.config.settings import build_settings, setting_targets
from flexmig.detect import DetectSettings
from flexmig.plan.types import PlannerSettings


def _get(settings: object, dotted: str) -> Any:
    for part in dotted.split("."):
        settings = getattr(settings, part)
    return settings


def _others(value: Any) -> list[Any]:
    """Values other than ``value``, of its type (the first the settings accept is used: enter and exit thresholds
    must keep their order)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int | float):
        return [value / 2, value * 1.5, value + 1] if value else [1]
    return []


def _built_with(kind: type[Any], table: Any, key: str, candidates: list[Any]) -> Any:
    for candidate in candidates:
        try:
            return build_settings(kind, dataclasses.replace(table, **{key: candidate}))
        except ValueError:
            continue
    raise AssertionError(f"no other value of {key} was accepted: {candidates}")


@pytest.mark.parametrize(("kind", "table"), [(PlannerSettings, "planner"), (DetectSettings, "detect")])
def test_each_key_of_the_table_sets_its_setting_and_nothing_else(kind: type[Any], table: str) -> None:
    default = getattr(Config(), table)
    base = build_settings(kind, default)
    for key, targets in setting_targets(default).items():
        value = getattr(default, key)
        if isinstance(value, DemandMixConfig):  # one weight changed
            candidates: list[Any] = [dataclasses.replace(value, g3=value.g3 + 1)]
        else:
            candidates = _others(value)
        built = _built_with(kind, default, key, candidates)
        if not targets:
            assert built == base, f"{table}.{key} is no setting, yet changed one"
            continue
        for target in targets:
            assert _get(built, target) != _get(base, target), f"{table}.{key} does not reach {target}"


def test_the_defaults_of_the_tables_are_the_components_defaults() -> None:
    assert build_settings(PlannerSettings, PlannerConfig()) == PlannerSettings()
    assert build_settings(DetectSettings, DetectConfig()) == DetectSettings()


def test_the_demand_mix_reaches_detection_as_weights_by_size() -> None:
    mix = dataclasses.replace(DetectConfig().demand_mix, g1=0.0, g7=2.0)
    built = build_settings(DetectSettings, dataclasses.replace(DetectConfig(), demand_mix=mix))
    assert dict(built.fragmentation.demand)["7g"] == 2.0 and dict(built.fragmentation.demand)["1g"] == 0.0


def test_a_key_that_names_no_setting_is_refused_by_name() -> None:
    @dataclass(frozen=True)
    class Table:
        checkpoint_s: float = doc_field(2.0, "exists in PlannerSettings")
        checkpoint_seconds: float = doc_field(3.0, "a key that names no setting")
        moved: float = field(default=1.0, metadata={"to": "nowhere.at_all"})

    with pytest.raises(TypeError, match="Table: checkpoint_seconds, nowhere is no field of PlannerSettings"):
        build_settings(PlannerSettings, Table())
