"""The parts of ``[slurm] node_per_gpu`` that need no daemon: the version rule, each GPU node's settings, the
configuration's checks, a GPU node's gres.conf records, the TaskProlog's per-node map and the claims that keep two
GPU nodes from changing for one job."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from flexmig.act.journal import Journal
from flexmig.act.nodeview import NodeView
from flexmig.act.results import ActionResult, PlanResult
from flexmig.cli.main import main as cli_main
from flexmig.config import parse_config
from flexmig.errors import ConfigError
from flexmig.mig import H200
from flexmig.nvml.types import GpuInfo, GpuInstanceInfo, Inventory, MigDeviceInfo
from flexmig.plan.reregistration import Verdict
from flexmig.plan.types import CreateInstance, Plan
from flexmig.slurm import taskprolog
from flexmig.slurm.agent_read import SlurmRead, SlurmRound, SlurmView
from flexmig.slurm.change import encode_change
from flexmig.slurm.claims import Claims, round_order
from flexmig.slurm.demand import SlurmDemand
from flexmig.slurm.gresconf import gres_map, gres_records
from flexmig.slurm.minors import parse_mig_minors, render_mig_minors
from flexmig.slurm.settings import SlurmSettings, gpu_node
from flexmig.slurm.shared_reads import SharedReads
from flexmig.slurm.sitecheck import version_problem
from flexmig.slurm.supply import Supply


def _gpu(index: int, items: list[tuple[str, int, int, int]]) -> GpuInfo:
    """A GPU with instances ``(profile, profile id, start, gi id)``, each with one compute instance."""
    gis = tuple(GpuInstanceInfo(gi, pid, p, start, 1) for p, pid, start, gi in items)
    devs = tuple(MigDeviceInfo(i, f"MIG-{index}-{s}", gi, 0, None, None, ()) for i, (_, _, s, gi) in enumerate(items))
    return GpuInfo(index, f"GPU-{index}", "NVIDIA H200", None, True, True, gis, devs)


INV = Inventory(
    "560",
    "12",
    (_gpu(0, [("1g.18gb", 19, 6, 13), ("3g.71gb", 9, 0, 1)]), _gpu(1, [("1g.18gb", 19, 5, 12), ("3g.71gb", 9, 0, 2)])),
)

PER_GPU = """
[slurm]
enabled = true
node_per_gpu = true
slurmd_pid_file = "/run/slurmd-{node}.pid"
slurmd_env = "/run/flexmig/slurm/slurmd-{node}.env"
gres_map = "/run/flexmig/slurm/gres-map-{node}.json"
slurmd_unit = "slurmd@{node}.service"
"""


@pytest.mark.parametrize(
    ("version", "ok"),
    [("22.05.8", False), ("23.02.7", False), ("23.11.0", True), ("24.11.5", True), ("slurm-wlm 24.05.8", True)],
)
def test_one_node_per_gpu_needs_slurm_23_11(version: str, ok: bool) -> None:
    why = version_problem(version)
    assert (why is None) == ok, why
    if not ok:
        assert why is not None and "23.11 or later" in why and version.rsplit(maxsplit=1)[-1] in why
        assert "set node_per_gpu = false" in why and "\n" not in why


def test_an_unreadable_version_is_refused_naming_it() -> None:
    why = version_problem("")
    assert why is not None and "cannot read Slurm's version from ''" in why


def test_each_gpu_node_gets_its_own_files_unit_hook_and_port() -> None:
    base = SlurmSettings(
        slurmd_pid_file=Path("/run/slurmd-{node}.pid"),
        slurmd_env=Path("/run/fm/slurmd-{node}.env"),
        gres_map=Path("/run/fm/map-{node}.json"),
        slurmd_unit="slurmd@{node}.service",
        slurmd_hook=("/sbin/ctl", "--node", "{node}"),
        slurmd_conf=("CPUs=8",),
    )
    node = gpu_node("h7", 3)
    got = base.for_node(node, port=6833)
    assert node == "h7-gpu3"
    assert got.slurmd_pid_file == Path("/run/slurmd-h7-gpu3.pid")
    assert got.slurmd_env == Path("/run/fm/slurmd-h7-gpu3.env")
    assert got.gres_map == Path("/run/fm/map-h7-gpu3.json")
    assert got.slurmd_unit == "slurmd@h7-gpu3.service"
    assert got.slurmd_hook == ("/sbin/ctl", "--node", "h7-gpu3")
    assert got.slurmd_conf == ("CPUs=8", "Port=6833")


def test_settings_without_templates_are_kept_as_they_are() -> None:
    plain = SlurmSettings(slurmd_conf=("CPUs=8",))
    assert plain.for_node("n1") is plain


def test_the_configuration_accepts_node_per_gpu_with_every_file_per_node() -> None:
    cfg = parse_config(PER_GPU)
    assert cfg.slurm.node_per_gpu and cfg.slurm.slurmd_port_base == 6830


@pytest.mark.parametrize("key", ["slurmd_pid_file", "slurmd_env", "gres_map", "slurmd_unit"])
def test_node_per_gpu_refuses_a_file_or_unit_shared_by_the_gpu_nodes(key: str) -> None:
    text = "\n".join(line for line in PER_GPU.splitlines() if not line.startswith(f"{key} ="))
    with pytest.raises(ConfigError, match=rf"slurm\.{key}.*must contain \{{node\}}"):
        parse_config(text)


def test_node_per_gpu_leaves_the_port_to_flexmig() -> None:
    with pytest.raises(ConfigError, match=r"slurm\.slurmd_conf.*leave Port= out"):
        parse_config(PER_GPU + 'slurmd_conf = "CPUs=8 Port=6818"\n')


def test_a_gpu_nodes_records_are_its_gpus_only(tmp_path: Path) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text(render_mig_minors(2))
    both = Supply("n", tmp_path / "gres.conf", tmp_path / "map.json", Path("/dev"), minors)
    one = Supply("n-gpu1", tmp_path / "gres.conf", tmp_path / "map.json", Path("/dev"), minors, gpu=1)
    assert {r.gpu for r in both.records(INV)} == {0, 1}
    assert [(r.type, r.gpu, r.start) for r in one.records(INV)] == [("3g.71gb", 1, 0), ("1g.18gb", 1, 5)]


def test_the_taskprolog_reads_the_map_of_its_own_node(tmp_path: Path) -> None:
    recs = gres_records(INV, parse_mig_minors(render_mig_minors(2)))
    for node, gpu in (("h-gpu0", 0), ("h-gpu1", 1)):
        mine = [r for r in recs if r.gpu == gpu]
        (tmp_path / f"map-{node}.json").write_text(json.dumps(gres_map(node, mine, {})))
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": str(os.geteuid())}
    template = str(tmp_path / "map-{node}.json")
    out = taskprolog.lines({**env, "SLURMD_NODENAME": "h-gpu1"}, template)
    assert "export CUDA_VISIBLE_DEVICES=MIG-1-0" in out, out
    out = taskprolog.lines({**env, "SLURMD_NODENAME": "h-gpu0"}, template)
    assert "export CUDA_VISIBLE_DEVICES=MIG-0-0" in out, out
    out = taskprolog.lines({**env, "SLURMD_NODENAME": "../x"}, template)
    assert out[0].startswith(f"print flexmig-taskprolog: no usable SLURMD_NODENAME for {template}; "), out
    assert out[1:] == ["export CUDA_VISIBLE_DEVICES="], out  # no GPU rather than Slurm's index


def test_a_job_one_gpu_node_claims_is_left_out_of_its_siblings_queues_until_the_claim_lapses() -> None:
    now = [0.0]
    claims = Claims(60.0, lambda: now[0])
    claims.update("h-gpu0", ["slurm-5"], acting=False)  # a verdict that does not act claims nothing
    assert claims.taken("h-gpu1") == frozenset()
    claims.update("h-gpu1", ["slurm-5", "slurm-6"], acting=True)
    assert claims.taken("h-gpu0") == {"slurm-5", "slurm-6"}
    assert claims.taken("h-gpu1") == frozenset()  # its own jobs stay in its queue
    assert claims.owners() == {"h-gpu1"}
    now[0] = 59.0
    assert claims.taken("h-gpu0") == {"slurm-5", "slurm-6"}
    now[0] = 61.0
    assert claims.taken("h-gpu0") == frozenset()  # lapsed: the job is everyone's again
    claims.update("h-gpu1", ["slurm-5"], acting=True)
    claims.update("h-gpu1", [], acting=False, abandoned=True)
    assert claims.taken("h-gpu0") == frozenset() and claims.owners() == set()


def test_in_mode_advise_a_gpu_node_whose_verdict_goes_claims_its_jobs_as_act_would() -> None:
    """Mode advise changes nothing, so no round has a result, a reservation or a ``change_waiting`` event; its plan
    still claims the jobs it serves, so that a sibling's published plan does not count them again."""
    view = NodeView.of(INV)
    read = SlurmRead((), None, INV, view, SlurmDemand("h-gpu1", (), (), ()), H200, {}, {})
    plan = Plan((CreateInstance(1, 4, H200.profile("1g.18gb"), "for slurm-7", 1.0),))
    going = Verdict(True, 0.0, 10.0, 1.0, "the change keeps more slices busy", newly_served=("slurm-7",))
    claims = Claims(60.0, lambda: 0.0)
    claims.update_from("h-gpu1", SlurmRound(read, plan, going))
    assert claims.taken("h-gpu0") == frozenset(), "mode act: a round that did nothing claims nothing"
    claims.update_from("h-gpu1", SlurmRound(read, plan, going), advise=True)
    assert claims.taken("h-gpu0") == {"slurm-7"}
    claims.update_from("h-gpu2", SlurmRound(read, plan, replace(going, go=False)), advise=True)
    assert claims.owners() == {"h-gpu1"}, "a verdict that says no claims nothing, in advise too"


