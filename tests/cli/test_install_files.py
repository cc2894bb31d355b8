"""What an operator gets from the wheel: the unit, the act drop-in, the configuration, dashboards with provisioning,
alert rules, schemas and the LICENSE, and ``flexmig install-files`` putting them where the unit's paths say.

The wheels are built from a copy of the checkout and installed into a fresh virtual environment (their
dependencies at the versions of this environment); that environment's ``flexmig install-files`` writes into a
temporary prefix, and ``systemd-analyze`` verifies and scores the installed unit, with and without the drop-in.
An image (``--root``) is written under its root with files that name each other as the image will see them, and the
TaskProlog that ``flexmig slurm conf`` names is installed.
"""

from __future__ import annotations

import email.parser
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flexmig.cli.install_cmd import plan_install, render_unit
from flexmig.cli.main import main as cli_main
from flexmig.cli.shipped_files import SHIPPED, shipped_files, shipped_root
from flexmig.config import parse_config, render_toml
from flexmig.errors import FlexmigError
from support.prometheus import PROMTOOL
from support.systemd import exposure, verify
from support.wheels import ROOT, build_wheel, fresh_venv, pip_into, source_copy

FLEXMIGD = Path("/opt/flexmig/bin/flexmigd")


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


# ----------------------------------------------------------------------------------------------- in this process


def test_the_checkout_holds_every_shipped_pattern() -> None:
    root = shipped_root()
    files = {p.as_posix() for p in shipped_files(root)}
    for pattern in SHIPPED:
        assert any(Path(f).match(pattern) for f in files), f"nothing ships for {pattern}"
    assert "LICENSE" in files and "systemd/flexmigd.service.d/act.conf" in files
    assert (root / "LICENSE").read_text().startswith("\n                                 Apache License")


def test_the_unit_is_filled_in_with_the_flexmigd_and_configuration_installed() -> None:
    template = (ROOT / "systemd" / "flexmigd.service").read_text()
    assert "ExecStart=@FLEXMIGD@ --config @CONFIG@\n" in template
    assert "/opt/flexmig" not in template
    unit = render_unit(template, Path("/usr/local/bin/flexmigd"), Path("/srv/etc/flexmig/flexmig.toml"))
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    assert line == "ExecStart=/usr/local/bin/flexmigd --config /srv/etc/flexmig/flexmig.toml"
    with pytest.raises(FlexmigError, match="absolute path"):
        render_unit(template, Path("bin/flexmigd"), Path("/etc/flexmig/flexmig.toml"))
    with pytest.raises(FlexmigError, match="spaces"):
        render_unit(template, Path("/opt/my venv/bin/flexmigd"), Path("/etc/flexmig/flexmig.toml"))


def test_provisioning_points_at_the_installed_dashboards_and_rules(tmp_path: Path) -> None:
    items = {i.dest.relative_to(tmp_path).as_posix(): i for i in plan_install(tmp_path, FLEXMIGD)}
    share = tmp_path / "usr/share/flexmig"
    grafana = items["usr/share/flexmig/dashboards/provisioning/dashboards/flexmig.yaml"].content.decode()
    assert f"      path: {share}/dashboards\n" in grafana
    prometheus = items["usr/share/flexmig/dashboards/provisioning/prometheus/prometheus.yml"].content.decode()
    assert f"  - {share}/dashboards/rules/flexmig.rules.yml\n" in prometheus
    assert '      - targets: ["127.0.0.1:17400"]' in prometheus
    assert items["etc/flexmig/flexmig.toml"].content.decode() == render_toml()
    assert "etc/systemd/system/flexmigd.service.d/act.conf" not in items, "act needs --act"
    assert {i.kind for i in items.values() if i.dest.name == "flexmig.toml"} == {"config", "file"}


def test_install_files_writes_keeps_an_edited_configuration_and_force_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "root"
    args = ["install-files", "--prefix", str(prefix), "--flexmigd", str(FLEXMIGD)]
    assert cli_main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(dry run: nothing is written)" in out and f"would create  {prefix}/etc/flexmig/flexmig.toml" in out
    assert not prefix.exists()

    assert cli_main(args) == 0
    config = prefix / "etc/flexmig/flexmig.toml"
    assert config.read_text() == render_toml()
    assert config.stat().st_mode & 0o777 == 0o644
    assert (prefix / "etc/flexmig/jobs").is_dir()
    unit = (prefix / "etc/systemd/system/flexmigd.service").read_text()
    assert f"ExecStart={FLEXMIGD} --config {config}\n" in unit
    capsys.readouterr()

    config.write_text('mode = "advise"\n')
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert f"keep    {config}  (exists; --force replaces it)" in out
    assert f"same    {prefix}/etc/systemd/system/flexmigd.service" in out
    assert config.read_text() == 'mode = "advise"\n'

    assert cli_main([*args, "--force", "--act"]) == 0
    out = capsys.readouterr().out
    assert f"replace {config}" in out and f"create  {prefix}/etc/systemd/system/flexmigd.service.d/act.conf" in out
    assert config.read_text() == render_toml()


