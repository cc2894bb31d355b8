"""Job specs: a valid spec parses to exactly what it says; hostile or malformed ones are refused, naming the culprit."""

from __future__ import annotations

import os
import pwd
import re
import signal
import sys
from pathlib import Path

import pytest

from flexmig.errors import JobSpecError
from flexmig.jobspec import JobPolicy, JobSpec, load_job_spec, parse_job_spec
from flexmig.mig import H200

ME = pwd.getpwuid(os.geteuid()).pw_name
ROOT = Path(__file__).resolve().parents[2]

GOOD = f"""\
name = "train-ddp"
argv = ["{sys.executable}", "train.py", "--steps", "100"]
user = "{ME}"
working_dir = "work"
checkpoint_dir = "ckpt"
launcher = "torchrun"
env = {{ OMP_NUM_THREADS = "1" }}

[ranks]
min = 1
max = 4
start = 2

[need]
profile = "1g.18gb"

[hook]
signal = "SIGUSR2"
ack_timeout_s = 30
exit_timeout_s = 5
"""


def write(tmp_path: Path, text: str, name: str = "job.toml", mode: int = 0o644) -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    p = tmp_path / name
    p.write_text(text)
    p.chmod(mode)
    return p


@pytest.fixture
def policy(tmp_path: Path) -> JobPolicy:
    return JobPolicy(allowed_dirs=(tmp_path,))


def test_a_valid_spec_gives_every_key_its_value(tmp_path: Path, policy: JobPolicy) -> None:
    spec = load_job_spec(write(tmp_path, GOOD), policy)
    assert spec.name == "train-ddp"
    assert spec.argv == (sys.executable, "train.py", "--steps", "100")
    assert spec.user == ME and spec.group is None
    assert spec.working_dir == (tmp_path / "work").resolve()
    assert spec.checkpoint_dir == (tmp_path / "work" / "ckpt").resolve()
    assert spec.ack_path == spec.checkpoint_dir / "flexmig-ack.json"
    assert (spec.ranks_min, spec.ranks_max, spec.ranks_start) == (1, 4, 2)
    assert spec.need.profile == "1g.18gb" and spec.need.profile_on(H200).name == "1g.18gb"
    assert spec.launcher == "torchrun"
    assert spec.hook.signal == signal.SIGUSR2
    assert (spec.hook.ack_timeout_s, spec.hook.exit_timeout_s) == (30.0, 5.0)
    assert spec.env == (("OMP_NUM_THREADS", "1"),)


def test_omitted_keys_take_their_defaults(tmp_path: Path, policy: JobPolicy) -> None:
    text = f'name = "j"\nargv = ["{sys.executable}"]\nuser = "{ME}"\nworking_dir = "work"\ncheckpoint_dir = "c"\n'
    text += "[need]\ncompute_slices = 2\n"
    spec = load_job_spec(write(tmp_path, text), JobPolicy((tmp_path,), default_ack_timeout_s=42))
    assert (spec.ranks_min, spec.ranks_max, spec.ranks_start) == (1, 1, 1)
    assert spec.launcher == "plain" and spec.hook.signal == signal.SIGUSR1
    assert spec.hook.ack_timeout_s == 42, "the daemon's jobs.ack_timeout_s applies"
    assert spec.need.profile_on(H200).name == "2g.35gb"
    assert spec.runtime_s is None, "a run time nobody stated is unknown"


def with_runtime(value: str) -> str:
    return GOOD.replace('launcher = "torchrun"\n', f'launcher = "torchrun"\nruntime_s = {value}\n')


def test_a_stated_run_time_is_kept_and_survives_the_journal(tmp_path: Path, policy: JobPolicy) -> None:
    spec = load_job_spec(write(tmp_path, with_runtime("5400")), policy)
    assert spec.runtime_s == 5400.0
    assert JobSpec.from_dict(spec.to_dict(), spec.source) == spec


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "4e7", '"1h"', "true"])
def test_a_run_time_that_is_no_positive_number_of_seconds_within_a_year_is_refused(
    tmp_path: Path, policy: JobPolicy, value: str
) -> None:
    with pytest.raises(JobSpecError, match=r"job\.toml:7: runtime_s: "):
        load_job_spec(write(tmp_path, with_runtime(value)), policy)


