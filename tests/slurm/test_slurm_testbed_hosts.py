"""``flexmig slurm testbed --hosts 2``: two simulated hosts under one slurmctld and munged, in the default layout of
the Slurm under test, said in one line; an ordinary user's jobs get each host's own MIG devices; a host's flexmigd
that dies is reported while the other host runs on; SIGTERM stops every daemon the command started."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from support.slurm import JOB_USERS, UNIT_UMASK, skip_reason, slurm_bin

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def _until(what: str, probe: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(probe) and probe():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def _ours(root: Path) -> list[psutil.Process]:
    """The daemons of this testbed: its flexmigds (by their command lines), slurmds, slurmctld and munged (by their
    pid files)."""
    found = []
    for pid_file in [*(root / "run").glob("*.pid"), root / "munge" / "munged.pid"]:
        with_pid = pid_file.read_text().strip() if pid_file.exists() else ""
        if with_pid.isdigit() and psutil.pid_exists(int(with_pid)):
            found.append(psutil.Process(int(with_pid)))
    for proc in psutil.process_iter(["cmdline"]):
        if "flexmig.daemon" in (words := " ".join(proc.info["cmdline"] or [])) and str(root) in words:
            found.append(proc)
    return found


def test_two_hosts_run_an_ordinary_users_jobs_report_a_dead_flexmigd_and_stop_everything_on_sigterm() -> None:
    root = Path("/tmp") / f"fm-hosts-{os.getpid()}"
    err = Path("/tmp") / f"fm-hosts-{os.getpid()}.err"
    env = dict(os.environ)
    if slurm_bin() is not None:
        env["FLEXMIG_SLURM_BIN"] = str(slurm_bin())
    with err.open("w") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexmig.cli.main", "slurm", "testbed", "--hosts", "2", "--sim", "h200:7g.141gb@0",
             str(root)],
            stdout=subprocess.PIPE, stderr=errf, text=True, umask=UNIT_UMASK, env=env,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("export SLURM_CONF="), (line, proc.poll(), err.read_text())
        _until("the ready line", lambda: "ready:" in err.read_text())
        said = err.read_text()
        assert said.splitlines()[0].startswith("flexmig slurm testbed: layout: one ") and "per MIG instance" in said
        assert "ready: 2 host(s) (flexmig-sim-h1, flexmig-sim-h2), 2 node(s) registered" in said, said
        cmd_env = {**env, "SLURM_CONF": line.strip().split("=", 1)[1]}

        def slurm(*argv: str) -> str:
            bin_dir = slurm_bin()
            exe = str(bin_dir / argv[0]) if bin_dir is not None else argv[0]
            res = subprocess.run([exe, *argv[1:]], env=cmd_env, capture_output=True, text=True, timeout=30, check=True)
            return res.stdout

        nodes = dict(x.split(" ", 1) for x in slurm("sinfo", "-h", "-N", "-o", "%N %o").splitlines())
        assert sorted(n.split("-gpu")[0] for n in nodes) == ["flexmig-sim-h1", "flexmig-sim-h2"], nodes
        if "static" in said:  # slurm.conf's NodeAddr: each host its own; a dynamic node (23.11+) gets the address
            assert sorted(nodes.values()) == ["127.0.0.1", "127.0.0.2"], nodes  # its slurmd registered from
        user = pwd.getpwnam(JOB_USERS[0])
        outs = []
        for _ in range(2):
            job = slurm("sbatch", "--parsable", f"--uid={user.pw_name}", f"--gid={user.pw_gid}",
                        "--gres=gpu:7g.141gb:1", f"--output={root}/jobs/job-%j.out", "--wrap",
                        'echo "$(id -u) $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"; sleep 600').strip()  # fmt: skip
            outs.append(root / "jobs" / f"job-{job}.out")
        _until("both jobs started", lambda: all(o.exists() and o.read_text().endswith("\n") for o in outs))
        seen = [o.read_text().split() for o in outs]
        assert {s[0] for s in seen} == {str(user.pw_uid)}, seen
        assert {s[1].split("-gpu")[0] for s in seen} == {"flexmig-sim-h1", "flexmig-sim-h2"}, seen
        assert len({s[2] for s in seen}) == 2 and all(s[2].startswith("MIG-") for s in seen), seen
        # host 2's flexmigd dies: reported in one line, the testbed runs on
        daemons = [p for p in _ours(root) if "flexmig.daemon" in " ".join(p.cmdline())]
        assert len(daemons) == 2, daemons
        h2 = next(p for p in daemons if "/hosts/h2/" in " ".join(p.cmdline()))
        h2.kill()
        dead = "host flexmig-sim-h2: flexmigd exited with status -9"
        _until("the dead flexmigd reported", lambda: dead in err.read_text())
        assert proc.poll() is None
        running = slurm("squeue", "-h", "-o", "%T").split()
        assert running == ["RUNNING", "RUNNING"], running
        before = _ours(root)
        assert {p.name() for p in before} >= {"slurmctld", "munged", "slurmd"}, before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, err.read_text()
        _, alive = psutil.wait_procs(before, timeout=5)
        assert not alive, alive
        assert "stopped" in err.read_text().splitlines()[-1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        subprocess.run(["rm", "-rf", str(root), str(err)], check=False)
