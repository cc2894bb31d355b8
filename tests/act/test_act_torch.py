"""The example torch DDP job under the actuator in act mode, driven through ``flexmig jobs``: it trains on 2 ranks,
is migrated to other MIG instances, re-split to 4 ranks and back to 2, resumes each time at the acknowledged
step + 1 with exactly the checkpoint's parameters, and its loss keeps falling across the moves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flexmig.act.client import ControlClient
from flexmig.act.procs import PsutilScanner
from support.actuatord import actuatord
from support.jobs import ROOT, Training, ddp_spec, flexmig, job_uid, write_spec

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.torch]


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flexmig-torch-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_ddp_job_migrates_and_resplits_resuming_exactly_with_falling_loss(base: Path) -> None:
    spec = write_spec(base / "train.toml", ddp_spec(base))
    t = Training(base)
    with actuatord(base) as node:
        sock = node.sock
        out = flexmig(sock, "submit", str(spec))
        assert "job ddp: running on gpu0:1g.18gb@0, gpu0:1g.18gb@1" in out
        first = t.wait_for(1, 15)
        assert first["world"] == 2 and first["resume"] is None

        flexmig(sock, "migrate", "ddp")
        after_migrate = t.wait_for(2, 10)
        jobs = json.loads(flexmig(sock, "list", "--json"))
        assert [(i["gpu"], i["start"]) for i in jobs[0]["instances"]] == [(0, 2), (0, 3)]
        assert after_migrate["world"] == 2

        flexmig(sock, "resplit", "ddp", "--ranks", "4")
        after_grow = t.wait_for(3, 10)
        assert after_grow["world"] == 4

        flexmig(sock, "resplit", "ddp", "--ranks", "2")
        after_shrink = t.wait_for(4, 10)
        assert after_shrink["world"] == 2
        jobs = json.loads(flexmig(sock, "list", "--json"))
        assert jobs[0]["state"] == "running" and jobs[0]["ranks"] == 2 and jobs[0]["generation"] == 4
        live = PsutilScanner().find(job_uid(base / "journal.sqlite3", "ddp") or "")
        assert sorted(f.slot for f in live) == [0, 1] and {f.generation for f in live} == {4}

        t.check_resumed_exactly(torch, moves=3)

        out = flexmig(sock, "stop", "ddp")
        assert "stop ddp: completed" in out


def test_the_example_runs_by_hand_without_flexmig(tmp_path: Path) -> None:
    """Outside flexmig the example trains as one process and ignores the hook's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXMIG_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_ddp.py"), "--steps", "30", "--log", str(tmp_path / "l")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    log = [json.loads(x) for x in (tmp_path / "l").read_text().splitlines()]
    losses = [e["loss"] for e in log if e["event"] == "step"]
    assert len(losses) == 30 and losses[-1] < losses[0] / 2 and log[-1]["event"] == "done"


def test_torchrun_launcher_runs_one_elastic_agent_per_instance_and_migrates(base: Path) -> None:
    """launcher = "torchrun": c10d rendezvous on loopback; the checkpoint signal reaches the workers, not the
    agents, and the job resumes after a migration as with the plain launcher."""
    spec = write_spec(base / "tr.toml", ddp_spec(base, max_ranks=2, launcher="torchrun"))
    t = Training(base)
    with actuatord(base, sim_state=False) as node:
        sock = node.sock
        client = ControlClient(sock, timeout_s=300)
        assert client.call("jobs.submit", path=str(spec))["ok"]
        assert t.wait_for(1, 5)["world"] == 2
        agents = PsutilScanner().find(job_uid(base / "journal.sqlite3", "ddp") or "")
        assert len(agents) == 2
        assert all("torch.distributed.run" in " ".join(psutil.Process(a.pid).cmdline()) for a in agents)
        assert client.call("jobs.migrate", name="ddp")["ok"]
        resumed = t.wait_for(2, 5)
        (ckpt,) = [e for e in t.log() if e["event"] == "checkpoint"]
        assert resumed["step"] == ckpt["step"] + 1 and resumed["params"] == ckpt["params"]
        assert resumed["world"] == 2
        assert client.call("jobs.stop", name="ddp")["ok"]