def test_install_files_names_the_file_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "root"
    (prefix / "etc/systemd/system").mkdir(parents=True)
    (prefix / "etc/systemd/system/flexmigd.service").mkdir()  # a directory where the unit goes
    assert cli_main(["install-files", "--prefix", str(prefix), "--flexmigd", str(FLEXMIGD)]) == 1
    err = capsys.readouterr().err
    assert f"{prefix}/etc/systemd/system/flexmigd.service exists and is not a regular file" in err


# -------------------------------------------------------------------------------------------- from the wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """flexmig's and flexmig-hook's wheels, built from a copy of the checkout."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = source_copy(tmp / "src")
    return {"flexmig": build_wheel(src, tmp / "dist"), "flexmig-hook": build_wheel(src / "hook", tmp / "dist")}


@pytest.fixture(scope="module")
def installed(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with both wheels and their dependencies (at this environment's versions); its bin/."""
    tmp = tmp_path_factory.mktemp("venv")
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    pins = tmp / "constraints.txt"
    pins.write_text("".join(x + "\n" for x in frozen.splitlines() if "==" in x and not x.startswith("flexmig")))
    python = fresh_venv(tmp / "venv")
    pip_into(python, "install", "--no-compile", "-c", str(pins), str(wheels["flexmig"]), str(wheels["flexmig-hook"]))
    return python.parent


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_wheel_carries_the_operators_files_and_the_license(wheels: dict[str, Path]) -> None:
    with zipfile.ZipFile(wheels["flexmig"]) as z:
        names = set(z.namelist())
        meta = email.parser.Parser().parsestr(z.read("flexmig-0.1.0.dist-info/METADATA").decode())
        license_text = z.read("flexmig-0.1.0.dist-info/licenses/LICENSE").decode()
        share = {n.removeprefix("flexmig/share/") for n in names if n.startswith("flexmig/share/")}
    assert share == {p.as_posix() for p in shipped_files(ROOT)}
    assert license_text == (ROOT / "LICENSE").read_text()
    assert meta["License-Expression"] == "Apache-2.0"
    assert "flexmig-hook==0.1.0" in meta.get_all("Requires-Dist", [])
    assert not any(n.startswith("flexmig_hook/") for n in names), "the hook's code ships in flexmig-hook alone"
    with zipfile.ZipFile(wheels["flexmig-hook"]) as z:
        hook_names = set(z.namelist())
        hook_meta = email.parser.Parser().parsestr(z.read("flexmig_hook-0.1.0.dist-info/METADATA").decode())
    sources = ROOT / "hook" / "src" / "flexmig_hook"
    assert {n for n in hook_names if not n.startswith("flexmig_hook-0.1.0.dist-info/")} == {
        f"flexmig_hook/{p.name}" for p in (*sources.glob("*.py"), sources / "py.typed")
    }
    # A training environment installs the hook alone: its frameworks come only with the extras that name them.
    assert all("extra ==" in r for r in hook_meta.get_all("Requires-Dist") or []), hook_meta.get_all("Requires-Dist")
    assert not names & hook_names, "the two distributions share no file"


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_install_files_from_the_wheel_gives_a_unit_that_verifies_in_both_modes(installed: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "root"
    flexmig = installed / "flexmig"
    where = subprocess.run(
        [str(installed / "python"), "-c", "import flexmig.cli.shipped_files as s; print(s.shipped_root())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(installed.parent)) and where.endswith("flexmig/share"), where

    dry = run(flexmig, "install-files", "--prefix", prefix, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not prefix.exists()
    done = run(flexmig, "install-files", "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert "23 file(s) written" in done.stdout, done.stdout

    config = prefix / "etc/flexmig/flexmig.toml"
    unit = prefix / "etc/systemd/system/flexmigd.service"
    (exec_start,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    assert exec_start == f"ExecStart={installed / 'flexmigd'} --config {config}"
    check = run(flexmig, "config", "check", config)
    assert check.stdout == f"{config}: OK (mode observe, metrics 127.0.0.1:17400, mqtt off)\n", check.stderr
    assert (prefix / "usr/share/doc/flexmig/LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    for name in ("flexmig-node.json", "flexmig-instance.json", "flexmig-daemon.json", "flexmig-actions.json"):
        assert json.loads((prefix / "usr/share/flexmig/dashboards" / name).read_text())["title"]

    if Path(PROMTOOL).exists():  # the installed scrape example loads the installed rules
        rules = prefix / "usr/share/flexmig/dashboards/rules"
        scrape = prefix / "usr/share/flexmig/dashboards/provisioning/prometheus/prometheus.yml"
        config_check = run(PROMTOOL, "check", "config", scrape)
        assert config_check.returncode == 0 and "SUCCESS" in config_check.stdout, config_check.stdout
        assert str(rules / "flexmig.rules.yml") in config_check.stdout
        rule_test = run(PROMTOOL, "test", "rules", "flexmig.rules.test.yml", cwd=rules)
        assert rule_test.returncode == 0, rule_test.stdout + rule_test.stderr

    result = verify(unit)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    observe, report = exposure(unit)
    assert re.search(r"✓ CapabilityBoundingSet=~CAP_SYS_ADMIN ", report), "observe has no CAP_SYS_ADMIN"
    assert re.search(r"✓ CapabilityBoundingSet=~CAP_SET\(UID\|GID\|PCAP\) ", report)

    act = run(flexmig, "install-files", "--prefix", prefix, "--act")
    assert act.returncode == 0, act.stderr
    assert (prefix / "etc/systemd/system/flexmigd.service.d/act.conf").is_file()
    result = verify(unit)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")
    acting, report = exposure(unit)
    assert re.search(r"✗ CapabilityBoundingSet=~CAP_SYS_ADMIN ", report), "the drop-in grants CAP_SYS_ADMIN"
    print(f"systemd-analyze security --offline=true: observe {observe}, act {acting}")
    assert observe < acting <= 3.2  # 3.0 for the capabilities, 0.2 for the job cgroups' delegation
    assert observe <= 2.5




def _written(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_an_image_is_written_under_its_root_and_its_files_name_each_other_as_the_image_will_see_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "srv" / "image"
    assert cli_main(["install-files", "--root", str(image), "--flexmigd", str(FLEXMIGD)]) == 0
    assert "next:" in capsys.readouterr().out
    files = _written(image)
    assert not [name for name, data in files.items() if str(tmp_path).encode() in data]  # no build path leaks in
    unit = files["etc/systemd/system/flexmigd.service"].decode()
    assert f"ExecStart={FLEXMIGD} --config /etc/flexmig/flexmig.toml\n" in unit
    grafana = files["usr/share/flexmig/dashboards/provisioning/dashboards/flexmig.yaml"].decode()
    assert "      path: /usr/share/flexmig/dashboards\n" in grafana
    prometheus = files["usr/share/flexmig/dashboards/provisioning/prometheus/prometheus.yml"].decode()
    assert "  - /usr/share/flexmig/dashboards/rules/flexmig.rules.yml\n" in prometheus
    assert (image / "etc/flexmig/jobs").is_dir()


def test_root_and_prefix_combine_as_destdir_and_prefix_do(tmp_path: Path) -> None:
    root, prefix = tmp_path / "build", Path("/opt/flexmig")
    items = plan_install(prefix, FLEXMIGD, root=root)
    assert all(i.dest.is_relative_to(root / "opt/flexmig") for i in items)
    unit = next(i for i in items if i.dest.name == "flexmigd.service").content.decode()
    assert f"ExecStart={FLEXMIGD} --config /opt/flexmig/etc/flexmig/flexmig.toml\n" in unit
    assert not [i.dest for i in items if str(root).encode() in i.content]
    with pytest.raises(FlexmigError, match="must be absolute"):
        plan_install(Path("opt"), FLEXMIGD, root=root)


def test_the_taskprolog_slurm_conf_names_is_installed_executable_and_reads_the_daemons_gres_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["slurm", "conf"]) == 0
    (named,) = [line.removeprefix("TaskProlog=") for line in capsys.readouterr().out.splitlines()
                if line.startswith("TaskProlog=")]  # fmt: skip
    assert cli_main(["install-files", "--root", str(tmp_path), "--flexmigd", str(FLEXMIGD)]) == 0
    prolog = tmp_path / named.lstrip("/")
    assert prolog.is_file() and prolog.stat().st_mode & 0o777 == 0o755
    text = prolog.read_text()
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert f'MAP_PATH = "{parse_config("").slurm.gres_map}"' in text  # where flexmigd writes it by default