def test_a_change_that_was_cancelled_gives_its_jobs_back_to_the_siblings_at_once() -> None:
    view = NodeView.of(INV)
    read = SlurmRead((), None, INV, view, SlurmDemand("h-gpu1", (), (), ()), H200, {}, {})
    plan = Plan((CreateInstance(1, 4, H200.profile("1g.18gb"), "for slurm-7", 1.0),))
    going = Verdict(True, 0.0, 10.0, 1.0, "serves 1 waiting job(s) on an idle node", newly_served=("slurm-7",))
    claims = Claims(60.0, lambda: 0.0)
    done = PlanResult(1, (ActionResult(1, "slurm_reregister", None, "completed", None, 3.0, ()),))
    claims.update_from("h-gpu1", SlurmRound(read, plan, going, done))
    assert claims.taken("h-gpu0") == {"slurm-7"}, "carried out: the job pends until Slurm starts it there"
    unregistered = "node h-gpu1 did not register within 60 s; it is not registered (the next round tries again)"
    failed = PlanResult(2, (ActionResult(2, "slurm_reregister", None, "failed", unregistered, 70.0, ()),))
    claims.update_from("h-gpu1", SlurmRound(read, plan, going, failed))
    assert claims.taken("h-gpu0") == {"slurm-7"}, "its new instances exist: the next round registers them"
    started = "Slurm job(s) 9 started on node h-gpu1 after the change was decided for it"
    cancelled = PlanResult(3, (ActionResult(3, "slurm_reregister", None, "cancelled", started, 1.0, ()),))
    claims.update_from("h-gpu1", SlurmRound(read, plan, going, cancelled))
    assert claims.taken("h-gpu0") == frozenset() and claims.owners() == set(), "nothing will start it on GPU 1"


