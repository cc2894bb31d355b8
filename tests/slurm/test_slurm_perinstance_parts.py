"""The parts of ``[slurm] node_per_instance`` that need no daemon: node names and ports, the configuration's rules,
an instance node's records, its gres.conf block removed when it retires, and a round's inputs to the carving and
the actions of its decision."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from flexmig.act.nodeview import NodeView
from flexmig.cli.main import main as cli_main
from flexmig.config import parse_config
from flexmig.config.checks import per_slice_params
from flexmig.errors import ConfigError
from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.nvml.types import GpuInfo, GpuInstanceInfo, Inventory, MigDeviceInfo
from flexmig.plan.carving import Waiting, carve
from flexmig.plan.types import Instance, JobRequest, RankNeed
from flexmig.slurm.client import SlurmCommands
from flexmig.slurm.demand import SlurmDemand, SlurmRunning
from flexmig.slurm.gres import GresCount
from flexmig.slurm.gresconf import drop_block, gres_records, merge_block
from flexmig.slurm.instances import busy_of, carving_actions, hold_name, host_layouts, queue_of
from flexmig.slurm.minors import parse_mig_minors, render_mig_minors
from flexmig.slurm.settings import SlurmSettings, instance_node, instance_port, parse_instance_node, slot_node
from flexmig.slurm.sitecheck import slot_problem, version_problem
from flexmig.slurm.slots import slot_count
from flexmig.slurm.slurmd import HookSlurmd, dynamic_conf, gres_slices, read_env_file
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.supply import Supply


def _gpu(index: int, items: list[tuple[str, int, int, int]]) -> GpuInfo:
    """A GPU with instances ``(profile, profile id, start, gi id)``, each with one compute instance."""
    gis = tuple(GpuInstanceInfo(gi, pid, p, start, 1) for p, pid, start, gi in items)
    devs = tuple(MigDeviceInfo(i, f"MIG-{index}-{s}", gi, 0, None, None, ()) for i, (_, _, s, gi) in enumerate(items))
    return GpuInfo(index, f"GPU-{index}", "NVIDIA H200", None, True, True, gis, devs)


INV = Inventory("560", "12", (_gpu(0, [("3g.71gb", 9, 0, 1), ("3g.71gb", 9, 4, 2)]),))

PER_INSTANCE = """
[slurm]
enabled = true
node_per_instance = true
slurmd_pid_file = "/run/slurmd-{node}.pid"
slurmd_env = "/run/flexmig/slurm/slurmd-{node}.env"
gres_map = "/run/flexmig/slurm/gres-map-{node}.json"
slurmd_unit = "slurmd@{node}.service"
"""


def test_an_instance_node_is_named_by_its_gpu_and_first_slice_and_has_a_port_of_its_own() -> None:
    assert instance_node("h7", 3, 4) == "h7-gpu3-4"
    assert parse_instance_node("h7", "h7-gpu3-4") == (3, 4)
    for other in ("h7-gpu3", "h7-gpu3-", "h7-gpu3-10", "h70-gpu3-4", "x-h7-gpu3-4", "h7-gpu3-4x"):
        assert parse_instance_node("h7", other) is None, other
    ports = {instance_port(6830, g, s) for g in range(8) for s in range(8)}
    assert len(ports) == 64 and min(ports) == 6830 and max(ports) == 6830 + 63


def test_node_per_instance_needs_slurm_23_11_and_says_so_by_its_name() -> None:
    why = version_problem("22.05.8", "node_per_instance")
    assert why is not None and "node_per_instance needs Slurm 23.11" in why and "set node_per_instance = false" in why
    assert version_problem("24.11.5", "node_per_instance") is None


def test_the_configuration_accepts_node_per_instance_with_every_file_per_node() -> None:
    cfg = parse_config(PER_INSTANCE)
    assert cfg.slurm.node_per_instance and not cfg.slurm.node_per_gpu


@pytest.mark.parametrize("key", ["slurmd_pid_file", "slurmd_env", "gres_map", "slurmd_unit"])
def test_node_per_instance_refuses_a_file_or_unit_shared_by_the_nodes(key: str) -> None:
    text = "\n".join(line for line in PER_INSTANCE.splitlines() if not line.startswith(f"{key} ="))
    with pytest.raises(ConfigError, match=rf"slurm\.{key}.*must contain \{{node\}} with node_per_instance"):
        parse_config(text)


def test_node_per_instance_leaves_the_port_to_flexmig_and_excludes_node_per_gpu() -> None:
    with pytest.raises(ConfigError, match=r"slurm\.slurmd_conf.*leave Port= out with node_per_instance"):
        parse_config(PER_INSTANCE + 'slurmd_conf = "CPUs=8 Port=6818"\n')
    with pytest.raises(ConfigError, match=r"slurm\.node_per_instance.*not both"):
        parse_config(PER_INSTANCE + "node_per_gpu = true\n")


def test_an_instance_node_offers_its_compute_slices_share_of_what_is_given_per_slice() -> None:
    keys = 'slurmd_conf = "Feature=mig"\nslurmd_conf_per_slice = "cpus=8 RealMemory=64000"\n'
    cfg = parse_config(PER_INSTANCE + keys)
    per = per_slice_params(cfg.slurm.slurmd_conf_per_slice)
    assert per == (("CPUs", 8), ("RealMemory", 64000))
    got = dynamic_conf("gpu:3g.71gb:1", ("Feature=mig",), per)
    assert got == "Feature=mig CPUs=24 RealMemory=192000 Gres=gpu:3g.71gb:1"
    assert dynamic_conf("gpu:7g.141gb:1", (), per) == "CPUs=56 RealMemory=448000 Gres=gpu:7g.141gb:1"
    assert dynamic_conf("gpu:1g.18gb:1", (), per) == "CPUs=8 RealMemory=64000 Gres=gpu:1g.18gb:1"
    assert gres_slices("gpu:1g.18gb:2,gpu:2g.35gb:1") == 4 and gres_slices("") == 0


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ('slurmd_conf_per_slice = "CPUs=8"\nnode_per_instance = false\nlayout = "node"\n', "only with node_per_"),
        ('slurmd_conf_per_slice = "Weight=8"\n', "only CPUs=, RealMemory= and TmpDisk= scale"),
        ('slurmd_conf_per_slice = "CPUs=8 cpus=4"\n', "CPUs= is given twice"),
        ('slurmd_conf_per_slice = "CPUs=8"\nslurmd_conf = "CPUs=64"\n', "CPUs= is in slurmd_conf too"),
        ('slurmd_conf_per_slice = "CPUs=0"\n', "CPUs=0: must be 1 to 9000 a slice"),
        ('slurmd_conf_per_slice = "TmpDisk=999999999"\n', "TmpDisk=999999999: must be 1 to 600000000"),
        ('slurmd_conf_per_slice = "CPUs=8"\nslurmd_conf = "CoresPerSocket=4"\n', "leave Boards=, Sockets="),
        ('slurmd_conf_per_slice = "CPUs 8"\n', "slurmd_conf_per_slice"),
    ],
)
def test_a_per_slice_parameter_that_cannot_scale_is_refused_by_its_key(keys: str, why: str) -> None:
    text = PER_INSTANCE.replace("node_per_instance = true\n", "") + keys
    if "node_per_instance" not in keys:
        text += "node_per_instance = true\n"
    with pytest.raises(ConfigError, match=r"slurm\.slurmd_conf_per_slice") as err:
        parse_config(text)
    assert why in str(err.value), err.value


def test_an_instance_nodes_records_are_its_instance_only(tmp_path: Path) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text(render_mig_minors(1))
    one = Supply("n-gpu0-4", tmp_path / "gres.conf", tmp_path / "map.json", Path("/dev"), minors, gpu=0, start=4)
    assert [(r.type, r.gpu, r.start) for r in one.records(INV)] == [("3g.71gb", 0, 4)]


def test_a_retired_nodes_block_goes_and_nothing_else_changes() -> None:
    recs = gres_records(INV, parse_mig_minors(render_mig_minors(1)))
    text = "# site's own\nNodeName=cpu1 Name=gpu File=/dev/null\n"
    text = merge_block(text, "h-gpu0-0", recs[:1])
    both = merge_block(text, "h-gpu0-4", recs[1:])
    assert drop_block(both, "h-gpu0-4") == text
    assert drop_block(drop_block(both, "h-gpu0-4"), "h-gpu0-0").rstrip("\n") == (
        "# site's own\nNodeName=cpu1 Name=gpu File=/dev/null"
    )
    assert drop_block(text, "h-gpu0-4") == text  # no block: nothing to do


def test_the_carving_queue_keeps_one_device_jobs_and_says_why_it_leaves_the_others() -> None:
    reqs = (
        JobRequest("slurm-1", RankNeed(profile="1g.18gb"), submitted_s=100.0, expected_runtime_s=600.0),
        JobRequest("slurm-2", RankNeed(profile="2g.35gb"), ranks=2, min_ranks=2, max_ranks=2, submitted_s=90.0),
        JobRequest("slurm-3", RankNeed(compute_slices=1), submitted_s=95.0),
    )
    queue, left = queue_of(SlurmDemand("n", reqs, (), (), {}), now_s=130.0)
    assert [(w.name, w.profile, w.limit_s, w.waited_s) for w in queue] == [("slurm-1", "1g.18gb", 600.0, 30.0)]
    assert "--nodes=2 --gres=gpu:2g.35gb:1" in left["slurm-2"] and "no MIG profile" in left["slurm-3"]


SLURM_JOB = SlurmJob(
    job_id=1, name="j", user_id=1000, user="alice", state="PENDING", reason="Resources", partitions=("mig",),
    nodes=(), node_count=1, gpus_per_node=(GresCount("gpu", "1g.18gb", 1),), held=(), requeue=False, comment="",
    priority=100, submit_s=100.0, start_s=None, time_limit_s=None, restart_count=0,
)


def test_a_job_of_n_nodes_waits_as_n_parts_each_carved_an_instance_node_of_its_own() -> None:
    """``--nodes=2 --gres=gpu:3g.71gb:1`` (what a job of two devices is told to ask for) needs two instance nodes:
    on an idle 7g both are carved, where one would leave the job waiting for good."""
    pair = replace(SLURM_JOB, job_id=7, node_count=2, gpus_per_node=(GresCount("gpu", "3g.71gb", 1),))
    one = replace(SLURM_JOB, job_id=8, node_count=1, gpus_per_node=(GresCount("gpu", "1g.18gb", 1),))
    reqs = (
        JobRequest("slurm-7", RankNeed(profile="3g.71gb"), submitted_s=100.0),
        JobRequest("slurm-8", RankNeed(profile="1g.18gb"), submitted_s=110.0),
    )
    queue, left = queue_of(SlurmDemand("n", reqs, (pair, one), (), {}), now_s=130.0)
    assert [w.name for w in queue] == ["slurm-7#1", "slurm-7#2", "slurm-8"] and left == {}
    assert [w.alone for w in queue] == [False, False, True]  # a part is started only with the others
    c = carve(H200, [Layout.of(H200, [("7g.141gb", 0)])], {}, queue, now_s=130.0)
    assert sorted((i.profile.name, i.start, j) for _, i, j in c.create) == [
        ("3g.71gb", 0, "slurm-7#2"), ("3g.71gb", 4, "slurm-7#1"),
    ]  # fmt: skip
    capped, _ = queue_of(SlurmDemand("n", reqs[:1], (replace(pair, node_count=500),), (), {}), 0.0, most_parts=7)
    assert len(capped) == 7  # no more parts than instance nodes the host can hold


def test_busy_instances_carry_their_jobs_time_left_and_an_unmapped_busy_node_counts_as_busy() -> None:
    job = SlurmJob.__new__(SlurmJob)
    running = [SlurmRunning(job, (Instance(0, 0, H200.profile("3g.71gb")),), False, 120.0)]
    busy = busy_of(running, {(0, 0): True, (0, 4): True, (0, 6): False})
    assert busy == {(0, 0): 120.0, (0, 4): None}


def test_a_carving_becomes_retirements_then_registrations() -> None:
    view = NodeView.of(INV)
    hl = host_layouts(view, H200, {0: True}, held=())
    assert hl.gpus == (0,) and [i.start for i in hl.layouts[0]] == [0, 4]
    c = carve(H200, hl.layouts, {(0, 0): 300.0}, [Waiting("slurm-9", "1g.18gb", 600.0, 5.0)], now_s=0.0)
    actions = carving_actions(lambda g, s, p: instance_node("h", g, s), hl, c, "why")
    assert [(a[2]["node"], a[2].get("retire", False), [ch["op"] for ch in a[2]["changes"]]) for a in actions] == [
        ("h-gpu0-4", True, ["destroy"]),
        (f"h-gpu0-{c.create[0][1].start}", False, ["create"]),
    ]
    assert actions[1][2]["serves"] == ["slurm-9"]
    static = carving_actions(lambda g, s, p: slot_node("h", g, s, p), hl, c, "why")
    assert [a[2]["node"] for a in static] == ["h-gpu0-4-3g71gb", f"h-gpu0-{c.create[0][1].start}-1g18gb"]
    assert hold_name("h") == "flexmig-h-hold"


def test_an_administrators_instance_is_pinned_and_never_carved() -> None:
    view = NodeView.of(INV)
    hl = host_layouts(view, H200, {0: True}, held=[(0, 4)])
    assert hl.pinned == frozenset({(0, 4)})
    c = carve(H200, hl.layouts, {(0, 0): 300.0}, [Waiting("slurm-9", "1g.18gb", 600.0, 5.0)], now_s=0.0,
              pinned=hl.pinned)  # fmt: skip
    assert c.destroy == () and c.create == ()


def test_slurm_conf_for_instance_nodes_makes_room_for_seven_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["slurm", "conf", "--node-per-instance", "--gpus", "8", "--cpus", "112"]) == 0
    out = capsys.readouterr().out
    assert "up to 56 dynamic nodes, <host>-gpu<K>-<S>" in out and "+ 56 x flexmig hosts>" in out
    assert 'node_per_instance = true, slurmd_conf_per_slice = "CPUs=2 ' in out
    assert "SlurmdPidFile=/run/slurmd-%n.pid" in out
    assert "NodeName=flexmig-future State=FUTURE CPUs=14 " in out  # a 7g instance's two CPUs a slice
    assert cli_main(["slurm", "conf", "--node-per-instance", "--node-per-gpu"]) != 0
    assert "not both" in capsys.readouterr().err


# ------------------------------------------------------------------------ static instance nodes (22.05 and later)
def test_a_static_node_is_named_by_its_gpu_first_slice_and_profile() -> None:
    assert slot_node("h7", 3, 4, "3g.71gb") == "h7-gpu3-4-3g71gb"
    assert slot_node("h7", 0, 0, "1g.18gb+me") == "h7-gpu0-0-1g18gbme"
    assert parse_instance_node("h7", "h7-gpu3-4-3g71gb") == (3, 4)
    for other in ("h7-gpu3-4-", "h7-gpu3-4-3g.71gb", "h7-gpu3-4-3G71GB", "h70-gpu3-4-3g71gb"):
        assert parse_instance_node("h7", other) is None, other
    static = SlurmSettings(node_per_instance=True, instance_nodes="static")
    assert static.static_nodes and static.instance_name("h7", 3, 4, "3g.71gb") == "h7-gpu3-4-3g71gb"
    dynamic = SlurmSettings(node_per_instance=True)
    assert not dynamic.static_nodes and dynamic.instance_name("h7", 3, 4, "3g.71gb") == "h7-gpu3-4"
    why = version_problem("22.05.8", "node_per_instance")
    assert why is not None and "instance_nodes = static" in why


def test_static_instance_nodes_go_with_node_per_instance_and_take_nothing_from_slurmd_conf() -> None:
    assert parse_config(PER_INSTANCE + 'instance_nodes = "static"\n').slurm.instance_nodes == "static"
    with pytest.raises(ConfigError, match=r"slurm\.instance_nodes.*for layout = auto or instance"):
        parse_config('[slurm]\nenabled = true\nlayout = "node"\ninstance_nodes = "static"\n')
    for key, value in (("slurmd_conf", "CPUs=8"), ("slurmd_conf_per_slice", "CPUs=2")):
        with pytest.raises(ConfigError, match=rf"slurm\.{key}.*leave it empty with instance_nodes = static"):
            parse_config(PER_INSTANCE + f'instance_nodes = "static"\n{key} = "{value}"\n')
    with pytest.raises(ConfigError, match=r"slurm\.instance_nodes"):
        parse_config(PER_INSTANCE + 'instance_nodes = "future"\n')


def test_a_static_node_missing_from_slurm_conf_or_with_other_gres_is_refused_with_one_line() -> None:
    assert slot_problem("h-gpu0-4-3g71gb", "gpu:3g.71gb:1", "gpu:3g.71gb:1") is None
    assert slot_problem("h-gpu0-4-3g71gb", "gpu:3g.71gb:1(S:0)", "gpu:3g.71gb:1") is None  # as scontrol prints it
    missing = slot_problem("h-gpu0-4-3g71gb", None, "gpu:3g.71gb:1")
    assert missing is not None and "static node h-gpu0-4-3g71gb is not in slurm.conf" in missing
    assert "flexmig slurm conf --node-per-instance --static" in missing and "nothing was changed" in missing
    other = slot_problem("h-gpu0-4-3g71gb", "gpu:1", "gpu:3g.71gb:1")
    assert other is not None and "gives static node h-gpu0-4-3g71gb Gres=gpu:1" in other


def test_slurm_conf_for_static_nodes_lists_every_place_of_every_profile(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["slurm", "conf", "--node-per-instance", "--static", "--host", "h1", "--gpus", "2", "--cpus", "28"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("NodeName=") and "Weight=" not in x]
    assert len(lines) == slot_count(H200, 2) == 2 * 18  # 7 + 4 + 3 + 2 + 1 + 1 places on an H200
    pools = [x for x in out.splitlines() if x.startswith("NodeName=") and "Weight=1000" in x]
    assert len(pools) == 2 * 12 + 1  # per GPU 1g.18gb x2-x7, 1g.35gb x2-x4, 2g.35gb x2-x3, 3g.71gb x2; 7g.141gb x2
    assert ("NodeName=h1-gpu1-x2-1g18gb NodeHostname=h1 NodeAddr=h1 Port=6858 CPUs=4 Gres=gpu:1g.18gb:2 Weight=1000 "
            "State=FUTURE") in pools  # fmt: skip
    assert f"{len(lines)} instance nodes and {len(pools)} pool nodes" in out
    assert len({x.split()[0] for x in lines}) == len(lines)
    assert ("NodeName=h1-gpu1-4-3g71gb NodeHostname=h1 NodeAddr=h1 Port=6842 CPUs=6 Gres=gpu:3g.71gb:1 State=FUTURE"
            in lines)  # fmt: skip
    assert all(x.endswith("State=FUTURE") for x in lines) and "MaxNodeCount" not in out
    assert 'instance_nodes = "static"' in out and 'slurmd_unit = "slurmd-static@{node}.service"' in out
    hint = [x for x in out.splitlines() if x.startswith(("# flexmig.toml", "#   "))]
    keys = [f"{k} = {v}" for k, v in re.findall(r'(\w+) = ("[^"]*"|\w+)', "\n".join(hint))]
    cfg = parse_config("[slurm]\nenabled = true\n" + "\n".join(keys) + "\n")  # the keys it prints load
    assert cfg.slurm.instance_nodes == "static" and cfg.slurm.node == "h1"
    assert cli_main(["slurm", "conf", "--static", "--host", "h1"]) != 0  # only with --node-per-instance
    assert cli_main(["slurm", "conf", "--node-per-instance", "--static"]) != 0  # the names need the host's
    assert cli_main(["slurm", "conf", "--node-per-instance", "--static", "--host", "h 1"]) != 0


def test_a_static_nodes_slurmd_runs_without_z(tmp_path: Path) -> None:
    env = tmp_path / "slurmd.env"
    unit = HookSlurmd("h-gpu0-4-3g71gb", env, tmp_path / "pid", SlurmCommands(), static=True, hook=("true",))
    unit.write_env("gpu:3g.71gb:1")
    assert read_env_file(env.read_text()) == {
        "FLEXMIG_SLURMD_NODE": "h-gpu0-4-3g71gb", "FLEXMIG_SLURMD_CONF": "Gres=gpu:3g.71gb:1",
        "FLEXMIG_SLURMD_MODE": "static",
    }  # fmt: skip
    assert unit.registered_conf() == "Gres=gpu:3g.71gb:1"  # what a restart after a crash registers again
