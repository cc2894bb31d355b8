"""Disk full in the middle of a migration or a re-split: the action waits for space and then carries on, the job
runs once at its checkpoint, and while it waits no job claims ranks that do not exist.

In-process (the actuator on a simulated node) and on flexmigd itself (a subprocess, see the end of this module).

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
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from flexmig import sim
from flexmig.act.client import ControlClient
from flexmig.act.events import MemorySink
from flexmig.act.journal import Journal
from flexmig.act.procs import PsutilScanner
from flexmig.act.service import Actuator
from flexmig.jobspec import JobPolicy
from flexmig.nvml import Nvml, NvmlWorker
from support.diskfull import Tmpfs
from support.flexmigd import ActNode, act_node, short_base
from support.hostile import scratch_user
from support.jobs import counter_spec, kill_ranks, log_lines, write_spec
from support.wait import until, wait_until

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
            await until(lambda: len(node.act.supervisor.alive("train")) == 1, what="the job's rank")
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

    await until(started, what="the new generation's start")
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
            await until(lambda: node.act.executor.durable.stalled is not None, what="the action waiting for space")
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


def test_a_job_exit_that_waits_for_space_never_makes_a_request_hang_behind_it() -> None:
    """A rank dies while the disk is full: its job's record waits for space, outside the action lock, and a stop
    asked meanwhile is refused at once, naming the journal, instead of hanging until space comes back (it hung 60 s:
    the record waited while holding the lock)."""

    async def scenario() -> None:
        async with node_with_job() as node:
            spec = counter_spec(node.base, "quitter", ranks=1)
            spec = spec.replace('user = "root"', f'user = "{pwd.getpwuid(os.geteuid()).pw_name}"')
            answer = await node.dispatch("jobs.submit", path=str(write_spec(node.base / "quitter.toml", spec)))
            assert answer["ok"], answer
            await until(lambda: len(node.act.supervisor.alive("quitter")) == 1, what="the quitter's rank")
            (rank,) = node.act.supervisor.alive("quitter")
            node.fs.fill()
            os.kill(rank.proc.pid, 9)
            await until(lambda: node.act.executor.durable.stalled is not None, what="its record waiting for space")
            try:
                answer = await asyncio.wait_for(node.dispatch("jobs.stop", name="train"), 10)
            except TimeoutError:
                raise AssertionError("jobs.stop hung behind a journal write waiting for space") from None
            # A stop works all the same (issue #44): by force, recorded in the journal's reserve, and it says so.
            assert answer["ok"] and answer["result"]["ok"], answer
            (stop,) = answer["result"]["actions"]
            assert "cannot be written now" in stop["error"] and "stopped without a checkpoint" in stop["error"]
            assert str(node.base / "state" / "journal.sqlite3") in stop["error"]
            assert node.act.supervisor.alive("train") == []
            node.fs.free()
            recorded = lambda: getattr(node.act.journal.get_job("quitter"), "state", None) == "failed"  # noqa: E731
            await until(recorded, what="the quitter's fate recorded")
            assert getattr(node.act.journal.get_job("train"), "state", None) == "stopped"

    asyncio.run(scenario())


def test_a_stop_works_when_a_job_has_filled_the_state_file_system_and_says_how() -> None:
    """A job of an ordinary user prints without end into a state file system smaller than its log cap: every journal
    write fails, and ``jobs stop`` failed with "journal write failed: database or disk is full" while the job went on
    (issue #44). Now the stop ends the job by force, records it in the space the journal keeps in reserve, and says
    so."""

    async def scenario(user: pwd.struct_passwd) -> None:
        with short_base("fm-full-") as base:
            node = Node(base)
            await node.start()
            try:
                spec = (
                    f'name = "flood"\nargv = ["/usr/bin/yes"]\nuser = "{user.pw_name}"\nworking_dir = "{base}"\n'
                    f'checkpoint_dir = "{base}/flood.ckpt"\n[need]\nprofile = "1g.18gb"\n'
                )
                answer = await node.dispatch("jobs.submit", path=str(write_spec(base / "flood.toml", spec)))
                assert answer["ok"], answer
                full = lambda: os.statvfs(node.fs.path).f_bavail == 0  # noqa: E731
                await until(full, what="the job filled the state file system")
                answer = await asyncio.wait_for(node.dispatch("jobs.stop", name="flood"), WAIT_S)
                assert answer["ok"] and answer["result"]["ok"], answer
                (stop,) = answer["result"]["actions"]
                assert "database or disk is full" in stop["error"], stop
                assert "stopped without a checkpoint" in stop["error"] and "recorded as stopped" in stop["error"]
                rec = node.act.journal.get_job("flood")
                assert rec is not None and rec.state == "stopped", rec
                assert node.act.supervisor.alive("flood") == []
                assert "in the space the journal keeps in reserve" in stop["error"], stop
            finally:
                await node.stop()

    with scratch_user("fmf") as user:
        asyncio.run(scenario(user))


# ------------------------------------------------------------------------------------------ the daemon, whole


def test_flexmigd_with_its_disk_full_mid_migration_waits_tells_and_finishes_the_move() -> None:
    """The issue's case on flexmigd itself: the disk fills just after the job acknowledged its checkpoint."""
    with short_base("fm-fulld-") as base, Tmpfs(base / "state") as fs, act_node(base, "h200") as node:
        client = ControlClient(node.sock, timeout_s=10)
        spec = write_spec(base / "train.toml", counter_spec(base, "train"))
        assert ControlClient(node.sock, timeout_s=60).call("jobs.submit", path=str(spec))["ok"]
        wait_until(lambda: jobs_of(client)["train"]["pids"], what="the job runs")
        before = node.jobs()["train"]
        ack = base / "ckpt-train" / "flexmig-ack.json"
        moved: list[Any] = []
        mover = threading.Thread(
            target=lambda: moved.append(ControlClient(node.sock, timeout_s=120).call("jobs.migrate", name="train")),
            daemon=True,
        )
        mover.start()
        wait_until(ack.exists, what="the acknowledgement", every_s=0.005)
        fs.fill()
        try:
            waiting = wait_until(lambda: jobs_of(client)["train"].get("waiting"), what="the move waiting for space")
            assert "database or disk is full" in waiting
            # Which write of the move meets the full disk depends on how far the move got after the acknowledgement
            # (the old rank's exit, or the new one's launch, may already be done): whichever it is, the job shows as
            # migrating, never as running, until the move's record is written.
            for _ in range(10):  # a while of it
                job = jobs_of(client)["train"]
                assert job["state"] == "migrating" and job["action"]["kind"] == "migrate", job
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
        wait_until(lambda: jobs_of(client)["train"]["state"] == "running", what="the job runs again")
        after = node.jobs()["train"]
        assert after["generation"] == before["generation"] + 1 and after["resume"] is not None
        wait_until(lambda: len(starts_in(base / "train.log")) >= 2, what="the new generation's start")
        # A second launch would be a second live rank now (the move launched its ranks before it answered).
        live = PsutilScanner().find(job_uid(node.journal, "train"))
        assert [(f.generation, f.slot) for f in live] == [(after["generation"], 0)], live
        log = base / "train.log"
        wait_until(lambda: log_lines(log)[-1]["event"] == "step", what="the new generation's first step")
        starts = starts_in(log)
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


# ---------------------------------------------------------------- flexmigd itself, full at every write of a move

HARNESS = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path

    from flexmig import signals

    signals.hold()
    sys.path.insert(0, os.environ["TEST_SUPPORT_ROOT"])
    import flexmig.act.journal as journal
    from flexmig.daemon import main
    from support.diskfull import Tmpfs

    fs = Tmpfs(Path(os.environ["TEST_FILL_FS"]))
    arm, hits = Path(os.environ["TEST_FILL_ARM"]), Path(os.environ["TEST_FILL_HITS"])
    txn, state = [], {"token": None, "retry": False}

    def trace(sql):
        # Right before a COMMIT of the journal runs, while the test has armed it: fill the file system, so that
        # this very write fails as it would on a full disk. Registering a plan is left alone (it is refused at
        # once by design, changing nothing: another test), and so is the first COMMIT once the space is back
        # (the stalled write going through).
        head = sql.strip().split(None, 3)
        word = head[0].upper() if head else ""
        if word == "BEGIN":
            txn.clear()
            return
        if word != "COMMIT":
            txn.append(" ".join(head[:3]))
            return
        what, _ = " / ".join(dict.fromkeys(txn)) or "?", txn.clear()
        if fs.full:
            return
        try:
            token = arm.read_text()
        except FileNotFoundError:
            return
        if token != state["token"]:
            state.update(token=token, retry=False)
        if state["retry"]:
            state["retry"] = False
            return
        if "INSERT INTO plans" in what:
            return
        fs.fill()
        state["retry"] = True
        with hits.open("a") as out:
            out.write(f"{token}\\t{what}\\n")

    opened = journal.Journal.__init__

    def init(self, path, *args, **kwargs):
        opened(self, path, *args, **kwargs)
        if Path(path).parent == fs.path:
            self.db.set_trace_callback(trace)

    journal.Journal.__init__ = init
    sys.exit(main(sys.argv[1:]))
    """
)


class FillingNode:
    """flexmigd (mode act) through :data:`HARNESS`, its state directory a tmpfs that fills at each journal write
    once armed; the test looks while the write waits, then frees the space."""

    def __init__(self, base: Path, fs: Tmpfs) -> None:
        self.base, self.fs = base, fs
        (base / "harness.py").write_text(HARNESS)
        self.arm, self.hits = base / "armed", base / "hits.tsv"
        self.node = ActNode(
            base,
            "h200",
            entry=(str(base / "harness.py"),),
            env={
                "TEST_SUPPORT_ROOT": str(Path(__file__).resolve().parents[1]),
                "TEST_FILL_FS": str(fs.path),
                "TEST_FILL_ARM": str(self.arm),
                "TEST_FILL_HITS": str(self.hits),
            },
        )
        self.looks: list[dict[str, Any]] = []

    def hit_lines(self, token: str) -> list[str]:
        if not self.hits.exists():
            return []
        return [x.split("\t", 1)[1] for x in self.hits.read_text().splitlines() if x.startswith(f"{token}\t")]

    def move(self, token: str, op: str, **args: Any) -> list[str]:
        """Ask for a move with every journal write of it hit by a full disk; returns what each hit write did."""
        client = ControlClient(self.node.sock, timeout_s=10)
        answers: list[Any] = []
        mover = threading.Thread(
            target=lambda: answers.append(ControlClient(self.node.sock, timeout_s=300).call(op, **args)),
            daemon=True,
        )
        self.arm.write_text(token)
        mover.start()
        handled = 0
        try:
            while mover.is_alive() or len(self.hit_lines(token)) > handled:
                if len(self.hit_lines(token)) == handled:
                    mover.join(0.02)
                    continue
                handled += 1
                wait_until(
                    lambda: self.node.metric("flexmig_journal_write_waiting"), what="the write waiting for space"
                )
                self.look(client)
                self.fs.free()
        finally:
            self.arm.unlink(missing_ok=True)
            self.fs.free()
        mover.join(60)
        assert answers and answers[0]["ok"], f"{op}: {answers}"
        return self.hit_lines(token)

    def look(self, client: ControlClient) -> None:
        """What the daemon says while a write waits: never a job running without its ranks."""
        listing = client.call("jobs.list")
        status = client.call("status")
        for job in listing:
            alive = [p for p in job["pids"] if psutil.pid_exists(p)]
            if job["state"] == "running":
                assert len(alive) == job["ranks"] == len(job["pids"]), f"claims ranks that do not exist: {job}"
            else:
                assert "waiting" in job and "database or disk is full" in job["waiting"], job
        shown = {j["name"]: j["state"] for j in status["jobs"]}
        assert shown == {j["name"]: j["state"] for j in listing}, (shown, listing)
        self.looks.append({j["name"]: (j["state"], len(j["pids"])) for j in listing})


def write_kind(statements: str) -> str:
    """What a journal write did, from the statements of its transaction."""
    for head, kind in (
        ("INSERT INTO steps", "step intent"),
        ("UPDATE steps", "step done"),
        ("UPDATE actions", "action state"),
        ("UPDATE plans", "plan state"),
        ("INSERT OR REPLACE", "job record"),
    ):
        if statements.startswith(head):
            return kind
    return statements


def job_uid(journal: Path, name: str) -> str:
    j = Journal(journal)
    try:
        rec = j.get_job(name)
        assert rec is not None
        return rec.uid
    finally:
        j.close()


def check_moved_once_from_its_checkpoint(node: ActNode, generation: int, ranks: int) -> None:
    """After a move: the job runs at ``generation`` with ``ranks`` live ranks, launched once, from the acknowledged
    checkpoint, on exactly its instances."""
    wait_until(lambda: node.jobs()["train"]["state"] == "running", what="the job runs again")
    job = node.jobs()["train"]
    assert job["generation"] == generation and job["ranks"] == ranks and job["resume"] is not None, job
    log = node.base / "train.log"
    wait_until(lambda: str(generation) in {e["generation"] for e in starts_in(log)}, what="the new generation's start")
    live = PsutilScanner().find(job_uid(node.journal, "train"))
    assert sorted((f.generation, f.slot) for f in live) == [(generation, i) for i in range(ranks)], live
    starts = [e for e in starts_in(log) if e["generation"] == str(generation)]
    assert len(starts) == 1, f"generation {generation} launched {len(starts)} times"
    assert starts[0]["resume"] == job["resume"]["checkpoint"] and starts[0]["step"] == job["resume"]["step"] + 1
    gens = [e["generation"] for e in starts_in(log)]
    assert gens == [str(g) for g in range(1, generation + 1)], f"a generation was launched twice or skipped: {gens}"
    layout = node.layout()[0]
    assert layout == sorted((s["start"], s["profile"]) for s in job["instances"]), "no instance leaked or missing"


def test_flexmigd_with_its_disk_full_at_each_journal_write_of_a_migration_and_of_a_resplit() -> None:
    """flexmigd itself, a real tmpfs as its state directory: every journal write of a migration, of a re-split to
    two ranks and of one back to one fails for a full disk in turn; each waits while the test looks (``jobs list``
    and ``status``: never ``running`` without its ranks), goes through once the space is back, and the move
    finishes. The job runs once per generation, from its checkpoint; no instance leaks."""
    with short_base("fm-fulld-") as base, Tmpfs(base / "state") as fs:
        rig = FillingNode(base, fs)
        try:
            node, log = rig.node.start(), base / "train.log"
            spec = write_spec(base / "train.toml", counter_spec(base, "train", max_ranks=2))
            assert ControlClient(node.sock, timeout_s=60).call("jobs.submit", path=str(spec))["ok"]
            wait_until(lambda: node.jobs()["train"]["state"] == "running" and starts_in(log), what="the job runs")
            hits: dict[str, list[str]] = {}
            moves: list[tuple[str, str, dict[str, Any], int]] = [
                ("migrate", "jobs.migrate", {"name": "train"}, 1),
                ("resplit to 2", "jobs.resplit", {"name": "train", "ranks": 2}, 2),
                ("resplit to 1", "jobs.resplit", {"name": "train", "ranks": 1}, 1),
            ]
            for generation, (name, op, args, ranks) in enumerate(moves, start=2):
                hits[name] = rig.move(name, op, **args)
                check_moved_once_from_its_checkpoint(node, generation, ranks)
            text = node.log.read_text()
            assert node.metric("flexmig_journal_write_waiting") == 0.0
            stalls = node.metric("flexmig_journal_write_stalls_total")
        finally:
            with contextlib.suppress(AssertionError):
                rig.node.stop()
            kill_ranks(rig.node.journal, base=base)
    print(f"\nflexmigd, disk full at each journal write: {sum(map(len, hits.values()))} writes hit, {stalls} stalls")
    for name, what in hits.items():
        kinds = Counter(write_kind(w) for w in what)
        print(f"  {name}: {len(what)} writes ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    seen = Counter(view["train"] for view in rig.looks)
    print(f"  the job as jobs list showed it while a write waited (state, live ranks): {dict(sorted(seen.items()))}")
    assert all(len(h) >= 15 for h in hits.values()), hits
    assert any(ranks == 0 for _, ranks in seen), "a write waited while the job had no rank (the issue's case)"
    assert stalls == sum(map(len, hits.values())), "each hit write waited once, and nothing else did"
    assert text.count("cannot write the journal") == stalls and text.count("written again after") == stalls
    assert "Traceback" not in text and "never retrieved" not in text, text[-3000:]
