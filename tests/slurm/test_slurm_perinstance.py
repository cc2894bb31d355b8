"""``[slurm] node_per_instance``: one dynamic node per MIG instance, against real Slurm daemons and flexmigd as a
subprocess.

On Slurm 23.11 and later (``make slurm-newer`` runs this module against 24.11): every instance is its own node,
``fm-node-gpu<K>-<S>``; a job needing a profile no instance has gets one carved from idle instances (their nodes
retired, a new node registered) while a job on another instance of the same GPU runs on untouched, its node never
drained and its slurmd never restarted. On Slurm 22.05 (the normal suite) flexmigd refuses the mode with one line
and registers nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time

import pytest

from support.flexmigd import node_action_steps, open_session, sample
from support.mosquitto import Mosquitto
from support.slurm import SlurmDaemon, per_gpu_capable, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'
NEWER = f"one dynamic node per MIG instance needs Slurm 23.11+ ({slurm_version()})"


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_profile_no_instance_has_is_carved_from_idle_instances_while_a_busy_one_runs_on() -> None:
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True) as d:
        busy, idle = "fm-node-gpu0-0", "fm-node-gpu0-4"
        assert d.slurm_node(busy).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node(idle).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node(d.node) is None  # no node for the whole host
        first = d.testbed.sbatch("-w", busy, "--gres=gpu:3g.71gb:1", script=SLEEP)
        running = d.wait_state(first, "RUNNING")
        assert running.nodes == (busy,), running
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        pid = d.slurmd_pid(busy)
        registered = d.slurm_node(busy).slurmd_start_s
        assert pid is not None

        # the busy instance's node, at every look while its sibling is carved
        second, seen, took = d.submit_while_watching(busy, "--gres=gpu:1g.18gb:1", script=SLEEP, what="a carved 1g")
        print(f"\nnode_per_instance: submit to running on a carved instance: {took:.1f} s ({slurm_version()})")

        job = d.job(second)
        assert job is not None and len(job.nodes) == 1, job
        carved = job.nodes[0]
        assert carved.startswith("fm-node-gpu0-") and carved != busy, carved
        assert d.slurm_node(carved).gpu_counts() == {"1g.18gb": 1}
        # slurmd_conf_per_slice = "CPUs=2" (the testbed's 16 CPUs over 7 slices): CPUs as the instance's slices
        assert (d.slurm_node(carved).cpus, d.slurm_node(busy).cpus) == (2, 6)
        assert d.slurm_node(idle) is None or d.slurm_node(idle).gpu_counts() != {"3g.71gb": 1}
        node = d.slurm_node(busy)
        assert node.gpu_counts() == {"3g.71gb": 1} and not node.drained, node
        assert all(s in ("allocated", "mixed") for s in seen), seen  # never drained, never absent
        assert d.slurmd_pid(busy) == pid and node.slurmd_start_s == registered  # its slurmd never restarted
        again = d.job(first)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        gres = d.paths.gres_conf.read_text()
        assert f"# BEGIN flexmig node={busy}" in gres and f"# BEGIN flexmig node={carved}" in gres
        assert f"# BEGIN flexmig node={idle}" not in gres or carved == idle
        line = d.wait(f"job {second}'s first line", lambda: d.output(second) if "\n" in d.output(second) else None)
        assert line.strip().startswith("MIG-"), line  # the TaskProlog read the carved node's own map
        # two devices on one node: a pool node's (tests/slurm/test_slurm_multidevice.py)


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_job_carved_for_runs_as_soon_as_its_node_registers_not_at_slurms_next_periodic_pass(
    broker: Mosquitto,
) -> None:
    """Every 1g instance busy, a 1g job waits (reason ``Resources``: the scheduler's pass after its submission found
    them taken; flexmigd is stopped until then) and flexmig carves it a 1g from the free memory slice. A dynamic
    node's registration does not run Slurm's scheduler (slurmctld's log: the node validated in state IDLE, then no
    pass), so the job waited for the next job event, backfill cycle (``bf_interval``, 30 s by default: 19 s here
    with it) or full pass (``sched_interval``, 60 s). flexmig's ``schedule`` step runs it: with both periodic passes
    10 minutes apart (so that only the step can start the job in time), the job runs within seconds of flexmigd
    going on (2.8 s measured; the issue's gate for a job on a new layout is 5 s)."""
    with SlurmDaemon(
        "h200:3g.71gb@0+1g.18gb@5+1g.18gb@6", node_per_instance=True, mqtt_port=broker.port,
        scheduler_parameters="sched_interval=600,bf_interval=600",
    ) as d:  # fmt: skip
        assert d.proc is not None
        open_session(broker.port, d.node, client_id="schedule-watcher")
        for start, profile in ((0, "3g.71gb"), (5, "1g.18gb"), (6, "1g.18gb")):
            busy = d.testbed.sbatch("-w", f"fm-node-gpu0-{start}", f"--gres=gpu:{profile}:1", script=SLEEP)
            d.wait_state(busy, "RUNNING")
        d.proc.send_signal(signal.SIGSTOP)
        try:
            job = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
            why = d.wait("the scheduler's pass over the job", lambda: (j := d.job(job)) and j.reason != "None" and j)
            assert (why.state, why.reason) == ("PENDING", "Resources"), why
        finally:
            d.proc.send_signal(signal.SIGCONT)
        going = time.monotonic()
        d.wait_state(job, "RUNNING", timeout_s=60)
        took = time.monotonic() - going
        print(f"\nnode_per_instance, a job carved for: flexmigd on to the job running: {took:.1f} s")
        found = d.job(job)
        assert found is not None and found.nodes == ("fm-node-gpu0-4",), found
        steps = node_action_steps(
            broker.port, d.node, "fm-node-gpu0-4", client_id="schedule-watcher", having="register"
        )
        assert steps[-1] == "schedule", steps
        assert took < 10, took  # Slurm's batch_sched_delay (3 s) and flexmig's probe_s (1 s) make most of it


def _scontrol(d: SlurmDaemon, *args: str) -> str:
    res = subprocess.run(
        [d.testbed.commands.path("scontrol"), *args], env=d.testbed.env(), capture_output=True, text=True, timeout=30,
        check=True,
    )  # fmt: skip
    return res.stdout


def _carvings(d: SlurmDaemon) -> list[str]:
    return [line for line in d.log().splitlines() if "carved:" in line]


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_job_of_two_nodes_gets_an_instance_node_carved_for_each() -> None:
    """What flexmig tells a job of two devices to ask for, ``--nodes=2 --gres=gpu:3g.71gb:1``, runs: a second 3g
    instance is carved from the two idle 2g beside the free 3g (without it the job would wait for good, the free 3g
    counted as all it needs)."""
    with SlurmDaemon("h200:2g.35gb@0+2g.35gb@2+3g.71gb@4", node_per_instance=True) as d:
        job = d.testbed.sbatch("--nodes=2", "--gres=gpu:3g.71gb:1", script=SLEEP)
        running = d.wait_state(job, "RUNNING", timeout_s=60)
        assert sorted(running.nodes) == ["fm-node-gpu0-0", "fm-node-gpu0-4"], running
        assert all(d.slurm_node(n).gpu_counts() == {"3g.71gb": 1} for n in running.nodes)


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_an_instance_node_an_administrator_drained_is_never_carved() -> None:
    with SlurmDaemon("h200:7g.141gb@0", node_per_instance=True) as d:
        node = "fm-node-gpu0-0"
        _scontrol(d, "update", f"nodename={node}", "state=drain", "reason=maint")
        job = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)  # fits only where the drained 7g is
        base = d.job_reads()
        d.wait("three more rounds", lambda: d.job_reads() >= base + 3)
        found = d.slurm_node(node)
        assert found is not None and found.drained and found.reason == "maint", found
        assert found.gpu_counts() == {"7g.141gb": 1}
        waiting = d.job(job)
        assert waiting is not None and waiting.state == "PENDING", waiting
        assert _carvings(d) == [], _carvings(d)
        _scontrol(d, "update", f"nodename={node}", "state=resume")  # the administrator is done: now it may change
        d.wait_state(job, "RUNNING", timeout_s=60)
        d.wait("the carving logged", lambda: len(_carvings(d)) == 1)  # logged once the round is done


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_killed_slurmd_of_a_busy_instance_node_comes_back_and_its_job_runs_on() -> None:
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True) as d:
        node = "fm-node-gpu0-4"
        job = d.testbed.sbatch("-w", node, "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait_state(job, "RUNNING")
        d.wait("its script runs (slurmd is past the Prolog)", lambda: d.output(job).strip())
        before = d.slurmd_pid(node)
        assert before is not None
        os.kill(before, signal.SIGKILL)
        states: list[str] = []

        def back() -> bool:
            found = d.slurm_node(node)
            states.append("absent" if found is None else found.state)
            pid = d.slurmd_pid(node)
            return pid is not None and pid != before and found is not None and found.responding

        d.wait("its slurmd started again", back, timeout_s=60)
        found = d.slurm_node(node)
        assert found.gpu_counts() == {"3g.71gb": 1} and not found.drained, found
        assert "down" not in states and "absent" not in states, states
        again = d.job(job)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        # flexmigd logs the round that restarted it once that round ends: after the node already answers
        d.wait("flexmig says why", lambda: "slurmd_restarted" in d.log() or "slurmd crashed" in d.log(), 30)


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_a_big_job_that_fits_nowhere_holds_its_region_so_that_only_shorter_jobs_start_there() -> None:
    keys = "hold_after_s = 2\n"
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, slurm_keys=keys) as d:
        busy, free = "fm-node-gpu0-0", "fm-node-gpu0-4"
        first = d.testbed.sbatch("-w", busy, "--time=3", "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait_state(first, "RUNNING")
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        big = d.testbed.sbatch("--gres=gpu:7g.141gb:1", script=SLEEP)  # needs the whole GPU: the busy 3g too

        def held() -> str | None:
            text = _scontrol(d, "show", "reservation", "--oneliner")
            return next((line for line in text.splitlines() if "flexmig-fm-node-hold" in line), None)

        line = d.wait("flexmig's hold on the region's nodes", held, timeout_s=60)
        assert re.search(r"Nodes=fm-node-gpu0-\[0,4\]", line), line  # the busy one too: freed, it stays held
        long = d.testbed.sbatch("--time=10", "--gres=gpu:3g.71gb:1", script=SLEEP)  # would outlast the busy 3g
        short = d.testbed.sbatch("--time=1", "--gres=gpu:3g.71gb:1", script=SLEEP)  # ends before it
        running = d.wait_state(short, "RUNNING", timeout_s=60)
        assert running.nodes == (free,), running
        base = d.job_reads()
        d.wait("three more rounds", lambda: d.job_reads() >= base + 3)
        waiting = d.job(long)
        assert waiting is not None and waiting.state == "PENDING", waiting  # nothing carved for it in the region
        assert [c for c in _carvings(d) if "3g" in c] == [], _carvings(d)
        subprocess.run([d.testbed.commands.path("scancel"), str(first), str(short)], env=d.testbed.env(), check=True)
        done = d.wait_state(big, "RUNNING", timeout_s=90)  # the region emptied: carved for the held job
        assert done.nodes == ("fm-node-gpu0-0",), done
        assert d.slurm_node("fm-node-gpu0-0").gpu_counts() == {"7g.141gb": 1}

        def behind() -> str | None:  # the job behind it, blocked now, holds the 7g's node from when the 7g job may end
            line = held()  # (made by the round that carved the 7g, once its node is registered: the job may run first)
            return line if line is not None and re.search(r"Nodes=fm-node-gpu0-0\b", line) else None

        d.wait("the hold of the job behind", behind, timeout_s=30)


@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
@pytest.mark.parametrize("when_idle", [True, False], ids=["hold_when_idle", "small_first"])
def test_a_big_job_holds_at_once_when_no_waiting_job_can_use_the_idle_instance(when_idle: bool) -> None:
    """``hold_after_s`` at its default (900 s): the 7g job behind a busy 3g holds the GPU within rounds of its
    submission, because the free 3g idles with no 3g job waiting, and a 3g job that would outlast the busy one then
    waits. With ``hold_when_idle = false`` there is no hold, and the same 3g job runs on the free instance at once."""
    keys = "" if when_idle else "hold_when_idle = false\n"
    with SlurmDaemon("h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, slurm_keys=keys) as d:
        busy, free = "fm-node-gpu0-0", "fm-node-gpu0-4"
        first = d.testbed.sbatch("-w", busy, "--time=3", "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait_state(first, "RUNNING")
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        big = d.testbed.sbatch("--gres=gpu:7g.141gb:1", script=SLEEP)

        def held() -> str | None:
            text = _scontrol(d, "show", "reservation", "--oneliner")
            return next((line for line in text.splitlines() if "flexmig-fm-node-hold" in line), None)

        if when_idle:
            line = d.wait("flexmig's hold on the region's nodes", held, timeout_s=30)
            assert re.search(r"Nodes=fm-node-gpu0-\[0,4\]", line), line
            why = f"slurm-{big}: blocked; holds 7g.141gb@0 on GPU 0 (no waiting job can use the idle slices)"
            assert why in d.log()
        else:
            base = d.job_reads()
            d.wait("three rounds", lambda: d.job_reads() >= base + 3)
            assert held() is None
        long = d.testbed.sbatch("--time=10", "--gres=gpu:3g.71gb:1", script=SLEEP)  # would outlast the busy 3g
        if when_idle:
            base = d.job_reads()
            d.wait("three more rounds", lambda: d.job_reads() >= base + 3)
            waiting = d.job(long)
            assert waiting is not None and waiting.state == "PENDING", waiting
        else:
            running = d.wait_state(long, "RUNNING", timeout_s=30)
            assert running.nodes == (free,), running
        pending = d.job(big)
        assert pending is not None and pending.state == "PENDING", pending


@pytest.mark.skipif(per_gpu_capable(), reason=f"Slurm {slurm_version()} takes node_per_instance")
def test_before_slurm_23_11_node_per_instance_is_refused_with_one_line() -> None:
    with SlurmDaemon("h200:7g.141gb@0", node_per_instance=True, wait_registered=False) as d:
        line = d.wait("the refusal", lambda: next(
            (x for x in d.log().splitlines() if "node_per_instance needs Slurm 23.11 or later" in x), None
        ))  # fmt: skip
        assert "nothing was changed" in line, line
        assert d.slurm_node("fm-node-gpu0-0") is None and d.slurm_node(d.node) is None



@pytest.mark.skipif(not per_gpu_capable(), reason=NEWER)
def test_with_slurms_default_backfill_interval_a_planned_node_is_retired_at_once_and_slurmctld_survives(
    broker: Mosquitto,
) -> None:
    """Slurm's default ``bf_interval`` is 30 s. 22.05.8's backfill scheduler crashes when a node it planned a job on
    is deleted before its next cycle, so flexmig waits for that cycle there; 22.05.9 and later (every Slurm that runs
    dynamic instance nodes) skip deleted nodes, and the wait would only hold each carving for up to 30 s. Here the
    idle instance's node is PLANNED (a two-node job waits for it and the busy one) when a 1g job needs it carved: its
    retirement has no ``backfill`` step, the 1g job runs within one ``bf_interval``, and slurmctld still answers
    after the backfill scheduler's next cycle."""
    with SlurmDaemon(
        "h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, mqtt_port=broker.port,
        scheduler_parameters="sched_interval=1,bf_interval=30",
    ) as d:  # fmt: skip
        open_session(broker.port, d.node, client_id="backfill-watcher")
        busy, idle = "fm-node-gpu0-0", "fm-node-gpu0-4"
        first = d.testbed.sbatch("-w", busy, "--time=10", "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait_state(first, "RUNNING")
        pair = d.testbed.sbatch("-N2", "-w", f"{busy},{idle}", "--time=5", "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait(f"{idle} planned for the two-node job", lambda: "PLANNED" in _scontrol(d, "show", "node", idle), 75)
        submitted = time.monotonic()
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        _scontrol(d, "update", f"jobid={second}", "priority=1000")  # before the two-node job, which keeps its plan
        d.wait_state(second, "RUNNING", timeout_s=90)
        took = time.monotonic() - submitted
        print(f"\nnode_per_instance, bf_interval=30, a planned idle node: submit to running: {took:.1f} s")
        assert d.slurm_node(idle) is None or d.slurm_node(idle).gpu_counts() != {"3g.71gb": 1}
        steps = node_action_steps(broker.port, d.node, idle, client_id="backfill-watcher")
        assert "backfill" not in steps, steps
        assert took < 30, took  # within one bf_interval (a figure, not a speed claim)
        before = asyncio.run(d.client().backfill_cycle_start())
        # the two-node job asks for a node that is gone (BadConstraints): a job that waits makes sdiag show the cycle
        big = d.testbed.sbatch("--time=5", "--gres=gpu:7g.141gb:1", script=SLEEP)
        d.wait(  # the cycle after the deletion, which begins by clearing its planned nodes (22.05.8 crashed there)
            "a backfill cycle after the deletion",
            lambda: (began := asyncio.run(d.client().backfill_cycle_start())) is not None and began != before,
            75,
        )
        assert "is UP" in _scontrol(d, "ping"), "slurmctld is down after the backfill cycle"
        waiting, running = d.job(pair), d.job(second)
        assert waiting is not None and waiting.state == "PENDING", waiting
        assert (later := d.job(big)) is not None and later.state == "PENDING", later
        assert running is not None and running.state == "RUNNING", running
