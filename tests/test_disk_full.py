"""Disk full in the middle of a migration or a re-split: the action waits for space and then carries on, the job
runs once at its checkpoint, and while it waits no job claims ranks that do not exist.

The actuator's state directory (journal and rank logs) is a real tmpfs of 16 MiB. The journal's connection reports
each statement it runs (SQLite's trace callback); at a chosen COMMIT the test fills the file system to the last
byte, so that very write fails as it would on a full disk. It then looks at ``jobs.list`` while the action waits,
and frees the space. Every third journal write of a move gets this, at offsets 0, 1 and 2 over three moves, so
every write of a migration and of a re-split (each way) is hit once. The job is ``examples/hook_minimal.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig import sim
from flexmig.act.client import ControlClient
from flexmig.act.events import MemorySink
from flexmig.act.procs import PsutilScanner
from flexmig.act.service import Actuator
from flexmig.jobs import JobPolicy
from flexmig.nvml import Nvml, NvmlWorker
from support.diskfull import Tmpfs
from support.flexmigd import act_node, short_base, wait_until
from support.jobs import counter_spec, kill_ranks, log_lines, write_spec

pytestmark = [pytest.mark.integration, pytest.mark.fault, pytest.mark.timeout(240)]

WAIT_S = 60.0


class Node:
    """The actuator (mode act) on a simulated H200, its state directory on a tmpfs the test fills at will."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.fs = Tmpfs(base / "state")
        self.events = MemorySink()
        self.commits = 0
        self.targets: Callable[[int], bool] | None = None
        self.filled = asyncio.Event()
        self.hits: list[int] = []
        self._retry_next = False

    async def start(self) -> None:
        self.fs.__enter__()
        self.sim = sim.install("h200", state_path=self.base / "sim.json")
        self.nvml = Nvml.open()
        self.worker = NvmlWorker()
        self.act = Actuator.build(
            mode="act",
            nvml=self.nvml,
            offload=self.worker.call,
            devices=sim.SimProcessTable(self.sim),
            journal_path=self.base / "state" / "journal.sqlite3",
            logs_dir=self.base / "state" / "logs",
            policy=JobPolicy((self.base,)),
            events=self.events,
            poll_s=0.01,
            resend_s=0.3,
            term_grace_s=3.0,
        )
        await self.act.start()
        self.act.executor.durable.first_s, self.act.executor.durable.longest_s = 0.05, 0.2
        self.control = self.act.control_server(self.base / "control.sock")
        self.act.journal.db.set_trace_callback(self._trace)

    async def stop(self) -> None:
        try:
            self.fs.free()
            for rec in self.act.journal.jobs():
                await self.act.supervisor.terminate(rec.name, 3.0)
        finally:
            await asyncio.to_thread(kill_ranks, self.base / "state" / "journal.sqlite3", base=self.base)
            await self.act.close()
            self.worker.shutdown()
            self.nvml.close()
            sim.uninstall()
            self.fs.__exit__()

    def _trace(self, sql: str) -> None:
        """Fill the disk right before the chosen COMMITs run (on the event loop's thread, inside the write)."""
        if sql.strip().upper() != "COMMIT" or self.fs.full:
            return  # attempts while the disk is full are the same write, tried again
        if self._retry_next:  # the first COMMIT after the space came back: the stalled write going through
            self._retry_next = False
            return
        self.commits += 1
        if self.targets is not None and self.targets(self.commits):
            self.fs.fill()
            self.hits.append(self.commits)
            self._retry_next = True
            self.filled.set()

    async def dispatch(self, op: str, **args: Any) -> dict[str, Any]:
        return await self.control.dispatch(json.dumps({"op": op, "args": args}).encode())

    async def until(self, what: str, probe: Callable[[], object]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not probe():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def node_with_job(ranks: int = 1) -> AsyncIterator[Node]:
    with short_base("fm-full-") as base:
        node = Node(base)
        await node.start()
        try:
            spec = counter_spec(base, "train", ranks=1, max_ranks=2)
            spec = spec.replace('user = "root"', f'user = "{pwd.getpwuid(os.geteuid()).pw_name}"')
            answer = await node.dispatch("jobs.submit", path=str(write_spec(base / "train.toml", spec)))
            assert answer["ok"], answer
            await node.until("the job's rank", lambda: len(node.act.supervisor.alive("train")) == 1)
            if ranks != 1:
                assert (await node.dispatch("jobs.resplit", name="train", ranks=ranks))["ok"]
            yield node
        finally:
            await node.stop()


def check_truthful(listing: dict[str, Any]) -> None:
    """No job said to be running has fewer live processes than ranks."""
    assert listing["ok"], listing
    for job in listing["result"]:
        alive = [p for p in job["pids"] if psutil.pid_exists(p)]
        if job["state"] == "running":
            assert len(alive) == job["ranks"], f"job {job['name']} claims {job['ranks']} running ranks: {job}"


async def check_runs_once_at_its_checkpoint(node: Node) -> None:
    rec = node.act.journal.get_job("train")
    assert rec is not None and rec.state == "running" and rec.resume is not None, rec
    live = await asyncio.to_thread(PsutilScanner().find, rec.uid)
    assert sorted((f.generation, f.slot) for f in live) == [(rec.generation, i) for i in range(len(rec.slots))]
    log = node.base / "train.log"

    def started() -> list[dict[str, Any]]:
        return [e for e in log_lines(log) if e["event"] == "start" and e["generation"] == str(rec.generation)]

    await node.until("the new generation's start", started)
    (start,) = started()
    assert start["resume"] == rec.resume.checkpoint and start["step"] == rec.resume.step + 1, (start, rec.resume)
    gens = [e["generation"] for e in log_lines(log) if e["event"] == "start"]
    assert len(gens) == len(set(gens)), f"a generation was launched twice: {gens}"
    layout = sorted((gi.start, gi.profile.name) for gi in node.sim.gpu(0).gpu_instances)
    assert layout == sorted((s.start, s.profile) for s in rec.slots), "no instance leaked or missing"


async def move_with_full_disks(node: Node, op: str, args: dict[str, Any], offset: int) -> list[int]:
    """Run one move with the disk filled at every third journal write (from ``offset``), freed after a look."""
    node.commits, node.hits = 0, []
    node.targets = lambda n: n > 1 and n % 3 == offset  # write 1 registers the plan: see the test below
    task = asyncio.create_task(node.dispatch(op, **args))
    try:
        while True:
            waiter = asyncio.create_task(node.filled.wait())
            done, _ = await asyncio.wait({task, waiter}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
            assert done, f"{op} made no progress"
            if waiter not in done:
                waiter.cancel()
                break
            node.filled.clear()
            await node.until("the action waiting for space", lambda: node.act.executor.durable.stalled is not None)
            check_truthful(await node.dispatch("jobs.list"))
            node.fs.free()
    finally:
        node.targets = None
        node.fs.free()
    answer = task.result()
    assert answer["ok"] and answer["result"]["ok"], answer
    return node.hits


def test_disk_full_at_each_journal_write_of_a_migration() -> None:
    async def scenario() -> list[list[int]]:
        async with node_with_job() as node:
            hits = []
            for offset in (2, 0, 1):
                hits.append(await move_with_full_disks(node, "jobs.migrate", {"name": "train"}, offset))
                await check_runs_once_at_its_checkpoint(node)
            assert node.act.executor.durable.stalls == sum(len(h) for h in hits)
            return hits

    hits = asyncio.run(scenario())
    print(f"\nmigration: journal writes hit by a full disk, per move: {hits}")
    assert all(hits) and len({n for h in hits for n in h}) >= 15, f"writes hit: {hits}"


@pytest.mark.parametrize("ranks", [2, 1])
def test_disk_full_at_each_journal_write_of_a_resplit(ranks: int) -> None:
    async def scenario() -> list[list[int]]:
        async with node_with_job(ranks=3 - ranks) as node:
            hits = []
            for offset in (2, 0, 1):
                hits.append(await move_with_full_disks(node, "jobs.resplit", {"name": "train", "ranks": ranks}, offset))
                await check_runs_once_at_its_checkpoint(node)
                rec = node.act.journal.get_job("train")
                assert rec is not None and len(rec.slots) == ranks
                back = await node.dispatch("jobs.resplit", name="train", ranks=3 - ranks)  # unhindered, for the next
                assert back["ok"] and back["result"]["ok"], back
            return hits

    hits = asyncio.run(scenario())
    print(f"\nresplit to {ranks}: journal writes hit by a full disk, per move: {hits}")
    assert all(hits) and len({n for h in hits for n in h}) >= 12, f"writes hit: {hits}"


def test_a_full_disk_when_a_move_is_asked_refuses_it_at_once_and_changes_nothing() -> None:
    async def scenario() -> None:
        async with node_with_job() as node:
            before = node.act.journal.get_job("train")
            node.fs.fill()
            answer = await node.dispatch("jobs.migrate", name="train")
            node.fs.free()
            assert answer["ok"] is False and "database or disk is full" in answer["error"], answer
            assert str(node.base / "state" / "journal.sqlite3") in answer["error"]
            after = node.act.journal.get_job("train")
            assert after == before and len(node.act.supervisor.alive("train")) == 1, "the job runs on, untouched"
            assert (await node.dispatch("jobs.migrate", name="train"))["result"]["ok"], "and moves once space is back"

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------ the daemon, whole


def test_flexmigd_with_its_disk_full_mid_migration_waits_tells_and_finishes_the_move() -> None:
    """The issue's case on flexmigd itself: the disk fills just after the job acknowledged its checkpoint."""
    with short_base("fm-fulld-") as base, Tmpfs(base / "state") as fs, act_node(base, "h200") as node:
        client = ControlClient(node.sock, timeout_s=10)
        spec = write_spec(base / "train.toml", counter_spec(base, "train"))
        assert ControlClient(node.sock, timeout_s=60).call("jobs.submit", path=str(spec))["ok"]
        wait_until("the job runs", lambda: jobs_of(client)["train"]["pids"])
        before = node.jobs()["train"]
        ack = base / "ckpt-train" / "flexmig-ack.json"
        moved: list[Any] = []
        mover = threading.Thread(
            target=lambda: moved.append(ControlClient(node.sock, timeout_s=120).call("jobs.migrate", name="train")),
            daemon=True,
        )
        mover.start()
        wait_until("the acknowledgement", ack.exists, every_s=0.005)
        fs.fill()
        try:
            waiting = wait_until("the move waiting for space", lambda: jobs_of(client)["train"].get("waiting"))
            assert "database or disk is full" in waiting
            wait_until("the old rank gone", lambda: not jobs_of(client)["train"]["pids"])
            for _ in range(10):  # a while of it: never "running" without its ranks
                job = jobs_of(client)["train"]
                assert job["state"] == "migrating" and not job["pids"], job
                status = ControlClient(node.sock, timeout_s=10).call("status")
                (shown,) = [j for j in status["jobs"] if j["name"] == "train"]
                assert shown["state"] == "migrating", shown
                time.sleep(0.1)
            assert node.metric("flexmig_journal_write_waiting") == 1.0
            assert (node.metric("flexmig_journal_write_retries_total") or 0) >= 1
            assert mover.is_alive(), "the move is not given up"
        finally:
            fs.free()
        mover.join(120)
        assert moved and moved[0]["ok"], moved
        wait_until("the job runs again", lambda: jobs_of(client)["train"]["state"] == "running")
        after = node.jobs()["train"]
        assert after["generation"] == before["generation"] + 1 and after["resume"] is not None
        wait_until("the new generation's start", lambda: len(starts_in(base / "train.log")) >= 2)
        time.sleep(0.5)  # a second launch, were there one, would show by now
        starts = starts_in(base / "train.log")
        assert [e["generation"] for e in starts] == ["1", "2"], "launched once after the move, not twice"
        assert starts[-1]["step"] == after["resume"]["step"] + 1, "from the acknowledged checkpoint"
        text = node.log.read_text()
        assert "cannot write the journal" in text and "written again after" in text, text[-3000:]
        assert "Traceback" not in text and "never retrieved" not in text, text[-3000:]
        assert node.metric("flexmig_journal_write_waiting") == 0.0


def jobs_of(client: ControlClient) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in client.call("jobs.list")}


def starts_in(log: Path) -> list[dict[str, Any]]:
    return [e for e in log_lines(log) if e["event"] == "start"]