def test_memory_and_compute_pick_the_smallest_profile_that_holds_both(tmp_path: Path, policy: JobPolicy) -> None:
    text = GOOD.replace('profile = "1g.18gb"', "memory_gib = 40\ncompute_slices = 1")
    spec = load_job_spec(write(tmp_path, text), policy)
    assert spec.need.profile_on(H200).name == "3g.71gb"


def test_spec_survives_the_journal_round_trip(tmp_path: Path, policy: JobPolicy) -> None:
    spec = load_job_spec(write(tmp_path, GOOD), policy)
    again = JobSpec.from_dict(spec.to_dict(), spec.source)
    assert again == spec


def test_a_bare_program_name_is_resolved_to_its_path(tmp_path: Path, policy: JobPolicy) -> None:
    spec = load_job_spec(write(tmp_path, GOOD.replace(sys.executable, "true")), policy)
    assert Path(spec.argv[0]).is_absolute() and Path(spec.argv[0]).name == "true"


def test_the_shipped_example_spec_is_valid() -> None:
    spec = load_job_spec(ROOT / "examples" / "train_ddp.toml", JobPolicy((ROOT,), check_permissions=False))
    assert spec.name == "train-ddp" and spec.argv[1].endswith("examples/train_ddp.py")


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("edit", "key", "why"),
    [
        (('name = "train-ddp"', 'name = "train; rm -rf /"'), "name", "letters, digits"),
        (('name = "train-ddp"', 'name = "$(reboot)"'), "name", "letters, digits"),
        ((f'argv = ["{sys.executable}",', 'argv = ["python3;reboot",'), "argv", "shell metacharacters"),
        ((f'argv = ["{sys.executable}",', 'argv = ["/bin/sh", "-c",'), "argv", "never runs a shell"),
        ((f'argv = ["{sys.executable}",', 'argv = ["/usr/bin/env", "bash",'), "argv", "never runs a shell"),
        ((f'user = "{ME}"', 'user = "root && reboot"'), "user", "not a valid user name"),
        (("OMP_NUM_THREADS", "LD_PRELOAD"), "env", "set by flexmig"),
        (("OMP_NUM_THREADS", "FLEXMIG_RESUME"), "env", "set by flexmig"),
        (("OMP_NUM_THREADS", '"A B"'), "env", "not a valid environment variable name"),
    ],
)
def test_shell_metacharacters_and_shells_are_refused(
    tmp_path: Path, policy: JobPolicy, edit: tuple[str, str], key: str, why: str
) -> None:
    text = GOOD.replace(*edit)
    with pytest.raises(JobSpecError, match=why) as err:
        load_job_spec(write(tmp_path, text), policy)
    assert str(tmp_path / "job.toml") in str(err.value) and f": {key}:" in str(err.value)


def test_argv_as_a_shell_string_is_refused(tmp_path: Path, policy: JobPolicy) -> None:
    text = GOOD.replace(f'argv = ["{sys.executable}", "train.py", "--steps", "100"]', 'argv = "python train.py"')
    with pytest.raises(JobSpecError, match="not a string: flexmig never runs a shell"):
        load_job_spec(write(tmp_path, text), policy)


def test_unknown_keys_are_refused_with_their_line(tmp_path: Path, policy: JobPolicy) -> None:
    with pytest.raises(JobSpecError) as err:
        load_job_spec(write(tmp_path, GOOD.replace("[hook]\n", "[hook]\nretries = 3\n")), policy)
    msg = str(err.value)
    assert "job.toml:18: hook.retries: unknown key" in msg
    with pytest.raises(JobSpecError, match=r"job.toml:2: argvs: unknown key"):
        load_job_spec(write(tmp_path, GOOD.replace("argv =", "argvs =")), policy)


