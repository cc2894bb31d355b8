"""A corrupt journal is named, row and field, in one line per problem; in mode act it stops the start.

Each fault is written into a real journal with SQLite (what a bad disk, a bad restore or a careless hand leaves):
a spec that is not JSON or not a job, bad instances, a bad generation, another schema, a payload that does not
decode, and a page of the file overwritten on disk. The journal refuses to open with lines naming the journal,
the row and the field (never a traceback, never a job spec file it no longer has); flexmigd in mode act exits at
once with those lines, and in observe it runs on without the actuator and says why in ``flexmig status``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flexmig.act.encoding import StartPayload, encode
from flexmig.act.journal import Journal, JournalError
from flexmig.act.records import JobRecord, Slot
from flexmig.jobspec.spec import JobPolicy, parse_job_spec
from support.flexmigd import ActNode, act_node, short_base
from support.wait import wait_until

pytestmark = pytest.mark.fault

SIM = "h200x1:1g.18gb@0"


def spec_text(base: Path, name: str) -> str:
    return f"""\
name = "{name}"
argv = ["/bin/true"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt"
[need]
profile = "1g.18gb"
"""


def good_journal(path: Path, base: Path, *, plan: bool = False) -> None:
    spec = parse_job_spec(spec_text(base, "train"), JobPolicy((base,), check_permissions=False))
    j = Journal(path)
    try:
        j.put_job(
            JobRecord(
                name="train",
                uid=uuid.uuid4().hex,
                spec=spec,
                state="stopped",
                generation=3,
                slots=(Slot(0, 0, "1g.18gb", "MIG-x"),),
                submitted_s=time.time(),
            )
        )
        if plan:
            j.begin_plan("control", [encode(StartPayload((Slot(0, 0, "1g.18gb"),), "test"), "train")])
    finally:
        j.close()


def sql(path: Path, statement: str, *args: object) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute(statement, args)
    finally:
        db.close()


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "spec is not JSON": (
        lambda p: sql(p, "UPDATE jobs SET spec='{' WHERE name='train'"),
        "jobs row 'train': spec: not valid JSON (Expecting property name",
    ),
    "spec is an empty object": (
        lambda p: sql(p, "UPDATE jobs SET spec='{}' WHERE name='train'"),
        "jobs row 'train': spec: name: is required",
    ),
    "spec is a list": (
        lambda p: sql(p, "UPDATE jobs SET spec='[1]' WHERE name='train'"),
        "jobs row 'train': spec: must be a JSON object, not list",
    ),
    "spec argv is a shell": (
        lambda p: sql(p, """UPDATE jobs SET spec=json_set(spec, '$.argv', json('["/bin/sh", "-c", "id"]'))"""),
        "jobs row 'train': spec: argv: program '/bin/sh' is a shell",
    ),
    "slots not a list": (
        lambda p: sql(p, "UPDATE jobs SET slots='{\"gpu\": 0}' WHERE name='train'"),
        "jobs row 'train': slots: must be a list of instances, not dict",
    ),
    "slot without a start": (
        lambda p: sql(p, """UPDATE jobs SET slots='[{"gpu": 0, "profile": "1g.18gb"}]' WHERE name='train'"""),
        "jobs row 'train': slots: item 0 lacks 'start'",
    ),
    "generation is text": (
        lambda p: sql(p, "UPDATE jobs SET generation='three' WHERE name='train'"),
        "jobs row 'train': generation: must be an integer, not 'three'",
    ),
    "generation is negative": (
        lambda p: sql(p, "UPDATE jobs SET generation=-1 WHERE name='train'"),
        "jobs row 'train': generation: -1 is out of range",
    ),
    "unknown state": (
        lambda p: sql(p, "UPDATE jobs SET state='zombie' WHERE name='train'"),
        "jobs row 'train': state: unknown state 'zombie'",
    ),
    "another schema": (
        lambda p: sql(p, "UPDATE meta SET value='7' WHERE key='schema'"),
        "meta row 'schema': journal schema 7, this flexmig reads 1",
    ),
    "no schema row": (
        lambda p: sql(p, "DELETE FROM meta"),
        "meta row 'schema': missing",
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_row_is_one_line_naming_the_journal_the_row_and_the_field(tmp_path: Path, fault: str) -> None:
    path = tmp_path / "journal.sqlite3"
    good_journal(path, tmp_path)
    damage, expected = FAULTS[fault]
    damage(path)
    with pytest.raises(JournalError) as info:
        Journal(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message, message
    assert "<job spec>" not in message and "\n" not in message


def test_every_bad_row_is_named_not_just_the_first(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    good_journal(path, tmp_path)
    sql(path, "INSERT INTO jobs SELECT 'second', uid, spec, source, state, generation, slots, resume, last_ack, "
        "master_port, error, submitted_s, updated_s FROM jobs WHERE name='train'")  # fmt: skip
    sql(path, "UPDATE jobs SET spec=json_set(spec, '$.name', 'second') WHERE name='second'")
    sql(path, "UPDATE jobs SET slots='x' WHERE name='train'")
    sql(path, "UPDATE jobs SET master_port=70000 WHERE name='second'")
    with pytest.raises(JournalError) as info:
        Journal(path)
    lines = str(info.value).splitlines()
    assert lines == [
        f"{path}: jobs row 'second': master_port: 70000 is out of range",
        f"{path}: jobs row 'train': slots: not valid JSON (Expecting value: line 1 column 1 (char 0))",
    ]


def test_a_spec_naming_another_job_than_its_row_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    good_journal(path, tmp_path)
    sql(path, "UPDATE jobs SET spec=json_set(spec, '$.name', 'other')")
    with pytest.raises(JournalError, match=r"jobs row 'train': spec: names job 'other', not the row's 'train'"):
        Journal(path)


def test_a_bad_action_payload_of_an_unfinished_plan_is_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    good_journal(path, tmp_path, plan=True)
    sql(path, "UPDATE actions SET payload='{\"to\": 5'")
    with pytest.raises(JournalError, match=r"actions row 1: payload: not valid JSON"):
        Journal(path)


def corrupt_page(path: Path) -> None:
    """Overwrite the jobs table's root page (the file's records of jobs) with garbage, on disk."""
    with sqlite3.connect(path) as db:
        page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        root = int(db.execute("SELECT rootpage FROM sqlite_master WHERE name='jobs'").fetchone()[0])
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)


def test_a_garbled_page_is_found_at_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    good_journal(path, tmp_path)
    corrupt_page(path)
    before = path.read_bytes()
    with pytest.raises(JournalError) as info:
        Journal(path)
    message = str(info.value)
    assert message.startswith(f"{path}: the journal is corrupt (SQLite quick_check: ")
    assert "restore it from a backup, or move it away" in message
    assert path.read_bytes() == before, "nothing written to a corrupt journal"


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base("fm-jcorrupt-") as d:
        yield d


def daemon(node: ActNode) -> subprocess.CompletedProcess[str]:
    node.write_config()
    argv = [
        sys.executable, "-m", "flexmig.daemon", "--sim", node.spec, "--sim-state", str(node.sim_state),
        "--config", str(node.config), "--metrics-addr", f"127.0.0.1:{node.port}",
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "NOTIFY_SOCKET": ""}
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault", ["garbled page", "spec is not JSON", "slot without a start", "spec is an empty object"]
)
def test_in_mode_act_a_corrupt_journal_stops_the_start_with_its_lines(base: Path, fault: str) -> None:
    node = ActNode(base, SIM)
    node.journal.parent.mkdir(mode=0o700)
    good_journal(node.journal, base, plan=True)
    if fault == "garbled page":
        corrupt_page(node.journal)
        expected = f"{node.journal}: the journal is corrupt"
    else:
        damage, why = FAULTS[fault]
        damage(node.journal)
        expected = f"{node.journal}: {why}"
    out = daemon(node)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert expected in out.stderr.splitlines()[-1]
    assert not node.sock.exists(), "nothing served"


@pytest.mark.integration
def test_in_mode_observe_a_corrupt_journal_leaves_the_daemon_sampling_and_the_log_says_why(base: Path) -> None:
    state = base / "state"
    state.mkdir(mode=0o700)
    good_journal(state / "journal.sqlite3", base)
    corrupt_page(state / "journal.sqlite3")
    with act_node(base, SIM, mode="observe", control=False) as node:

        def said() -> list[str]:  # the line may follow the start the rig waits for
            return [x for x in node.log.read_text().splitlines() if "the journal is corrupt" in x]

        (line,) = wait_until(said, what="the log line about the corrupt journal")
        log = node.log.read_text()
        assert f"{node.journal}: the journal is corrupt" in line and "samples on without jobs" in line
        assert "Traceback" not in log
        assert node.metric("flexmig_planner_runs_total") is not None  # serving metrics, sampling on
