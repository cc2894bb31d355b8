"""The executor on a simulated node with real rank processes: start, migrate, re-split, stop, safety rules, faults.

Each test runs the real Actuator (journal, supervisor, executor, jobs API) in this process over the real
``flexmig.nvml`` on the simulated library; ranks are real processes running ``examples/hook_minimal.py`` (or a
small misbehaving script written by the test).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig.act.journal import StepEvent
from flexmig.config import Mode
from flexmig.errors import FlexmigError, PlanRejectedError
from flexmig.mig import H200
from flexmig.plan.types import DestroyInstance, Instance, MigrateJob, Plan
from support.simact import SimActuator
from support.wait import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "examples" / "hook_minimal.py"
P1G = H200.profile("1g.18gb")
P2G = H200.profile("2g.35gb")


class Rig(SimActuator):
    """A simulated node with the actuator on it, in this process."""

    def __init__(
        self,
        base: Path,
        spec: str,
        mode: Mode = "act",
        on_step: Callable[[StepEvent], None] | None = None,
        ack_dir: Path | None = None,
    ) -> None:
        super().__init__(base, spec, mode=mode, on_step=on_step, ack_dir=ack_dir)

    # ------------------------------------------------------------------------------------------- helpers
    def job(
        self,
        name: str = "counter",
        *,
        ranks: int = 2,
        rmax: int = 4,
        script: Path = MINIMAL,
        profile: str = "1g.18gb",
        ack_timeout_s: float = 10,
        user: str | None = None,
        extra: str = "",
    ) -> Path:
        """Write a job spec for ``script`` (log at BASE/NAME.log) and return its path."""
        user = user or pwd.getpwuid(os.geteuid()).pw_name
        text = textwrap.dedent(
            f"""\
            name = "{name}"
            argv = ["{sys.executable}", "{script}", "--log", "{self.base}/{name}.ckpt/{name}.log", "--log-every", "5"]
            user = "{user}"
            working_dir = "{self.base}"
            checkpoint_dir = "{self.base}/{name}.ckpt"
            [ranks]
            min = 1
            max = {rmax}
            start = {ranks}
            [need]
            profile = "{profile}"
            [hook]
            ack_timeout_s = {ack_timeout_s}
            exit_timeout_s = 5
            """
        )
        path = self.base / f"{name}.toml"
        path.write_text(text + extra)
        path.chmod(0o644)
        return path

    def log(self, name: str = "counter") -> list[dict[str, Any]]:
        p = self.base / f"{name}.ckpt" / f"{name}.log"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    async def stepped(self, name: str = "counter", past: int = 10) -> dict[str, Any]:
        """Wait until the job's current generation has started and run ``past`` steps; returns its start event."""

        def ok() -> dict[str, Any] | None:
            rec = self.record(name)
            log = self.log(name)
            starts = [i for i, e in enumerate(log) if e["event"] == "start" and e["generation"] == str(rec.generation)]
            if not starts:
                return None
            start = log[starts[-1]]
            later = log[starts[-1] :]
            return start if any(e["event"] == "step" and e["step"] >= start["step"] + past for e in later) else None

        got: dict[str, Any] = await until(ok, what=f"job {name}'s new generation {past} steps in")
        return got

    def layout(self, gpu: int = 0) -> str:
        layout = self.node.gpu(gpu).layout
        assert layout is not None
        return layout.spec()

    def pids_on(self, gpu: int = 0) -> dict[str, set[int]]:
        g = self.node.gpu(gpu)
        return {
            f"{gi.profile.name}@{gi.start}": {p.pid for ci in gi.compute_instances for p in ci.processes}
            for gi in g.gpu_instances
        }

    def record(self, name: str = "counter") -> Any:
        return self.act.journal.get_job(name)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events.events]


