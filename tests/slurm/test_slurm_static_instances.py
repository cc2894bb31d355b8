"""``[slurm] node_per_instance`` with ``instance_nodes = "static"``: one static node of slurm.conf per place each MIG
profile can take, against real Slurm daemons and flexmigd as a subprocess.

This is the per-instance mode for Slurm 22.05 (the normal suite runs it there; ``make slurm-newer`` against 24.11):
slurm.conf lists ``fm-node-gpu<K>-<S>-<profile>`` in State=FUTURE; a job needing a profile no instance has gets
one carved from idle instances (their nodes back to FUTURE, the new instance's node out of it) while a job on
another instance of the same GPU runs on untouched; after a slurmctld restart, which returns every such node to
FUTURE, flexmig starts their slurmds again and the running job is not lost. The carving is a ``slurm_carving``
event on a real mosquitto.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from flexmig.mqtt.events import Event
from support.flexmigd import collect_events, node_action_steps, open_session, sample
from support.mosquitto import Mosquitto
from support.schemas import validator
from support.slurm import SlurmDaemon, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _future(d: SlurmDaemon, node: str) -> str:
    """The node's State as ``scontrol --future`` shows it (FUTURE nodes included)."""
    res = subprocess.run(
        [d.testbed.commands.path("scontrol"), "--future", "-o", "show", "node", node],
        env=d.testbed.env(), capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    words = dict(w.split("=", 1) for w in res.stdout.split() if "=" in w)
    return words.get("State", "")


def _carvings(port: int, node: str, *, until: str, limit_s: float = 30.0) -> list[Event]:
    """The ``slurm_carving`` events queued for the watcher's session, collected until one creates node ``until``
    (bounded); each validated against the schema."""
    schema = validator("event.v1.schema.json")
    out: list[Event] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        events = collect_events(port, node, client_id="carving-watcher", quiet_s=1.0, limit_s=5.0)
        for e in events:
            assert [err.message for err in schema.iter_errors(json.loads(e.to_json()))] == [], e
        out += [e for e in events if e.kind.value == "slurm_carving"]
        if any(c["slurm_node"] == until for e in out for c in e.payload["create"]):
            return out
    raise AssertionError(f"no slurm_carving event created {until} within {limit_s} s: {out}")


def test_a_profile_no_instance_has_is_carved_and_the_static_nodes_follow_the_instances(broker: Mosquitto) -> None:
    with SlurmDaemon(
        "h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=True, mqtt_port=broker.port
    ) as d:
        open_session(broker.port, d.node, client_id="carving-watcher")
        busy, idle = "fm-node-gpu0-0-3g71gb", "fm-node-gpu0-4-3g71gb"
        assert d.slurm_node(busy).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node(idle).gpu_counts() == {"3g.71gb": 1}
        assert d.slurm_node("fm-node-gpu0-0-1g18gb") is None  # FUTURE: hidden until its instance exists
        assert _future(d, "fm-node-gpu0-0-1g18gb") == "FUTURE"
        first = d.testbed.sbatch("-w", busy, "--gres=gpu:3g.71gb:1", script=SLEEP)
        running = d.wait_state(first, "RUNNING")
        assert running.nodes == (busy,), running
        d.wait("flexmig saw the job run", lambda: sample(d.metrics(), "flexmig_slurm_running_jobs") == 1.0)
        pid = d.slurmd_pid(busy)
        assert pid is not None
        second, seen, took = d.submit_while_watching(busy, "--gres=gpu:1g.18gb:1", script=SLEEP, what="a carved 1g")
        print(f"\nstatic instance nodes: submit to running on a carved instance: {took:.1f} s ({slurm_version()})")
        job = d.job(second)
        assert job is not None and len(job.nodes) == 1, job
        carved = job.nodes[0]
        assert carved.startswith("fm-node-gpu0-") and carved.endswith("-1g18gb"), carved
        assert d.slurm_node(carved).gpu_counts() == {"1g.18gb": 1}
        assert d.slurm_node(carved).cpus == 2  # slurm.conf's line: a compute slice's share of the 16 CPUs
        assert d.slurm_node(idle) is None and _future(d, idle) == "FUTURE"  # its instance is gone
        node = d.slurm_node(busy)
        assert node.gpu_counts() == {"3g.71gb": 1} and not node.drained, node
        assert all(s in ("allocated", "mixed") for s in seen), seen  # never drained, never absent
        assert d.slurmd_pid(busy) == pid  # its slurmd never restarted
        again = d.job(first)
        assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        line = d.wait(f"job {second}'s first line", lambda: d.output(second) if "\n" in d.output(second) else None)
        assert line.strip().startswith("MIG-"), line  # the TaskProlog read the carved node's own map
        (event,) = _carvings(broker.port, d.node, until=carved)  # the carving, once, as it was done
        assert event.payload["mode"] == "act" and event.payload["hold"] is None, event
        ((created),) = event.payload["create"]
        assert created["job"] == f"slurm-{second}" and created["instance"].startswith("gpu0:1g.18gb@"), event
        assert {x["slurm_node"] for x in event.payload["destroy"]} == {idle}, event

        # slurmctld starts again: Slurm returns every static node to slurm.conf's FUTURE, their slurmds run on
        d.stop_ctld()
        d.start_ctld()
        d.wait("flexmig registers both again", lambda: all(
            (n := d.slurm_node(name)) is not None and n.responding for name in (busy, carved)
        ), timeout_s=60)  # fmt: skip
        for job_id in (first, second):
            again = d.job(job_id)
            assert again is not None and again.state == "RUNNING" and again.restart_count == 0, again
        assert "slurmctld no longer lists static node" in d.log()
        # the carved instance's node takes a new job once its first one is gone
        subprocess.run([d.testbed.commands.path("scancel"), str(second)], env=d.testbed.env(), check=True)
        third = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        assert d.wait_state(third, "RUNNING", timeout_s=60).nodes == (carved,)


def test_an_instance_without_its_line_in_slurm_conf_is_refused_with_one_line() -> None:
    with SlurmDaemon("h200:7g.141gb@0", node_per_instance=True, static_nodes=True, start=False) as d:
        d.testbed.prepare("#!/bin/sh\n")
        conf = d.paths.slurm_conf.read_text()
        d.paths.slurm_conf.write_text("\n".join(x for x in conf.splitlines() if "-7g141gb " not in x) + "\n")
        d.wait_registered = False
        d.testbed.start()
        d.start_flexmigd()
        line = d.wait("the refusal", lambda: next(
            (x for x in d.log().splitlines() if "static node fm-node-gpu0-0-7g141gb is not in slurm.conf" in x), None
        ))  # fmt: skip
        assert "flexmig slurm conf --node-per-instance --static" in line and "nothing was changed" in line, line
        assert d.slurmd_pid("fm-node-gpu0-0-7g141gb") is None


def test_with_slurms_default_backfill_interval_a_retirement_waits_for_no_backfill_cycle(broker: Mosquitto) -> None:
    """Slurm's default ``bf_interval`` is 30 s. A dynamic node's deletion waits for the backfill scheduler's next
    cycle (22.05.8 crashes when a node it planned on is deleted before), a static node's return to FUTURE need not
    (its record stays): the carving's retirement has no such step, and the 1g job runs within one ``bf_interval``."""
    with SlurmDaemon(
        "h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=True, mqtt_port=broker.port,
        scheduler_parameters="sched_interval=1,bf_interval=30",
    ) as d:  # fmt: skip
        open_session(broker.port, d.node, client_id="backfill-watcher")
        busy, idle = "fm-node-gpu0-0-3g71gb", "fm-node-gpu0-4-3g71gb"
        first = d.testbed.sbatch("-w", busy, "--gres=gpu:3g.71gb:1", script=SLEEP)
        d.wait_state(first, "RUNNING")
        submitted = time.monotonic()
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)
        d.wait_state(second, "RUNNING", timeout_s=90)
        took = time.monotonic() - submitted
        print(f"\nstatic instance nodes, bf_interval=30: submit to running on a carved instance: {took:.1f} s")
        steps = node_action_steps(broker.port, d.node, idle, client_id="backfill-watcher")
        assert "backfill" not in steps, steps
        assert took < 30, took  # within one bf_interval (a figure, not a speed claim)
