"""Another local user attacks a job that is not theirs, through what every user can do: start a process with any
environment, hold a pipe, open sockets. The real actuator runs in this process on a simulated node (support/hostile.py);
the job and the attacker are real processes of two users made with ``useradd`` (removed after).

Each test here failed on the code before issue #44's fixes: a decoy carrying a job's markers was adopted in place of
its real rank (which was then killed as a stray).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.act.procs import process_alive
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT
from support.hostile import Rig, base_dir, scratch_user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs jobs as users made for the test")
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@pytest.fixture
def base() -> Iterator[Path]:
    with base_dir() as d:
        yield d


def spawn_below(pid: int, user: pwd.struct_passwd, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A ``sleep`` of ``user`` with ``env``, whose pid is lower than ``pid``: what the pid counter gives an attacker
    after it wraps (every ~30,000 forks), made here at once by setting the kernel's last pid (as CRIU does)."""
    for _ in range(20):
        NS_LAST_PID.write_text(str(max(300, pid - 200)))
        p = subprocess.Popen(
            ["/bin/sleep", "600"], user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env, cwd="/"
        )
        if p.pid < pid:
            return p
        p.kill()
        p.wait(10)
    pytest.skip(f"could not get a pid below {pid} (the machine forks too fast)")


def decoy_env(rec: object, slot: int = 0) -> dict[str, str]:
    """The markers of ``rec``'s rank ``slot``, as anyone can read them (the job ID is in /proc/PID/cgroup)."""
    return {
        "PATH": "/usr/bin:/bin",
        ENV_JOB: rec.name,  # type: ignore[attr-defined]
        ENV_JOB_ID: rec.uid,  # type: ignore[attr-defined]
        ENV_GENERATION: str(rec.generation),  # type: ignore[attr-defined]
        ENV_SLOT: str(slot),
    }


# ------------------------------------------------------------------------------------------- adoption
@needs_root
def test_a_decoy_of_another_user_carrying_a_jobs_markers_is_never_adopted_and_the_real_rank_is_never_killed(
    base: Path,
) -> None:
    async def scenario(owner: pwd.struct_passwd, other: pwd.struct_passwd) -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("finish", user=owner.pw_name))))["ok"]
            (real,) = rig.alive()
            rec = rig.record()
            decoy = await asyncio.to_thread(spawn_below, real, other, decoy_env(rec))
            try:
                summary = await rig.restart()
                assert summary["adopted"]["evil"] == [real], f"decoy {decoy.pid} adopted: {summary['adopted']}"
                assert decoy.poll() is None, "root never signals another user's process for carrying markers"
                decoy.kill()
                await asyncio.to_thread(decoy.wait, 10)
                assert await rig.act.supervisor.end_strays("evil", 1.0) == [], "the real rank is no stray"
                assert process_alive(real) and rig.record().state == "running"
                assert rig.alive() == [real]
                recorded = rig.act.journal.recorded_ranks(rec.uid, rec.generation)
                assert recorded[0].pid == real and recorded[0].uid == owner.pw_uid, recorded
            finally:
                decoy.kill()
                decoy.wait(10)
            assert rig.deaths == []

    with scratch_user("fmo") as owner, scratch_user("fmx") as other:
        asyncio.run(scenario(owner, other))


@needs_root
def test_a_process_of_the_jobs_own_user_posing_as_its_rank_is_not_adopted_in_place_of_the_recorded_one(
    base: Path,
) -> None:
    """The job's user could start a decoy too (outside the job's cgroup, with a lower pid): the journal recorded
    which process was launched in the slot, and when it started, and only that one is adopted."""

    async def scenario(owner: pwd.struct_passwd) -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("finish", user=owner.pw_name))))["ok"]
            (real,) = rig.alive()
            decoy = await asyncio.to_thread(spawn_below, real, owner, decoy_env(rig.record()))
            try:
                summary = await rig.restart()
                assert summary["adopted"]["evil"] == [real], summary["adopted"]
            finally:
                decoy.kill()
                decoy.wait(10)

    with scratch_user("fmo") as owner:
        asyncio.run(scenario(owner))
