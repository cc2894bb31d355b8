"""mig-parted's configuration format, tried on mig-parted's own files (tests/data/mig-parted: its
``examples/config.yaml`` and the ``config-default.yaml`` its systemd unit ships, copied with their source).

* every named configuration parses, and resolves per GPU as ``mig-parted apply`` would: entries in order, the
  last that matches a GPU stands, device filters by PCI device ID, ``devices: all`` or indices, ``mig-enabled:
  false``; each resolved profile set becomes a layout the hardware accepts, with exactly those counts;
* files mig-parted refuses are refused, naming the configuration and the fault;
* ``flexmig layouts --export mig-parted`` writes a file that reads back to the node's layout.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from flexmig.cli.main import main as cli_main
from flexmig.config import parse_config
from flexmig.config.migparted import load_baseline, parse_mig_parted_text, read_mig_parted
from flexmig.errors import ConfigError
from flexmig.mig import A100_40, A100_80, H100_80, H200, MODELS, GpuModel, Layout
from flexmig.mig.migparted import (
    GpuBaseline,
    GpuState,
    baseline_for,
    export_spec,
    layout_for,
    parse_profile,
    parse_spec,
    to_yaml,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "mig-parted"
EXAMPLE = parse_mig_parted_text((DATA / "config.yaml").read_text(), "config.yaml")
DEFAULT = parse_mig_parted_text((DATA / "config-default.yaml").read_text(), "config-default.yaml")


def counts(layout: Layout) -> dict[str, int]:
    return dict(Counter(i.profile.name for i in layout))


def resolved(entries: object, index: int, model: GpuModel) -> GpuBaseline | None:
    return baseline_for(entries, index, model)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ the example file


def test_the_example_file_has_its_named_configurations() -> None:
    assert set(EXAMPLE.configs) == {
        "all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-1g.10gb", "all-2g.10gb", "all-3g.20gb",
        "all-balanced", "custom-config",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXAMPLE.configs))
def test_every_example_configuration_is_a_valid_layout_on_an_a100_40gb_node(name: str) -> None:
    entries = EXAMPLE.select(name)
    for index in range(8):
        base = resolved(entries, index, A100_40)
        assert base is not None, f"{name} covers every GPU of an 8-GPU node"
        if base.mig_enabled:
            layout = layout_for(A100_40, base.counts)
            assert not layout.violations() and counts(layout) == base.counts


def test_all_1g_10gb_is_four_two_slice_instances_on_an_a100_40gb() -> None:
    base = resolved(EXAMPLE.select("all-1g.10gb"), 0, A100_40)
    assert base == GpuBaseline(True, {"1g.10gb": 4})
    assert layout_for(A100_40, base.counts).spec() == "1g.10gb@0+1g.10gb@2+1g.10gb@4+1g.10gb@6"


def test_custom_config_gives_each_gpu_its_own_entry() -> None:
    entries = EXAMPLE.select("custom-config")
    got = {i: resolved(entries, i, A100_40) for i in range(9)}
    assert all(got[i] == GpuBaseline(False, {}) for i in range(4))
    assert got[4] == GpuBaseline(True, {"1g.5gb": 7})
    assert got[5] == GpuBaseline(True, {"2g.10gb": 3})
    assert got[6] == GpuBaseline(True, {"3g.20gb": 2})
    assert got[7] == GpuBaseline(True, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
    assert got[8] is None, "an index no entry names is not part of the configuration"


def test_all_enabled_is_mig_on_with_no_instances_and_all_disabled_is_mig_off() -> None:
    assert resolved(EXAMPLE.select("all-enabled"), 0, H200) == GpuBaseline(True, {})
    assert resolved(EXAMPLE.select("all-disabled"), 3, H200) == GpuBaseline(False, {})
    assert layout_for(H200, {}) == Layout.empty(H200)


def test_a_profile_the_gpu_model_lacks_is_named() -> None:
    base = resolved(EXAMPLE.select("all-1g.10gb"), 0, H200)  # no device filter: mig-parted would try it on an H200
    assert base is not None
    with pytest.raises(ConfigError, match=r"h200 has no MIG profile '1g\.10gb'"):
        layout_for(H200, base.counts)


# ------------------------------------------------------------------------------- the default file, with filters


def test_every_configuration_of_the_default_file_parses() -> None:
    assert len(DEFAULT.configs) >= 50
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-1g.18gb"} <= set(DEFAULT.configs)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        (H100_80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (A100_80, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (A100_40, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
    ],
    ids=lambda x: x.key if isinstance(x, GpuModel) else "",
)
def test_all_balanced_picks_the_entry_whose_device_filter_names_the_model(
    model: GpuModel, expected: dict[str, int]
) -> None:
    base = resolved(DEFAULT.select("all-balanced"), 2, model)
    assert base == GpuBaseline(True, expected)
    assert counts(layout_for(model, expected)) == expected


def test_all_1g_10gb_differs_by_model_through_its_device_filters() -> None:
    entries = DEFAULT.select("all-1g.10gb")
    assert resolved(entries, 0, A100_40) == GpuBaseline(True, {"1g.10gb": 4})
    assert resolved(entries, 0, A100_80) == GpuBaseline(True, {"1g.10gb": 7})
    assert resolved(entries, 0, H100_80) == GpuBaseline(True, {"1g.10gb": 7})
    assert resolved(entries, 0, H200) is None, "no filter of all-1g.10gb names the H200"


def test_every_configuration_of_the_default_file_lays_out_or_names_the_missing_profile() -> None:
    laid = Counter[str]()
    for name in DEFAULT.configs:
        for model in MODELS:
            base = resolved(DEFAULT.select(name), 0, model)
            if base is None or not base.mig_enabled:
                continue
            try:
                layout = layout_for(model, base.counts)
            except ConfigError as exc:
                assert "has no MIG profile" in str(exc), (name, model.key, exc)
                continue
            assert not layout.violations() and counts(layout) == base.counts, (name, model.key)
            laid[model.key] += 1
    assert all(laid[m.key] >= 8 for m in MODELS), laid


def test_a_filter_with_a_subsystem_id_matches_no_gpu_here() -> None:
    spec = parse_spec(
        {"version": "v1", "mig-configs": {"x": [
            {"device-filter": "0x233510DE:0x17A610DE", "devices": "all", "mig-enabled": True,
             "mig-devices": {"1g.18gb": 7}},
        ]}},
    )  # fmt: skip
    assert baseline_for(spec.select("x"), 0, H200) is None


def test_the_last_matching_entry_stands_as_mig_parted_applies_them_in_order() -> None:
    spec = parse_spec(
        {"version": "v1", "mig-configs": {"x": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.141gb": 1}},
        ]}},
    )  # fmt: skip
    assert baseline_for(spec.select("x"), 0, H200) == GpuBaseline(True, {"1g.18gb": 7})
    assert baseline_for(spec.select("x"), 1, H200) == GpuBaseline(True, {"7g.141gb": 1})


# ----------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("mig-configs: {a: [{devices: all, mig-enabled: false}]}\n", "missing 'version' field"),
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\n", "unknown version"),
        ("version: v1\n", "at least one entry in 'mig-configs'"),
        ("version: v1\nmig-configs: {a: []}\n", "mig-configs.a: at least one entry"),
        ("version: v1\nmig-configs: {a: [{mig-enabled: false}]}\n", "missing required field: devices"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}\n", "invalid string input"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}\n", "'mig-devices' when 'mig-enabled'"),
        (
            'version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, mig-devices: {"1g.5gb": 1}}]}\n',
            "MIG devices included when 'mig-enabled' is false",
        ),
        ('version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {"1g5gb": 1}}]}\n',
         "invalid format for '1g5gb'"),
        ('version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 0}}]}\n',
         "all counts for all MIG profiles are 0"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, extra: 1}]}\n", "unexpected field: extra"),
        ("version: v1\nmig-configs: {a: [{device-filter: A100, devices: all, mig-enabled: false}]}\n",
         "device-filter 'A100' is not a PCI device ID"),
        ("version: v1\nmig-configs: [\n", "config.yaml:3: not valid YAML: did not find expected node content"),
    ],
)
def test_files_mig_parted_refuses_are_refused_naming_the_fault(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"^config\.yaml") as err:
        parse_mig_parted_text(text, "config.yaml")
    assert why in str(err.value)


def test_a_compute_instance_profile_smaller_than_its_gpu_instance_is_refused() -> None:
    assert parse_profile("7c.7g.141gb", H200) == H200.profile("7g.141gb")
    with pytest.raises(ConfigError, match="one compute instance spanning each GPU instance"):
        parse_profile("1c.2g.35gb", H200)


def test_counts_no_layout_can_hold_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"no layout of h200 holds 2 x 4g\.71gb"):
        layout_for(H200, {"4g.71gb": 2})


def test_a_layout_keeps_the_instances_a_gpu_already_has_where_it_can() -> None:
    current = Layout.of(H200, [("3g.71gb", 4), ("1g.18gb", 2)])
    target = layout_for(H200, {"3g.71gb": 1, "1g.18gb": 3}, prefer=current)
    assert {("3g.71gb", 4), ("1g.18gb", 2)} <= {(i.profile.name, i.start) for i in target}


# ------------------------------------------------------------------------------------------------ the config


def test_the_baseline_is_read_from_the_configuration_and_checked_with_it(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text((DATA / "config-default.yaml").read_text())
    f.chmod(0o644)
    cfg = parse_config(f'[baseline]\nmig_parted_file = "{f}"\nmig_parted_config = "all-balanced"\n')
    base = load_baseline(cfg.baseline)
    assert base is not None and base.name == "all-balanced" and base.file == f
    assert read_mig_parted(f).select("all-1g.18gb")


# ------------------------------------------------------------------------------------------------ the export


def test_the_export_of_a_one_model_node_is_one_entry_for_all_devices() -> None:
    spec = export_spec([GpuState(i, H200, True, ("3g.71gb", "2g.35gb", "1g.18gb")) for i in range(2)], "now")
    assert to_yaml(spec) == (
        "version: v1\nmig-configs:\n  now:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n"
        '        "1g.18gb": 1\n        "2g.35gb": 1\n        "3g.71gb": 1\n'
    )


def test_the_export_of_a_mixed_node_filters_by_device_id_and_lists_indices_where_needed() -> None:
    states = [
        GpuState(0, H200, True, ("7g.141gb",)),
        GpuState(1, H200, True, ("1g.18gb",) * 7),
        GpuState(2, A100_40, False),
        GpuState(3, A100_40, False),
    ]
    spec = export_spec(states, "mixed")
    entries = spec["mig-configs"]["mixed"]  # type: ignore[index]
    assert entries == [
        {"device-filter": "0x233510DE", "devices": [0], "mig-enabled": True, "mig-devices": {"7g.141gb": 1}},
        {"device-filter": "0x233510DE", "devices": [1], "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
        {"device-filter": "0x20B010DE", "devices": "all", "mig-enabled": False, "mig-devices": {}},
    ]
    back = parse_mig_parted_text(to_yaml(spec), "x").select("mixed")
    models = [H200, H200, A100_40, A100_40]
    for s in states:
        expected = dict(Counter(s.mig_devices)) if s.mig_enabled else {}
        assert baseline_for(back, s.index, models[s.index]) == GpuBaseline(s.mig_enabled, expected)


def test_flexmig_layouts_export_reads_back_to_the_simulated_nodes_layout(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
    assert cli_main(["layouts", "--export", "mig-parted", "--sim", spec, "--name", "all-flexmig"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# mig-parted configuration of the simulated node")
    data = yaml.safe_load(text)
    assert data["version"] == "v1" and list(data["mig-configs"]) == ["all-flexmig"]
    entries = parse_spec(data).select("all-flexmig")
    for gpu in (0, 1):
        assert baseline_for(entries, gpu, H200) == GpuBaseline(True, {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1})


def test_flexmig_layouts_needs_a_model_or_export(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["layouts"]) == 2
    assert "--export mig-parted" in capsys.readouterr().err


def test_config_check_refuses_a_baseline_that_standdown_would_refuse_by_the_same_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mig = tmp_path / "config.yaml"
    mig.write_text('version: v1\nmig-configs:\n  odd:\n    - devices: all\n      mig-enabled: true\n'
                   '      mig-devices: {"1c.2g.35gb": 2}\n')  # fmt: skip
    mig.chmod(0o644)
    conf = tmp_path / "flexmig.toml"
    conf.write_text(f'[baseline]\nmig_parted_file = "{mig}"\nmig_parted_config = "odd"\n')
    conf.chmod(0o600)
    assert cli_main(["config", "check", str(conf)]) != 0
    err = capsys.readouterr().err
    with pytest.raises(ConfigError) as standdown:  # what flexmig standdown meets when it plans the layout
        layout_for(H200, {"1c.2g.35gb": 2})
    assert "baseline.mig_parted_file" in err and str(standdown.value) in err, err
    assert "one compute instance spanning each GPU instance" in err
