"""flexmigd in mode act names the capabilities it lacks (the shipped unit has none; the act drop-in grants them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flexmig.service.privileges import ACT_CAPABILITIES, act_privilege_warning, effective_capabilities, missing_for_act

ACT_CONF = Path(__file__).resolve().parents[2] / "systemd" / "flexmigd.service.d" / "act.conf"


def status_file(tmp_path: Path, cap_eff: str) -> Path:
    path = tmp_path / "status"
    path.write_text(f"Name:\tflexmigd\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\nCapBnd:\t{cap_eff}\n")
    return path


def test_no_capability_names_each_that_act_needs_and_the_drop_in(tmp_path: Path) -> None:
    status = status_file(tmp_path, "0000000000000000")
    assert effective_capabilities(status) == 0
    assert missing_for_act(status) == list(ACT_CAPABILITIES)
    warning = act_privilege_warning(status)
    assert warning is not None
    assert warning.startswith("mode act without CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_DAC_READ_SEARCH")
    assert "CAP_SYS_ADMIN: create and destroy MIG instances" in warning
    assert "flexmig install-files --prefix / --act" in warning


def test_full_root_or_the_drop_ins_set_is_enough(tmp_path: Path) -> None:
    assert act_privilege_warning(status_file(tmp_path, "000001ffffffffff")) is None
    drop_in = {bit for name, (bit, _) in ACT_CAPABILITIES.items() if name in ACT_CONF.read_text()}
    assert act_privilege_warning(status_file(tmp_path, f"{sum(1 << b for b in drop_in):016x}")) is None


def test_an_unreadable_status_warns_of_nothing(tmp_path: Path) -> None:
    assert effective_capabilities(tmp_path / "missing") is None
    assert missing_for_act(tmp_path / "missing") == []
    assert act_privilege_warning(status_file(tmp_path, "zz")) is None


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="capability sets of a root process: needs root")
def test_the_check_reads_this_processs_real_capability_set() -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv not found: apt-get install util-linux")
    code = "import json; from flexmig.service.privileges import missing_for_act; print(json.dumps(missing_for_act()))"
    act = "-all,+sys_admin,+setuid,+setgid,+kill,+dac_read_search"
    for bounding, missing in ((act, []), ("-all,+kill", [n for n in ACT_CAPABILITIES if n != "CAP_KILL"])):
        done = subprocess.run(
            [setpriv, f"--bounding-set={bounding}", "--", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == missing, bounding
