"""Job cgroups: where the daemon finds the cgroup v2 hierarchy, which job IDs may name a cgroup, and, on the real
cgroup filesystem, that a process placed in a job's cgroup before ``exec`` takes everything it starts with it, even
a child that leaves its session and empties its environment, and that ``kill`` ends them all."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexmig.act.jobcgroups import JobCgroups, cgroup2_root, own_cgroup, probe
from support.wait import wait_until

HYBRID = """\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
"""


def test_the_cgroup2_mount_is_found_among_v1_hierarchies() -> None:
    assert cgroup2_root(HYBRID) == (Path("/sys/fs/cgroup/unified"), "/")


def test_a_mount_point_with_a_space_is_unescaped_and_a_host_without_cgroup2_has_none() -> None:
    line = r"40 30 0:50 /sub /mnt/my\040cgroups rw - cgroup2 cgroup2 rw"
    root = cgroup2_root(line)
    assert root is not None and str(root[0]) == "/mnt/my cgroups" and root[1] == "/sub"
    assert cgroup2_root(HYBRID.splitlines()[0] + "\n" + HYBRID.splitlines()[2]) is None


def test_the_processs_own_cgroup_is_the_0_line() -> None:
    text = "9:name=systemd:/x\n4:memory:/y\n0::/system.slice/flexmigd.service\n"
    assert own_cgroup(text) == "/system.slice/flexmigd.service"
    assert own_cgroup("4:memory:/y\n") is None


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "x" * 65, "job id", "ä"])
def test_a_job_id_that_is_not_a_plain_name_names_no_cgroup(bad: str) -> None:
    with pytest.raises(ValueError, match="job ID"):
        JobCgroups(Path("/nonexistent")).path(bad)


CGROUPS, WHY = probe()


@pytest.fixture
def job() -> Iterator[tuple[JobCgroups, str]]:
    if CGROUPS is None:
        pytest.skip(f"no job cgroups here: {WHY}")
    uid = uuid.uuid4().hex
    yield CGROUPS, uid
    CGROUPS.kill(uid)
    wait_until(lambda: CGROUPS.remove(uid), timeout_s=10, what="the test's cgroup removed")


@pytest.mark.integration
def test_what_a_rank_starts_stays_in_its_cgroup_and_dies_with_it(job: tuple[JobCgroups, str]) -> None:
    cgroups, uid = job
    fd = cgroups.open_procs(uid)
    script = "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    os.execve('/bin/sleep', ['sleep', '60'], {})\n"
    try:
        rank = subprocess.Popen(
            ["/usr/bin/python3", "-c", script + "os.wait()\n"],
            preexec_fn=lambda: os.write(fd, b"0"),  # noqa: PLW1509 - one syscall
            start_new_session=True,
        )
    finally:
        os.close(fd)
    assert uid in cgroups.jobs()
    wait_until(lambda: len(cgroups.pids(uid)) == 2, timeout_s=10, what="the rank and its escaped child")
    assert rank.pid in cgroups.pids(uid)
    assert not cgroups.remove(uid), "a cgroup with processes stays"
    cgroups.kill(uid)
    assert rank.wait(timeout=10) == -9
    wait_until(lambda: not cgroups.pids(uid), timeout_s=10, what="the escaped child killed too")
    assert cgroups.remove(uid) and uid not in cgroups.jobs()
    assert cgroups.remove(uid), "removing a cgroup that is gone is not an error"


@pytest.mark.integration
def test_a_cgroup_removed_between_the_open_and_the_read_has_no_processes_and_nothing_to_kill(
    job: tuple[JobCgroups, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon removes an empty job cgroup while another task may be looking at it: the kernel then answers a
    # read of its cgroup.procs (or a write of cgroup.kill) through the open descriptor with ENODEV.
    cgroups, uid = job
    os.close(cgroups.open_procs(uid))  # the cgroup exists, empty
    real_open = os.open

    def open_then_removed(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        fd = real_open(path, flags, mode)
        if Path(path).parent == cgroups.path(uid):
            cgroups.path(uid).rmdir()  # the other look removes it now, on the real cgroup filesystem
        return fd

    monkeypatch.setattr(os, "open", open_then_removed)
    assert cgroups.pids(uid) == []
    assert not cgroups.path(uid).exists()
    monkeypatch.setattr(os, "open", real_open)
    os.close(cgroups.open_procs(uid))  # made again
    monkeypatch.setattr(os, "open", open_then_removed)
    cgroups.kill(uid)  # no OSError
    monkeypatch.setattr(os, "open", real_open)
    assert not cgroups.path(uid).exists()
