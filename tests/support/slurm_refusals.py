"""What a refused job looks like on a real testbed: flexmigd's one warning line for it, the other jobs served, the
refused job left pending (jobs no layout of the per-instance mode can serve: flexmig.slurm.instances' MIXED and
TOO_MANY)."""

from __future__ import annotations

from support.slurm import SlurmDaemon


def refused_once(d: SlurmDaemon, job: int, reason: str, script: str) -> str:
    """flexmigd's warning line naming ``reason`` for ``job``, once the daemon has served a one-device job submitted
    after it (a round later) while ``job`` still pends, and said it only once (not every round)."""
    line: str = d.wait("flexmigd's refusal", lambda: next((x for x in d.log().splitlines() if reason in x), None),
                       timeout_s=30)  # fmt: skip
    assert f"job {job} {reason}" in line and "WARNING" in line, line
    one = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=script)  # a round later: a carving for this one alone
    d.wait_state(one, "RUNNING", timeout_s=60)
    pending = d.job(job)
    assert pending is not None and pending.state == "PENDING", pending
    warned = [x for x in d.log().splitlines() if reason in x and "WARNING" in x]
    assert len(warned) == 1, d.log()[-3000:]  # told once, not every round
    return line