def _line_in(text: str, line: str) -> int:
    """The 1-based number of the last line of ``text`` that equals ``line``."""
    return [n for n, got in enumerate(text.split("\n"), 1) if got == line][-1]


def test_a_header_inside_a_multi_line_string_is_not_where_the_key_is(tmp_path: Path, policy: JobPolicy) -> None:
    argv = f'argv = ["{sys.executable}", "train.py", "--steps", "100"]'
    text = GOOD.replace(argv, argv[:-1] + ', """\n[hook]\nsignal = "SIGKILL"\n"""]')
    text = text.replace('signal = "SIGUSR2"', 'signal = "SIGKILL"')
    assert text.count("[hook]") == 2 and text.count('signal = "SIGKILL"') == 2
    with pytest.raises(JobSpecError, match="is not one of") as err:
        load_job_spec(write(tmp_path, text), policy)
    line = _line_in(text, 'signal = "SIGKILL"')
    assert f"job.toml:{line}: hook.signal:" in str(err.value)


def test_a_key_in_an_inline_table_is_refused_with_its_line(tmp_path: Path, policy: JobPolicy) -> None:
    text = GOOD.replace('[hook]\nsignal = "SIGUSR2"\nack_timeout_s = 30\nexit_timeout_s = 5\n', "")
    text = text.replace("[ranks]", 'hook = { signal = "SIGKILL" }\n\n[ranks]')
    with pytest.raises(JobSpecError, match="is not one of") as err:
        load_job_spec(write(tmp_path, text), policy)
    line = _line_in(text, 'hook = { signal = "SIGKILL" }')
    assert f"job.toml:{line}: hook.signal:" in str(err.value)


@pytest.mark.parametrize(
    ("edit", "key", "why"),
    [
        (("min = 1", 'min = "1"'), "ranks.min", "must be an integer, not a string"),
        (("ack_timeout_s = 30", "ack_timeout_s = true"), "hook.ack_timeout_s", "must be a number, not a boolean"),
        (("ack_timeout_s = 30", "ack_timeout_s = -1"), "hook.ack_timeout_s", "must be in"),
        (('signal = "SIGUSR2"', 'signal = "SIGKILL"'), "hook.signal", "is not one of"),
        (("max = 4", "max = 0"), "ranks.max", "less than ranks.min"),
        (("start = 2", "start = 9"), "ranks.start", "outside ranks.min..ranks.max"),
        (('launcher = "torchrun"', 'launcher = "mpirun"'), "launcher", "is not 'plain' or 'torchrun'"),
        (("[ranks]\nmin = 1\nmax = 4\nstart = 2\n", "ranks = 3\n"), "ranks", "must be a table"),
        (("exit_timeout_s = 5", 'exit_timeout_s = 5\nstandby = "yes"'), "hook.standby", "must be true or false"),
        (("exit_timeout_s = 5", "exit_timeout_s = 5\nstandby_timeout_s = 0"), "hook.standby_timeout_s", "must be in"),
        (("exit_timeout_s = 5", "exit_timeout_s = 5\nkeep = -1"), "hook.keep", r"must be 0 \(keep every"),
        (("exit_timeout_s = 5", 'exit_timeout_s = 5\nkeep = "2"'), "hook.keep", "must be an integer"),
        (("exit_timeout_s = 5", "exit_timeout_s = 5\nstandby = true"), "hook.standby", "needs launcher 'plain'"),
    ],
)
def test_wrong_types_and_values_are_refused_naming_the_key(
    tmp_path: Path, policy: JobPolicy, edit: tuple[str, str], key: str, why: str
) -> None:
    with pytest.raises(JobSpecError, match=why) as err:
        load_job_spec(write(tmp_path, GOOD.replace(*edit)), policy)
    assert f": {key}:" in str(err.value)


