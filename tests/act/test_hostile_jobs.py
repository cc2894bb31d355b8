"""A job's own user attacks the actuator through what the job may write and do: its acknowledgement, its exit, its
processes, its output, its name. The real actuator runs in this process on a simulated node; every job is a real
process (``support/hostile_job.py``, ``/usr/bin/yes``, ``/usr/bin/printenv``), as root or as a user made for the test.

Each test here failed on the code before issue #19's fixes: the settle task died (and the restart with it), the move
ended in "internal error" with the job left without ranks, the finished job was called failed, the stray ran on,
the other user's job got the first one's checkpoint, the rank log grew without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig.act import jobcgroups, recovery
from flexmig.act.events import ActEvent, MemorySink
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_RESUME, ENV_SLOT
from support.hostile import Rig, base_dir, scratch_user
from support.jobs import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs jobs as a user made for the test")
_CGROUPS, _NO_CGROUPS = jobcgroups.probe()
needs_cgroups = pytest.mark.skipif(_CGROUPS is None, reason=f"no job cgroups here: {_NO_CGROUPS}")


@pytest.fixture
def base() -> Iterator[Path]:
    with base_dir() as d:
        yield d


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def move_of(res: dict[str, object]) -> dict[str, str]:
    """The migrate action of a ``jobs.migrate`` answer (its plan may create the target first)."""
    (move,) = [a for a in res["actions"] if a["kind"] == "migrate"]  # type: ignore[attr-defined]
    return move  # type: ignore[no-any-return]


def payload(base: Path, content: bytes) -> str:
    path = base / "payload.bin"
    path.write_bytes(content)
    path.chmod(0o644)
    return str(path)


# ------------------------------------------------------------------------------------- acknowledgements
def test_an_acknowledgement_with_a_5000_digit_step_cancels_the_move_and_the_job_runs_on(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            spec = rig.hostile("ack-bytes", payload(base, b'{"step": ' + b"9" * 5000 + b', "checkpoint": "/x"}'))
            assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
            pids = rig.alive()
            res = await rig.call("jobs.migrate", name="evil")
            assert not res["ok"] and move_of(res)["outcome"] == "cancelled", res
            assert "more than 20 digits" in move_of(res)["error"]
            assert rig.alive() == pids and rig.record().state == "running", "the job runs on where it was"
            assert rig.deaths == []

    run(scenario())


def test_a_deeply_nested_acknowledgement_left_by_a_job_that_exits_kills_neither_the_daemon_nor_its_restart(
    base: Path,
) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            spec = rig.hostile("ack-bytes-exit", payload(base, b"[" * 30_000 + b"]" * 30_000))
            assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
            await rig.until("the job settled", lambda: rig.record().state != "running")
            assert rig.record().state == "done", rig.record()
            assert rig.deaths == [], "a background task died: flexmigd would have exited"
            await rig.restart()
            assert rig.deaths == [] and rig.record().state == "done"

    run(scenario())


def test_an_acknowledgement_replaced_by_a_directory_after_it_was_read_leaves_the_job_moved_and_running(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("ack-then-dir"))))["ok"]
            before = rig.record()
            with caplog.at_level(logging.WARNING, logger="flexmig.act.executor"):
                res = await rig.call("jobs.migrate", name="evil")
            assert res["ok"], res
            after = rig.record()
            assert after.state == "running" and after.generation == before.generation + 1
            assert len(rig.alive()) == 1, "the job runs, on its new instance"
            lines = [r.getMessage() for r in caplog.records if "stale acknowledgement" in r.getMessage()]
            assert len(lines) == 1 and "is a directory" in lines[0], lines
            summary = await rig.restart()
            assert summary["adopted"]["evil"] and rig.record().state == "running", summary
            assert rig.deaths == []

    run(scenario())


# ------------------------------------------------------------------------------------------------ exits
def test_a_job_that_finishes_inside_the_checkpoint_window_without_acknowledging_is_done_not_failed(
    base: Path,
) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("finish"))))["ok"]
            res = await rig.call("jobs.migrate", name="evil")
            assert move_of(res)["outcome"] == "cancelled", res
            assert "finished (every rank exited 0) before it could checkpoint" in move_of(res)["error"]
            assert rig.record().state == "done" and rig.record().error is None
            assert "job_failed" not in [e.kind for e in rig.events.events]

    run(scenario())


def test_a_process_of_a_stopped_job_still_running_is_reported_as_an_unknown_rank(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("stray"))))["ok"]
            assert (await rig.call("jobs.stop", name="evil"))["ok"]
            rec = rig.record()
            # What a daemon that was away when the job stopped would find: a process with the job's markers.
            markers = {ENV_JOB: "evil", ENV_JOB_ID: rec.uid, ENV_GENERATION: str(rec.generation), ENV_SLOT: "0"}
            env = {**os.environ, **markers}
            survivor = await asyncio.create_subprocess_exec("/bin/sleep", "60", env=env)
            await _reported_alone(rig, rec.uid, survivor)

    run(scenario())


@pytest.mark.parametrize("how", ["stop", "migrate"])
@pytest.mark.parametrize(
    "mode", ["stray", pytest.param("stray-clean", marks=needs_cgroups, id="stray-with-an-empty-environment")]
)
def test_a_process_that_left_its_ranks_process_group_is_stopped_with_the_job_and_named(
    base: Path, mode: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile(mode))))["ok"]
            pid_file = base / "stray.pid"
            await rig.until("the stray started", pid_file.exists)
            stray = int(pid_file.read_text())
            if mode == "stray-clean":
                await rig.until("the stray runs sleep", lambda: psutil.Process(stray).name() == "sleep")
                assert psutil.Process(stray).environ() == {}, "no marker left to find it by"
            (rank,) = rig.alive()
            assert os.getpgid(stray) != os.getpgid(rank)
            with caplog.at_level(logging.WARNING, logger="flexmig.act.supervisor"):
                if how == "stop":
                    assert (await rig.call("jobs.stop", name="evil"))["ok"]
                else:
                    res = await rig.call("jobs.migrate", name="evil")
                    assert res["ok"], res
                    assert rig.record().state == "running" and rig.alive() != [rank]
            assert not _running(stray), f"the stray outlived the job's {how}"
            lines = [r.getMessage() for r in caplog.records if "left their rank's process group" in r.getMessage()]
            assert len(lines) == 1 and str(stray) in lines[0], lines
            if rig.act.supervisor.cgroups is not None:
                cgroup = rig.act.supervisor.cgroups.path(rig.record().uid)
                assert cgroup.exists() == (how == "migrate"), "a stopped job's cgroup is removed, a moved one's kept"

    run(scenario())


@needs_cgroups
def test_a_process_with_no_markers_in_the_cgroup_of_a_stopped_job_is_reported_as_an_unknown_rank(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.hostile("stray"))))["ok"]
            assert (await rig.call("jobs.stop", name="evil"))["ok"]
            rec = rig.record()
            cgroups = rig.act.supervisor.cgroups
            assert cgroups is not None and not cgroups.path(rec.uid).exists()
            # What a daemon that was away when the job stopped would find: a process of the job's in its cgroup,
            # its environment emptied.
            fd = cgroups.open_procs(rec.uid)
            try:
                survivor = await asyncio.create_subprocess_exec(
                    "/bin/sleep", "60", env={}, preexec_fn=lambda: os.write(fd, b"0")
                )
            finally:
                os.close(fd)
            await _reported_alone(rig, rec.uid, survivor)
            await rig.until("the survivor left the cgroup", lambda: not cgroups.pids(rec.uid))
            assert [r for r in await recovery.unknown_ranks(rig.act.executor) if r["job_id"] == rec.uid] == []
            assert not cgroups.path(rec.uid).exists(), "the empty cgroup of a job that no longer runs is removed"

    run(scenario())


async def _reported_alone(rig: Rig, uid: str, survivor: asyncio.subprocess.Process) -> None:
    """``survivor`` is the one unknown rank of the stopped job ``uid``, with no MIG device; it is killed after."""
    try:
        # (only this job's: other tests' simulated ranks on this machine may show up too)
        found = [r for r in await recovery.unknown_ranks(rig.act.executor) if r["job_id"] == uid]
        assert [r["pid"] for r in found] == [survivor.pid], found
        assert found[0]["job"] == "evil" and found[0]["target"] == "no MIG device"
    finally:
        survivor.kill()
        await survivor.wait()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --------------------------------------------------------------------------------------- other users
@needs_root
def test_a_same_name_job_of_another_user_never_resumes_from_the_first_users_checkpoint(base: Path) -> None:
    async def scenario(user: pwd.struct_passwd) -> None:
        async with Rig(base) as rig:
            first = rig.job([sys.executable, str(ROOT / "examples" / "hook_minimal.py"), "--log", f"{base}/c.log"])
            assert (await rig.call("jobs.submit", path=str(first)))["ok"]
            await rig.until("steps", lambda: (base / "c.log").exists() and (base / "c.log").stat().st_size > 200)
            assert (await rig.call("jobs.stop", name="evil"))["ok"]
            assert rig.record().last_ack is not None, "the first job checkpointed"
            theirs = base / "theirs"
            theirs.mkdir()
            os.chown(theirs, user.pw_uid, user.pw_gid)
            second = rig.job(["/usr/bin/printenv"], user=user.pw_name, work=theirs)
            assert (await rig.call("jobs.submit", path=str(second)))["ok"]
            rec = rig.record()
            log = base / "logs" / "evil" / f"g{rec.generation:04d}-r0.log"
            printed = lambda: log.exists() and b"FLEXMIG_JOB=" in log.read_bytes()  # noqa: E731
            await rig.until("the rank printed its environment", printed)
            env = log.read_text()
            assert f"{ENV_RESUME}=" not in env, f"another user's job was handed the checkpoint: {env}"
            assert rec.resume is None and rec.last_ack is None

    with scratch_user() as user:
        run(scenario(user))


@needs_root
def test_a_rank_that_writes_without_end_never_takes_more_than_its_log_cap_and_owns_its_log(base: Path) -> None:
    from flexmig.act.ranklogs import RankLogs  # noqa: PLC0415 - here, so the module's other tests run on older code

    cap, keep = 64 * 1024, 1

    async def scenario(user: pwd.struct_passwd) -> None:
        async with Rig(base, rank_logs=RankLogs(max_bytes=cap, keep=keep)) as rig:
            assert (await rig.call("jobs.submit", path=str(rig.job(["/usr/bin/yes"], user=user.pw_name))))["ok"]
            logs = base / "logs" / "evil"
            rotated = logs / "g0001-r0.log.1"
            seen: set[int] = set()

            def rotations() -> bool:
                with contextlib.suppress(FileNotFoundError):
                    seen.add(rotated.stat().st_ino)
                return len(seen) >= 5

            await rig.until("the log rotated five times", rotations)
            # Between a rename and the next file, only .1 may be there; a new file is made under a dot name first.
            names = {p.name for p in logs.iterdir() if not p.name.startswith(".")}
            assert names and names <= {"g0001-r0.log", "g0001-r0.log.1"}, names
            for p in (q for q in logs.iterdir() if not q.name.startswith(".")):
                try:
                    st = p.stat()
                except FileNotFoundError:  # rotated away meanwhile
                    continue
                assert st.st_size <= cap, (p, st.st_size)
                assert st.st_uid == user.pw_uid, "the job's user owns its output (its quota counts it)"
            assert rig.record().state == "running"

    with scratch_user() as user:
        run(scenario(user))


# ------------------------------------------------------------------------------------------- stopping
class StopAtFirstAction(MemorySink):
    """Events, and SIGTERM's effect on the executor (``stopping``) as soon as the first action of a plan begins."""

    def __init__(self) -> None:
        super().__init__()
        self.executor: Any = None

    def emit(self, event: ActEvent) -> None:
        super().emit(event)
        if event.kind == "action_started" and self.executor is not None:
            self.executor.stopping = True


def test_a_plan_begun_before_the_daemon_was_told_to_stop_starts_no_job_after_it(base: Path) -> None:
    async def scenario() -> None:
        events = StopAtFirstAction()
        async with Rig(base, events=events) as rig:
            events.executor = rig.act.executor
            res = await rig.call("jobs.submit", path=str(rig.hostile("finish")))
            kinds = {a["kind"]: a for a in res["actions"]}
            assert kinds["create_instance"]["outcome"] == "completed", res
            assert kinds["start"]["outcome"] == "skipped" and "the daemon is stopping" in kinds["start"]["error"]
            assert rig.alive() == [] and rig.record().state == "pending", "no job started after the stop"
            assert not rig.node.gpu(0).gpu_instances, "the instance the plan made for it was removed again"

    run(scenario())
