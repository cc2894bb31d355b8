"""The default Slurm layout against real Slurm daemons: a flexmigd whose ``[slurm]`` table names no mode (only
``enabled = true`` and the testbed's paths) runs one node per MIG instance in the form the node's Slurm supports,
says which in one line, and refuses in one line, changing nothing, where neither form can work.

On Slurm 22.05 (the normal suite) with the State=FUTURE instance lines of ``flexmig slurm conf --node-per-instance
--static`` in slurm.conf it runs static instance nodes; on 24.11 (``make slurm-newer``) the same, and dynamic ones
where slurm.conf has no such lines. The jobs run as an ordinary user made for the run.
"""

from __future__ import annotations

import pytest

from flexmig.mig.catalogue import model_by_key
from flexmig.slurm.settings import parse_instance_node
from flexmig.slurm.slots import slot_count
from support.slurm import SlurmDaemon, per_gpu_capable, skip_reason, slurm_version

pytestmark = [pytest.mark.integration, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

SLEEP = '#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES"\nsleep 600\n'


def _layout_lines(d: SlurmDaemon) -> list[str]:
    return [line for line in d.log().splitlines() if "Slurm layout: " in line]


@pytest.mark.parametrize("static", [True, False], ids=["static-lines", "no-static-lines"])
def test_enabled_alone_runs_one_node_per_instance_and_says_which(static: bool) -> None:
    if not static and not per_gpu_capable():
        pytest.skip(f"dynamic instance nodes need Slurm 23.11 or later, this is {slurm_version()}")
    with SlurmDaemon(
        "h200:3g.71gb@0+3g.71gb@4", node_per_instance=True, static_nodes=static, default_layout=True, start=False
    ) as d:
        d.start()  # waits until the instance nodes of the first layout are registered
        conf = (d.paths.flexmig / "flexmigd.toml").read_text()
        assert "node_per_instance" not in conf and "instance_nodes" not in conf and "layout" not in conf, conf
        lines = _layout_lines(d)
        assert len(lines) == 1, lines
        version = slurm_version().split()[-1]
        if static:
            assert "one static node of slurm.conf per MIG instance" in lines[0], lines
            declared = slot_count(model_by_key("h200"), 1)
            assert f"declares {declared} for fm-node" in lines[0] and f"Slurm {version}" in lines[0], lines
        else:
            assert "one dynamic node per MIG instance" in lines[0] and f"Slurm {version}" in lines[0], lines
        busy = "fm-node-gpu0-0-3g71gb" if static else "fm-node-gpu0-0"
        first = d.testbed.sbatch("-w", busy, "--gres=gpu:3g.71gb:1", script=SLEEP)
        assert d.wait_state(first, "RUNNING").nodes == (busy,)
        second = d.testbed.sbatch("--gres=gpu:1g.18gb:1", script=SLEEP)  # carved from the idle 3g instance
        job = d.wait_state(second, "RUNNING")
        where = parse_instance_node("fm-node", job.nodes[0]) if len(job.nodes) == 1 else None
        assert where is not None and where[0] == 0 and where[1] >= 4, job  # in the idle 3g's slices 4-7
        assert d.slurm_node(job.nodes[0]).gpu_counts() == {"1g.18gb": 1}
        running = d.job(first)
        assert running is not None and running.state == "RUNNING", running  # its GPU re-carved around it
        out = d.wait("the 1g job printed its device", lambda: d.output(second).strip())
        assert out.startswith("MIG-"), out
        assert d.testbed.job_user is not None and d.job(second) is not None


def test_where_no_instance_form_can_work_it_refuses_in_one_line_and_changes_nothing() -> None:
    # The whole-node testbed: slurm.conf has no instance lines, and its paths are one node's (no {node}).
    with SlurmDaemon("h200:7g.141gb@0", default_layout=True, wait_registered=False) as d:
        d.wait("the refusal", lambda: "Slurm: [slurm] " in d.log())
        refused = [line for line in d.log().splitlines() if "Slurm: [slurm] " in line]
        assert len(refused) == 1 and "WARNING" in refused[0], refused
        if per_gpu_capable():  # dynamic instance nodes would work, but this configuration's paths are one node's
            assert "slurmd_pid_file" in refused[0] and "has no {node}" in refused[0], refused
        else:
            assert "[slurm] layout = auto: Slurm 22.05" in refused[0], refused
            assert "declares none for fm-node" in refused[0] and "--node-per-instance --static" in refused[0]
        assert refused[0].endswith("nothing was changed"), refused
        d.wait("flexmigd up after the refusal", lambda: "flexmigd 0.1.0 up" in d.log() or " up: " in d.log())
        assert _layout_lines(d) == []
        assert "NodeName=fm-node" not in d.paths.gres_conf.read_text()  # no gres.conf block written
        assert d.slurm_node("fm-node") is None  # never registered: no slurmd was started
        assert d.proc is not None and d.proc.poll() is None  # flexmigd runs on, sampling