def test_a_change_carried_out_just_before_a_restart_keeps_its_jobs_from_the_siblings_for_the_rest_of_its_hold(
    tmp_path: Path,
) -> None:
    """A change that was carried out leaves its jobs pending for a few seconds until Slurm starts them on the new
    instances; a daemon restarted meanwhile reads its claims back from the journal, so that an idle sibling does not
    change for the same job."""
    wall = [1000.0]
    journal = Journal(tmp_path / "journal.sqlite3", wall=lambda: wall[0])
    plan = Plan((CreateInstance(1, 4, H200.profile("1g.18gb"), "for slurm-7", 1.0),))
    done = [("h-gpu1", ("slurm-7",), 990.0, "done"), ("h-gpu2", ("slurm-8",), 900.0, "done"),
            ("h-gpu3", ("slurm-9",), 995.0, "cancelled")]  # fmt: skip
    for node, serves, at, state in done:
        wall[0] = at
        action = encode_change(node, plan, (), "for the waiting jobs", 0.0, serves=serves)
        _, ids = journal.begin_plan("slurm", [action])
        journal.start_action(ids[0])
        journal.finish_action(ids[0], state)  # type: ignore[arg-type]
    wall[0] = 995.0  # a journal written before changes named their jobs: nothing to restore from that row
    _, ids = journal.begin_plan("slurm", [("slurm_reregister", None, {"node": "h-gpu4", "changes": []})])
    journal.finish_action(ids[0], "done")
    now = [50.0]
    claims = Claims(60.0, lambda: now[0])
    assert claims.restore(journal.recent_actions(200), 1000.0) == 1, "only the change of 10 s ago, carried out"
    assert claims.taken("h-gpu0") == {"slurm-7"} and claims.taken("h-gpu1") == frozenset()
    now[0] = 99.0  # 59 s after the change
    assert claims.taken("h-gpu0") == {"slurm-7"}
    now[0] = 100.5  # 60.5 s after it: lapsed as if the daemon had never stopped
    assert claims.taken("h-gpu0") == frozenset()
    journal.close()


