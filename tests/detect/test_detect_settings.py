"""Detection settings: documented defaults, and the mapping from the daemon's one-threshold-plus-margin table."""

import pytest

from flexmig.config import DetectConfig, parse_config
from flexmig.config.settings import build_settings
from flexmig.detect import DEFAULT_DEMAND, DetectSettings
from flexmig.detect.settings import FragmentationSettings


def test_defaults_keep_a_dead_band_between_entering_and_leaving() -> None:
    s = DetectSettings()
    assert s.underuse.activity_enter < s.underuse.activity_exit
    assert s.underuse.memory_enter < s.underuse.memory_exit
    assert s.fragmentation.exit < s.fragmentation.enter


def test_the_default_demand_mix_sums_to_one_and_favours_small_instances() -> None:
    weights = dict(DEFAULT_DEMAND)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["1g"] > weights["3g"] > weights["7g"]


def _from_table(d: DetectConfig) -> DetectSettings:
    return build_settings(DetectSettings, d)


def test_a_daemon_without_a_detect_table_uses_the_documented_detection_defaults() -> None:
    assert _from_table(parse_config("", "flexmig.toml").detect) == DetectSettings()


def test_the_daemon_configuration_maps_onto_detection_settings() -> None:
    d = parse_config("[detect]\nunderuse_activity = 0.1\nfragmentation_exit = 0.2\n", "flexmig.toml").detect
    s = _from_table(d)
    assert s.underuse.activity_enter == 0.1
    assert s.fragmentation.exit == 0.2
    assert s.underuse.memory_exit == DetectSettings().underuse.memory_exit


def test_exit_above_enter_is_refused() -> None:
    with pytest.raises(ValueError, match="exit <= enter"):
        FragmentationSettings(enter=0.2, exit=0.4)
