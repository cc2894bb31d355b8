"""The framework integrations of the hook under the real actuator: a Hugging Face ``Trainer`` job, a PyTorch
Lightning job and an FSDP job (``torch.distributed.checkpoint``), each started on 2 ranks as standby-enabled jobs,
migrated to other instances and re-split to 1 rank; each resumes right after the acknowledged step, with its
loss carrying on where it was.

Tiny models built from config on the CPU (gloo); nothing is downloaded (``HF_HUB_OFFLINE=1``). The actuator runs
as ``python -m flexmig.actuatord`` on a simulated node, driven through ``flexmig jobs``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.actuatord import actuatord
from support.jobs import ROOT, flexmig, job_toml, log_lines, write_spec
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.timeout(900)]

# (framework module to import, example script, its arguments)
FRAMEWORKS = {
    "transformers": ("transformers", "train_hf.py", []),
    "lightning": ("lightning", "train_lightning.py", ["--step-time", "0.02"]),
    "fsdp": ("torch", "train_fsdp.py", ["--step-time", "0.02"]),
}


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flexmig-fw-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def spec(base: Path, script: str, args: list[str]) -> str:
    return job_toml(
        "fw",
        [sys.executable, str(ROOT / "examples" / script), *args, "--log", f"{base}/train.log"],
        base,
        checkpoint_dir=base / "ckpt",
        env=ENV,
        ranks=(1, 2, 2),
        hook={"standby": True, "ack_timeout_s": 300, "exit_timeout_s": 60},
    )


def wait_for(log: Path, n_starts: int, steps_after: int, timeout_s: float = 300) -> list[dict[str, Any]]:
    def started() -> list[dict[str, Any]] | None:
        events = log_lines(log)
        starts = [i for i, e in enumerate(events) if e["event"] == "start"]
        if len(starts) >= n_starts and sum(1 for e in events[starts[n_starts - 1] :] if e["event"] == "step") >= (
            steps_after
        ):
            return events
        return None

    found: list[dict[str, Any]] = wait_until(started, timeout_s, f"start {n_starts} with {steps_after} steps after it")
    return found


def check_resumed(events: list[dict[str, Any]], n_start: int, acked: int, world: int) -> None:
    """Start ``n_start`` resumed right after step ``acked`` on ``world`` ranks, and the loss carried on."""
    idx = [i for i, e in enumerate(events) if e["event"] == "start"][n_start - 1]
    start = events[idx]
    assert start["world"] == world
    before = [e for e in events[:idx] if e["event"] == "step"]
    after = [e for e in events[idx:] if e["event"] == "step"]
    assert after[0]["step"] == acked + 1, f"resumed at step {after[0]['step']}, not right after {acked}"
    assert before[-1]["step"] >= acked, "the acknowledged step was one the job had run"
    first = sum(e["loss"] for e in [e for e in events if e["event"] == "step"][:3]) / 3
    last = sum(e["loss"] for e in before[-5:]) / 5
    resumed = sum(e["loss"] for e in after[:5]) / 5
    assert resumed < 0.8 * first, f"the loss started over: {resumed} vs {first} at the very start"
    assert resumed <= 1.5 * last + 0.05, f"the loss jumped across the move: {last} -> {resumed}"


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_framework_job_migrates_and_resplits_resuming_after_the_acknowledged_step(base: Path, framework: str) -> None:
    module, script, args = FRAMEWORKS[framework]
    pytest.importorskip(module)
    spec_path = write_spec(base / "fw.toml", spec(base, script, args))
    log = base / "train.log"
    with actuatord(base) as node:
        sock = node.sock
        try:
            flexmig(sock, "submit", str(spec_path))
            events = wait_for(log, 1, 8)
            assert next(e for e in events if e["event"] == "start")["world"] == 2

            flexmig(sock, "migrate", "fw")
            (job,) = json.loads(flexmig(sock, "list", "--json"))
            assert [(i["gpu"], i["start"]) for i in job["instances"]] == [(0, 2), (0, 3)]
            check_resumed(wait_for(log, 2, 8), 2, job["resume"]["step"], world=2)

            flexmig(sock, "resplit", "fw", "--ranks", "1")
            (job,) = json.loads(flexmig(sock, "list", "--json"))
            assert job["ranks"] == 1 and job["generation"] == 3
            check_resumed(wait_for(log, 3, 8), 3, job["resume"]["step"], world=1)
            assert Path(job["resume"]["checkpoint"]).parent == base / "ckpt"

            assert "stop fw: completed" in flexmig(sock, "stop", "fw")
        except AssertionError as exc:
            logs = sorted((base / "logs" / "fw").glob("*.log")) if (base / "logs").exists() else []
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in logs)
            raise AssertionError(f"{exc}\n{(base / 'service.log').read_text()[-2000:]}\n{tails}") from None
