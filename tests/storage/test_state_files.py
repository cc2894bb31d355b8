"""The daemon's own files are trusted only when nobody else can have put them there or changed them.

Journal and outbox alike: a symlink, a file of another user, a file others may write, an empty file and a file
that is not (or no longer) one of ours are refused with one line naming it, and left exactly as they were found; a
state directory that is a symlink, another user's, or writable by others is refused too, as is one below a
directory others can change. New files are made 0600, new state directories 0700.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from flexmig.act.journal import Journal, JournalError
from flexmig.errors import OutboxError, StorageError
from flexmig.mqtt.outbox import Outbox

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")

Opener = Callable[[Path], object]


def open_journal(path: Path) -> object:
    j = Journal(path)
    j.close()
    return j


def open_outbox(path: Path) -> object:
    box = Outbox(path)
    box.close()
    return box


KINDS = [
    pytest.param(open_journal, "journal", JournalError, id="journal"),
    pytest.param(open_outbox, "outbox", OutboxError, id="outbox"),
]


def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_a_new_file_is_created_readable_by_its_owner_alone(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    opener(path)
    assert mode_of(path) == 0o600
    opener(path)  # and it opens again as an existing file
    kept = (".lock", ".reserve")  # a lock; the space the journal keeps for a stop on a full disk
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(kept)) == [path.name]


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_a_symlink_in_place_of_the_file_is_refused_and_its_target_left_alone(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    d = state(tmp_path)
    target = d / "real.sqlite3"
    opener(target)
    before = target.read_bytes()
    link = d / f"{what}.sqlite3"
    link.symlink_to(target)
    with pytest.raises(error, match=rf"{link}: refused: it is a symlink"):
        opener(link)
    assert target.read_bytes() == before and link.is_symlink()


@needs_root
@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_a_file_of_another_user_is_refused_and_not_chmodded_into_acceptance(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    opener(path)
    os.chown(path, 4242, 4242)
    path.chmod(0o644)
    with pytest.raises(error, match=rf"{path}: refused: owned by uid 4242, not by the daemon's user"):
        opener(path)
    st = os.lstat(path)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (4242, 0o644)


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
@pytest.mark.parametrize("mode", [0o660, 0o606, 0o666])
def test_a_file_others_may_write_is_refused_as_it_is(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception], mode: int
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    opener(path)
    path.chmod(mode)
    with pytest.raises(error, match=rf"{path}: refused: mode {mode:04o} lets its group or others write it"):
        opener(path)
    assert mode_of(path) == mode


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_an_own_file_that_others_may_read_is_accepted_and_closed_to_them(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    opener(path)
    path.chmod(0o644)
    opener(path)
    assert mode_of(path) == 0o600


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_an_empty_file_is_refused_not_taken_for_a_new_one(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    path.touch(mode=0o600)
    with pytest.raises(error, match=rf"{path}: refused: the file is empty \(0 bytes\)"):
        opener(path)
    assert path.stat().st_size == 0


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_an_sqlite_file_without_our_tables_is_refused(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes(x TEXT)")
    path.chmod(0o600)
    with pytest.raises(error, match=rf"{path}: refused: .*no flexmig {what}"):
        opener(path)
    with sqlite3.connect(path) as db:  # nothing was added to it
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master")] == ["notes"]


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_a_file_that_is_not_sqlite_is_refused(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    path.write_text("name = 'not a database'\n")
    path.chmod(0o600)
    with pytest.raises(error, match=rf"{path}: refused: not an SQLite database"):
        opener(path)
    assert path.read_text() == "name = 'not a database'\n"


@pytest.mark.parametrize(("opener", "what", "error"), KINDS)
def test_a_write_ahead_log_without_its_database_is_refused(
    tmp_path: Path, opener: Opener, what: str, error: type[Exception]
) -> None:
    path = state(tmp_path) / f"{what}.sqlite3"
    wal = Path(f"{path}-wal")
    wal.write_bytes(b"\x37\x7f\x06\x82" + bytes(28))
    wal.chmod(0o600)
    with pytest.raises(error, match=rf"{wal} exists without the database"):
        opener(path)
    assert not path.exists()


def test_a_missing_state_directory_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "var" / "state" / "journal.sqlite3"
    open_journal(path)
    assert mode_of(path.parent) == 0o700


def test_a_state_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = state(tmp_path)
    link = tmp_path / "state-link"
    link.symlink_to(real)
    with pytest.raises(JournalError, match=rf"state directory {link}: refused: it is a symlink \(to {real}\)"):
        open_journal(link / "journal.sqlite3")
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_state_directory_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    d = state(tmp_path)
    d.chmod(mode)
    with pytest.raises(JournalError, match=rf"state directory {d}: refused: mode {mode:04o} lets its group"):
        open_journal(d / "journal.sqlite3")
    assert list(d.iterdir()) == [] and mode_of(d) == mode


@needs_root
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = state(tmp_path)
    os.chown(d, 4242, 4242)
    with pytest.raises(JournalError, match=rf"state directory {d}: refused: owned by uid 4242"):
        open_journal(d / "journal.sqlite3")


def test_a_state_directory_below_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    above = tmp_path / "shared"
    above.mkdir()
    above.chmod(0o777)
    d = above / "state"
    d.mkdir(mode=0o700)
    with pytest.raises(JournalError, match=rf"directory {above} has mode 0777: its group or others can write"):
        open_journal(d / "journal.sqlite3")


def test_a_state_directory_below_a_root_owned_sticky_directory_is_accepted(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the sticky directory must belong to root")
    above = tmp_path / "tmp-like"
    above.mkdir()
    above.chmod(0o1777)
    open_journal(above / "state" / "journal.sqlite3")


def test_the_outbox_directory_is_checked_too(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(OutboxError, match=rf"outbox directory {d}: refused: mode 0777"):
        open_outbox(d / "outbox.sqlite3")


def test_storage_errors_are_flexmig_errors_with_one_line(tmp_path: Path) -> None:
    path = state(tmp_path) / "journal.sqlite3"
    path.touch(mode=0o600)
    with pytest.raises(StorageError) as info:
        open_journal(path)
    assert "\n" not in str(info.value)