@pytest.mark.parametrize(
    ("need", "why"),
    [
        ('profile = "9g.99gb"', "no MIG profile of any supported GPU"),
        ('profile = "1g.18gb;x"', "not a MIG profile name"),
        ("memory_gib = 500", "no MIG profile of any supported GPU offers"),
        ("compute_slices = 5", "not a MIG compute size"),
        ('profile = "1g.18gb"\ncompute_slices = 1', "either a profile or"),
        ("", r"give \[need\] profile"),
    ],
)
def test_impossible_profiles_are_refused(tmp_path: Path, policy: JobPolicy, need: str, why: str) -> None:
    with pytest.raises(JobSpecError, match=why):
        load_job_spec(write(tmp_path, GOOD.replace('profile = "1g.18gb"', need)), policy)


def test_a_profile_of_another_gpu_model_is_refused_on_this_node(tmp_path: Path, policy: JobPolicy) -> None:
    spec = load_job_spec(write(tmp_path, GOOD.replace("1g.18gb", "1g.5gb")), policy)  # an A100-40GB profile
    with pytest.raises(KeyError, match=r"h200 has no MIG profile '1g\.5gb'"):
        spec.need.profile_on(H200)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (('working_dir = "work"', 'working_dir = "/etc"'), "working_dir"),
        (('checkpoint_dir = "ckpt"', 'checkpoint_dir = "../../.."'), "checkpoint_dir"),
        (('checkpoint_dir = "ckpt"', 'checkpoint_dir = "/var/tmp/../../etc"'), "checkpoint_dir"),
    ],
)
def test_paths_outside_the_allowed_directories_are_refused(
    tmp_path: Path, policy: JobPolicy, edit: tuple[str, str], key: str
) -> None:
    with pytest.raises(JobSpecError, match="outside the allowed directories") as err:
        load_job_spec(write(tmp_path, GOOD.replace(*edit)), policy)
    assert f": {key}:" in str(err.value)


def test_a_symlink_cannot_smuggle_a_directory_out_of_the_allowed_ones(tmp_path: Path, policy: JobPolicy) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "ckpt").symlink_to("/etc")
    with pytest.raises(JobSpecError, match="checkpoint_dir: /etc is outside"):
        load_job_spec(write(tmp_path, GOOD), policy)


def test_a_spec_others_can_write_is_refused_unread(tmp_path: Path, policy: JobPolicy) -> None:
    p = write(tmp_path, "this is not even TOML", mode=0o666)
    with pytest.raises(JobSpecError, match="lets group or others write it"):
        load_job_spec(p, policy)


def test_a_spec_over_the_size_limit_is_refused_unread(tmp_path: Path, policy: JobPolicy) -> None:
    p = write(tmp_path, "")
    os.truncate(p, 1 << 40)  # a sparse terabyte (as /proc/kcore claims): reading it whole exhausts memory
    with pytest.raises(JobSpecError, match=re.escape(f"{p}: job spec larger than 65536 bytes (1099511627776 bytes)")):
        load_job_spec(p, policy)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("check_permissions", [True, False])
def test_a_fifo_is_refused_unread_without_waiting_for_a_writer(tmp_path: Path, check_permissions: bool) -> None:
    p = tmp_path / "job.toml"
    os.mkfifo(p, 0o644)
    with pytest.raises(JobSpecError, match=re.escape(f"{p}: ") + ".*not a regular file"):
        load_job_spec(p, JobPolicy((tmp_path,), check_permissions=check_permissions))


