"""Reading Slurm's answers: GRES strings, hostlists, ``squeue --json`` and ``sinfo --json`` (recorded from a real
22.05.8), the same from a real 24.11.5 (data_parser v0.0.42, whose nodes come from ``scontrol --json show nodes``),
and refusing anything malformed with one message naming the culprit."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.errors import SlurmError
from flexmig.slurm.gres import GresCount, parse_gres, parse_index_list
from flexmig.slurm.hostlist import expand_hostlist
from flexmig.slurm.minors import parse_mig_minors, render_mig_minors
from flexmig.slurm.nodes import SlurmNode, gpu_hosts, parse_scontrol_nodes, parse_sinfo
from flexmig.slurm.shared_reads import read_spacing
from flexmig.slurm.squeue import parse_squeue

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SQUEUE = (DATA / "squeue-22.05.8.json").read_text()
SINFO = (DATA / "sinfo-22.05.8.json").read_text()
# Slurm 24.11.5 (Debian 13), recorded by tests/support/slurm_newer.py's chroot; job IDs as submitted there.
SQUEUE_24 = (DATA / "squeue-24.11.5.json").read_text()
SINFO_24 = (DATA / "sinfo-24.11.5.json").read_text()
NODES_24 = (DATA / "scontrol-nodes-24.11.5.json").read_text()


def sinfo_nodes(text: str) -> tuple[SlurmNode, ...]:
    nodes = parse_sinfo(text)
    assert nodes is not None, "a 22.05 answer lists its nodes"
    return nodes


# --------------------------------------------------------------------------------------------------- GRES
def test_a_job_request_with_two_types_reads_as_two_counts() -> None:
    assert parse_gres("gres:gpu:1g.18gb:2,gres:gpu:2g.35gb:1") == (
        GresCount("gpu", "1g.18gb", 2),
        GresCount("gpu", "2g.35gb", 1),
    )


def test_allocated_gres_keep_their_indices_even_with_commas_inside() -> None:
    got = parse_gres("gpu:3g.71gb:0(IDX:N/A),gpu:1g.18gb:2(IDX:1,3),gpu:2g.35gb:1(IDX:4-5)")
    assert [g.indices for g in got] == [(), (1, 3), (4, 5)]


def test_untyped_count_only_and_socket_bound_gres() -> None:
    assert parse_gres("gres:gpu:2") == (GresCount("gpu", None, 2),)
    assert parse_gres("gpu") == (GresCount("gpu", None, 1),)
    assert parse_gres("bandwidth:lustre:4G")[0].count == 4 * 1024**3
    assert parse_gres("gpu:3g.71gb:1(S:0-1)") == (GresCount("gpu", "3g.71gb", 1),)
    assert parse_gres("(null)") == () and parse_gres(None) == ()


@pytest.mark.parametrize("bad", ["gpu:a:b:c", "gpu:1g.18gb:1(IDX:1-", "gpu:x y:1", "gpu:1(IDX:3-1)", ":1"])
def test_malformed_gres_is_refused_naming_where(bad: str) -> None:
    with pytest.raises(SlurmError, match="job 7 tres_per_node"):
        parse_gres(bad, where="job 7 tres_per_node")


def format_gres(items: Iterable[GresCount]) -> str:
    """``gpu:3g.71gb:1,gpu:1g.18gb:2``: GRES counts as Slurm writes them (no indices)."""
    return ",".join(i.spec() for i in items)


@given(st.lists(st.tuples(st.sampled_from(["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]), st.integers(0, 64))))
def test_format_then_parse_is_the_identity(items: list[tuple[str, int]]) -> None:
    counts = tuple(GresCount("gpu", t, n) for t, n in items)
    assert parse_gres(format_gres(counts)) == counts


def test_index_lists() -> None:
    assert parse_index_list("0-2,5") == (0, 1, 2, 5)
    assert parse_index_list("N/A") == ()
    with pytest.raises(SlurmError):
        parse_index_list("2-x")


# ----------------------------------------------------------------------------------------------- hostlists
def test_hostlists_expand_as_scontrol_show_hostnames_does() -> None:
    assert expand_hostlist("n[1-3,5]") == ("n1", "n2", "n3", "n5")
    assert expand_hostlist("rack[1-2]-n[01-02]") == ("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02")
    assert expand_hostlist("a,b[08-10]") == ("a", "b08", "b09", "b10")
    assert expand_hostlist("") == ()
    for bad in ("n[1-", "n]1[", "n[a-b]"):
        with pytest.raises(SlurmError, match="hostlist"):
            expand_hostlist(bad)


# ------------------------------------------------------------------------------------------------- squeue
def test_squeue_of_22_05_8_reads_every_request_shape() -> None:
    jobs = {j.job_id: j for j in parse_squeue(SQUEUE)}
    assert jobs[2].pending and jobs[2].reason == "ReqNodeNotAvail"
    assert jobs[2].gpus_per_node == (GresCount("gpu", "1g.18gb", 1),)
    assert jobs[4].gpus_per_node == (GresCount("gpu", "1g.18gb", 2), GresCount("gpu", "2g.35gb", 1))
    assert jobs[5].gpus_per_node == (GresCount("gpu", None, 2),)  # --gres=gpu:2
    assert jobs[6].gpus_per_node == (GresCount("gpu", "1g.18gb", 3),)  # --gpus=1g.18gb:3 (per job)
    assert jobs[8].gpus_per_node == (GresCount("gpu", "1g.18gb", 2),)  # --gpus-per-task=...:1 with 2 tasks
    assert jobs[9].array_tasks == 3  # a pending array 1-3 stands for three jobs
    assert jobs[10].comment == "flexmig:hook" and jobs[10].requeue
    assert jobs[11].time_limit_s == 600.0 and not jobs[11].requeue
    assert jobs[1].state == "COMPLETED"  # squeue --json lists finished jobs too: the caller filters


def test_an_infinite_time_limit_of_a_running_job_reads_as_none() -> None:
    doc = json.loads(SQUEUE)
    rec = next(j for j in doc["jobs"] if j["job_id"] == 2)
    rec.update(
        job_state="RUNNING", time_limit=525600, start_time=1000, nodes="vm", gres_detail=["gpu:1g.18gb:1(IDX:0)"]
    )
    job = next(j for j in parse_squeue(json.dumps(doc)) if j.job_id == 2)
    assert job.time_limit_s is None and job.remaining_s(2000.0) is None
    assert job.held_on("vm") == (GresCount("gpu", "1g.18gb", 1, (0,)),)


def test_squeue_with_slurmctld_down_is_an_error_not_an_empty_queue() -> None:
    down = {
        "meta": {},
        "errors": [{"description": "Failed while looking for jobs", "error_number": -1, "source": "slurm_load_jobs"}],
        "jobs": [],
    }
    with pytest.raises(SlurmError, match="slurm_load_jobs: Failed while looking for jobs"):
        parse_squeue(json.dumps(down))


def _with(key: str, value: Any) -> str:
    doc = json.loads(SQUEUE)
    doc["jobs"][3][key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("", "not JSON"),
        ('{"jobs": [', "not JSON"),
        ("[1, 2]", "not an object"),
        ('{"errors": [], "jobs": 3}', "no 'jobs' list"),
        ('{"errors": [], "jobs": [7]}', "jobs\\[0\\] is a JSON int"),
        (_with("job_state", 5), "job 4: 'job_state'"),
        (_with("tres_per_node", "gres:gpu:1:2:3"), "job 4 tres_per_node"),
        (_with("user_id", True), "job 4: 'user_id' is a boolean"),
        (_with("gres_detail", [1]), "job 4: gres_detail\\[0\\]"),
        (_with("nodes", "n[1-"), "hostlist"),
    ],
)
def test_garbage_from_squeue_is_one_error_naming_it(text: str, culprit: str) -> None:
    with pytest.raises(SlurmError, match=culprit):
        parse_squeue(text)


# -------------------------------------------------------------------------------------------------- sinfo
def test_sinfo_of_22_05_8_gives_the_dynamic_node_and_its_gres() -> None:
    (node,) = sinfo_nodes(SINFO)
    assert node.name == "vm" and node.dynamic and node.idle and node.responding and not node.drained
    assert node.gpu_counts() == {"7g.141gb": 1}
    assert node.partitions == ("mig",)


def test_a_drained_node_not_responding() -> None:
    doc = json.loads(SINFO)
    doc["nodes"][0].update(state="idle", state_flags=["DRAIN", "NOT_RESPONDING"], reason="flexmig: x")
    (node,) = sinfo_nodes(json.dumps(doc))
    assert node.drained and not node.responding and node.reason == "flexmig: x"


# ------------------------------------------------------------------------------------------ Slurm 24.11
def test_squeue_of_24_11_5_reads_every_request_shape_as_22_05_did() -> None:
    jobs = {j.job_id: j for j in parse_squeue(SQUEUE_24)}
    assert jobs[1].state == "COMPLETED"  # with --states=all, as 22.05 lists them anyway
    assert jobs[2].state == "RUNNING" and jobs[2].time_limit_s == 600.0
    assert jobs[2].held_on("fm-node") == (GresCount("gpu", "1g.18gb", 1, (0,)),)
    assert jobs[3].pending and jobs[3].reason == "ReqNodeNotAvail" and jobs[3].time_limit_s is None
    assert jobs[3].gpus_per_node == (GresCount("gpu", "7g.141gb", 1),)  # gres/gpu:7g.141gb:1
    assert jobs[4].gpus_per_node == (GresCount("gpu", "1g.18gb", 2), GresCount("gpu", "2g.35gb", 1))
    assert jobs[5].gpus_per_node == (GresCount("gpu", None, 2),)  # --gres=gpu:2
    assert jobs[6].gpus_per_node == (GresCount("gpu", "1g.18gb", 3),)  # --gpus=1g.18gb:3 (per job)
    assert jobs[7].gpus_per_node == (GresCount("gpu", "1g.18gb", 2),)  # gres/gpu:1g.18gb=1 per task, 2 tasks
    assert jobs[8].array_tasks == 3 and jobs[8].array_max_tasks == 2  # --array=1-3%2
    assert jobs[9].comment == "flexmig:hook" and jobs[9].requeue
    assert jobs[10].time_limit_s is None  # --time=UNLIMITED: {"set": false, "infinite": true}


def test_sinfo_of_24_11_5_says_its_nodes_must_come_from_scontrol() -> None:
    assert parse_sinfo(SINFO_24) is None


def test_scontrol_nodes_of_24_11_5_give_the_drained_dynamic_node_and_its_gres() -> None:
    (node,) = parse_scontrol_nodes(NODES_24)
    assert node.name == "fm-node" and node.dynamic and node.drained and node.responding
    assert node.state == "mixed" and node.reason == "maint" and node.partitions == ("mig",)
    assert node.gpu_counts() == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert GresCount("gpu", "1g.18gb", 1, (0,)) in node.gres_used
    assert node.features == "" and node.weight == 1 and node.slurmd_start_s > 1.7e9


def test_a_24_11_node_with_features_a_number_left_unset_and_garbage_in_its_state() -> None:
    doc = json.loads(NODES_24)
    doc["nodes"][0].update(features=["a100", "ib"], weight={"set": False, "infinite": False, "number": 0})
    (node,) = parse_scontrol_nodes(json.dumps(doc))
    assert node.features == "a100,ib" and node.weight == 1  # unset: the default
    doc["nodes"][0]["state"] = [5]
    with pytest.raises(SlurmError, match="node fm-node: 'state'"):
        parse_scontrol_nodes(json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gres/gpu:1g.18gb=1", (GresCount("gpu", "1g.18gb", 1),)),
        ("gres/gpu=2", (GresCount("gpu", None, 2),)),
        ("gres/gpu:3g.71gb:1,gres/gpu:1g.18gb=2", (GresCount("gpu", "3g.71gb", 1), GresCount("gpu", "1g.18gb", 2))),
    ],
)
def test_the_tres_count_form_of_23_02_and_later(text: str, want: tuple[GresCount, ...]) -> None:
    assert parse_gres(text) == want


# ---------------------------------------------------------------------------------------------- MIG minors
def test_the_minors_table_has_nine_minors_per_gpu_instance() -> None:
    minors = parse_mig_minors(render_mig_minors(2))
    assert minors.of(0, 2, 0) == (21, 22)  # gpu0/gi2/access 21, gpu0/gi2/ci0/access 22
    assert minors.of(1, 0, 0) == (3 + 15 * 9, 4 + 15 * 9)
    with pytest.raises(SlurmError, match="gpu0/gi1/ci9"):
        minors.of(0, 1, 9)


def test_a_broken_minors_line_names_the_file_and_line() -> None:
    with pytest.raises(SlurmError, match="mig-minors:2"):
        parse_mig_minors("config 1\ngpu0/gi0/access x\n", "mig-minors")


def test_the_gpu_hosts_are_the_machines_of_the_nodes_with_gpus() -> None:
    """Instance nodes of one machine share its address and count once; a node without an address counts by name;
    nodes without GPU GRES (a CPU partition) do not count."""

    def node(name: str, address: str, gres: str) -> SlurmNode:
        return SlurmNode(name, "idle", frozenset(), "", parse_gres(gres), (), (), 8, address=address)

    nodes = [
        node("a-gpu0-0", "10.0.0.1", "gpu:3g.71gb:1"),
        node("a-gpu0-4", "10.0.0.1", "gpu:3g.71gb:1"),
        node("b", "10.0.0.2", "gpu:1g.18gb:7"),
        node("c", "", "gpu:7g.141gb:1"),
        node("cpu1", "10.0.0.9", ""),
    ]
    assert gpu_hosts(nodes) == 3
    assert gpu_hosts([]) == 0


def test_the_read_spacing_grows_with_the_cluster_and_with_a_slow_read() -> None:
    """A small cluster with a quick queue: every probe; 100 hosts sharing 20 reads a second: 5 s; a read of 2,000
    jobs (0.34 s here) or a slurmctld slow to answer: ten times that; never below the probe."""
    assert read_spacing(4, 0.02, reads_per_s=20.0, probe_s=1.0) == 1.0
    assert read_spacing(100, 0.02, reads_per_s=20.0, probe_s=1.0) == 5.0
    assert read_spacing(4, 0.34, reads_per_s=20.0, probe_s=1.0) == pytest.approx(3.4)
    assert read_spacing(0, 0.0, reads_per_s=20.0, probe_s=2.0) == 2.0
