"""The Slurm setups flexmig refuses, each with one line naming the file or key (the checks run on every read, before
anything is stopped), and the ones it accepts."""

from __future__ import annotations

from pathlib import PurePosixPath

from flexmig.slurm.reservations import parse_reservations
from flexmig.slurm.sitecheck import (
    cgroup_problem,
    configless_problem,
    gres_conf_problem,
    node_table_problem,
    parse_cgroup_conf,
    shared_fs_problem,
    tres_problem,
)

PROFILES = ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
# /proc/self/mountinfo lines as the kernel writes them
MOUNTS = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
45 22 0:40 / /etc/slurm rw,relatime shared:30 - nfs4 ctl:/export/slurm rw,vers=4.2
46 22 0:41 / /var/spool rw,relatime shared:31 - xfs /dev/sdb1 rw
"""


def test_configless_mode_is_refused_naming_the_missing_file() -> None:
    why = configless_problem(False, "/etc/slurm/slurm.conf", "enable_configless")
    assert why is not None and why.startswith("/etc/slurm/slurm.conf: no local slurm.conf")
    assert "enable_configless" in why and "configless mode is not supported" in why
    assert configless_problem(True, "/etc/slurm/slurm.conf", "enable_configless") is None  # local files win


def test_a_gres_conf_on_a_network_file_system_is_refused() -> None:
    why = shared_fs_problem(PurePosixPath("/etc/slurm/gres.conf"), MOUNTS)
    assert why is not None and "shared nfs4 file system (/etc/slurm)" in why
    assert shared_fs_problem(PurePosixPath("/var/spool/slurm/gres.conf"), MOUNTS) is None
    assert shared_fs_problem(PurePosixPath("/opt/gres.conf"), MOUNTS) is None  # the ext4 root


def test_autodetect_or_gpu_lines_for_the_node_outside_flexmigs_block_are_refused_with_the_line() -> None:
    text = "# site\nNodeName=other Name=gpu File=/dev/nvidia0\nAutoDetect=nvml\n"
    why = gres_conf_problem(text, "n1", "/etc/slurm/gres.conf")
    assert why is not None and why.startswith("/etc/slurm/gres.conf:3: 'AutoDetect=nvml': AutoDetect for node n1")
    ranged = gres_conf_problem("NodeName=n[1-4] Name=gpu File=/dev/nvidia0\n", "n1", "gres.conf")
    assert ranged is not None and "GPU lines for node n1" in ranged
    assert gres_conf_problem("NodeName=n2 AutoDetect=nvml\nName=mps Count=100\n", "n1", "gres.conf") is None
    assert gres_conf_problem("AutoDetect=off\n", "n1", "gres.conf") is None


def test_constrain_devices_is_refused_on_a_simulated_node_only() -> None:
    cgroup = parse_cgroup_conf("# cgroup.conf\nConstrainDevices=yes  # isolate GPUs\nConstrainCores=yes\n")
    why = cgroup_problem("task/affinity,task/cgroup", cgroup, simulated=True)
    assert why is not None and why.startswith("cgroup.conf: ConstrainDevices=yes on a simulated node")
    assert cgroup_problem("task/affinity,task/cgroup", cgroup, simulated=False) is None  # a real node: supported
    assert cgroup_problem("task/none", cgroup, simulated=True) is None  # inert without task/cgroup


def test_gpu_tres_that_name_some_profiles_but_not_all_are_refused() -> None:
    why = tres_problem("cpu,mem,gres/gpu,gres/gpu:3g.71gb", PROFILES)
    assert why is not None and why.startswith("AccountingStorageTRES lists GPU types (3g.71gb) but not 1g.18gb")
    assert tres_problem("cpu,mem,gres/gpu", PROFILES) is None  # counting GPUs only: supported
    assert tres_problem(",".join(["cpu", *(f"gres/gpu:{p}" for p in PROFILES)]), PROFILES) is None


def test_reservations_of_scontrol_show_reservation_oneliner_as_22_05_prints_them() -> None:
    text = (
        "ReservationName=maint StartTime=2026-12-01T23:51:24 EndTime=2026-12-02T00:51:24 Duration=01:00:00 "
        "Nodes=gpu[1-3],gpu7 NodeCnt=4 CoreCnt=64 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES "
        "TRES=cpu=64 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) "
        "Watts=n/a MaxStartDelay=(null)\n"
    )
    (r,) = parse_reservations(text)
    assert r.name == "maint" and r.nodes == ("gpu1", "gpu2", "gpu3", "gpu7") and "MAINT" in r.flags
    assert r.end_s - r.start_s == 3600 and not r.flexmig and not r.active(r.start_s - 1)
    assert parse_reservations("No reservations in the system\n") == ()


def test_a_node_table_with_no_room_for_the_node_is_refused_naming_max_node_count() -> None:
    why = node_table_problem("8", 8, "h-gpu7")
    assert why is not None and why.startswith("node h-gpu7 cannot register: slurm.conf's MaxNodeCount is 8"), why
    assert "holds 8 nodes already (FUTURE placeholders count" in why and "nothing was changed" in why
    assert node_table_problem("9", 8, "h-gpu7") is None
    assert node_table_problem("", 8, "h-gpu7") is None and node_table_problem("(null)", 99, "h") is None
