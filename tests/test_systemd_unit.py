"""The shipped systemd unit: it verifies cleanly, scores well on exposure, and keeps /dev/nvidia* reachable."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flexmig.config import DEFAULT_CONFIG_PATH, Config, parse_config, render_toml

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "flexmigd.service"
EXAMPLE = ROOT / "systemd" / "flexmig.toml"
INSTALLED_EXEC = "/opt/flexmig/bin/flexmigd"


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze not found: apt-get install systemd (make debs does it)")
    return tool


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, in order (systemd keys may repeat)."""
    section = ""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def values(key: str, section: str = "Service") -> list[str]:
    return [v for s, k, v in unit_entries(UNIT.read_text()) if s == section and k == key]


def runnable_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointing at this venv's flexmigd: verify insists that the binary exists."""
    flexmigd = Path(sys.executable).with_name("flexmigd")
    assert flexmigd.exists(), "the package is not installed in this environment"
    text = UNIT.read_text() if text is None else text
    assert f"ExecStart={INSTALLED_EXEC} " in text
    copy = tmp_path / "flexmigd.service"
    copy.write_text(text.replace(f"ExecStart={INSTALLED_EXEC} ", f"ExecStart={flexmigd} "))
    return copy


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.integration
def test_systemd_analyze_verify_passes_with_empty_stderr(tmp_path: Path) -> None:
    result = verify(runnable_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == ""


@pytest.mark.integration
def test_the_verify_check_catches_a_misspelt_key(tmp_path: Path) -> None:
    # systemd-analyze exits 0 on unknown keys; only stderr tells, which is why the test above reads it.
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict")
    result = verify(runnable_copy(tmp_path, broken))
    assert result.returncode == 0
    assert "Unknown key 'ProtectSystm' in section [Service], ignoring." in result.stderr


@pytest.mark.integration
def test_security_exposure_is_at_most_3(tmp_path: Path) -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(runnable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    m = re.search(r"Overall exposure level for flexmigd\.service: (\d+\.\d+)", text)
    assert m, result.stdout + result.stderr
    assert float(m.group(1)) <= 3.0, text


def test_the_unit_is_type_notify_with_a_watchdog_and_sighup_reload() -> None:
    assert values("Type") == ["notify"]
    assert values("NotifyAccess") == ["main"]
    assert values("ExecReload") == ["/bin/kill -HUP $MAINPID"]
    assert values("Restart") == ["on-failure"]
    (watchdog,) = values("WatchdogSec")
    seconds = int(watchdog.removesuffix("s"))
    assert Config.default().sampling.stall_s <= seconds, "a wedged loop must be noticed before systemd gives up"


def test_the_unit_starts_the_daemon_on_the_default_configuration_file() -> None:
    assert values("ExecStart") == [f"{INSTALLED_EXEC} --config {DEFAULT_CONFIG_PATH}"]
    assert values("ConfigurationDirectory") == ["flexmig"]
    assert values("StateDirectory") == ["flexmig"]
    assert values("RuntimeDirectory") == ["flexmig"]
    cfg = Config.default()
    assert cfg.state.directory == Path("/var/lib/flexmig")
    assert cfg.control.socket.parent == Path("/run/flexmig")


@pytest.mark.integration
def test_flexmigd_accepts_the_arguments_of_exec_start() -> None:
    flexmigd = Path(sys.executable).with_name("flexmigd")
    out = subprocess.run([str(flexmigd), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--config" in out


def test_gpu_devices_stay_reachable() -> None:
    assert values("PrivateDevices") in ([], ["no"]), "PrivateDevices=yes hides /dev/nvidia*"
    assert values("DevicePolicy") == ["closed"]
    allowed = values("DeviceAllow")
    assert "char-nvidia* rw" in allowed, "nvidia-frontend, nvidia-uvm, nvidia-caps (MIG capabilities)"
    assert "/dev/nvidiactl rw" in allowed
    assert "/dev/nvidia-uvm rw" in allowed
    assert values("ProcSubset") == [], "ProcSubset=pid hides /proc/driver/nvidia"


def test_capabilities_are_those_act_mode_needs_and_no_more() -> None:
    (caps,) = values("CapabilityBoundingSet")
    assert set(caps.split()) == {"CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}
    assert values("NoNewPrivileges") == ["yes"]
    assert values("ProtectSystem") == ["strict"]
    (families,) = values("RestrictAddressFamilies")
    assert set(families.split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def test_the_checked_in_example_configuration_is_the_generated_one() -> None:
    # Regenerate with: flexmig config example > systemd/flexmig.toml
    assert EXAMPLE.read_text() == render_toml()
    assert parse_config(EXAMPLE.read_text(), str(EXAMPLE)) == Config.default()
