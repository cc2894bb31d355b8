"""The simulator's nvidia-smi (``flexmig.sim.smi``) prints what NVML says in the real tool's layouts.

The expected lines are published outputs of the real ``nvidia-smi``, on nodes laid out the same way:

* ``mig -lgi``: GPU 0 of NVIDIA/DCGM issue #138 (https://github.com/NVIDIA/DCGM/issues/138, A100-80GB);
* ``mig -lgip``: GH200 144GB in NVIDIA/mig-parted pull request #139 (H200 has the same profile IDs, SMs and engines;
  its memory sizes differ, and are substituted);
* ``mig -lci``: the header and row layout that public transcripts of drivers 525-570 share (A100, H100, RTX PRO 6000);
* ``-L``: A100-SXM4-80GB with seven 1g.10gb in DataDog/datadog-agent pull request #33120;
* the summary table: driver 535 on A100-SXM4-40GB (the GPU and MIG-device rows) and on several GPUs (process rows).
"""

from __future__ import annotations

import io
import re

from flexmig.sim import install, uninstall
from flexmig.sim.smi import main


def smi(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out, err)
    return status, out.getvalue(), err.getvalue()


def same_layout(ours: str, published: str) -> bool:
    """True when ``ours`` lays its fields out as ``published`` does: the same number of fields, each ending (numbers,
    right-aligned) or starting (names, left-aligned) in the same column, the frame in the same place."""
    mine = [(m.start(), m.end()) for m in re.finditer(r"\S+", ours)]
    theirs = [(m.start(), m.end()) for m in re.finditer(r"\S+", published)]
    return len(ours) == len(published) and len(mine) == len(theirs) and all(
        a[1] == b[1] or a[0] == b[0] for a, b in zip(mine, theirs, strict=True)
    )


def test_mig_lgi_prints_the_published_layout_with_the_drivers_ids_and_placements() -> None:
    node = install("a100-80x2:1g.10gb@2+1g.10gb@3+2g.20gb@0+3g.40gb@4")  # the layout of the published output
    status, out, _ = smi("mig", "-lgi")
    assert status == 0
    lines = out.splitlines()
    assert lines[:5] == [
        "+-------------------------------------------------------+",
        "| GPU instances:                                        |",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|=======================================================|",
    ]
    published = [  # its GPU 0, in its order: by profile as -lgip lists them, then by GPU-instance ID
        "|   0  MIG 1g.10gb         19        9          2:1     |",
        "|   0  MIG 1g.10gb         19       10          3:1     |",
        "|   0  MIG 2g.20gb         14        3          0:2     |",
        "|   0  MIG 3g.40gb          9        2          4:4     |",
    ]
    rows = lines[5::2]
    assert all(rule == lines[0] for rule in lines[6::2])
    for gpu in (0, 1):
        mine = [r for r in rows if r.startswith(f"|   {gpu}  ")]
        assert all(same_layout(r, p) for r, p in zip(mine, published, strict=True)), mine
        truth = node.gpu(gpu).gpu_instances
        shown = [(int(r.split()[5]), r.split()[6]) for r in mine]
        assert sorted(shown) == sorted((gi.id, f"{gi.start}:{gi.profile.memory_slices}") for gi in truth)
        assert [r.split()[4] for r in mine] == ["19", "19", "14", "9"]


def test_mig_lgip_prints_the_published_lines_with_this_models_memory() -> None:
    install("h200")
    status, out, _ = smi("mig", "-lgip")
    assert status == 0
    lines = out.splitlines()
    assert lines[:5] == [
        "+-----------------------------------------------------------------------------+",
        "| GPU instance profiles:                                                      |",
        "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                              Free/Total   GiB              CE    JPEG  OFA  |",
        "|=============================================================================|",
    ]
    published = {  # GH200 144GB's rows, memory aside
        "19": ("|   0  MIG 1g.18gb       19     7/7        17.50      No     16     1     0   |",
               "|                                                             1     1     0   |"),
        "20": ("|   0  MIG 1g.18gb+me    20     1/1        17.50      No     16     1     0   |",
               "|                                                             1     1     1   |"),
    }  # fmt: skip
    rows = {line.split()[4]: i for i, line in enumerate(lines) if line.startswith("|   0  MIG")}
    for profile_id, (first, second) in published.items():
        i = rows[profile_id]
        memory = lines[i][43:48]
        assert re.fullmatch(r"\d+\.\d\d", memory)
        assert lines[i] == first.replace("17.50", memory)
        assert lines[i + 1] == second
    order = [line.split()[4] for line in lines if line.startswith("|   0  MIG")]
    assert order == ["19", "20", "15", "14", "9", "5", "0"]  # the published order


