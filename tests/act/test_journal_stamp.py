"""The journal's stamp: what lets the daemon skip re-reading job counts at a sweep when nothing was written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from flexmig.act.journal import Journal


def test_the_stamp_holds_while_nothing_is_written_and_moves_with_any_write(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    try:
        before = journal.stamp()
        journal.job_counts()
        assert journal.stamp() == before  # reading changes nothing
        plan_id, _ = journal.begin_plan("test", [])
        own = journal.stamp()
        assert own != before  # a write of this object
        other = sqlite3.connect(path)
        try:
            other.execute("UPDATE plans SET state='done' WHERE id=?", (plan_id,))
            other.commit()
        finally:
            other.close()
        assert journal.stamp() != own  # a commit by another connection to the same file
    finally:
        journal.close()
