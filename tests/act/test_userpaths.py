"""Paths a job's user can change, handled as root: no symlink followed on the way, nothing done by name, nothing
handed over but what was just made. Real directories, files and symlinks, with openat2(2) and with the per-component
walk that stands in for it where a kernel (or a seccomp filter) lacks it."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.act import userpaths
from flexmig.act.userpaths import UserPathError, clear_ack, ensure_dir, open_dir, read_ack_in, resolve_beneath
from flexmig_hook.protocol import Ack, AckError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="hands directories to another user")


@pytest.fixture(params=["openat2", "walk"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test twice: with openat2, and as on a kernel without it."""
    if request.param == "walk":
        monkeypatch.setattr(userpaths._OPENAT2, "call", None)
        monkeypatch.setattr(userpaths._OPENAT2, "tried", True)
    yield str(request.param)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "secret").write_text("root's\n")
    return tmp_path


def test_a_directory_behind_a_symlink_is_refused_naming_the_link(kernel: str, tree: Path) -> None:
    with pytest.raises(UserPathError, match=f"{tree / 'link'} is a symbolic link"):
        open_dir(tree / "link" / "deeper")
    fd = open_dir(tree / "real")
    os.close(fd)
    with pytest.raises(FileNotFoundError):
        open_dir(tree / "absent")


@needs_root
def test_missing_directories_are_made_and_handed_to_the_user_each_one(kernel: str, tree: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    ensure_dir(tree / "real" / "a" / "b", nobody.pw_uid, nobody.pw_gid, 0o700)
    for d in (tree / "real" / "a", tree / "real" / "a" / "b"):
        st = d.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, nobody.pw_gid, 0o700)
    assert (tree / "real").stat().st_uid == os.geteuid(), "what existed is left as it was"


@needs_root
def test_a_symlink_where_a_directory_is_to_be_made_is_refused_and_its_target_keeps_its_owner(
    kernel: str, tree: Path
) -> None:
    (tree / "real" / "ckpt").symlink_to(tree / "secret")
    with pytest.raises(UserPathError, match="symbolic link"):
        ensure_dir(tree / "real" / "ckpt", 65534, 65534, 0o700)
    assert (tree / "secret").stat().st_uid == 0 and stat.S_IMODE((tree / "secret").stat().st_mode) != 0o700


def test_an_acknowledgement_is_read_and_removed_in_its_directory_never_through_a_link(kernel: str, tree: Path) -> None:
    ack = tree / "real" / "ack.json"
    ack.write_text('{"step": 3, "checkpoint": "/c"}')
    assert read_ack_in(ack) == Ack(3, "/c")
    with pytest.raises(AckError, match="symbolic link"):
        read_ack_in(tree / "link" / "ack.json")
    assert clear_ack(ack) and not ack.exists() and not clear_ack(ack)
    (tree / "real" / "ack.json").symlink_to(tree / "secret")
    assert clear_ack(tree / "real" / "ack.json"), "the link is removed"
    assert (tree / "secret").exists(), "its target is not"
    (tree / "real" / "ack.json").mkdir()
    with pytest.raises(UserPathError, match="is a directory"):
        clear_ack(tree / "real" / "ack.json")
    assert (tree / "real" / "ack.json").is_dir(), "left as it is"


def test_a_checkpoint_resolves_inside_its_directory_and_never_out_of_it(kernel: str, tree: Path) -> None:
    root = tree / "real"
    (root / "step-5.pt").write_bytes(b"weights")
    (root / "escape").symlink_to(tree / "secret")
    real, st = resolve_beneath(root, root / "step-5.pt") or (None, None)
    assert real == root / "step-5.pt" and st is not None and st.st_size == 7
    with pytest.raises(UserPathError):
        resolve_beneath(root, root / "escape")
    with pytest.raises(UserPathError, match="outside"):
        resolve_beneath(root, tree / "secret")
    if kernel == "openat2":  # a link that stays inside is followed (the walk follows none)
        (root / "latest.pt").symlink_to("step-5.pt")
        found = resolve_beneath(root, root / "latest.pt")
        assert found is not None and found[0] == root / "step-5.pt"