@pytest.fixture
def base() -> Iterator[Path]:
    # World-traversable, so a job dropped to 'nobody' can reach its files (pytest's tmp dirs are 0700).
    d = Path(tempfile.mkdtemp(prefix="flexmig-act-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------ happy paths
def test_submit_starts_one_rank_per_new_instance_each_seeing_only_its_mig_device(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            res = await rig.call("jobs.submit", path=str(rig.job()))
            assert res["ok"], res
            assert rig.layout() == "1g.18gb@0+1g.18gb@1"
            await rig.stepped()
            rec = rig.record()
            assert rec.state == "running" and rec.generation == 1
            starts = [e for e in rig.log() if e["event"] == "start"]
            assert {e["visible"] for e in starts} <= {s.uuid for s in rec.slots}
            pids = {h.proc.pid for h in rig.act.supervisor.alive("counter")}
            assert set().union(*rig.pids_on().values()) == pids, "NVML lists each rank on its MIG device"

    run(scenario())


def test_migration_resumes_at_the_acknowledged_step_plus_one_on_the_new_instances(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            await rig.call("jobs.submit", path=str(rig.job()))
            await rig.stepped()
            old = rig.record()
            res = await rig.call("jobs.migrate", name="counter")
            assert res["ok"], res
            new = rig.record()
            assert new.generation == old.generation + 1
            assert {s.key for s in new.slots} == {(0, 2), (0, 3)}
            assert rig.layout() == "1g.18gb@2+1g.18gb@3", "the sources were destroyed after the move"
            start = await rig.stepped()
            assert start["step"] == new.resume.step + 1 == new.last_ack.step + 1
            assert start["total"] == sum(range(start["step"])), "state restored exactly from the checkpoint"
            assert start["visible"] in {s.uuid for s in new.slots}
            kinds = [(e.kind, e.action) for e in rig.events.events if e.action == "migrate"]
            assert kinds == [("action_started", "migrate"), ("action_completed", "migrate")]
            done = next(e for e in rig.events.events if e.kind == "action_completed" and e.action == "migrate")
            assert [n for n, _ in done.steps] == [
                "clear_ack",
                "request",
                "await_ack",
                "await_exit",
                "layout",
                "launch",
            ] and done.duration_s is not None

    run(scenario())


def test_resplit_relaunches_with_the_new_world_size_and_keeps_the_instances_it_had(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            await rig.call("jobs.submit", path=str(rig.job()))
            await rig.stepped()
            assert (await rig.call("jobs.resplit", name="counter", ranks=3))["ok"]
            rec = rig.record()
            assert [s.key for s in rec.slots] == [(0, 0), (0, 1), (0, 2)]
            assert (await rig.stepped())["world"] == 3
            assert (await rig.call("jobs.resplit", name="counter", ranks=1))["ok"]
            assert rig.layout() == "1g.18gb@0", "instances the job left were destroyed"
            with pytest.raises(FlexmigError, match=r"may run 1\.\.4 ranks, not 5"):
                await rig.call("jobs.resplit", name="counter", ranks=5)

    run(scenario())


def test_stop_waits_for_the_checkpoint_and_resubmitting_resumes_from_it(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            spec = rig.job()
            await rig.call("jobs.submit", path=str(spec))
            await rig.stepped()
            assert (await rig.call("jobs.stop", name="counter"))["ok"]
            rec = rig.record()
            assert rec.state == "stopped" and rec.last_ack is not None
            assert not rig.act.supervisor.alive("counter")
            await rig.call("jobs.submit", path=str(spec))
            start = await rig.stepped(past=2)
            assert start["step"] == rec.last_ack.step + 1

    run(scenario())


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_ranks_run_as_the_spec_user_never_as_root(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            # The venv's interpreter lives under /root (0700), out of nobody's reach: run a plain program.
            spec = rig.job(user="nobody", ranks=1)
            text = spec.read_text().splitlines()
            text[1] = 'argv = ["sleep", "600"]'
            spec.write_text("\n".join(text) + "\n")
            assert (await rig.call("jobs.submit", path=str(spec)))["ok"]
            (h,) = rig.act.supervisor.alive("counter")
            assert psutil.Process(h.proc.pid).uids().effective == pwd.getpwnam("nobody").pw_uid
            assert (base / "counter.ckpt").stat().st_uid == pwd.getpwnam("nobody").pw_uid

    run(scenario())


def test_a_restarted_actuator_adopts_running_ranks_and_can_still_move_them(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            await rig.call("jobs.submit", path=str(rig.job()))
            await rig.stepped()
            pids = {h.proc.pid for h in rig.act.supervisor.alive("counter")}
            summary = await rig.restart()
            assert set(summary["adopted"]["counter"]) == pids
            assert (await rig.call("jobs.migrate", name="counter"))["ok"]
            await rig.stepped(past=2)
            assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie" for p in pids)

    run(scenario())


def test_acknowledgements_can_go_to_a_daemon_owned_directory_nobody_can_list(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200", ack_dir=base / "acks") as rig:
            assert (base / "acks").stat().st_mode & 0o7777 == 0o1733
            await rig.call("jobs.submit", path=str(rig.job(ranks=1)))
            await rig.stepped()
            (h,) = rig.act.supervisor.alive("counter")
            env = psutil.Process(h.proc.pid).environ()
            rec = rig.record()
            assert env["FLEXMIG_ACK_PATH"] == str(base / "acks" / f"counter.{rec.uid}.ack.json")
            assert (await rig.call("jobs.migrate", name="counter"))["ok"]
            assert (await rig.stepped(past=2))["step"] == rig.record().last_ack.step + 1

    run(scenario())


def test_a_job_that_finishes_is_done_and_one_whose_rank_crashes_is_failed_with_its_peers_stopped(base: Path) -> None:
    hang = _script(
        base, "hang.py", "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(7)\ntime.sleep(600)\n"
    )

    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            spec = rig.job(name="short", ranks=2)
            spec.write_text(spec.read_text().replace('"--log-every"', '"--steps", "20", "--log-every"'))
            await rig.call("jobs.submit", path=str(spec))
            rec = await until(lambda: (r := rig.record("short")).state != "running" and r, what="job short ended")
            assert rec.state == "done" and rec.error is None
            assert [e["event"] for e in rig.log("short")][-1] == "done"

            await rig.call("jobs.submit", path=str(rig.job(name="bad", script=hang)))
            rec = await until(lambda: (r := rig.record("bad")).state != "running" and r, what="job bad ended")
            assert rec.state == "failed" and rec.error == "rank 1 exited with status 7"
            await until(lambda: not rig.act.supervisor.alive("bad"), what="job bad's ranks gone")
            assert "job_failed" in rig.kinds()

    run(scenario())


# ---------------------------------------------------------------------------------------- safety rules
@pytest.mark.parametrize("mode", ["observe", "advise"])
def test_observe_and_advise_never_act(base: Path, mode: Mode) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0", mode=mode) as rig:
            with pytest.raises(PlanRejectedError, match=f"mode is '{mode}'") as err:
                await rig.call("jobs.submit", path=str(rig.job()))
            if mode == "advise":
                assert "StartJob counter" in str(err.value), "advise shows the plan it would have run"
            plan = Plan((DestroyInstance(0, 0, P1G, "test", 1.0),))
            with pytest.raises(PlanRejectedError, match="changes nothing outside mode 'act'"):
                await rig.act.execute(plan)
            assert rig.act.journal.unfinished_plans() == [] and rig.act.journal.recent_actions() == []
            assert rig.layout() == "1g.18gb@0" and rig.act.journal.jobs() == []
            assert await rig.call("jobs.list") == []

    run(scenario())


def test_an_instance_running_a_process_of_no_registered_job_is_never_destroyed(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0+1g.18gb@1") as rig:
            foreign = rig.node.start_process(rig.node.gpu(0).mig_uuid_at(1))
            res = await rig.act.execute(Plan((DestroyInstance(0, 1, P1G, "defragment", 1.0),)))
            assert not res.ok and "no registered job" in (res.results[0].error or "")
            assert rig.layout() == "1g.18gb@0+1g.18gb@1"
            assert foreign in rig.pids_on()["1g.18gb@1"]

    run(scenario())


def test_a_job_sharing_its_instance_with_a_foreign_process_is_not_moved(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200") as rig:
            await rig.call("jobs.submit", path=str(rig.job(ranks=1)))
            await rig.stepped()
            rec = rig.record()
            rig.node.start_process(rec.slots[0].uuid)
            res = await rig.call("jobs.migrate", name="counter")
            assert not res["ok"]
            assert any("no registered job" in (a["error"] or "") for a in res["actions"])
            assert rig.record().generation == rec.generation, "no checkpoint was even requested"
            assert rig.layout() == "1g.18gb@0", json.dumps(res, indent=1)

    run(scenario())


# ------------------------------------------------------------------------------------------------ faults
def _in_place_move(rig: Rig) -> Plan:
    (slot,) = rig.record().slots
    return Plan((MigrateJob("counter", (Instance(0, slot.start, P1G),), (Instance(0, 0, P2G),), "grow", 1.0),))


@pytest.mark.parametrize(
    ("call", "code"),
    [("nvmlGpuInstanceDestroy", "IN_USE"), ("nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")],
)
def test_nvml_errors_during_a_migration_roll_back_to_the_old_instance(base: Path, call: str, code: str) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0") as rig:
            await rig.call("jobs.submit", path=str(rig.job(ranks=1)))
            await rig.stepped()
            rig.node.inject_error(call, code, gpu=0, times=1)
            res = await rig.act.execute(_in_place_move(rig))
            (r,) = res.results
            assert r.outcome == "failed" and code in (r.error or "") and "rolled back" in (r.error or "")
            rec = rig.record()
            assert rec.state == "running" and [s.key for s in rec.slots] == [(0, 0)]
            assert rig.layout() == "1g.18gb@0"
            start = await rig.stepped(past=3)
            assert start["step"] == rec.last_ack.step + 1, "relaunched from the acknowledged checkpoint"
            failed = [e for e in rig.events.events if e.kind == "action_failed"]
            assert len(failed) == 1 and code in (failed[0].error or "")

    run(scenario())


def test_a_gpu_lost_mid_migration_leaves_the_job_failed_with_its_checkpoint_kept(base: Path) -> None:
    rig_box: list[Rig] = []

    def lose_after_destroy(ev: StepEvent) -> None:
        if ev.step == "destroy:0@0" and ev.phase == "done":
            rig_box[0].node.lose_gpu(0)

    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0", on_step=lose_after_destroy) as rig:
            rig_box.append(rig)
            await rig.call("jobs.submit", path=str(rig.job(ranks=1)))
            await rig.stepped()
            res = await rig.act.execute(_in_place_move(rig))
            (r,) = res.results
            assert r.outcome == "failed" and "GPU_IS_LOST" in (r.error or "")
            rec = rig.record()
            assert rec.state == "failed" and "roll-back failed too" in (rec.error or "")
            assert rec.last_ack is not None and await asyncio.to_thread(Path(rec.last_ack.checkpoint).is_file)
            assert not rig.act.supervisor.alive("counter")
            assert [e.kind for e in rig.events.events if e.kind in ("job_failed", "action_failed")] == [
                "job_failed",
                "action_failed",
            ]

    run(scenario())


NO_HOOK = "import time\nwhile True:\n    time.sleep(0.01)\n"

CRASH_ON_CHECKPOINT = """\
import sys, time
from flexmig import hook
h = hook.install()
(h.checkpoint_dir / f"ready-{h.rank}").touch()   # the hook answers a checkpoint request from now on
while True:
    time.sleep(0.01)
    if h.should_checkpoint():
        if h.rank == 1:
            sys.exit(3)   # rank 1 dies while saving; rank 0 waits for it forever, as in a collective
"""

LATE_RANK = """\
import os, sys, time
from pathlib import Path
from flexmig import hook
h = hook.install(handler=False)
if h.rank == 1:   # still starting up (importing torch, say) when the request comes: the signal is ignored meanwhile
    while not (h.checkpoint_dir / "release").exists():
        time.sleep(0.01)
h.install_handler()
(h.checkpoint_dir / f"ready-{h.rank}").touch()
while True:
    time.sleep(0.01)
    if h.should_checkpoint():
        p = h.checkpoint_dir / f"rank{h.rank}-gen{os.environ['FLEXMIG_GENERATION']}.json"
        hook.atomic_write_json(p, {"step": 0})
        h.acknowledge(0, p)
        sys.exit(0)
"""

SLOW_ACK = """\
import json, sys, time
from flexmig import hook
h = hook.install()
step = json.loads(h.resume.read_text())["step"] + 1 if h.resume else 0
with open(h.checkpoint_dir / "starts.log", "a") as f:
    f.write(json.dumps({"step": step, "resume": str(h.resume) if h.resume else None}) + "\\n")
while True:
    time.sleep(0.01)
    if h.should_checkpoint():
        time.sleep(1.0)   # a checkpoint slower than the daemon's patience
        p = h.checkpoint_dir / f"step-{step}.json"
        hook.atomic_write_json(p, {"step": step})
        h.acknowledge(step, p)
        sys.exit(0)
    step += 1
"""


def _script(base: Path, name: str, text: str) -> Path:
    p = base / name
    p.write_text(text)
    return p


def test_a_job_that_never_acknowledges_keeps_running_and_the_move_is_cancelled(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0+1g.18gb@1") as rig:
            spec = rig.job(script=_script(base, "nohook.py", NO_HOOK), ack_timeout_s=0.6)
            await rig.call("jobs.submit", path=str(spec))
            pids = {h.proc.pid for h in rig.act.supervisor.alive("counter")}
            res = await rig.call("jobs.migrate", name="counter")
            assert not res["ok"]
            migrate = next(a for a in res["actions"] if a["kind"] == "migrate")
            assert migrate["outcome"] == "cancelled" and "did not acknowledge" in migrate["error"]
            assert {h.proc.pid for h in rig.act.supervisor.alive("counter")} == pids, "same ranks, still running"
            assert rig.layout() == "1g.18gb@0+1g.18gb@1", "targets created for the move were removed"
            assert rig.record().state == "running"
            assert "action_cancelled" in rig.kinds()

    run(scenario())


def test_a_rank_that_was_not_listening_when_asked_is_asked_again_until_it_exits(base: Path) -> None:
    """Rank 0 acknowledges at once; rank 1 installs its hook only afterwards. The daemon keeps asking the ranks still
    running, so rank 1 checkpoints and exits by itself instead of being killed at the exit timeout."""

    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0+1g.18gb@1") as rig:
            await rig.call("jobs.submit", path=str(rig.job(script=_script(base, "late.py", LATE_RANK))))
            ckpt = base / "counter.ckpt"
            await until((ckpt / "ready-0").exists, what="rank 0 of the standby generation ready")
            moving = asyncio.create_task(rig.call("jobs.migrate", name="counter"))
            await until((ckpt / "rank0-gen1.json").exists, what="rank 0's acknowledgement")  # then it exits
            assert not (ckpt / "ready-1").exists(), "rank 1 was not listening when the request came"
            (ckpt / "release").touch()
            res = await moving
            assert res["ok"], res
            assert (ckpt / "rank1-gen1.json").exists(), "rank 1 was asked again and checkpointed"
            (await_exit,) = rig.act.journal.db.execute("SELECT result FROM steps WHERE name = 'await_exit'").fetchall()
            result = json.loads(await_exit[0])
            assert result["forced"] is False and set(result["exit_codes"].values()) == {0}, result

    run(scenario())


def test_a_job_that_crashes_while_checkpointing_is_marked_failed_and_its_ranks_stopped(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0+1g.18gb@1") as rig:
            await rig.call("jobs.submit", path=str(rig.job(script=_script(base, "crash.py", CRASH_ON_CHECKPOINT))))
            ckpt = base / "counter.ckpt"
            await until(lambda: (ckpt / "ready-0").exists() and (ckpt / "ready-1").exists(), what="both standby ranks")
            res = await rig.call("jobs.migrate", name="counter")
            migrate = next(a for a in res["actions"] if a["kind"] == "migrate")
            assert migrate["outcome"] == "failed"
            assert "crashed while checkpointing (rank 1 exited with status 3)" in migrate["error"]
            rec = rig.record()
            assert rec.state == "failed" and "rank 1 exited with status 3" in (rec.error or "")
            assert not rig.act.supervisor.alive("counter"), "the hanging rank 0 was terminated"
            assert rig.layout() == "1g.18gb@0+1g.18gb@1"
            assert "job_failed" in rig.kinds()

    run(scenario())


def test_a_late_acknowledgement_after_a_cancelled_move_resumes_the_job_in_place(base: Path) -> None:
    async def scenario() -> None:
        async with Rig(base, "h200:1g.18gb@0") as rig:
            spec = rig.job(script=_script(base, "slow.py", SLOW_ACK), ranks=1, ack_timeout_s=0.3)
            await rig.call("jobs.submit", path=str(spec))
            starts = base / "counter.ckpt" / "starts.log"
            await until(starts.exists, what="the starts file")  # written once the hook is installed
            res = await rig.call("jobs.migrate", name="counter")
            assert next(a for a in res["actions"] if a["kind"] == "migrate")["outcome"] == "cancelled"
            lines = await until(
                lambda: len(starts.read_text().splitlines()) >= 2 and starts.read_text(), what="a second start"
            )
            second = json.loads(lines.splitlines()[1])
            rec = await until(lambda: (r := rig.record()).generation == 2 and r, what="generation 2 in the journal")
            assert second["resume"] == rec.last_ack.checkpoint and second["step"] == rec.last_ack.step + 1
            assert rec.state == "running" and [s.key for s in rec.slots] == [(0, 0)]

    run(scenario())
