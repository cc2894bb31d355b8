"""flexmigd with ``[slurm] enabled``, as a subprocess, against a real Slurm 22.05 on a simulated node: the issue's
scenario end to end, its events and metrics, a Slurm that stops, and ``flexmig slurm testbed`` itself."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from flexmig.mqtt.events import Event
from flexmig.slurm.change import planned_delete_crashes
from support.flexmigd import collect_events, open_session, sample
from support.jobs import counter_spec, write_spec
from support.mosquitto import Mosquitto
from support.slurm import (
    JOB_USERS,
    UNIT_UMASK,
    SlurmDaemon,
    hook_command,
    skip_reason,
    slurm_bin,
    slurm_version,
)
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "event.v1.schema.json").read_text())
EVENTS = jsonschema.Draft202012Validator(SCHEMA)
SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _printed(d: SlurmDaemon, job: int) -> Callable[[], str]:
    return lambda: d.output(job).strip()


def _valid(events: list[Event]) -> None:
    for e in events:
        errors = [err.message for err in EVENTS.iter_errors(json.loads(e.to_json()))]
        assert errors == [], (e.kind, errors)


def test_pending_slurm_jobs_get_their_instances_with_events_and_metrics(broker: Mosquitto) -> None:
    with SlurmDaemon("h200:7g.141gb@0", mqtt_port=broker.port) as d:
        open_session(broker.port, d.node, client_id="slurm-watcher")
        jobs = d.submit_together(3, "--gres=gpu:1g.18gb:1", script=SLEEP)
        submitted = time.monotonic()
        for j in jobs:
            d.wait_state(j, "RUNNING", timeout_s=60)
        took = time.monotonic() - submitted
        assert took < 60, took  # the bound: within a minute (a timing figure, not a speed claim)
        seen = [d.wait(f"job {j} printed its device", _printed(d, j)) for j in jobs]
        assert all(s.startswith("MIG-") for s in seen) and len(set(seen)) == 3, seen
        node = d.slurm_node()
        assert node.gpu_counts() == {"1g.18gb": 7}, node  # the whole GPU carved, with the smallest profile
        inv = json.loads(
            subprocess.run(
                [sys.executable, "-m", "flexmig.cli.main", "inventory", "--json", "--sim", d.spec,
                 "--sim-state", str(d.paths.flexmig / "sim.json")],
                capture_output=True, text=True, timeout=60, check=True,
            ).stdout
        )  # fmt: skip
        (gpu,) = inv["gpus"]
        assert sorted(g["profile_name"] for g in gpu["gpu_instances"]) == ["1g.18gb"] * 7  # Slurm's view is NVML's
        assert set(seen) <= {m["uuid"] for m in gpu["mig_devices"]}  # each job on one of them
        d.wait(
            "the metrics show Slurm's new view",
            lambda: sample(d.metrics(), "flexmig_slurm_registered_gpus", profile="1g.18gb") == 7.0,
        )
        text = d.metrics()
        assert sample(text, "flexmig_slurm_in_sync") == 1.0
        assert sample(text, "flexmig_slurm_up") == 1.0
        done = sample(text, "flexmig_actions_total", action="slurm_reregister", outcome="completed")
        assert done is not None and done >= 2  # the first registration, then the repartition
        events = collect_events(broker.port, d.node, client_id="slurm-watcher")
        _valid(events)
        kinds = [e.kind.value for e in events]
        assert "slurm_plan" in kinds and "action_completed" in kinds, kinds
        plan = next(e for e in events if e.kind.value == "slurm_plan")
        assert plan.payload["go"] is True and plan.payload["mode"] == "act"
        assert any(c.startswith("create gpu0:1g.18gb@") for c in plan.payload["changes"])
        assert any(e.kind.value == "action_completed" and e.payload.get("action") == "slurm_reregister" for e in events)
        # flexmig's own queue never feeds a Slurm node
        spec = write_spec(d.base / "counter.toml", counter_spec(d.base, "counter"))
        sock = str(d.paths.flexmig / "control.sock")
        res = subprocess.run(
            [sys.executable, "-m", "flexmig.cli.main", "jobs", "--socket", sock, "submit", str(spec)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode != 0 and "sbatch" in res.stderr, res.stdout + res.stderr


def test_a_hook_job_is_moved_by_checkpoint_with_job_events(broker: Mosquitto) -> None:
    with SlurmDaemon("h200:4g.71gb@0+3g.71gb@4", mqtt_port=broker.port) as d:
        open_session(broker.port, d.node, client_id="slurm-hook-watcher")
        log = d.paths.jobs / "hook.jsonl"
        script = f"#!/bin/sh\nexec {hook_command(log, '--step-time', '0.02')}\n"
        hook = d.testbed.sbatch("--requeue", "--comment=flexmig:hook", "--gres=gpu:3g.71gb:1", script=script)
        d.wait_state(hook, "RUNNING")
        d.wait(  # the testbed's hook_settle_s is 5 s: flexmig counts the job as movable from then on
            "the hook job movable", lambda: sample(d.metrics(), "flexmig_slurm_movable_jobs") == 1.0, timeout_s=30
        )
        small = d.submit_together(4, "--gres=gpu:1g.18gb:1", script=SLEEP)
        for j in small:
            d.wait_state(j, "RUNNING", timeout_s=90)
        d.wait("the hook job resumed", lambda: sum('"start"' in line for line in log.read_text().splitlines()) >= 2)
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        starts = [x for x in lines if x["event"] == "start"]
        ckpt = next(x for x in lines if x["event"] == "checkpoint")
        assert starts[1]["step"] == ckpt["step"] + 1
        job = d.job(hook)
        assert job is not None and job.restart_count == 1
        events = collect_events(broker.port, d.node, client_id="slurm-hook-watcher")
        _valid(events)
        mine = [e.kind.value for e in events if e.payload.get("slurm_job") == hook]
        assert mine == ["slurm_job_signalled", "slurm_job_requeued", "slurm_job_released"], mine
        text = d.metrics()
        assert sample(text, "flexmig_slurm_job_actions_total", action="requeued") == 1.0
        assert (sample(text, "flexmig_slurm_drain_seconds_count") or 0) >= 1


def test_flexmigd_samples_on_with_one_line_while_slurmctld_is_down(broker: Mosquitto) -> None:
    with SlurmDaemon("h200:7g.141gb@0", mqtt_port=broker.port) as d:
        open_session(broker.port, d.node, client_id="slurm-down-watcher")
        before = sample(d.metrics(), "flexmig_sweeps_total") or 0
        d.stop_ctld()
        d.wait("flexmig noticed", lambda: sample(d.metrics(), "flexmig_slurm_up") == 0.0, timeout_s=90)
        d.wait(  # a second round fails the same way (each waits out Slurm's client timeout)
            "another failed read", lambda: (sample(d.metrics(), "flexmig_slurm_read_errors_total") or 0) >= 2, 120
        )
        log = d.log()
        assert log.count("Slurm cannot be read") == 1, log[-3000:]
        assert (sample(d.metrics(), "flexmig_sweeps_total") or 0) > before  # sampling goes on
        completed = sample(d.metrics(), "flexmig_actions_total", action="slurm_reregister", outcome="completed")
        d.start_ctld()
        d.wait("Slurm answers again", lambda: "Slurm answers again" in d.log(), timeout_s=90)
        assert sample(d.metrics(), "flexmig_slurm_up") == 1.0
        assert sample(d.metrics(), "flexmig_actions_total", action="slurm_reregister", outcome="completed") == completed
        events = collect_events(broker.port, d.node, client_id="slurm-down-watcher")
        _valid(events)
        kinds = [e.kind.value for e in events]
        assert kinds.count("slurm_unreachable") == 1 and kinds.count("slurm_reachable") == 1, kinds


def test_the_testbed_command_runs_a_job_of_an_ordinary_user_and_stops_everything_on_sigterm(tmp_path: Path) -> None:
    """Started as flexmigd's unit starts it (``UMask=0077``); a job of an ordinary user gets its MIG device (its
    TaskProlog's interpreter was the one that runs the testbed, which lay under /root: exit 127)."""
    root = Path("/tmp") / f"fm-tbcmd-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexmig.cli.main", "slurm", "testbed", "--sim", "h200:7g.141gb@0", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        umask=UNIT_UMASK,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("export SLURM_CONF="), (line, proc.poll())
        conf = line.strip().split("=", 1)[1]
        env = {**os.environ, "SLURM_CONF": conf}
        bins = slurm_bin()  # the Slurm under test's commands (24.11's in make slurm-newer), as the testbed's own

        def cmd(name: str) -> str:
            return str(bins / name) if bins is not None else name

        def listed() -> str:  # the export line comes before the node registers (a dynamic node: not listed until then)
            argv = [cmd("sinfo"), "-h", "-N", "-o", "%N %G"]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False).stdout.strip()

        out = wait_until(lambda: proc.poll() is None and listed(), 60, "the testbed's node listed by sinfo")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        node, gres = out.split()  # one node a MIG instance by default: flexmig-sim-gpu0-0 (-7g141gb on 22.05)
        assert node.startswith("flexmig-sim-gpu0-0") and gres == "gpu:7g.141gb:1", out
        user = pwd.getpwnam(JOB_USERS[0])
        sub = subprocess.run(
            [cmd("sbatch"), "--parsable", f"--uid={user.pw_name}", f"--gid={user.pw_gid}", "--gres=gpu:7g.141gb:1",
             f"--output={root}/jobs/job-%j.out", "--wrap", 'echo "$(id -u) $CUDA_VISIBLE_DEVICES"'],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        output = root / "jobs" / f"job-{sub.stdout.strip()}.out"
        deadline = time.monotonic() + 60
        while not (output.exists() and output.read_text().endswith("\n")) and time.monotonic() < deadline:
            time.sleep(0.2)
        last = output.read_text().splitlines()[-1] if output.exists() else "(no output)"
        assert last.startswith(f"{user.pw_uid} MIG-"), output.read_text() if output.exists() else last
        pids = [int((root / "run" / name).read_text()) for name in ("slurmctld.pid", f"slurmd-{node}.pid")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert all(
            not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split()[2] for p in pids
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the command stops what it started (a kill would leave it running)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_an_idle_node_needing_a_new_layout_runs_its_job_at_once_with_the_production_defaults() -> None:
    with SlurmDaemon("h200:7g.141gb@0", interval_s=None) as d:  # interval_s 10, min_interval_s 60, probe_s 1
        first = d.submit_together(1, "--gres=gpu:1g.18gb:1", script="#!/bin/sh\nsleep 2\n")
        d.wait_state(first[0], "COMPLETED", timeout_s=60)  # a change, then the node is idle again
        submitted = time.monotonic()
        (big,) = d.submit_together(1, "--gres=gpu:7g.141gb:1", script=SLEEP)
        d.wait_state(big, "RUNNING", timeout_s=60)
        took = time.monotonic() - submitted
        assert took < 30, took  # not held by the batching gate (60 s); bench/slurm_mix.py and bench/slurm.py time it
        assert d.slurm_node().gpu_counts() == {"7g.141gb": 1}


def test_with_slurms_own_scheduler_settings_an_idle_node_runs_its_job_in_seconds_from_22_05_9() -> None:
    """No SchedulerParameters (``sched_interval`` 60 s, ``bf_interval`` 30 s, ``batch_sched_delay`` 3 s): the job's
    submission runs the scheduler before the node is registered again, and the dynamic node's registration does
    not run it; flexmig's ``schedule`` step does, at most ``batch_sched_delay`` after the pass that flexmig's own
    drain queued (24.11.5: 4.5-5.1 s from submission to running). From Slurm 22.05.9 on the change waits for no
    backfill cycle; 22.05.8's change waits for one (its crash, docs/slurm-node.md): up to 30 s."""
    with SlurmDaemon("h200:7g.141gb@0", interval_s=None, scheduler_parameters="") as d:
        submitted = time.monotonic()
        (job,) = d.submit_together(1, "--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait_state(job, "RUNNING", timeout_s=90)
        took = time.monotonic() - submitted
        print(f"\nan idle node, Slurm's own scheduler settings ({slurm_version()}): submit to running: {took:.1f} s")
        assert d.slurm_node().gpu_counts().get("1g.18gb", 0) >= 1
        assert took < (40 if planned_delete_crashes(slurm_version()) else 10), took


def test_the_control_socket_answers_while_the_journal_finishes_a_change_at_start_up() -> None:
    deaf = '#!/bin/sh\ntrap "echo USR1" USR1\nwhile true; do sleep 0.2; done\n'  # a hook job that never acknowledges
    with SlurmDaemon("h200:4g.71gb@0+3g.71gb@4", slurm_keys="ack_timeout_s = 30\n") as d:
        job = d.testbed.sbatch("--requeue", "--comment=flexmig:hook", "--gres=gpu:3g.71gb:1", script=deaf)
        d.wait_state(job, "RUNNING")
        d.submit_together(2, "--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait("the change waits for the acknowledgement", lambda: f"Slurm job {job} signalled" in d.log(), 120)
        assert d.proc is not None
        d.proc.kill()  # flexmigd dies in the middle of the change
        d.proc.wait(30)
        d.proc = None
        mark = len(d.log())
        d.start_flexmigd()
        sock = str(d.paths.flexmig / "control.sock")
        res = d.wait(
            "flexmig status answers",
            lambda: (r := subprocess.run(
                [sys.executable, "-m", "flexmig.cli.main", "status", "--socket", sock, "--json"],
                capture_output=True, text=True, timeout=30, check=False,
            )).returncode == 0 and r,
            timeout_s=60,
        )  # fmt: skip
        assert json.loads(res.stdout)["mode"] == "act"
        assert "journal reconciled" not in d.log()[mark:]  # answered while the change was being finished
        d.wait("the change finished", lambda: "journal reconciled" in d.log()[mark:], timeout_s=90)
