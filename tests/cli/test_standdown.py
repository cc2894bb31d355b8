"""``flexmig standdown`` against flexmigd in mode act on a simulated node whose baseline is a mig-parted file.

The node starts as ``3g.71gb@0 + 2g.35gb@4 + 1g.18gb@6`` on two H200s; the demo workload runs processes that belong
to no registered job on some instances (the roles come from the simulator's seed, checked first). The baseline
gives GPU 0 five 1g.18gb and a 2g.35gb (the 2g may stay where it is, beside its stranger's process) and GPU 1 a
7g.141gb, which would need the instances its strangers use. A job of flexmig's holds GPU 0's 3g.

* ``--dry-run`` says so for each GPU and changes nothing;
* ``--stop-jobs``: the job is checkpointed and stopped, GPU 0 is re-laid around the instance it keeps, GPU 1 is
  left alone (exit status 1, naming the processes), and the daemon is in mode observe afterwards, so a second
  stand-down is refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flexmig.sim.workload import SyntheticWorkload
from support.flexmigd import act_node, short_base
from support.jobs import counter_spec, flexmig, log_lines, write_spec
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SPEC = "h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6"
BASELINE = """\
version: v1
mig-configs:
  test-baseline:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "2g.35gb": 1
        "1g.18gb": 5
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "7g.141gb": 1
"""


def test_the_scenario_rests_on_these_workload_roles() -> None:
    roles = SyntheticWorkload(0)
    assert roles.role(0, 0, "3g.71gb").kind == "idle", "GPU 0's 3g is free for the job"
    assert roles.role(0, 4, "2g.35gb").kind != "idle", "GPU 0's 2g runs a stranger's process"
    assert all(roles.role(1, s, p).kind != "idle" for s, p in ((0, "3g.71gb"), (4, "2g.35gb"), (6, "1g.18gb")))


def test_standdown_restores_what_it_may_stops_jobs_only_when_told_and_never_touches_strangers() -> None:
    with short_base() as base:
        mig = base / "mig-parted.yaml"
        mig.write_text(BASELINE)
        mig.chmod(0o644)
        extra = f'[baseline]\nmig_parted_file = "{mig}"\nmig_parted_config = "test-baseline"\n'
        with act_node(base, SPEC, extra=extra) as node:
            before = node.layout()
            spec = write_spec(base / "big.toml", counter_spec(base, "big", profile="3g.71gb"))
            assert "on gpu0:3g.71gb@0" in flexmig(node.sock, "submit", str(spec))
            wait_until(lambda: len(log_lines(base / "big.log")) >= 3, what="big runs")
            wait_until(lambda: _strangers(node.cli_json("status")) >= 4, what="the strangers' processes")

            dry = node.cli("standdown", "--dry-run", "--json")
            assert dry.returncode == 1, dry.stderr
            gpus = {g["gpu"]: g for g in json.loads(dry.stdout)["gpus"]}
            assert gpus[0]["state"] == "left alone" and "job big runs on gpu0:3g.71gb@0" in gpus[0]["why"]
            assert "--stop-jobs" in gpus[0]["why"]
            assert gpus[1]["state"] == "left alone" and "processes flexmig cannot account for" in gpus[1]["why"]
            assert node.layout() == before, "a dry run changes nothing"
            assert node.jobs()["big"]["state"] == "running"

            done = node.cli("standdown", "--stop-jobs")
            assert done.returncode == 1, done.stdout + done.stderr  # GPU 1 stays as it is
            lines = done.stdout.splitlines()
            assert lines[0].startswith("stand-down to test-baseline (")
            restored = "1g.18gb@0+1g.18gb@1+1g.18gb@2+1g.18gb@3+2g.35gb@4+1g.18gb@6"
            assert lines[1].startswith(f"  GPU 0: restored to {restored}")
            assert "stop big" in lines[1] and "destroy gpu0:3g.71gb@0" in lines[1]
            assert lines[2].startswith("  GPU 1: left alone: ") and "cannot account for" in lines[2]
            assert lines[3].startswith('mode observe: the daemon no longer plans; set mode = "observe"')

            after = node.layout()
            assert after[0] == [(0, "1g.18gb"), (1, "1g.18gb"), (2, "1g.18gb"), (3, "1g.18gb"), (4, "2g.35gb"),
                                (6, "1g.18gb")]  # fmt: skip
            assert after[1] == before[1], "GPU 1's strangers keep their instances"
            job = node.jobs()["big"]
            assert job["state"] == "stopped" and job["last_ack"] is not None, "stopped after its checkpoint"
            assert any(e["event"] == "checkpoint" for e in log_lines(base / "big.log"))
            assert node.cli_json("status")["mode"] == "observe"

            again = node.cli("standdown")
            assert again.returncode == 1
            assert "mode is 'observe': flexmig changes nothing outside mode 'act'" in again.stderr


def _strangers(status: dict[str, Any]) -> int:
    """Instances running processes of no job."""
    return len([i for g in status["gpus"] for i in g["instances"] if i["processes"] and not i["job"]])
