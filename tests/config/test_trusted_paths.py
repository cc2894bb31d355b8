"""A file that steers the daemon is only as safe as the directories above it (sshd's StrictModes rule).

Configuration files, job specs and credential files in a directory that others may write (or below one) are
refused, naming the directory; a root-owned directory with the sticky bit (``/tmp``) is accepted, because nobody
else can rename or remove what root owns in it. A symlink is judged by its target, and the refusal names both.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from flexmig.config import ConfigFileError, load_config
from flexmig.errors import ConfigError, JobSpecError, SimError
from flexmig.jobspec import JobPolicy, load_job_spec
from flexmig.security import check_file_permissions, resolve_trusted
from flexmig.sim import install, uninstall

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sticky rule trusts root-owned directories only")

SPEC = """\
name = "j"
argv = ["/bin/true"]
user = "root"
working_dir = "{base}"
checkpoint_dir = "{base}/ckpt"
[need]
profile = "1g.18gb"
"""


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def opened_dir(path: Path, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_config_in_a_directory_others_may_write_is_refused_naming_it(tmp_path: Path, mode: int) -> None:
    shared = opened_dir(tmp_path / "shared", mode)
    path = write(shared / "flexmig.toml", 'mode = "act"\n')
    with pytest.raises(ConfigFileError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.file == str(path)
    assert problem.message.startswith(
        f"refused: directory {shared} has mode {mode:04o}: its group or others can write it"
    )
    assert f"chmod go-w {shared}" in problem.message


def test_a_config_two_levels_below_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = opened_dir(tmp_path / "shared", 0o777)
    path = write(opened_dir(shared / "etc" / "flexmig", 0o755) / "flexmig.toml", "")
    with pytest.raises(ConfigFileError, match=re.escape(f"directory {shared} has mode 0777")):
        load_config(path)


def test_a_job_spec_in_a_group_writable_directory_is_refused(tmp_path: Path) -> None:
    jobs = opened_dir(tmp_path / "jobs", 0o775)
    spec = write(jobs / "j.toml", SPEC.format(base=tmp_path))
    with pytest.raises(JobSpecError, match=re.escape(f"{spec}: refused: directory {jobs} has mode 0775")):
        load_job_spec(spec, JobPolicy((tmp_path,)))
    jobs.chmod(0o755)
    assert load_job_spec(spec, JobPolicy((tmp_path,))).name == "j"


@needs_root
def test_a_config_below_a_root_owned_sticky_directory_is_accepted(tmp_path: Path) -> None:
    sticky = opened_dir(tmp_path / "tmp", 0o1777)
    path = write(opened_dir(sticky / "mine", 0o755) / "flexmig.toml", 'mode = "advise"\n')
    assert load_config(path).mode == "advise"


@needs_root
def test_a_sticky_directory_of_another_user_is_not_trusted(tmp_path: Path) -> None:
    sticky = opened_dir(tmp_path / "tmp", 0o1777)
    os.chown(sticky, 4242, 4242)
    path = write(opened_dir(sticky / "mine", 0o755) / "flexmig.toml", "")
    with pytest.raises(ConfigFileError, match=re.escape(f"directory {sticky} is owned by uid 4242")):
        load_config(path)


def test_a_config_directly_in_a_sticky_directory_others_own_things_in_is_judged_by_its_own_owner(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a root-owned sticky directory")
    sticky = opened_dir(tmp_path / "tmp", 0o1777)
    path = write(sticky / "flexmig.toml", "")
    load_config(path)  # root's file in root's sticky directory: nobody else can swap it
    os.chown(path, 4242, 4242)
    with pytest.raises(ConfigFileError, match=r"owned by uid 4242"):
        load_config(path)


def test_a_config_symlink_refusal_names_the_link_and_the_target(tmp_path: Path) -> None:
    target = write(tmp_path / "srv" / "real.toml", 'mode = "act"\n', 0o666)
    link = tmp_path / "etc" / "flexmig.toml"
    link.parent.mkdir()
    link.symlink_to(target)
    with pytest.raises(ConfigFileError) as info:
        load_config(link)
    (problem,) = info.value.problems
    assert problem.file == str(link)
    assert problem.message == (
        f"symlink to {target}: refused: mode 0666 lets group or others write it (chmod go-w {target})"
    )


def test_a_config_symlink_into_a_world_writable_directory_is_refused_naming_that_directory(tmp_path: Path) -> None:
    shared = opened_dir(tmp_path / "shared", 0o777)
    target = write(shared / "real.toml", "", 0o644)
    link = tmp_path / "flexmig.toml"
    link.symlink_to(target)
    with pytest.raises(ConfigFileError, match=re.escape(f"{link}: refused: directory {shared} has mode 0777")):
        load_config(link)


def test_a_symlink_on_the_way_is_followed_and_judged_where_it_leads(tmp_path: Path) -> None:
    real = opened_dir(tmp_path / "real", 0o755)
    write(real / "flexmig.toml", 'mode = "advise"\n')
    (tmp_path / "via").symlink_to("real")
    where = resolve_trusted(tmp_path / "via" / "flexmig.toml")
    assert where.target == real / "flexmig.toml" and where.links == (tmp_path / "via",)
    assert load_config(tmp_path / "via" / "flexmig.toml").mode == "advise"


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(ConfigFileError, match=r"more than 40 symlinks on the way"):
        load_config(tmp_path / "a")


def test_a_password_file_in_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = opened_dir(tmp_path / "shared", 0o777)
    pw = write(shared / "mqtt.password", "s3cret\n", 0o600)
    with pytest.raises(ConfigError, match=re.escape(f"{pw}: refused: directory {shared} has mode 0777")):
        check_file_permissions(pw, "secret")
    path = write(tmp_path / "flexmig.toml", f'[mqtt]\nusername = "u"\npassword_file = "{pw}"\n')
    with pytest.raises(ConfigFileError, match=re.escape(f"flexmig.toml:3: mqtt.password_file: {pw}: refused")):
        load_config(path)


@pytest.mark.parametrize("content", ["[]", "42", '"h200"', "null"])
def test_a_simulator_state_file_that_is_not_an_object_is_one_clear_error(tmp_path: Path, content: str) -> None:
    state = write(tmp_path / "sim.json", content)
    with pytest.raises(SimError) as info:
        install("h200x1", state_path=state)
    uninstall()
    message = str(info.value)
    assert str(state) in message and "\n" not in message
    assert "must hold a JSON object" in message
