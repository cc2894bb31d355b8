"""'Never a shell' is decided by what a program *is*, not by what it is called: a symlink, a PATH lookup or a
renamed link to a shell (or to ``env``, which runs anything) is refused by its resolved target, both when a spec is
read and again right before the launch (the link may have been changed in between)."""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
from pathlib import Path

import pytest

from flexmig.act.procs import LaunchRequest, SubprocessLauncher
from flexmig.errors import JobSpecError
from flexmig.jobspec import JobPolicy, load_job_spec
from flexmig.jobspec.programs import shell_reason

ME = pwd.getpwuid(os.geteuid()).pw_name
BASH = Path("/bin/bash").resolve()


def spec_text(argv: str) -> str:
    return (
        f'name = "j"\nargv = {argv}\nuser = "{ME}"\nworking_dir = "."\ncheckpoint_dir = "ckpt"\n'
        '[need]\nprofile = "1g.18gb"\n'
    )


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    p.chmod(0o644)
    return p


def test_a_symlink_to_bash_under_another_name_is_refused_by_its_target(tmp_path: Path) -> None:
    tool = tmp_path / "train-tool"
    tool.symlink_to(BASH)
    with pytest.raises(JobSpecError, match="is a shell") as err:
        load_job_spec(write(tmp_path, spec_text(f'["{tool}", "-c", "id"]')), JobPolicy((tmp_path,)))
    assert f"{tmp_path / 'job.toml'}" in str(err.value) and ": argv:" in str(err.value)
    assert str(BASH) in str(err.value), "the message names what the program really is"


def test_a_chain_of_relative_symlinks_is_followed_to_the_end(tmp_path: Path) -> None:
    (tmp_path / "b").symlink_to(BASH)
    (tmp_path / "a").symlink_to("b")
    with pytest.raises(JobSpecError, match="is a shell"):
        load_job_spec(write(tmp_path, spec_text('["./a", "-c", "id"]')), JobPolicy((tmp_path,)))


def test_a_bare_name_found_through_path_is_judged_by_its_target(tmp_path: Path) -> None:
    # Debian's rbash is a symlink to bash; its own name is in no list of shells.
    assert Path("/usr/bin/rbash").is_symlink() and Path("/usr/bin/rbash").resolve() == BASH
    with pytest.raises(JobSpecError, match="is a shell"):
        load_job_spec(write(tmp_path, spec_text('["rbash", "-c", "id"]')), JobPolicy((tmp_path,)))


def test_a_link_to_env_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runner").symlink_to("/usr/bin/env")
    with pytest.raises(JobSpecError, match="env"):
        load_job_spec(write(tmp_path, spec_text(f'["{tmp_path}/runner", "bash", "-c", "id"]')), JobPolicy((tmp_path,)))


def test_a_hard_link_to_a_shell_is_refused_by_its_inode(tmp_path: Path) -> None:
    link = tmp_path / "trainer"
    try:
        os.link(BASH, link)
    except OSError as exc:  # another file system: the hard link cannot be made here
        pytest.fail(f"cannot hard-link {BASH} into {tmp_path}: {exc}")
    assert shell_reason(str(link)) is not None


def test_ordinary_programs_pass(tmp_path: Path) -> None:
    assert shell_reason(sys.executable) is None
    assert shell_reason("/usr/bin/true") is None
    assert shell_reason(str(tmp_path / "missing")) is None, "a missing program is the launcher's error, not this"


def test_the_launcher_refuses_a_link_swapped_to_a_shell_after_the_spec_was_read(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.symlink_to("/usr/bin/true")
    load_job_spec(write(tmp_path, spec_text(f'["{tool}", "-c", "touch {tmp_path}/ran"]')), JobPolicy((tmp_path,)))
    tool.unlink()
    tool.symlink_to(BASH)  # swapped between submit and launch
    req = LaunchRequest(
        argv=(str(tool), "-c", f"touch {tmp_path}/ran"), env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        log_path=tmp_path / "rank.log",
    )  # fmt: skip
    with pytest.raises(OSError, match="is a shell"):
        asyncio.run(SubprocessLauncher().launch(req))
    assert not (tmp_path / "ran").exists(), "nothing ran"
