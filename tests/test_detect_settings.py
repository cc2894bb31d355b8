"""Detection settings: documented defaults, and the mapping from the daemon's one-threshold-plus-margin table."""

import pytest

from flexmig.config import parse_config
from flexmig.detect import DEFAULT_DEMAND, DetectSettings, settings_from_thresholds
from flexmig.detect.settings import FragmentationSettings


def test_defaults_keep_a_dead_band_between_entering_and_leaving():
    s = DetectSettings()
    assert s.underuse.activity_enter < s.underuse.activity_exit
    assert s.underuse.memory_enter < s.underuse.memory_exit
    assert s.fragmentation.exit < s.fragmentation.enter


def test_the_default_demand_mix_sums_to_one_and_favours_small_instances():
    weights = dict(DEFAULT_DEMAND)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["1g"] > weights["3g"] > weights["7g"]


def test_one_threshold_and_a_margin_become_enter_and_exit_thresholds():
    s = settings_from_thresholds(
        activity=0.2, memory=0.25, window_s=600, hysteresis=0.05, fragmentation=0.5, fragmentation_window_s=300,
        demand={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 7: 1.0},
    )  # fmt: skip
    assert (s.underuse.activity_enter, s.underuse.activity_exit) == (0.2, pytest.approx(0.25))
    assert (s.underuse.memory_enter, s.underuse.memory_exit) == (0.25, pytest.approx(0.30))
    assert (s.fragmentation.enter, s.fragmentation.exit) == (0.5, pytest.approx(0.45))
    assert s.underuse.enter_after_s == 600 and s.fragmentation.enter_after_s == 300
    assert dict(s.fragmentation.demand) == {"1g": 1.0, "2g": 1.0, "3g": 1.0, "4g": 1.0, "7g": 1.0}


def test_the_daemon_configuration_maps_onto_detection_settings():
    d = parse_config("[detect]\nunderuse_activity = 0.1\n", "flexmig.toml").detect
    s = settings_from_thresholds(
        activity=d.underuse_activity, memory=d.underuse_memory, window_s=d.underuse_window_s,
        hysteresis=d.hysteresis, fragmentation=d.fragmentation_threshold,
        fragmentation_window_s=d.fragmentation_window_s, demand=d.demand_mix.weights(),
    )  # fmt: skip
    assert s.underuse.activity_enter == 0.1


def test_exit_above_enter_is_refused():
    with pytest.raises(ValueError, match="exit <= enter"):
        FragmentationSettings(enter=0.2, exit=0.4)
