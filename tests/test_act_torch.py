"""The example torch DDP job under the actuator in act mode, driven through ``flexmig jobs``: it trains on 2 ranks,
is migrated to other MIG instances, re-split to 4 ranks and back to 2, resumes each time at the acknowledged
step + 1 with exactly the checkpoint's parameters, and its loss keeps falling across the moves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig.act.client import ControlClient
from flexmig.act.journal import Journal
from flexmig.act.procs import PsutilScanner

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent


def flexmig(sock: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


class Training:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.log_path = base / "train.log"

    def log(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(x) for x in self.log_path.read_text().splitlines() if x.strip()]

    def wait_for(self, n_starts: int, steps_after: int, timeout_s: float = 120) -> dict[str, Any]:
        """Wait for the n-th start event and ``steps_after`` steps after it; returns that start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = self.log()
            starts = [i for i, e in enumerate(log) if e["event"] == "start"]
            if len(starts) >= n_starts:
                i = starts[n_starts - 1]
                if sum(1 for e in log[i:] if e["event"] == "step") >= steps_after:
                    return log[i]
            time.sleep(0.1)
        raise AssertionError(f"training did not reach start {n_starts} + {steps_after} steps: {self.log()[-3:]}")


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="flexmig-torch-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_ddp_job_migrates_and_resplits_resuming_exactly_with_falling_loss(base):
    sock = base / "control.sock"
    spec = base / "train.toml"
    spec.write_text(
        f"""\
name = "ddp"
argv = ["{sys.executable}", "{ROOT}/examples/train_ddp.py", "--steps", "100000", "--step-time", "0.03",
        "--lr", "0.005", "--log", "{base}/train.log"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt"
env = {{ OMP_NUM_THREADS = "1" }}
[ranks]
min = 1
max = 4
start = 2
[need]
profile = "1g.18gb"
[hook]
ack_timeout_s = 120
exit_timeout_s = 60
"""
    )
    spec.chmod(0o644)
    service = subprocess.Popen(
        [sys.executable, "-m", "flexmig.act", "--mode", "act", "--sim", "h200", "--sim-state", str(base / "sim.json"),
         "--state-dir", str(base), "--allow-dir", str(base), "--log-level", "WARNING"],
        stdout=(base / "service.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    t = Training(base)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
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
        live = PsutilScanner().find(_uid(base) or "")
        assert sorted(f.slot for f in live) == [0, 1] and {f.generation for f in live} == {4}

        log = t.log()
        checkpoints = [e for e in log if e["event"] == "checkpoint"]
        starts = [e for e in log if e["event"] == "start"]
        assert len(checkpoints) == 3 and len(starts) == 4
        for ckpt, start in zip(checkpoints, starts[1:], strict=True):
            assert start["step"] == ckpt["step"] + 1, "resumes at the acknowledged step + 1"
            assert start["params"] == ckpt["params"], "parameters are exactly the checkpoint's"
            saved = torch.load(ckpt["path"], map_location="cpu", weights_only=True)
            flat = [float(v) for t_ in saved["model"].values() for v in t_.reshape(-1).tolist()]
            assert flat == start["params"]

        steps = [e["step"] for e in log if e["event"] == "step"]
        assert steps == list(range(len(steps))), "every step ran exactly once across the moves"
        loss = {e["step"]: e["loss"] for e in log if e["event"] == "step"}
        for ckpt in checkpoints:
            k = ckpt["step"]
            before = sum(loss[s] for s in range(k - 2, k + 1)) / 3
            after = sum(loss[s] for s in range(k + 1, k + 4)) / 3
            assert after < before, f"loss rose across the move at step {k}: {before} -> {after}"
        assert loss[steps[-1]] < loss[0] / 2

        out = flexmig(sock, "stop", "ddp")
        assert "stop ddp: completed" in out
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            service.kill()
        uid = _uid(base)
        if uid:
            for f in PsutilScanner().find(uid):
                psutil.Process(f.pid).kill()


def _uid(base: Path) -> str | None:
    j = Journal(base / "journal.sqlite3")
    try:
        rec = j.get_job("ddp")
        return rec.uid if rec else None
    finally:
        j.close()


def test_the_example_runs_by_hand_without_flexmig(tmp_path):
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


def test_torchrun_launcher_runs_one_elastic_agent_per_instance_and_migrates(base):
    """launcher = "torchrun": c10d rendezvous on loopback; the checkpoint signal reaches the workers, not the
    agents, and the job resumes after a migration as with the plain launcher."""
    sock = base / "control.sock"
    spec = base / "tr.toml"
    spec.write_text(
        f"""\
name = "ddp"
argv = ["{sys.executable}", "{ROOT}/examples/train_ddp.py", "--steps", "100000", "--step-time", "0.03",
        "--log", "{base}/train.log"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt"
launcher = "torchrun"
env = {{ OMP_NUM_THREADS = "1" }}
[ranks]
min = 1
max = 2
start = 2
[need]
profile = "1g.18gb"
[hook]
ack_timeout_s = 120
exit_timeout_s = 60
"""
    )
    spec.chmod(0o644)
    service = subprocess.Popen(
        [sys.executable, "-m", "flexmig.act", "--mode", "act", "--sim", "h200", "--state-dir", str(base),
         "--allow-dir", str(base), "--log-level", "WARNING"],
        stdout=(base / "service.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    t = Training(base)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        client = ControlClient(sock, timeout_s=300)
        assert client.call("jobs.submit", path=str(spec))["ok"]
        assert t.wait_for(1, 5)["world"] == 2
        agents = PsutilScanner().find(_uid(base) or "")
        assert len(agents) == 2
        assert all("torch.distributed.run" in " ".join(psutil.Process(a.pid).cmdline()) for a in agents)
        assert client.call("jobs.migrate", name="ddp")["ok"]
        resumed = t.wait_for(2, 5)
        (ckpt,) = [e for e in t.log() if e["event"] == "checkpoint"]
        assert resumed["step"] == ckpt["step"] + 1 and resumed["params"] == ckpt["params"]
        assert resumed["world"] == 2
        assert client.call("jobs.stop", name="ddp")["ok"]
    finally:
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            service.kill()
        uid = _uid(base)
        if uid:
            for f in PsutilScanner().find(uid):
                psutil.Process(f.pid).kill()
