"""A migrated job trains on exactly what an uninterrupted one does: per-step losses equal, in every framework example.

For each example (torch DDP, Hugging Face ``Trainer``, PyTorch Lightning, FSDP with ``torch.distributed.checkpoint``)
two jobs of 2 ranks run side by side under the actuator (``python -m flexmig.actuatord`` on a simulated H200), the
same script with the same seed: one is left alone, the other migrated once through ``flexmig jobs`` a few steps in.
The move is cold (no standby ranks): it asks for the checkpoint at once, so the job cannot finish before it comes on
a loaded machine (a standby start of the Hugging Face example took 18 s at load 9); the checkpoint and the resume
are the same with standby ranks. Every step's loss of the moved job must equal the uninterrupted job's, bit for
bit. Tiny models on the CPU (gloo), a few dozen steps.
"""

from __future__ import annotations

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

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.timeout(600)]

STEPS = 48
# (framework module to import, example script, its arguments, the last step it logs: the loop's index, counted
# from 0, or the framework's global step, counted from 1)
EXAMPLES = {
    "ddp": ("torch", "train_ddp.py", ["--step-time", "0.25"], STEPS - 1),
    "transformers": ("transformers", "train_hf.py", ["--step-time", "0.25"], STEPS),
    "lightning": ("lightning", "train_lightning.py", ["--step-time", "0.25"], STEPS),
    "fsdp": ("torch", "train_fsdp.py", ["--step-time", "0.25"], STEPS - 1),
}


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="flexmig-exact-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def spec(base: Path, name: str, script: str, args: list[str]) -> Path:
    script_path = str(ROOT / "examples" / script)
    argv = [sys.executable, script_path, *args, "--steps", str(STEPS), "--log", f"{base}/{name}.log"]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    hook = {"ack_timeout_s": 300, "exit_timeout_s": 60}
    text = job_toml(name, argv, base, env=env, ranks=(1, 2, 2), hook=hook)
    return write_spec(base / f"{name}.toml", text)


def losses(log: Path) -> dict[int, float]:
    """Step -> loss of every step the job logged (each once: a resumed generation starts after the checkpoint)."""
    out: dict[int, float] = {}
    for e in log_lines(log):
        if e["event"] == "step":
            assert int(e["step"]) not in out, f"step {e['step']} ran twice"
            out[int(e["step"])] = float(e["loss"])
    return out


def wait(what: str, predicate: Any, timeout_s: float = 300) -> Any:
    return wait_until(predicate, timeout_s, what, every_s=0.1)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_a_migrated_job_has_the_losses_of_an_uninterrupted_one(base: Path, example: str) -> None:
    module, script, args, last = EXAMPLES[example]
    pytest.importorskip(module)
    with actuatord(base) as node:
        sock = node.sock
        try:
            flexmig(sock, "submit", str(spec(base, "alone", script, args)))
            flexmig(sock, "submit", str(spec(base, "moved", script, args)))
            wait("a few steps of the job to move", lambda: len(losses(base / "moved.log")) >= 3)
            out = flexmig(sock, "migrate", "moved")
            assert "migrate moved: completed" in out, out

            def finished(name: str) -> bool:  # rank 0 logged its last step (the jobs' other ranks may still be ending)
                return any(e["event"] == "step" and e["step"] >= last for e in log_lines(base / f"{name}.log"))

            wait("both jobs' last step", lambda: finished("alone") and finished("moved"))
            moved = [e for e in log_lines(base / "moved.log") if e["event"] == "start"]
            assert len(moved) == 2 and moved[1]["world"] == 2, "moved once, resumed at the same world size"
            alone, after = losses(base / "alone.log"), losses(base / "moved.log")
            assert sorted(after) == sorted(alone), "the moved job ran every step once, as the uninterrupted one did"
            differ = {s: (alone[s], after[s]) for s in alone if alone[s] != after[s]}
            assert not differ, f"losses differ after the move at steps {sorted(differ)[:5]}: {differ}"
        except AssertionError as exc:
            logs = sorted((base / "logs").rglob("*.log")) if (base / "logs").exists() else []
            tails = "\n".join(f"--- {p}\n{p.read_text()[-1200:]}" for p in logs[-4:])
            raise AssertionError(f"{exc}\n{(base / 'service.log').read_text()[-2000:]}\n{tails}") from None
