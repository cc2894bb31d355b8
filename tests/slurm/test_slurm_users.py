"""Slurm jobs of ordinary users, and another user of the node against them: each job gets its MIG device under
flexmigd's shipped umask, no user can make another's checkpoint base (and so turn off their hook), and a job
whose hook is off is never signalled. Real slurmctld and slurmd, jobs of users made for the run."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from flexmig.slurm.taskprolog import MARKER_NAME
from support.slurm import JOB_USERS, UNIT_UMASK, SlurmDaemon, SlurmRig, skip_reason
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

PRINT = '#!/bin/sh\necho "$(id -u) $CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _as(user: str, *argv: str) -> None:
    """Run ``argv`` as ``user`` (a hostile user's own commands)."""
    pw = pwd.getpwnam(user)
    subprocess.run(argv, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], check=True, timeout=30, umask=0o022)


def test_under_the_units_umask_a_job_of_an_ordinary_user_gets_its_mig_device() -> None:
    """flexmigd runs with ``UMask=0077``; the TaskProlog runs as the job's user and must read the GRES map. The map's
    directories were made 0700 (``mkdir(parents=True)``): every task of every ordinary user got
    ``CUDA_VISIBLE_DEVICES=`` (empty)."""
    assert UNIT_UMASK == 0o077
    with SlurmDaemon("h200:7g.141gb@0") as d:
        job = d.testbed.sbatch("--gres=gpu:7g.141gb:1", script=PRINT)
        d.wait(f"job {job} printed its device", lambda: d.output(job).strip())
        line = d.output(job).strip().splitlines()[-1]  # after any line of the TaskProlog's
        uid, _, visible = line.partition(" ")
        assert int(uid) == pwd.getpwnam(JOB_USERS[0]).pw_uid != 0, line
        assert visible.startswith("MIG-"), (line, d.output(job))
        gres_map = d.testbed.map_path
        assert _mode(gres_map) == 0o644
        made = gres_map.relative_to(d.paths.run).parents  # what flexmigd made: run/flexmig, run/flexmig/slurm
        assert [(str(p), _mode(d.paths.run / p)) for p in made if str(p) != "."] == [
            ("flexmig/slurm", 0o755),
            ("flexmig", 0o755),
        ]


def _hostile_scratch(rig: SlurmRig) -> Path:
    """A directory anybody may make entries in (sticky, like /var/tmp) for the checkpoint bases."""
    scratch = rig.base / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)
    return scratch


def test_a_user_who_made_the_checkpoint_base_first_cannot_turn_off_anothers_hook() -> None:
    """The TaskProlog made the parents of ``[slurm] checkpoint_dir`` as the job's user, so whoever made them first
    (another user, on purpose) owned them: every other user's hook was off on that node, flexmigd signalled their
    jobs all the same, and they ended FAILED. Now the Prolog (root) makes the bases and takes a planted one back."""
    owner, other = JOB_USERS[0], JOB_USERS[1]

    async def run() -> None:
        rig = SlurmRig("h200:4g.71gb@0+3g.71gb@4")
        scratch = _hostile_scratch(rig)
        rig.overrides["checkpoint_dir"] = str(scratch / "flexmig-slurm" / "{user}" / "{job_id}")
        planted = scratch / "flexmig-slurm"
        async with rig:
            _as(other, "mkdir", "-m", "0755", str(planted))  # the other user makes the base first ...
            _as(other, "mkdir", "-m", "0755", str(planted / owner))  # ... and the owner's directory in it
            hook = rig.hook_job("--gres=gpu:3g.71gb:1")
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _steps(rig, hook, 3), what="the hook job steps", not_yet=(Exception,))
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(4)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            rnd = await rig.change()
            assert rnd.result is not None and rnd.result.ok, rnd
            await rig.wait_state(hook, "RUNNING")
            await until(lambda: _starts(rig, hook, 2), what="the hook job resumed", not_yet=(Exception,))
            log = rig.hook_log(hook)
            starts = [e for e in log if e["event"] == "start"]
            ckpts = [e for e in log if e["event"] == "checkpoint"]
            assert starts[1]["step"] == ckpts[0]["step"] + 1, log
            job = await rig.job(hook)
            assert job is not None and job.restart_count == 1, job
            marker = json.loads((scratch / "flexmig-slurm" / owner / str(hook) / MARKER_NAME).read_text())
            assert marker == {"version": 1, "job_id": hook, "restart": 1}, marker  # the run under way: its hook is on
            fixed = scratch / "flexmig-slurm"
            st = fixed.lstat()
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and _mode(fixed) == 0o755
            mine = fixed / owner
            assert mine.stat().st_uid == pwd.getpwnam(owner).pw_uid and _mode(mine) == 0o700
            aside = [p for p in scratch.iterdir() if p.name.startswith(".flexmig-slurm.flexmig-")]
            assert len(aside) == 1 and aside[0].stat().st_uid == pwd.getpwnam(other).pw_uid, list(scratch.iterdir())

    asyncio.run(run())


async def _steps(rig: SlurmRig, job: int, n: int) -> bool:
    return sum(e["event"] == "step" for e in rig.hook_log(job)) >= n  # type: ignore[no-any-return]


async def _starts(rig: SlurmRig, job: int, n: int) -> bool:
    return sum(e["event"] == "start" for e in rig.hook_log(job)) >= n  # type: ignore[no-any-return]


def test_a_hook_job_whose_hook_could_not_be_set_up_is_never_signalled_and_the_change_waits_for_it() -> None:
    """A job that asked for the hook (``--requeue``, ``flexmig:hook``) but got none (its base is not its user's:
    the Prolog refuses it, so the TaskProlog gives it no checkpoint directory): flexmigd read only the comment,
    signalled it, and the signal ended it with its work lost. Now its TaskProlog's marker decides: it runs to its
    end, unsignalled, and the change waits for it."""
    owner, other = JOB_USERS[0], JOB_USERS[1]

    async def run() -> None:
        rig = SlurmRig("h200:4g.71gb@0+3g.71gb@4")
        ckpt = rig.paths.checkpoints
        other_pw = pwd.getpwnam(other)
        theirs = ckpt / owner
        async with rig:
            ckpt.mkdir(mode=0o755)
            theirs.mkdir(mode=0o700)  # not the owner's: another user's directory under the owner's name
            os.chown(theirs, other_pw.pw_uid, other_pw.pw_gid)
            job = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=1", "--requeue", "--comment=flexmig:hook", seconds=8)
            await rig.wait_state(job, "RUNNING")
            small = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            read = await rig.agent.read()
            held = [r for r in read.demand.running if r.job.job_id == job]
            assert held and not held[0].movable, held
            rnd = await rig.change()  # carried out once the job ended by itself
            assert rnd.result is not None and rnd.result.ok, rnd
            done = await rig.job(job)
            assert done is not None and done.state == "COMPLETED" and done.restart_count == 0, done
            assert not rig.signalled(job)
            assert [k for k, d in rig.slurm_events if d.get("slurm_job") == job] == []
            assert not (ckpt / owner / str(job)).exists() or not (ckpt / owner / str(job) / MARKER_NAME).exists()
            assert theirs.stat().st_uid == other_pw.pw_uid  # refused, left as it is
            for j in small:
                await rig.wait_state(j, "RUNNING")

    asyncio.run(run())
