"""The node-spec grammar MODEL[xCOUNT][@DRIVER][:LAYOUT], and the errors a person sees for a bad spec."""

import pytest

from flexmig.errors import NodeSpecError
from flexmig.mig import A100_40, H200, parse_node_spec


def test_model_alone_is_one_gpu_with_mig_enabled_and_no_instances() -> None:
    spec = parse_node_spec("h200")
    assert spec.layout is not None
    assert (spec.model, spec.count, len(spec.layout)) == (H200, 1, 0)


def test_count_and_layout() -> None:
    spec = parse_node_spec("a100-40x2:3g.20gb@4+2g.10gb@0+1g.5gb@2")
    assert spec.model == A100_40 and spec.count == 2
    assert spec.layout is not None and spec.layout.spec() == "2g.10gb@0+1g.5gb@2+3g.20gb@4"


def test_media_variant_profile_keeps_its_plus() -> None:
    spec = parse_node_spec("h200:1g.18gb+me@0+1g.18gb@1")
    assert spec.layout is not None
    assert [i.profile.name for i in spec.layout] == ["1g.18gb+me", "1g.18gb"]


def test_a_driver_version_follows_the_count_and_stays_in_the_spec_text() -> None:
    spec = parse_node_spec("a100-40x2@470.82.01:3g.20gb@4")
    assert (spec.count, spec.driver, str(spec)) == (2, "470.82.01", "a100-40x2@470.82.01:3g.20gb@4")
    assert parse_node_spec("h200@550.90").driver == "550.90"
    assert parse_node_spec("h200").driver is None
    with pytest.raises(NodeSpecError, match="driver version BRANCH"):
        parse_node_spec("h200@latest")


def test_dash_layout_means_mig_disabled() -> None:
    assert parse_node_spec("h100-80x4:-").layout is None


@pytest.mark.parametrize(
    ("spec", "caret", "words"),
    [
        ("h300", 0, "unknown GPU model 'h300'"),
        ("h200x0", 5, "GPU count must be 1..64"),
        ("h200x65", 5, "GPU count must be 1..64"),
        ("h200:3g.71gb@2", 5, "may start only at memory slice {0,4}"),
        ("h200:3g.71gb@0+4g.71gb@0", 15, "memory slice 0 is already held"),
        ("h200:5g@0", 5, "no MIG profile '5g'"),
        ("h200:3g.71gb", 5, "expected PROFILE@START"),
        ("h200:", 5, "empty LAYOUT"),
    ],
)
def test_bad_spec_points_at_the_bad_item(spec: str, caret: int, words: str) -> None:
    with pytest.raises(NodeSpecError) as err:
        parse_node_spec(spec)
    message = str(err.value)
    assert words in message
    assert message.splitlines()[-1] == "  " + " " * caret + "^"
