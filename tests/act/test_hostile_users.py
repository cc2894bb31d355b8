"""Another local user attacks a job that is not theirs, through what every user can do: start a process with any
environment, hold a pipe, open sockets. The real actuator runs in this process on a simulated node (support/hostile.py);
the job and the attacker are real processes of two users made with ``useradd`` (removed after).

Each test here failed on the code before issue #44's fixes: a decoy carrying a job's markers was adopted in place of
its real rank (which was then killed as a stray); root's log writer of a rank that handed its pipe to a process
outside the job ran on after the job was stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from flexmig.act.procs import process_alive
from flexmig.act.ranklogs import LOGPUMP
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT
from support.hostile import SYSTEM_PYTHON, Rig, base_dir, scratch_user

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


# ------------------------------------------------------------------------------------------ log writers
# The job's user, outside the job: take the rank's log pipe over a Unix socket and write into it without end.
HOLDER = """
import os, signal, socket, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
srv = socket.socket(socket.AF_UNIX); srv.bind(sys.argv[1]); srv.listen(1)
print("listening", flush=True)
conn, _ = srv.accept()
_, fds, _, _ = socket.recv_fds(conn, 16, 2)
print("holding", flush=True)
while True:
    for fd in fds:
        try:
            os.write(fd, b"written from outside the job\\n" * 64)
        except OSError:
            pass
    time.sleep(0.01)
"""


def log_writers() -> list[psutil.Process]:
    """This process's rank log writers (the in-process actuator starts them as its children)."""
    out = []
    for c in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if str(LOGPUMP) in c.cmdline():
                out.append(c)
    return out


@needs_root
def test_a_rank_that_hands_its_log_pipe_to_an_outside_process_does_not_keep_roots_log_writer_after_the_stop(
    base: Path,
) -> None:
    async def scenario(owner: pwd.struct_passwd) -> None:
        home = base / "outside"
        home.mkdir()
        os.chown(home, owner.pw_uid, owner.pw_gid)
        sock = home / "take.sock"
        holder = await asyncio.create_subprocess_exec(
            SYSTEM_PYTHON, "-I", "-c", HOLDER, str(sock), user=owner.pw_uid, group=owner.pw_gid, extra_groups=[],
            stdout=subprocess.PIPE, cwd="/",
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert await asyncio.wait_for(holder.stdout.readline(), 60) == b"listening\n"
            async with Rig(base) as rig:
                spec = rig.hostile("handoff", str(sock), user=owner.pw_name)
                assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
                assert await asyncio.wait_for(holder.stdout.readline(), 60) == b"holding\n"
                rec = rig.record()
                (writer,) = log_writers()
                cgroup = await asyncio.to_thread(Path(f"/proc/{writer.pid}/cgroup").read_text)
                if rig.act.supervisor.cgroups is not None:
                    assert f"/job-{rec.uid}" in cgroup, f"the log writer runs in the job's cgroup: {cgroup}"
                await rig.call("jobs.stop", name="evil")
                assert rig.record().state != "running"
                await rig.until("the log writer ended", lambda: not process_alive(writer.pid))
                assert rig.deaths == []
        finally:
            with contextlib.suppress(ProcessLookupError):
                holder.kill()
            await asyncio.wait_for(holder.wait(), 30)

    with scratch_user("fmo") as owner:
        asyncio.run(scenario(owner))


# ------------------------------------------------------------------------------------------ standby ranks
@needs_root
def test_a_standby_rank_that_never_says_ready_holds_no_other_request_up_and_never_runs_without_its_world(
    base: Path,
) -> None:
    """The job's user writes a program that, started as a standby rank, never says ready (nor reads its world):
    before, the move held the action lock for the whole ``standby_timeout_s`` (other requests dropped at their
    deadline) and then handed the world to the mute rank, so the job showed generation 2 running a rank that never
    got it."""

    async def scenario(owner: pwd.struct_passwd) -> None:
        async with Rig(base) as rig:
            spec = rig.hostile("mute-standby", user=owner.pw_name, name="mute")
            spec.write_text(spec.read_text() + "standby = true\nstandby_timeout_s = 600\n")
            assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
            assert (await rig.call("jobs.submit", path=str(rig.hostile("finish", name="other"))))["ok"]
            move = asyncio.ensure_future(rig.call("jobs.migrate", name="mute"))
            try:
                (mute,) = await rig.until("the standby rank started", lambda: rig.act.supervisor.standby("mute"))
                stop = await asyncio.wait_for(rig.call("jobs.stop", name="other", force=True), 60)
                assert stop["ok"], stop
                res = await asyncio.wait_for(move, 60)
            finally:
                move.cancel()
            assert res["ok"], res
            rec = rig.record("mute")
            assert rec.state == "running" and rec.generation == 2
            (rank,) = rig.alive("mute")
            assert rank != mute.proc.pid, "the mute standby rank is not the job's rank"
            await rig.until("the mute standby rank ended", lambda: not process_alive(mute.proc.pid))
            env = psutil.Process(rank).environ()
            assert env.get("MASTER_PORT") == str(rec.master_port) and env.get("RANK") == "0", "it has its world"
            assert rig.deaths == []

    with scratch_user("fmo") as owner:
        asyncio.run(scenario(owner))