def test_a_proc_file_that_says_it_is_empty_but_is_not_is_refused(tmp_path: Path, policy: JobPolicy) -> None:
    p = Path(f"/proc/{os.getpid()}/status")  # ours, read-only: passes the permission rules
    with pytest.raises(JobSpecError, match=re.escape(f"{p}: refused: holds other than the 0 bytes its size says")):
        load_job_spec(p, policy)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_a_spec_owned_by_another_user_is_refused(tmp_path: Path, policy: JobPolicy) -> None:
    p = write(tmp_path, GOOD)
    os.chown(p, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(JobSpecError, match="owned by uid"):
        load_job_spec(p, policy)


def test_an_unknown_user_is_refused(tmp_path: Path, policy: JobPolicy) -> None:
    with pytest.raises(JobSpecError, match="no such user 'nosuchuser'"):
        load_job_spec(write(tmp_path, GOOD.replace(f'user = "{ME}"', 'user = "nosuchuser"')), policy)


def test_invalid_toml_names_the_file(tmp_path: Path, policy: JobPolicy) -> None:
    with pytest.raises(JobSpecError, match=r"job.toml: not valid TOML"):
        load_job_spec(write(tmp_path, "name = \n"), policy)


def test_parse_without_a_file_names_the_spec_generically(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match=r"<job spec>: name: is required"):
        parse_job_spec("argv = ['x']", JobPolicy((tmp_path,), check_permissions=False))


# ------------------------------------------------------------------------------------------ every problem at once


def test_every_problem_of_a_spec_is_named_at_once_in_file_order(tmp_path: Path, policy: JobPolicy) -> None:
    text = (
        GOOD.replace('name = "train-ddp"', 'name = "train ddp"')
        .replace("argv =", "argvs =")
        .replace('signal = "SIGUSR2"', 'signal = "SIGKILL"')
        .replace("OMP_NUM_THREADS", "LD_PRELOAD")
    )
    path = write(tmp_path, text)
    with pytest.raises(JobSpecError) as err:
        load_job_spec(path, policy)
    lines = str(err.value).splitlines()
    assert [line.split(": ", 2)[1] for line in lines] == ["name", "argvs", "env", "hook.signal"], lines
    assert all(line.startswith(f"{path}:") for line in lines)
    assert "argvs: unknown key (did you mean 'argv'?)" in lines[1]
    assert not any("argv: is required" in line for line in lines), "the misspelt key was told, not its absence"


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("usr", "user"), ("chekpoint_dir", "checkpoint_dir"), ("launchr", "launcher")],
)
def test_a_misspelt_key_says_which_key_it_probably_is(tmp_path: Path, policy: JobPolicy, typo: str, meant: str) -> None:
    text = GOOD.replace("[ranks]", f'{typo} = "x"\n\n[ranks]')
    with pytest.raises(JobSpecError, match=rf"{typo}: unknown key \(did you mean '{meant}'\?\)"):
        load_job_spec(write(tmp_path, text), policy)


def test_a_misspelt_key_in_a_table_says_which_key_it_probably_is(tmp_path: Path, policy: JobPolicy) -> None:
    text = GOOD.replace("[ranks]\nmin", "[ranks]\nmn")
    with pytest.raises(JobSpecError, match=r"ranks.mn: unknown key \(did you mean 'min'\?\)"):
        load_job_spec(write(tmp_path, text), policy)
    far = GOOD.replace("[ranks]\nmin", "[ranks]\nzzz")
    with pytest.raises(JobSpecError, match=r"ranks.zzz: unknown key \(known keys in \[ranks\]: max, min, start\)"):
        load_job_spec(write(tmp_path, far), policy)


def test_standby_ranks_are_opt_in_and_kept_across_the_journal(tmp_path: Path, policy: JobPolicy) -> None:
    plain = GOOD.replace('launcher = "torchrun"', 'launcher = "plain"')
    assert load_job_spec(write(tmp_path, plain), policy).hook.standby is False
    opted = plain.replace("exit_timeout_s = 5", "exit_timeout_s = 5\nstandby = true")
    spec = load_job_spec(write(tmp_path, opted), policy)
    assert spec.hook.standby is True and spec.hook.standby_timeout_s == 120.0
    assert JobSpec.from_dict(spec.to_dict()).hook == spec.hook