def test_the_gpu_nodes_of_a_round_share_one_look_at_slurm_and_nvml_until_one_of_them_changes_something() -> None:
    looks: list[str] = []

    async def fetch() -> SlurmView:
        looks.append("slurm")
        return ((), (), ())

    async def inventory() -> Inventory:
        looks.append("nvml")
        return INV

    async def scenario() -> None:
        shared = SharedReads(fetch, inventory)
        for _ in range(8):  # eight GPU nodes, none of which does anything: one look at Slurm, one at NVML
            await shared.view()
            assert await shared.inventory() is INV
            shared.after(SlurmRound(None, note="a change waits for the node's jobs"))
        assert shared.reads == 1 and looks == ["slurm", "nvml"]
        shared.after(SlurmRound(None, events=(("change_waiting", {"start_in_s": 30.0}),)))  # one committed a change
        await shared.view()
        await shared.inventory()
        assert shared.reads == 2, "the next agent reads both as the commit left them"

    asyncio.run(scenario())
    assert looks == ["slurm", "nvml", "slurm", "nvml"]


def test_a_gpu_node_whose_change_waits_plans_first_so_it_claims_its_jobs_again_after_a_restart() -> None:
    nodes = [("h-gpu0", 0), ("h-gpu1", 1), ("h-gpu2", 2), ("h-gpu3", 3)]
    # After a restart: no claim is remembered; GPU 2's change waits in flexmig's reservation, GPU 0 is idle.
    after_restart = round_order(nodes, waiting={"h-gpu2"}, claiming=(), busy={"h-gpu1", "h-gpu2", "h-gpu3"})
    assert after_restart[0] == "h-gpu2", "its reservation survived: it claims before the idle GPU 0 plans"
    assert after_restart[1:] == ["h-gpu0", "h-gpu1", "h-gpu3"]
    running = round_order(nodes, waiting=(), claiming={"h-gpu3"}, busy={"h-gpu0"})
    assert running == ["h-gpu3", "h-gpu1", "h-gpu2", "h-gpu0"], "claims first, then idle nodes, then by GPU"


def test_busy_gpu_nodes_plan_by_when_they_are_expected_to_empty_so_the_soonest_claims_a_waiting_job() -> None:
    nodes = [("h-gpu0", 0), ("h-gpu1", 1), ("h-gpu2", 2), ("h-gpu3", 3)]
    empty_at = {"h-gpu0": 900.0, "h-gpu1": 240.0, "h-gpu2": 600.0, "h-gpu3": 30.0}  # GPU 3's is from when it ran
    busy = {"h-gpu0", "h-gpu1", "h-gpu2"}
    order = round_order(nodes, waiting=(), claiming=(), busy=busy, empty_at=empty_at)
    assert order == ["h-gpu3", "h-gpu1", "h-gpu2", "h-gpu0"], "idle first, then the busy ones, soonest empty first"
    assert round_order(nodes, waiting=(), claiming=(), busy=busy) == ["h-gpu3", "h-gpu0", "h-gpu1", "h-gpu2"]
    claimed = round_order(nodes, waiting={"h-gpu2"}, claiming={"h-gpu0"}, busy=busy, empty_at=empty_at)
    assert claimed == ["h-gpu2", "h-gpu0", "h-gpu3", "h-gpu1"], "a waiting change and claims still come first"
    unseen = round_order(nodes, waiting=(), claiming=(), busy=busy, empty_at={"h-gpu1": 240.0})
    assert unseen == ["h-gpu3", "h-gpu0", "h-gpu2", "h-gpu1"], "a busy node not yet looked at plans first"


def test_slurm_conf_for_gpu_nodes_names_per_node_files_the_template_unit_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["slurm", "conf", "--node-per-gpu", "--gpus", "8", "--cpus", "64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    conf = dict(line.split("=", 1) for line in lines if not line.startswith("#") and "=" in line)
    pid = conf["SlurmdPidFile"]
    assert "%n" in pid and conf["SlurmdSpoolDir"].endswith("%n")
    template = (Path(__file__).resolve().parents[2] / "systemd" / "slurmd@.service").read_text()
    assert f"PIDFile={pid.replace('%n', '%i')}\n" in template, "slurmctld's pid file is the unit's, per GPU node"
    future = next(line for line in lines if "State=FUTURE" in line)
    assert "CPUs=8 " in future and "gpu:7g.141gb:1" in future and "gpu:1g.18gb:7," in future  # one GPU's worth
    assert any("8 x flexmig hosts" in line for line in lines if line.startswith("MaxNodeCount="))
    assert cli_main(["slurm", "conf", "--node-per-gpu", "--gpus", "8", "--cpus", "4"]) != 0
    assert "--cpus 4: fewer than the 8 nodes of a host" in capsys.readouterr().err
