"""Property tests of what the daemon reads back from its own files: whatever a row of the journal holds (a bad disk,
a bad restore, a careless hand), opening it raises JournalError naming the journal, or opens it; whatever the
simulator's state file holds, loading it raises SimError naming the file, or loads it. Never a ValueError, a
RecursionError or an OverflowError out of a start. Real SQLite files and real state files; a fixed budget."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexmig import sim
from flexmig.act.journal import Journal, JournalError
from flexmig.act.records import JobRecord, Slot
from flexmig.errors import SimError
from flexmig.jobspec.spec import JobPolicy, parse_job_spec

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
docs = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner))
hostile = st.sampled_from(
    [
        "[" * 5000 + "]" * 5000,
        '{"a": ' + "9" * 5000 + "}",
        "9" * 4400,
        "1e999",
        "NaN",
        '{"gpu": 1e400, "start": 0, "profile": "1g.18gb"}',
        '[{"gpu": ' + "9" * 30 + ', "start": 0, "profile": "1g.18gb"}]',
    ]
)
texts = hostile | st.text(max_size=200) | docs.map(lambda d: json.dumps(d, allow_nan=True))
FIELDS = ("spec", "slots", "resume", "last_ack")


def journal_with_a_job(path: Path, base: Path) -> None:
    text = f'name = "train"\nargv = ["/bin/true"]\nuser = "root"\nworking_dir = "{base}"\n'
    text += f'checkpoint_dir = "{base}/ckpt"\n[need]\nprofile = "1g.18gb"\n'
    spec = parse_job_spec(text, JobPolicy((base,), check_permissions=False))
    j = Journal(path)
    try:
        j.put_job(
            JobRecord(
                name="train", uid=uuid.uuid4().hex, spec=spec, state="stopped", generation=3,
                slots=(Slot(0, 0, "1g.18gb", "MIG-x"),), submitted_s=time.time(),
            )
        )  # fmt: skip
    finally:
        j.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    base = tmp_path_factory.mktemp("journal")
    journal_with_a_job(base / "journal.sqlite3", base)
    return (base / "journal.sqlite3").read_bytes()


@FUZZ
@given(field=st.sampled_from(FIELDS), value=texts, generation=st.integers() | st.text(max_size=12))
def test_no_row_makes_opening_the_journal_raise_anything_but_journal_error(
    tmp_path: Path, pristine: bytes, field: str, value: str, generation: object
) -> None:
    path = tmp_path / f"j-{uuid.uuid4().hex}.sqlite3"
    path.write_bytes(pristine)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute(f"UPDATE jobs SET {field}=?, generation=?", (value, generation))
    except OverflowError:  # Python ints past SQLite's 64 bits cannot be stored at all: nothing to read back
        return
    finally:
        db.close()
    try:
        Journal(path).close()
    except JournalError as exc:
        assert str(exc).startswith(f"{path}: "), exc


@FUZZ
@given(doc=hostile | docs.map(lambda d: json.dumps(d, allow_nan=True)) | st.text(max_size=300))
def test_no_state_file_makes_the_simulator_raise_anything_but_sim_error(tmp_path: Path, doc: str) -> None:
    path = tmp_path / f"sim-{uuid.uuid4().hex}.json"
    path.write_text(doc)
    try:
        sim.install("h200", state_path=path)
    except SimError as exc:
        assert str(path) in str(exc), exc
    finally:
        sim.uninstall()
