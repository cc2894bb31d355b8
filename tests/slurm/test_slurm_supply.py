"""What Slurm is told about the node: gres.conf lines in GRES index order, flexmig's block in a shared gres.conf,
the TaskProlog's map and what the TaskProlog makes of it (MIG UUIDs, hook variables, resume after a requeue)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flexmig import hook
from flexmig.errors import SlurmError
from flexmig.nvml.types import GpuInfo, GpuInstanceInfo, Inventory, MigDeviceInfo
from flexmig.slurm import taskprolog
from flexmig.slurm.gresconf import block_markers, gres_map, gres_records, gres_string, merge_block
from flexmig.slurm.hookcheck import hook_problem
from flexmig.slurm.install import render_taskprolog
from flexmig.slurm.minors import parse_mig_minors, render_mig_minors
from flexmig.slurm.slurmd import check_node_conf, dynamic_conf
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.supply import Supply

MINORS = parse_mig_minors(render_mig_minors(2))
_PROFILE_IDS = {"7g.141gb": 0, "4g.71gb": 5, "3g.71gb": 9, "2g.35gb": 14, "1g.18gb": 19}


def inventory(*gpus: list[tuple[str, int, int]]) -> Inventory:
    """GPUs with instances ``(profile, start, gi_id)``, each with one compute instance (ID 0)."""
    out = []
    for g, items in enumerate(gpus):
        gis = tuple(GpuInstanceInfo(gi, _PROFILE_IDS[p], p, start, 1) for p, start, gi in items)
        devs = tuple(
            MigDeviceInfo(i, f"MIG-{g}-{start}", gi, 0, None, None, ()) for i, (_, start, gi) in enumerate(items)
        )
        out.append(GpuInfo(g, f"GPU-{g}", "NVIDIA H200", None, True, True, gis, devs))
    return Inventory("560", "12", tuple(out))


INV = inventory([("1g.18gb", 6, 13), ("3g.71gb", 0, 1), ("2g.35gb", 4, 5)], [("1g.18gb", 5, 12), ("3g.71gb", 0, 2)])


def test_records_are_grouped_by_type_in_order_of_first_appearance_then_by_gpu_and_start() -> None:
    recs = gres_records(INV, MINORS, "/dev")
    assert [(r.type, r.gpu, r.start) for r in recs] == [
        ("3g.71gb", 0, 0),
        ("3g.71gb", 1, 0),
        ("2g.35gb", 0, 4),
        ("1g.18gb", 0, 6),
        ("1g.18gb", 1, 5),
    ]
    # slurmd numbers GRES by the Gres= string's type order, then gres.conf order: record i is index i
    assert gres_string(recs) == "gpu:3g.71gb:2,gpu:2g.35gb:1,gpu:1g.18gb:2"


def test_a_line_names_the_gpu_and_both_capability_devices() -> None:
    rec = gres_records(INV, MINORS, "/dev")[0]
    assert rec.line("n1") == (
        "NodeName=n1 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,"
        "/dev/nvidia-caps/nvidia-cap13"
    )


def test_no_instance_registers_no_gpu() -> None:
    assert gres_string(gres_records(inventory([]), MINORS)) == "gpu:0"


def test_flexmig_replaces_only_its_own_block_in_a_shared_gres_conf() -> None:
    recs = gres_records(INV, MINORS, "/dev")
    site = "# site file\nNodeName=other[1-4] Name=gpu File=/dev/nvidia[0-3]\nName=mps Count=100\n"
    once = merge_block(site, "n1", recs)
    assert once.startswith(site.rstrip("\n"))
    begin, end = block_markers("n1")
    assert once.count(begin) == 1 and once.count(end) == 1
    twice = merge_block(once, "n1", recs[:1])
    assert twice.count("NodeName=n1 ") == 1 and "NodeName=other[1-4]" in twice and "Name=mps" in twice


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("NodeName=n[1-2] Name=gpu File=/dev/nvidia0\n", "gres.conf:1"),
        ("Name=gpu File=/dev/nvidia0\n", "every node"),
        ("NodeName=n1 AutoDetect=nvml\n", "gres.conf:1"),
    ],
)
def test_gpu_lines_for_the_node_outside_the_block_are_refused_naming_the_line(text: str, culprit: str) -> None:
    with pytest.raises(SlurmError, match="outside flexmig's block") as err:
        merge_block(text, "n1", gres_records(INV, MINORS))
    assert culprit in str(err.value) or "configures GPUs" in str(err.value)


def test_a_block_without_its_end_is_refused() -> None:
    begin, _ = block_markers("n1")
    with pytest.raises(SlurmError, match="no end line"):
        merge_block(f"{begin}\nNodeName=n1 Name=gpu Type=x MultipleFiles=/dev/nvidia0\n", "n1", ())


def test_a_node_name_that_is_not_slurms_is_refused() -> None:
    with pytest.raises(SlurmError, match="not a Slurm node name"):
        merge_block("", "n1 NodeName=evil", ())


def test_slurmd_conf_takes_key_value_words_only_and_never_gres() -> None:
    assert check_node_conf("CPUs=64 RealMemory=500000 Feature=mig") == ("CPUs=64", "RealMemory=500000", "Feature=mig")
    assert dynamic_conf("gpu:1g.18gb:2", ("CPUs=4",)) == "CPUs=4 Gres=gpu:1g.18gb:2"
    for bad in ('CPUs="4"', "CPUs=4 ; rm -rf /", "Gres=gpu:1"):
        with pytest.raises(SlurmError):
            check_node_conf(bad)


# ------------------------------------------------------------------------------------------------ TaskProlog
def _env(tmp: Path, gpus: str, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_GPUS": gpus,
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": str(os.geteuid()),
        **extra,
    }


def _map(tmp: Path) -> Path:
    recs = gres_records(INV, MINORS)
    path = tmp / "map.json"
    path.write_text(
        json.dumps(gres_map("n1", recs, {"checkpoint_dir": str(tmp / "ck/{user}/{job_id}"), "ack_wait_s": 90}))
    )
    assert taskprolog.prolog_lines(_env(tmp, ""), str(path)) == []  # the Prolog, as root: the user's base
    return path


def test_the_taskprolog_turns_gres_indices_into_mig_uuids_and_sets_the_hook_variables(tmp_path: Path) -> None:
    out = taskprolog.lines(_env(tmp_path, "0,3"), str(_map(tmp_path)))
    assert "export CUDA_VISIBLE_DEVICES=MIG-0-0,MIG-0-6" in out
    assert "export FLEXMIG_JOB=slurm-42" in out
    assert f"export FLEXMIG_CHECKPOINT_DIR={tmp_path}/ck/alice/42" in out
    assert f"export FLEXMIG_ACK_PATH={tmp_path}/ck/alice/42/flexmig-ack.json" in out
    assert "export FLEXMIG_ACK_WAIT_S=90" in out
    assert not any(line.startswith("export FLEXMIG_RESUME") for line in out)
    assert (tmp_path / "ck" / "alice" / "42").is_dir()


def test_after_a_requeue_the_taskprolog_resumes_at_the_acknowledged_step(tmp_path: Path) -> None:
    path = _map(tmp_path)
    first = taskprolog.lines(_env(tmp_path, "1"), str(path))
    env = dict(line.removeprefix("export ").split("=", 1) for line in first if line.startswith("export "))
    env["FLEXMIG_ACK_WAIT_S"] = "0.05"  # under Slurm the hook then waits to be requeued; here, briefly
    h = hook.install(env, handler=False)
    assert h.env.ack_wait_s == 0.05
    ckpt = h.checkpoint_dir / "step-7.json"
    hook.atomic_write_json(ckpt, {"step": 7})
    h.acknowledge(7, ckpt)
    again = taskprolog.lines(_env(tmp_path, "1", SLURM_RESTART_COUNT="1"), str(path))
    assert f"export FLEXMIG_RESUME={ckpt}" in again and "export FLEXMIG_RESUME_STEP=7" in again


def test_the_taskprolog_refuses_a_checkpoint_directory_another_user_planted(tmp_path: Path) -> None:
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    (tmp_path / "ck" / "alice").mkdir(parents=True)
    (tmp_path / "ck" / "alice" / "42").symlink_to(elsewhere)
    out = taskprolog.lines(_env(tmp_path, "0"), str(_map(tmp_path)))
    assert "export CUDA_VISIBLE_DEVICES=MIG-0-0" in out
    assert any("checkpoint hook is off" in line for line in out)
    assert not any(line.startswith("export FLEXMIG_JOB") for line in out)


def test_the_taskprolog_never_fails_the_task_and_says_why(tmp_path: Path) -> None:
    # no map: a node flexmig does not manage (the TaskProlog runs cluster-wide); Slurm's variables stay
    missing = taskprolog.lines(_env(tmp_path, "0"), str(tmp_path / "nope.json"))
    assert missing == [
        f"print flexmig-taskprolog: no GRES map at {tmp_path / 'nope.json'}; CUDA_VISIBLE_DEVICES left as Slurm set it"
    ]
    # a flexmig node whose map cannot name the task's instance: the task sees no GPU rather than Slurm's index,
    # which CUDA would read as an instance another job may hold
    (tmp_path / "bad.json").write_text("{")
    bad = taskprolog.lines(_env(tmp_path, "0"), str(tmp_path / "bad.json"))
    other = taskprolog.lines({**_env(tmp_path, "0"), "SLURMD_NODENAME": "n2"}, str(_map(tmp_path)))
    unknown = taskprolog.lines(_env(tmp_path, "9"), str(_map(tmp_path)))
    (tmp_path / "old.json").write_text('{"version": 2}')
    old = taskprolog.lines(_env(tmp_path, "0"), str(tmp_path / "old.json"))
    for out, culprit in ((bad, "cannot read"), (other, "not n2"), (unknown, "GRES index 9"), (old, "version 1")):
        assert out[0].startswith("print flexmig-taskprolog: ") and culprit in out[0], out
        assert "sees no GPU" in out[0], out
        assert out[1:] == ["export CUDA_VISIBLE_DEVICES="], out
    # a task that asked for no GPU is only told
    none = taskprolog.lines(_env(tmp_path, ""), str(tmp_path / "bad.json"))
    assert len(none) == 1 and none[0].startswith("print ") and "cannot read" in none[0]


@pytest.mark.integration
def test_the_installed_taskprolog_empties_cuda_visible_devices_slurm_gave(tmp_path: Path) -> None:
    # the script as Slurm runs it: a fresh python3 with the task's environment, its lines as Slurm reads them
    script = tmp_path / "taskprolog"
    script.write_text(render_taskprolog(tmp_path / "map.json", sys.executable))
    script.chmod(0o755)
    _map(tmp_path)
    env = {**_env(tmp_path, "7"), "CUDA_VISIBLE_DEVICES": "7", "PATH": os.environ.get("PATH", "")}
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.splitlines()[-1] == "export CUDA_VISIBLE_DEVICES=", out


def test_the_installed_taskprolog_carries_its_interpreter_and_map(tmp_path: Path) -> None:
    text = render_taskprolog(Path("/run/x/map.json"), "/usr/bin/python3")
    assert text.startswith("#!/usr/bin/python3 -I\n")
    assert 'MAP_PATH = "/run/x/map.json"' in text and "import flexmig" not in text
    with pytest.raises(ValueError, match="absolute"):
        render_taskprolog(Path("relative.json"))


def test_the_taskprologs_default_checkpoint_directory_is_the_configurations() -> None:
    from flexmig.config import SlurmConfig  # noqa: PLC0415

    assert SlurmConfig().checkpoint_dir == taskprolog.DEFAULT_CHECKPOINT_DIR


# ------------------------------------------------------------------------------------------------ writing
def _supply(tmp: Path) -> Supply:
    minors = tmp / "mig-minors"
    minors.write_text(render_mig_minors(2))
    return Supply("n1", tmp / "gres.conf", tmp / "map.json", Path("/dev"), minors)


def test_the_block_and_the_map_are_written_beside_the_sites_lines(tmp_path: Path) -> None:
    supply = _supply(tmp_path)
    (tmp_path / "gres.conf").write_text("Name=mps Count=100\n")
    records = supply.write(INV)
    text = (tmp_path / "gres.conf").read_text()
    assert text.startswith("Name=mps Count=100\n") and text.count("NodeName=n1 Name=gpu") == len(records) == 5
    assert supply.index_map()[0] == (0, 0, "3g.71gb")


def test_a_gres_conf_others_can_write_is_refused_naming_it_and_left_as_it_is(tmp_path: Path) -> None:
    supply = _supply(tmp_path)
    conf = tmp_path / "gres.conf"
    conf.write_text("Name=mps Count=100\n")
    conf.chmod(0o666)
    with pytest.raises(SlurmError, match=str(conf)):
        supply.write(INV)
    assert conf.read_text() == "Name=mps Count=100\n"


def test_under_the_units_umask_the_map_and_the_directories_made_for_it_are_readable_by_all(tmp_path: Path) -> None:
    """flexmigd's unit has ``UMask=0077``: the map's directories came out 0700 and no job user's TaskProlog could read
    it. (The integration test with a job of a real user: tests/slurm/test_slurm_users.py.)"""
    supply = _supply(tmp_path)
    supply.map_path = tmp_path / "run" / "flexmig" / "slurm" / "map.json"
    old = os.umask(0o077)
    try:
        supply.write(INV)
    finally:
        os.umask(old)
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (supply.map_path, *supply.map_path.parents[:3])]
    assert modes == [0o644, 0o755, 0o755, 0o755], [oct(m) for m in modes]


def test_a_map_directory_others_may_not_search_is_one_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supply = _supply(tmp_path)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    supply.map_path = closed / "map.json"
    supply.write(INV)
    supply.write(INV)
    warned = [r.getMessage() for r in caplog.records if "cannot be read by the jobs' users" in r.getMessage()]
    assert len(warned) == 1 and f"directory {closed} is mode 0700" in warned[0], warned
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700  # an administrator's directory: left as it is


# ------------------------------------------------------------------------------------- checkpoint bases
OTHER_UID, OWNER_UID = 61234, 61235  # uids of no user: root may own files by them all the same


def _scratch(tmp: Path) -> Path:
    """A directory anybody may make entries in (sticky, like /var/tmp)."""
    d = tmp / "scratch"
    d.mkdir()
    d.chmod(0o1777)
    return d


def test_the_prolog_takes_back_a_base_another_user_planted_where_anybody_may_write(tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    planted = scratch / "fm"
    planted.mkdir(mode=0o755)
    (planted / "alice").mkdir()
    os.chown(planted, OTHER_UID, OTHER_UID)
    said = taskprolog.prepare_base(str(planted / "{user}" / "{job_id}"), "7", "alice", OWNER_UID, OWNER_UID)
    st = planted.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    base = (planted / "alice").lstat()
    assert (base.st_uid, base.st_gid, stat.S_IMODE(base.st_mode)) == (OWNER_UID, OWNER_UID, 0o700)
    (aside,) = [p for p in scratch.iterdir() if p.name != "fm"]
    assert aside.lstat().st_uid == OTHER_UID and (aside / "alice").is_dir()  # kept, not deleted
    assert len(said) == 1 and "put aside as" in said[0] and str(aside) in said[0], said


def test_the_prolog_takes_back_a_planted_symlink_and_never_follows_it(tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    target = tmp_path / "theirs"
    target.mkdir()
    (scratch / "fm").symlink_to(target)
    os.lchown(scratch / "fm", OTHER_UID, OTHER_UID)
    taskprolog.prepare_base(str(scratch / "fm" / "{user}" / "{job_id}"), "7", "alice", OWNER_UID, OWNER_UID)
    assert (scratch / "fm").is_dir() and not (scratch / "fm").is_symlink()
    assert list(target.iterdir()) == []  # nothing made where the link pointed


def test_the_prolog_refuses_a_base_of_another_owner_where_only_root_may_write(tmp_path: Path) -> None:
    root_part = tmp_path / "ck"
    root_part.mkdir(mode=0o755)
    theirs = root_part / "alice"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match=r"ck/alice is a directory of uid 61234.*not user alice's"):
        taskprolog.prepare_base(str(root_part / "{user}" / "{job_id}"), "7", "alice", OWNER_UID, OWNER_UID)
    assert theirs.stat().st_uid == OTHER_UID  # left as it is: an administrator's to fix


def test_without_the_prologs_base_the_taskprolog_turns_the_hook_off_and_writes_no_marker(tmp_path: Path) -> None:
    recs = gres_records(INV, MINORS)
    path = tmp_path / "map.json"
    path.write_text(json.dumps(gres_map("n1", recs, {"checkpoint_dir": str(tmp_path / "ck/{user}/{job_id}")})))
    out = taskprolog.lines(_env(tmp_path, "0"), str(path))
    assert "export CUDA_VISIBLE_DEVICES=MIG-0-0" in out  # the GPU all the same
    assert not any(line.startswith("export FLEXMIG_") and "SLURM_GPUS" not in line for line in out), out
    assert any("does not exist (flexmig's Prolog makes it" in line and "hook is off" in line for line in out), out
    assert not (tmp_path / "ck").exists()


def _job(uid: int, restarts: int = 0) -> SlurmJob:
    return SlurmJob(
        job_id=42, name="j", user_id=uid, user="alice", state="RUNNING", reason="None", partitions=("mig",),
        nodes=("n1",), node_count=1, gpus_per_node=(), held=(), requeue=True, comment="flexmig:hook", priority=1,
        submit_s=0.0, start_s=0.0, time_limit_s=None, restart_count=restarts,
    )  # fmt: skip


def test_flexmigd_counts_the_hook_on_only_for_the_run_the_taskprolog_set_up(tmp_path: Path) -> None:
    template = str(tmp_path / "ck" / "{user}" / "{job_id}")
    assert "does not exist" in (hook_problem(template, _job(os.geteuid())) or "")
    path = _map(tmp_path)  # the Prolog made the base
    (tmp_path / "ck" / "alice" / "42").mkdir(mode=0o700)  # the job's directory, but no TaskProlog's word in it
    assert f"no {tmp_path}/ck/alice/42/flexmig-hook.json" in (hook_problem(template, _job(os.geteuid())) or "")
    taskprolog.lines(_env(tmp_path, "0"), str(path))
    assert hook_problem(template, _job(os.geteuid())) is None
    assert "of run 0 of the job, not of run 1" in (hook_problem(template, _job(os.geteuid(), restarts=1)) or "")
    assert "not the job user's" in (hook_problem(template, _job(OTHER_UID)) or "")
    marker = tmp_path / "ck" / "alice" / "42" / taskprolog.MARKER_NAME
    marker.write_text('{"job_id": 42, "restart": ' + "9" * 50 + "}")
    assert "more than 20 digits" in (hook_problem(template, _job(os.geteuid())) or "")
    marker.unlink()
    marker.symlink_to(tmp_path / "map.json")
    assert "flexmig-hook.json" in (hook_problem(template, _job(os.geteuid())) or "")
