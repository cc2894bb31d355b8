"""What a Slurm administrator of a MIG cluster hit with flexmig's first Slurm agent, each as the rule it broke, against
a real Slurm 22.05 (munged, slurmctld, slurmd) on a simulated node: a killed slurmd, an administrator's drain,
down state and reservation (also in the last moment before flexmig takes the node out of Slurm), features and
weight set with ``scontrol update``, a hook job that ignores its signal, a change whose demand goes away, and a 7g
job among 1g jobs without time limits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from flexmig.act.journal import StepEvent
from flexmig.slurm.agent_read import SlurmRead, SlurmRound
from flexmig.slurm.reservations import PREFIX, flexmig_name
from support.slurm import SlurmRig, skip_reason
from support.wait import until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def test_slurmd_killed_with_two_jobs_running_comes_back_at_once_no_drain_no_job_lost() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            jobs = [rig.sleeper(f"--gres=gpu:{p}:1", "--time=1", seconds=8) for p in ("4g.71gb", "3g.71gb")]
            for j in jobs:
                await rig.wait_state(j, "RUNNING")
                await rig.started(j)  # its script runs (not slurmd still in the Prolog)
            pid = int(rig.paths.slurmd_pid(rig.node).read_text())
            os.kill(pid, signal.SIGKILL)
            states: list[str] = []

            async def back() -> bool:
                rnd = await rig.agent.round("act")
                node = (await rig.agent.read()).node
                assert node is not None
                states.append(f"{node.state}{'+DRAIN' if node.drained else ''}")
                return rnd.read is not None and await rig.agent.slurmd.running()

            await until(back, 20, "slurmd running again", not_yet=(Exception,))
            assert int(rig.paths.slurmd_pid(rig.node).read_text()) != pid
            assert ("slurmd_restarted", "slurmd crashed") in [(k, d.get("reason")) for k, d in rig.node_events]
            for j in jobs:
                done = await rig.wait_state(j, "COMPLETED")
                assert done.restart_count == 0  # no job lost, none requeued
            node = (await rig.agent.read()).node
            assert node is not None and node.responding and not node.drained
            assert not any("down" in s or "DRAIN" in s for s in states), states
            assert rig.act.journal.recent_actions(5)[0].payload.get("reason") == "first registration"  # no change
            await rig.close_flexmig()  # a flexmigd restart finds nothing to finish, and waits for nothing
            summary = await rig.open_flexmig()
            assert summary["plans"] == [], summary

    asyncio.run(scenario())


def test_an_administrators_drain_and_its_reason_are_never_changed() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            rig.run("scontrol", "update", f"nodename={rig.node}", "state=drain", "reason=maint")
            job = rig.sleeper("--gres=gpu:1g.18gb:1")  # needs a new layout, and the node is idle
            await rig.wait_state(job, "PENDING")
            actions = len(rig.act.journal.recent_actions())
            for _ in range(4):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and "drained (maint)" in rnd.note, rnd.note
                await rig.next_backfill_cycle()
            node = (await rig.agent.read()).node
            assert node is not None and node.drained and node.reason == "maint", node
            assert len(rig.act.journal.recent_actions()) == actions
            pending = await rig.job(job)
            assert pending is not None and pending.pending
            assert ("left_alone", "node fm-node is drained (maint); flexmig leaves it as it is") in [
                (k, d.get("reason")) for k, d in rig.node_events
            ]

    asyncio.run(scenario())


def test_an_administrators_maintenance_reservation_is_never_deleted() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            rig.run(
                "scontrol", "create", "reservation", "reservationname=maint", f"nodes={rig.node}",
                "starttime=now+3600", "duration=60", "users=root", "flags=maint,ignore_jobs",
            )  # fmt: skip
            job = rig.sleeper("--gres=gpu:1g.18gb:1")
            await rig.wait_state(job, "PENDING")
            for _ in range(3):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and "reservation maint" in rnd.note, rnd.note
            names = [r.name for r in await rig.agent.client.reservations()]
            assert names == ["maint"], names
            read = await rig.agent.read()
            assert read.registered_as == {"7g.141gb": 1}  # not re-registered: that would have deleted it

    asyncio.run(scenario())


def test_a_hook_job_that_ignores_its_signal_is_asked_once_and_the_node_stays_open() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4", settings={"ack_timeout_s": 3.0}) as rig:
            deaf = rig.sleeper("--requeue", "--comment=flexmig:hook", "--gres=gpu:3g.71gb:1", "--time=1", seconds=20)
            await rig.wait_state(deaf, "RUNNING")
            small = [rig.sleeper("--gres=gpu:1g.18gb:1", seconds=60) for _ in range(2)]
            for j in small:
                await rig.wait_state(j, "PENDING")
            first = await rig.change()
            assert first.result is not None and not first.result.ok, first
            assert [k for k, d in rig.node_events if d.get("slurm_job") == deaf] == ["ack_missed"], rig.node_events
            done: SlurmRound | None = None
            for _ in range(6):
                rnd = await rig.agent.round("act")
                if rnd.result is not None:  # only once the deaf job ended by itself (a loaded machine's slow rounds)
                    job = await rig.job(deaf)
                    assert job is not None and job.state in ("COMPLETED", "COMPLETING"), (job, rnd)
                    done = rnd
                    break
                await rig.next_backfill_cycle()
            if done is None:
                node = (await rig.agent.read()).node
                assert node is not None and not node.drained and "RESERVED" not in node.flags, node  # open meanwhile
                now = (await rig.agent.read()).now_s
                mine = [r for r in await rig.agent.client.reservations() if r.name == flexmig_name(rig.node)]
                assert all(r.start_s > now for r in mine), mine  # if committed: when the deaf job's limit ends
                assert rig.signals(deaf) == 1
                await rig.wait_state(deaf, "COMPLETED", timeout_s=40)
                done = await rig.change()
            assert done.result is not None and done.result.ok, done
            for j in small:
                await rig.wait_state(j, "RUNNING")
            assert rig.signals(deaf) == 1

    asyncio.run(scenario())


def test_a_waiting_change_lets_fitting_jobs_run_at_once_and_is_abandoned_when_its_demand_is_gone() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4", settings={"max_wait_s": 0.0}) as rig:
            long = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=5")
            await rig.wait_state(long, "RUNNING")
            big = rig.sleeper("--gres=gpu:7g.141gb:1", "--time=5")  # needs the whole GPU: waits for the 3g job
            await rig.wait_state(big, "PENDING")
            rnd = await rig.agent.round("act")
            assert "change committed" in rnd.note, rnd.note
            mine = next(r for r in await rig.agent.client.reservations() if r.name == flexmig_name(rig.node))
            assert rnd.read is not None and mine.start_s - rnd.read.now_s > 100  # halfway to the 3g job's limit
            fits = rig.sleeper("--gres=gpu:4g.71gb:1", "--time=1", seconds=30)  # a free instance, ends before it
            await rig.wait_state(fits, "RUNNING", timeout_s=10)
            rig.run("scancel", str(big))
            gone = await rig.agent.round("act")
            assert "change abandoned" in gone.note, gone.note
            assert "change_abandoned" in [k for k, _ in gone.events]
            assert not any(r.name == flexmig_name(rig.node) for r in await rig.agent.client.reservations())

    asyncio.run(scenario())


def test_a_7g_job_does_not_starve_behind_later_1g_jobs_without_time_limits() -> None:
    # Jobs without --time give no hint of when the node would empty: the forecast cannot justify closing it, and the
    # bound max_wait_s (aging) does: the 7g job starts once it waited that long, and no later 1g job overtakes it.
    async def scenario() -> None:
        spec = "h200:" + "+".join(f"1g.18gb@{s}" for s in (0, 1, 2, 3, 4, 5, 6))
        async with SlurmRig(spec, settings={"min_interval_s": 300.0, "max_wait_s": 20.0}) as rig:
            first = [rig.sleeper("--gres=gpu:1g.18gb:1", seconds=6) for _ in range(3)]  # no --time: no limit
            for j in first:
                await rig.wait_state(j, "RUNNING")
            big = rig.sleeper("--gres=gpu:7g.141gb:1", seconds=2)
            await rig.wait_state(big, "PENDING")
            later: list[int] = []
            committed: list[int] = []
            last = [0.0]

            async def started() -> bool:
                if time.monotonic() - last[0] >= 1.0:  # a steady stream of small jobs, one a second
                    last[0] = time.monotonic()
                    later.append(rig.sleeper("--gres=gpu:1g.18gb:1", seconds=6))
                rnd = await rig.agent.round("act")
                if "change committed" in rnd.note:
                    committed.append(len(later))
                    assert rnd.verdict is not None and rnd.verdict.forced, rnd.verdict  # by the bound, not the forecast
                j = await rig.job(big)
                return j is not None and j.state in ("RUNNING", "COMPLETED")

            await until(started, 180, "the 7g job started", not_yet=(Exception,))
            assert committed, "the change was never committed"
            big_job = await rig.job(big)
            assert big_job is not None and big_job.start_s is not None
            for j in later[committed[0] :]:  # submitted once the node was closed for the 7g job
                x = await rig.job(j)
                assert x is not None and (x.start_s is None or x.start_s >= big_job.start_s), (j, x)

    asyncio.run(scenario())


def test_the_site_wide_limit_keeps_a_node_open_while_another_is_closed_for_flexmig() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4", settings={"max_closed_nodes": 1, "max_wait_s": 0.0}) as rig:
            other = f"{PREFIX}elsewhere"  # another node's change, as every node sees it in Slurm
            rig.run(
                "scontrol", "create", "reservation", f"reservationname={other}", f"nodes={rig.testbed.future_node}",
                "starttime=now", "duration=30", "users=root", "flags=ignore_jobs",
            )  # fmt: skip
            long = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=5")
            await rig.wait_state(long, "RUNNING")
            big = rig.sleeper("--gres=gpu:7g.141gb:1", "--time=5")
            await rig.wait_state(big, "PENDING")
            rnd = await rig.agent.round("act")
            assert "site limit" in rnd.note, rnd.note
            assert [r.name for r in await rig.agent.client.reservations()] == [other]
            rig.run("scontrol", "delete", f"reservation={other}")
            again = await rig.agent.round("act")
            assert "change committed" in again.note, again.note

    asyncio.run(scenario())


def test_a_node_an_administrator_downed_stays_down_even_when_its_slurmd_dies() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            rig.run("scontrol", "update", f"nodename={rig.node}", "state=down", "reason=broken fan")
            job = rig.sleeper("--gres=gpu:1g.18gb:1")  # needs a new layout
            await rig.wait_state(job, "PENDING")
            for _ in range(3):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and "down (broken fan)" in rnd.note, rnd.note
            pid = int(rig.paths.slurmd_pid(rig.node).read_text())
            os.kill(pid, signal.SIGKILL)  # slurmd dies on the node the administrator took out of service
            await until(lambda: _crashed(rig), what="slurmd seen crashed", not_yet=(Exception,))
            for _ in range(4):
                rnd = await rig.agent.round("act")
                assert rnd.result is None and "down (broken fan)" in rnd.note, rnd.note
                await rig.next_backfill_cycle()
            assert await rig.agent.slurmd.state() == "crashed"  # not started again: it would end the DOWN state
            node = (await rig.agent.read()).node
            assert node is not None and node.state == "down" and node.reason == "broken fan", node
            assert "slurmd_restarted" not in [k for k, _ in rig.node_events]
            assert rig.act.journal.recent_actions(5)[0].payload.get("reason") == "first registration"
            pending = await rig.job(job)
            assert pending is not None and pending.pending

    asyncio.run(scenario())


async def _crashed(rig: SlurmRig) -> bool:
    return await rig.agent.slurmd.state() == "crashed"


def test_a_crashed_slurmd_on_a_drained_node_comes_back_its_job_completes_and_the_drain_stays() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:4g.71gb@0+3g.71gb@4") as rig:
            job = rig.sleeper("--gres=gpu:3g.71gb:1", "--time=1", seconds=8)
            await rig.wait_state(job, "RUNNING")
            await rig.started(job)  # its script runs (not slurmd still in the Prolog)
            rig.run("scontrol", "update", f"nodename={rig.node}", "state=drain", "reason=maint")
            os.kill(int(rig.paths.slurmd_pid(rig.node).read_text()), signal.SIGKILL)
            await until(lambda: _crashed(rig), what="slurmd seen crashed", not_yet=(Exception,))
            rnd = await rig.agent.round("act")
            assert ("slurmd_restarted", "slurmd crashed") in [(k, d.get("reason")) for k, d in rnd.events], rnd
            done = await rig.wait_state(job, "COMPLETED")
            assert done.restart_count == 0
            node = (await rig.agent.read()).node
            assert node is not None and node.drained and node.reason == "maint", node

    asyncio.run(scenario())


def _admin_at(step: str, phase: str, action: Callable[[], None]) -> tuple[Callable[[StepEvent], None], dict[str, bool]]:
    """An on_step hook that runs ``action`` (an administrator's command) once, right after ``step``'s commit, once
    armed (``armed["on"] = True``)."""
    armed = {"on": False}

    def on_step(ev: StepEvent) -> None:
        if armed["on"] and ev.action_kind == "slurm_reregister" and ev.step == step and ev.phase == phase:
            armed["on"] = False
            action()

    return on_step, armed


@pytest.mark.parametrize("what", ["drain", "reservation"])
def test_an_administrators_drain_or_reservation_just_before_the_delete_cancels_the_change(what: str) -> None:
    rig_box: list[SlurmRig] = []

    def admin() -> None:  # the last moment before `scontrol delete nodename`: flexmig's reservation is gone
        rig = rig_box[0]
        if what == "drain":
            rig.run("scontrol", "update", f"nodename={rig.node}", "state=drain", "reason=maint")
        else:
            rig.run(
                "scontrol", "create", "reservation", "reservationname=maint", f"nodes={rig.node}",
                "starttime=now+3600", "duration=60", "users=root", "flags=maint,ignore_jobs",
            )  # fmt: skip

    hook, armed = _admin_at("unreserve", "done", admin)

    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0", on_step=hook) as rig:
            rig_box.append(rig)
            job = rig.sleeper("--gres=gpu:1g.18gb:1")
            await rig.wait_state(job, "PENDING")
            armed["on"] = True
            rnd = await rig.agent.round("act")
            assert rnd.result is not None and not rnd.result.ok, rnd
            (action,) = rnd.result.results
            assert action.outcome == "cancelled" and "before the node left Slurm" in (action.error or ""), action

            # slurmd runs again and registers; slurmctld may still flag the node NOT_RESPONDING for a ping it sent
            # while slurmd was stopped, until its next ping (at most SlurmdTimeout / 3)
            async def answers() -> SlurmRead | None:
                got = await rig.agent.read()
                return got if got.node is not None and got.node.responding else None

            read: SlurmRead = await until(answers, 40, "the node answers with the GRES it had", not_yet=(Exception,))
            assert read.node is not None
            assert read.registered_as == {"7g.141gb": 1}  # never deleted, never changed
            if what == "drain":
                assert read.node.drained and read.node.reason == "maint", read.node
            else:
                assert [r.name for r in read.reservations] == ["maint"]
                assert not read.node.drained, read.node  # flexmig's own drain undone
            for _ in range(3):
                again = await rig.agent.round("act")
                assert again.result is None and "flexmig leaves it as it is" in again.note, again.note
            pending = await rig.job(job)
            assert pending is not None and pending.pending

    asyncio.run(scenario())


def test_features_weight_and_comment_an_administrator_set_survive_a_re_registration() -> None:
    async def scenario() -> None:
        async with SlurmRig("h200:7g.141gb@0") as rig:
            rig.run(
                "scontrol", "update", f"nodename={rig.node}",
                "features=mig,nvlink", "weight=7", "comment=rack 4, ticket 42",
            )  # fmt: skip
            jobs = [rig.sleeper("--gres=gpu:1g.18gb:1") for _ in range(2)]
            for j in jobs:
                await rig.wait_state(j, "PENDING")
            rnd = await rig.change()
            assert rnd.result is not None and rnd.result.ok, rnd
            for j in jobs:
                await rig.wait_state(j, "RUNNING")
            shown = rig.run("scontrol", "show", "node", rig.node)
            assert "Gres=gpu:1g.18gb:" in shown, shown  # re-registered with its new instances
            for line in (
                "AvailableFeatures=mig,nvlink",
                "ActiveFeatures=mig,nvlink",
                "Weight=7",
                "Comment=rack 4, ticket 42",
            ):
                assert line in shown, shown

    asyncio.run(scenario())
