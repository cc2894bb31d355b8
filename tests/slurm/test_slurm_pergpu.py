"""``[slurm] node_per_gpu``: one dynamic node per MIG GPU, against real Slurm daemons and flexmigd as a subprocess.

On Slurm 23.11 and later (``make slurm-newer`` runs this module against 24.11): a host with two simulated GPUs
registers ``fm-node-gpu0`` and ``fm-node-gpu1``, each with its own slurmd; a job runs on GPU 0's node; a job
needing a profile only a new layout of GPU 1 gives is submitted, and flexmig re-registers ``fm-node-gpu1`` alone
while GPU 0's node, its slurmd and its job run on untouched. On Slurm 22.05 (the normal suite) flexmigd refuses the
mode with one line and registers nothing.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from support.flexmigd import sample
from support.slurm import SlurmDaemon, per_gpu_capable, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'
REFUSED = "node_per_gpu needs Slurm 23.11 or later"


@pytest.mark.skipif(not per_gpu_capable(), reason=f"one dynamic node per GPU needs Slurm 23.11+ ({slurm_version()})")
def test_a_change_of_one_gpu_re_registers_that_gpus_node_alone() -> None:
    with SlurmDaemon("h200x2:7g.141gb@0", node_per_gpu=True) as d:
        gpu0, gpu1 = "fm-node-gpu0", "fm-node-gpu1"
        assert d.slurm_node(gpu0).gpu_counts() == {"7g.141gb": 1}
        assert d.slurm_node(gpu1).gpu_counts() == {"7g.141gb": 1}
        assert d.slurm_node(d.node) is None  # no node for the whole host
        first = d.testbed.sbatch("-w", gpu0, "--gres=gpu:7g.141gb:1", script=SLEEP)
        running = d.wait_state(first, "RUNNING")
        assert running.nodes == (gpu0,), running
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        pid0 = d.slurmd_pid(gpu0)
        registered0 = d.slurm_node(gpu0).slurmd_start_s
        assert pid0 is not None

        seen: list[str] = []

        def started() -> bool:
            node0 = d.slurm_node(gpu0)  # GPU 0's node, at every look while GPU 1 changes
            seen.append("absent" if node0 is None else f"{node0.state}{'+drain' if node0.drained else ''}")
            job = d.job(second)
            return job is not None and job.state == "RUNNING"

        submitted = time.monotonic()
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait(f"job {second} running on GPU 1's new layout", started, timeout_s=90)
        took = time.monotonic() - submitted
        print(f"\nnode_per_gpu: submit to running on the re-registered {gpu1}: {took:.1f} s ({slurm_version()})")

        job = d.job(second)
        assert job is not None and job.nodes == (gpu1,), job
        assert d.slurm_node(gpu1).gpu_counts() == {"1g.18gb": 7}, d.slurm_node(gpu1)
        node0 = d.slurm_node(gpu0)
        assert node0.gpu_counts() == {"7g.141gb": 1} and not node0.drained, node0
        assert all(s in ("allocated", "mixed") for s in seen), seen  # never drained, never absent
        assert d.slurmd_pid(gpu0) == pid0 and node0.slurmd_start_s == registered0  # its slurmd never restarted
        again = d.job(first)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        # The round's lines are logged once every GPU node's round is done: the job may run before that.
        def planned() -> str | None:
            text = d.log()
            return text if f"{gpu1}: " in text and "Slurm plan (act)" in text else None

        log: str = d.wait("the round's plan logged", planned)
        assert f"node {gpu0} is not registered" not in log.split("Slurm plan (act)", 1)[1]
        gres = d.paths.gres_conf.read_text()
        assert f"# BEGIN flexmig node={gpu0}" in gres and f"# BEGIN flexmig node={gpu1}" in gres
        # RUNNING comes before the TaskProlog and the script's first line: wait for that line (under load, seconds).
        line = d.wait(f"job {second}'s first line", lambda: d.output(second) if "\n" in d.output(second) else None)
        assert line.strip().startswith("MIG-"), line  # the TaskProlog read GPU 1's own map


@pytest.mark.skipif(not per_gpu_capable(), reason=f"one dynamic node per GPU needs Slurm 23.11+ ({slurm_version()})")
def test_two_idle_gpu_nodes_do_not_both_change_for_one_job() -> None:
    with SlurmDaemon("h200x2:7g.141gb@0", node_per_gpu=True) as d:
        submitted = time.monotonic()
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait_state(job, "RUNNING")
        print(f"\nnode_per_gpu, two idle GPU nodes: submit to running {time.monotonic() - submitted:.1f} s")
        base = d.job_reads()
        d.wait("three more rounds", lambda: d.job_reads() >= base + 3)  # a round reads the queue once (shared)
        changes = [line for line in d.log().splitlines() if "action_started" in line and "serves" in line]
        assert len(changes) == 1 and "fm-node-gpu0" in changes[0], changes  # GPU 0 served it, GPU 1 left it
        assert d.slurm_node("fm-node-gpu1").gpu_counts() == {"7g.141gb": 1}
        assert d.slurm_node("fm-node-gpu0").gpu_counts() == {"1g.18gb": 7}


@pytest.mark.skipif(not per_gpu_capable(), reason=f"one dynamic node per GPU needs Slurm 23.11+ ({slurm_version()})")
def test_of_two_busy_gpu_nodes_the_one_expected_to_empty_first_changes_for_a_waiting_job() -> None:
    # GPU 0 is expected to be busy for half its job's 5-minute limit, GPU 1 for half a 2-minute one: either could
    # serve the 1g jobs after a change, and either would commit one. GPU 1 plans first, commits and claims the jobs;
    # GPU 0 (by GPU the first to plan) neither waits for them nor closes.
    with SlurmDaemon("h200x2:7g.141gb@0", node_per_gpu=True) as d:
        gpu0, gpu1 = "fm-node-gpu0", "fm-node-gpu1"
        late = d.testbed.sbatch("-w", gpu0, "--time=5", "--gres=gpu:7g.141gb:1", script=SLEEP)
        soon = d.testbed.sbatch("-w", gpu1, "--time=2", "--gres=gpu:7g.141gb:1", script=SLEEP)
        d.wait_state(late, "RUNNING")
        d.wait_state(soon, "RUNNING")
        d.wait("flexmig saw both run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 2.0)
        base = d.job_reads()
        d.wait("a round with both busy", lambda: d.job_reads() >= base + 2)
        d.submit_together(4, "--time=5", "--gres=gpu:1g.18gb:1", script=SLEEP)

        def mine() -> list[str] | None:
            return [n for n in _reservations(d) if n.startswith("flexmig-")] or None

        names: list[str] = d.wait("flexmig's reservation", mine)
        base = d.job_reads()
        d.wait("three more rounds", lambda: d.job_reads() >= base + 3)
        assert names == mine() == [f"flexmig-{gpu1}"], (names, d.log()[-3000:])
        assert d.slurm_node(gpu0).gpu_counts() == {"7g.141gb": 1} and not d.slurm_node(gpu0).drained


@pytest.mark.skipif(per_gpu_capable(), reason=f"this Slurm ({slurm_version()}) runs one dynamic node per GPU")
def test_an_older_slurm_refuses_node_per_gpu_with_one_line_and_touches_nothing() -> None:
    with SlurmDaemon("h200x2:7g.141gb@0", node_per_gpu=True, wait_registered=False) as d:
        d.wait("the refusal", lambda: REFUSED in d.log())
        d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)  # demand, which it leaves alone
        base = _config_reads(d)
        d.wait("three more rounds", lambda: _config_reads(d) >= base + 3)  # each asks scontrol show config again
        assert d.slurm_node("fm-node-gpu0") is None and d.slurm_node("fm-node-gpu1") is None
        assert not list(d.paths.run.glob("slurmd-*.pid"))  # no slurmd was started
        assert "BEGIN flexmig" not in d.paths.gres_conf.read_text()
        rc = d.stop_flexmigd()
        assert rc == 0, d.log()[-2000:]
        lines = [line for line in d.log().splitlines() if REFUSED in line]
        assert len(lines) == 1, lines
        assert "this is Slurm 22.05" in lines[0] and "set node_per_gpu = false" in lines[0], lines[0]


def _reservations(d: SlurmDaemon) -> list[str]:
    """The names of Slurm's reservations."""
    res = subprocess.run(
        [d.testbed.commands.path("scontrol"), "show", "reservation", "--oneliner"],
        env=d.testbed.env(), capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return re.findall(r"ReservationName=(\S+)", res.stdout)


def _config_reads(d: SlurmDaemon) -> int:
    """How many times slurmctld was asked for its configuration (sdiag's REQUEST_BUILD_INFO: ``scontrol show
    config``; while the version is refused flexmigd asks once a round, and nothing else here asks)."""
    return d.rpc_count("REQUEST_BUILD_INFO")


CRASH_HOOK = """#!/bin/sh
# Around the slurmd stand-in: when flexmigd first stops GPU 1's slurmd for a change, SIGKILL flexmigd (this hook's
# parent) first, as a crash right in the middle of that GPU node's re-registration; then do what was asked.
for verb; do :; done
if [ -e "{armed}" ] && [ ! -e "{fired}" ] && [ "$FLEXMIG_SLURMD_NODE" = "{node}" ] && [ "$verb" = stop ]; then
    touch "{fired}"
    kill -9 "$PPID"
fi
exec "$@"
"""


@pytest.mark.skipif(not per_gpu_capable(), reason=f"one dynamic node per GPU needs Slurm 23.11+ ({slurm_version()})")
def test_a_crash_mid_change_is_finished_at_start_for_the_right_gpu_node() -> None:
    with SlurmDaemon("h200x2:7g.141gb@0", node_per_gpu=True, start=False) as d:
        gpu0, gpu1 = "fm-node-gpu0", "fm-node-gpu1"
        armed, fired = d.base / "crash-armed", d.base / "crash-fired"
        hook = d.base / "crash-hook.sh"
        hook.write_text(CRASH_HOOK.format(armed=armed, fired=fired, node=gpu1))
        hook.chmod(0o755)
        d.testbed.hook_prefix = (str(hook),)
        d.start()
        first = d.testbed.sbatch("-w", gpu0, "--gres=gpu:7g.141gb:1", script=SLEEP)
        d.wait_state(first, "RUNNING")
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        pid0 = d.slurmd_pid(gpu0)
        armed.touch()
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        proc = d.proc
        assert proc is not None
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # until the hook killed it
            time.sleep(0.1)
        assert fired.exists() and proc.returncode == -9, (proc.returncode, d.log()[-2000:])
        assert d.stop_flexmigd() == -9
        d.start_flexmigd()  # waits until both GPU nodes are registered and responding
        d.wait_state(second, "RUNNING")
        d.wait("the second start reconciled", lambda: len(_reconciled(d)) == 2)  # logged once the action is done
        reconciled = _reconciled(d)
        assert "1 unfinished plan(s) run to their end" in reconciled[1], reconciled
        job = d.job(second)
        assert job is not None and job.nodes == (gpu1,), job
        assert d.slurm_node(gpu1).gpu_counts() == {"1g.18gb": 7}
        node0 = d.slurm_node(gpu0)
        assert node0.gpu_counts() == {"7g.141gb": 1} and not node0.drained, node0
        assert d.slurmd_pid(gpu0) == pid0  # GPU 0's slurmd ran on through the crash and the recovery
        again = d.job(first)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again


def _reconciled(d: SlurmDaemon) -> list[str]:
    """flexmigd's lines saying what each start's reconciliation of the journal did."""
    return [line for line in d.log().splitlines() if "reconciled: journal reconciled" in line]