def test_mig_lci_lists_each_compute_instance_in_the_published_layout() -> None:
    node = install("h100-80:1g.10gb@2+2g.20gb@0")
    status, out, _ = smi("mig", "-lci")
    assert status == 0
    lines = out.splitlines()
    assert lines[:6] == [
        "+--------------------------------------------------------------------+",
        "| Compute instances:                                                 |",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|====================================================================|",
    ]
    published = "|   0      9       MIG 1g.10gb          0         0          0:1     |"
    one, two = lines[6], lines[8]
    assert same_layout(one, published) and same_layout(two, published.replace("1g.10gb", "2g.20gb"))
    ids = {gi.profile.name: gi.id for gi in node.gpu(0).gpu_instances}
    assert one.split()[2:4] == [str(ids["1g.10gb"]), "MIG"] and two.split()[2] == str(ids["2g.20gb"])


def test_list_gpus_names_each_gpu_and_mig_device_with_its_uuid_as_published() -> None:
    node = install("a100-80:" + "+".join(f"1g.10gb@{s}" for s in range(7)))
    status, out, _ = smi("-L")
    assert status == 0
    lines = out.splitlines()
    gpu = node.gpu(0)
    assert lines[0] == f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpu.uuid})"
    assert lines[1:] == [f"  MIG 1g.10gb     Device {i:>2}: (UUID: {u})" for i, u in enumerate(gpu.mig_uuids)]


def test_query_gpu_prints_csv_with_units_in_the_header_and_na_for_utilization_under_mig() -> None:
    node = install("h200x2:3g.71gb@0")
    status, out, _ = smi("--query-gpu=index,uuid,memory.total,utilization.gpu,mig.mode.current", "--format=csv")
    assert status == 0
    head, *rows = out.splitlines()
    assert head == "index, uuid, memory.total [MiB], utilization.gpu [%], mig.mode.current"
    assert rows == [f"{i}, {node.gpu(i).uuid}, 143771 MiB, [N/A], Enabled" for i in range(2)]
    status, out, _ = smi("--query-gpu", "index,memory.total", "--format=csv,noheader,nounits", "-i", "1")
    assert (status, out) == (0, "1, 143771\n")


def test_query_compute_apps_lists_the_processes_of_mig_devices_with_their_gpu() -> None:
    node = install("h200:3g.71gb@0+2g.35gb@4")
    pid = node.start_process(node.mig_uuids(0)[1], memory_bytes=3 << 30)
    status, out, _ = smi("--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader")
    assert status == 0
    assert out == f"{pid}, {node.gpu(0).uuid}, 3072 MiB\n"


def test_the_summary_table_keeps_the_real_tools_columns_and_says_it_is_the_simulators() -> None:
    node = install("a100-40:3g.20gb@0")
    pid = node.start_process(node.mig_uuids(0)[0], memory_bytes=1 << 30)
    status, out, _ = smi()
    assert status == 0
    lines = out.splitlines()
    assert {len(line) for line in lines[1:] if line} == {89}
    assert "flexmig's simulated node" in lines[3] and "not NVIDIA's nvidia-smi" in lines[3]
    gpu_row = next(line for line in lines if line.startswith("|   0  NVIDIA A100-SXM4-40GB"))
    bus = gpu_row[44:60]
    assert gpu_row == f"|   0  NVIDIA A100-SXM4-40GB          On  | {bus} Off |                   On |"
    gi = node.gpu(0).gpu_instances[0].id
    mig_row = next(line for line in lines if line.startswith(f"|  0 {gi:>4}   0   0  |"))
    published = "|  0    2   0   0  |              37MiB / 19968MiB  | 42      0 |  3   0    2    0    0 |"
    assert same_layout(mig_row, published) and mig_row.endswith("| 42      0 |  3   0    2    0    0 |")
    proc_row = next(line for line in lines if f" {pid} " in line)
    assert proc_row[:37] == f"|    0{gi:>6}    0{pid:>10}      C   " and proc_row.endswith("1024MiB |")


def test_a_command_line_it_does_not_answer_is_refused_with_status_2_and_the_usage() -> None:
    install("h200")
    status, out, err = smi("--gpu-reset")
    assert (status, out) == (2, "")
    assert "does not answer '--gpu-reset'" in err and "--query-gpu fields:" in err


def test_it_never_answers_for_a_real_driver() -> None:
    uninstall()
    status, out, err = smi("-L")
    assert (status, out) == (9, "") and "simulated node only" in err
