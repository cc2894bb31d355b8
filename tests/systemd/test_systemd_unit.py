"""The shipped systemd unit: it verifies cleanly, scores well on exposure, and keeps /dev/nvidia* reachable.

As shipped it holds no capability (modes observe and advise need none); the drop-in ``flexmigd.service.d/act.conf``
grants what mode act needs. Both are tried for real: the daemon runs in observe with no capabilities, and the
process operations of mode act work with the drop-in's set and fail without it (``setpriv`` stands in for systemd,
which applies ``CapabilityBoundingSet=`` to a root service the same way).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flexmig.act.client import ControlClient
from flexmig.cli.install_cmd import render_unit
from flexmig.config import DEFAULT_CONFIG_PATH, Config, parse_config, render_toml
from support.systemd import exposure, run_support_module, verify
from support.wait import wait_for_socket, wait_until

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "flexmigd.service"
ACT = ROOT / "systemd" / "flexmigd.service.d" / "act.conf"
EXAMPLE = ROOT / "systemd" / "flexmig.toml"
ACT_CAPS = {"CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_READ_SEARCH"}


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


def values(key: str, section: str = "Service", unit: Path = UNIT) -> list[str]:
    return [v for s, k, v in unit_entries(unit.read_text()) if s == section and k == key]


def runnable_copy(tmp_path: Path, text: str | None = None, *, act: bool = False) -> Path:
    """The unit as ``flexmig install-files`` writes it, ExecStart this venv's flexmigd (verify insists that the
    binary exists); with ``act`` the act drop-in beside it, where systemd reads drop-ins of that unit."""
    flexmigd = Path(sys.executable).with_name("flexmigd")
    assert flexmigd.exists(), "the package is not installed in this environment"
    text = UNIT.read_text() if text is None else text
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "flexmigd.service"
    copy.write_text(render_unit(text, flexmigd, DEFAULT_CONFIG_PATH))
    if act:
        (tmp_path / "flexmigd.service.d").mkdir()
        shutil.copy(ACT, tmp_path / "flexmigd.service.d" / "act.conf")
    return copy


def capabilities(unit: Path) -> set[str]:
    """The capability bounding set a unit file states (its last assignment; empty when it states an empty one)."""
    (caps,) = values("CapabilityBoundingSet", unit=unit)
    return set(caps.split())


@pytest.mark.integration
@pytest.mark.parametrize("act", [False, True], ids=["observe", "act"])
def test_systemd_analyze_verify_passes_with_empty_stderr(tmp_path: Path, act: bool) -> None:
    result = verify(runnable_copy(tmp_path, act=act))
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
def test_security_exposure_is_lower_as_shipped_than_with_the_act_drop_in(tmp_path: Path) -> None:
    # systemd 252: 2.2 as shipped (no capabilities), 3.2 with act.conf: 3.0 for its five capabilities, 0.2 more for
    # the job cgroups (Delegate=yes, ProtectControlGroups=no), the price of counting every process a job starts
    observe, text = exposure(runnable_copy(tmp_path / "observe"))
    assert observe <= 2.5, text
    assert "✓ CapabilityBoundingSet=~CAP_SYS_ADMIN " in text
    acting, text = exposure(runnable_copy(tmp_path / "act", act=True))
    assert observe < acting <= 3.2, text
    assert "✗ CapabilityBoundingSet=~CAP_SYS_ADMIN " in text


def test_the_unit_is_type_notify_with_a_watchdog_and_sighup_reload() -> None:
    assert values("Type") == ["notify"]
    assert values("NotifyAccess") == ["main"]
    assert values("ExecReload") == ["/bin/kill -HUP $MAINPID"]
    assert values("Restart") == ["on-failure"]
    (watchdog,) = values("WatchdogSec")
    seconds = int(watchdog.removesuffix("s"))
    assert Config.default().sampling.stall_s <= seconds, "a wedged loop must be noticed before systemd gives up"


def test_the_unit_starts_the_daemon_on_the_default_configuration_file(tmp_path: Path) -> None:
    assert values("ExecStart") == ["@FLEXMIGD@ --config @CONFIG@"], "install-files fills in both"
    installed = tmp_path / "flexmigd.service"
    installed.write_text(render_unit(UNIT.read_text(), Path("/opt/flexmig/bin/flexmigd"), DEFAULT_CONFIG_PATH))
    assert values("ExecStart", unit=installed) == [f"/opt/flexmig/bin/flexmigd --config {DEFAULT_CONFIG_PATH}"]
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


def test_the_unit_holds_no_capability_and_the_act_drop_in_those_act_needs_and_no_more() -> None:
    assert values("CapabilityBoundingSet") == [""], "an empty assignment: the empty set"
    assert values("AmbientCapabilities") == []
    assert capabilities(ACT) == ACT_CAPS
    assert unit_entries(ACT.read_text())[1:] == [
        ("Service", "Delegate", "yes"),
        ("Service", "ProtectControlGroups", "no"),
    ], "besides the capabilities, only the job cgroups' delegation"
    assert values("ProtectControlGroups") == ["yes"], "as shipped (observe) the cgroup tree stays read-only"
    assert not ACT_CAPS & {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}, "no writing other users' files"
    assert values("NoNewPrivileges") == ["yes"]
    assert values("ProtectSystem") == ["strict"]
    (families,) = values("RestrictAddressFamilies")
    assert set(families.split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def test_the_checked_in_example_configuration_is_the_generated_one() -> None:
    # Regenerate with: flexmig config example > systemd/flexmig.toml
    assert EXAMPLE.read_text() == render_toml()
    assert parse_config(EXAMPLE.read_text(), str(EXAMPLE)) == Config.default()


def setpriv(caps: set[str]) -> list[str]:
    """``setpriv`` with exactly ``caps`` in the bounding set and no new privileges, as the unit runs flexmigd."""
    tool = shutil.which("setpriv")
    if tool is None:
        pytest.fail("setpriv not found: apt-get install util-linux")
    bounding = ",".join(["-all", *sorted("+" + c.removeprefix("CAP_").lower() for c in caps)])
    return [tool, f"--bounding-set={bounding}", "--inh-caps=-all", "--no-new-privs", "--"]


def act_probe(caps: set[str], workdir: Path) -> dict[str, object]:
    done = run_support_module(setpriv(caps), "act_privileges", str(workdir), timeout_s=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="capability sets of a root service: needs root")
def test_the_act_drop_ins_capabilities_launch_find_and_signal_ranks_of_another_user(tmp_path: Path) -> None:
    assert act_probe(ACT_CAPS, tmp_path) == {"launch": True, "find": True, "signal": True}
    # Without CAP_DAC_READ_SEARCH a restarted daemon would not find the ranks it launched (nor re-adopt them).
    without = act_probe(ACT_CAPS - {"CAP_DAC_READ_SEARCH"}, tmp_path)
    assert without["launch"] is True and without["signal"] is True
    assert str(without["find"]).startswith("found []")
    # As shipped (no capability) nothing of that is possible: observe cannot start a job.
    shipped = act_probe(capabilities(UNIT), tmp_path)
    assert str(shipped["launch"]).startswith("PermissionError"), shipped


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.skipif(os.geteuid() != 0, reason="capability sets of a root service: needs root")
def test_flexmigd_in_observe_runs_with_the_units_empty_capability_set(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sock = tmp_path / "control.sock"
    config = tmp_path / "flexmig.toml"
    config.write_text(
        f'[prometheus]\nlisten = "127.0.0.1:{port}"\n[control]\nsocket = "{sock}"\n'
        f'[state]\ndirectory = "{tmp_path}"\njournal = "{tmp_path}/journal.sqlite3"\n'
        f'[mqtt]\noutbox = "{tmp_path}/outbox.sqlite3"\n'
    )
    config.chmod(0o644)
    flexmigd = Path(sys.executable).with_name("flexmigd")
    proc = subprocess.Popen(
        [*setpriv(capabilities(UNIT)), str(flexmigd), "--sim", "h200", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def metrics() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"flexmigd exited {proc.returncode} without capabilities")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return "flexmig_gpu_memory_total_bytes" in r.read().decode()

        wait_until(metrics, 60, "metrics from flexmigd without capabilities", every_s=0.2)
        wait_for_socket(sock, 60)  # the control socket comes up after the journal is reconciled
        status = ControlClient(sock, timeout_s=30).call("status")
        assert status["mode"] == "observe" and len(status["gpus"]) == 1
        with open(f"/proc/{proc.pid}/status") as f:
            effective = next(line.split()[1] for line in f if line.startswith("CapEff:"))
        assert int(effective, 16) == 0, "flexmigd ran with capabilities"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
