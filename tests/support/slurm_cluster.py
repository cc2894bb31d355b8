"""A real Slurm cluster on one machine for integration tests (not a test module): the testbed with several simulated
hosts (:class:`flexmig.slurm.testbed.Testbed` with ``hosts``), one slurmctld and munged, and one flexmigd (mode act,
a subprocess under the unit's umask) per host with its own simulated GPUs, journal, control socket, metrics port and
slurmds, as ``flexmig slurm testbed --hosts N`` runs them.

The layout is the testbed's default for the Slurm under test (:func:`flexmig.slurm.testbed_layout.choose_layout`:
static instance nodes on 22.05, dynamic ones from 23.11) unless a test names another. Jobs run as the users made for
the run (:data:`support.slurm.JOB_USERS`). Every wait is bounded and names what it waited for; leaving the context
stops every flexmigd, cancels the jobs, stops the daemons and removes the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexmig.cli.slurm_testbed import seed_sim_state
from flexmig.mig.nodespec import parse_node_spec
from flexmig.slurm.client import SlurmClient
from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.settings import instance_node, slot_node
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.testbed import Testbed, free_port, stop_pid
from flexmig.slurm.testbed_layout import choose_layout
from support.processes import stop_process
from support.slurm import UNIT_UMASK, WAIT_S, commands, hook_command, job_user, slurm_version


class SlurmCluster:
    """``with SlurmCluster("h200:7g.141gb@0", hosts=2) as c:`` a Slurm cluster of ``hosts`` simulated hosts, each
    with its flexmigd, every host's first nodes registered."""

    def __init__(
        self,
        spec: str,
        hosts: int = 2,
        *,
        layout: str = "instance",
        node: str = "fm",
        interval_s: float | None = 1.0,
        slurm_keys: str = "",
        hook_prefix: tuple[str, ...] = (),
    ) -> None:
        node_spec = parse_node_spec(spec)
        self.spec = spec
        self.layout = choose_layout(layout, slurm_version(), hosts)
        self.base = Path(tempfile.mkdtemp(prefix="fm-cluster-", dir="/tmp"))
        self.base.chmod(0o755)
        self.testbed = Testbed(
            self.base, node_spec.model, node_spec.count, node=node, commands=commands(), hosts=hosts,
            node_per_gpu=self.layout.node_per_gpu, node_per_instance=self.layout.node_per_instance,
            static_nodes=self.layout.static_nodes, job_user=job_user(), hook_prefix=hook_prefix,
        )  # fmt: skip
        self.paths = self.testbed.paths
        self.hosts = hosts
        self.interval_s = interval_s
        self.slurm_keys = slurm_keys
        self.metrics_ports = [free_port() for _ in range(hosts)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * hosts

    # ------------------------------------------------------------------------------------------ life
    def __enter__(self) -> SlurmCluster:
        try:
            self.testbed.prepare()
            self.testbed.start()
            for host in range(self.hosts):
                self.start_flexmigd(host, wait=False)
            for host in range(self.hosts):
                self.wait_registered(host)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for host in range(self.hosts):
            self.stop_flexmigd(host)
        self.testbed.stop()
        if not os.environ.get("FLEXMIG_KEEP_TESTBED"):
            shutil.rmtree(self.base, ignore_errors=True)

    def node(self, host: int) -> str:
        """Host ``host``'s Slurm node name (from 0: ``fm-h1`` is host 0)."""
        return self.testbed.host_node(host)

    def log_path(self, host: int) -> Path:
        """Host ``host``'s flexmigd log."""
        return self.paths.log / f"flexmigd-h{host + 1}.log"

    def start_flexmigd(self, host: int, *, wait: bool = True) -> None:
        """Write host ``host``'s configuration and start its flexmigd (its simulated node from its state file when
        there is one: a restart); ``wait``: until its first nodes are registered."""
        f = self.testbed.host_paths(host).flexmig
        if host > 0:
            seed_sim_state(self.spec, f / "sim.json", host)
        port = self.metrics_ports[host]
        text = self.testbed.flexmigd_config(metrics_port=port, interval_s=self.interval_s, host=host)
        conf = f / "flexmigd.toml"
        conf.write_text(text + self.slurm_keys)
        conf.chmod(0o600)
        argv = [
            sys.executable, "-m", "flexmig.daemon", "--sim", self.spec, "--sim-state", str(f / "sim.json"),
            "--config", str(conf),
        ]  # fmt: skip
        with self.log_path(host).open("ab") as log:
            self.procs[host] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.testbed.env(host), umask=UNIT_UMASK
            )
        if wait:
            self.wait_registered(host)

    def first_nodes(self, host: int) -> list[str]:
        """The nodes host ``host`` registers at start (one per instance of the spec's layout, per GPU, or the
        host's)."""
        if not self.layout.node_per_instance:
            return self.testbed.node_names(host)
        node, gpus = self.node(host), range(self.testbed.gpus)
        layout = parse_node_spec(self.spec).layout or ()
        if self.layout.static_nodes:
            return [slot_node(node, k, inst.start, inst.profile.name) for k in gpus for inst in layout]
        return [instance_node(node, k, inst.start) for k in gpus for inst in layout]

    def wait_registered(self, host: int) -> None:
        """Until host ``host``'s first nodes respond."""
        for name in self.first_nodes(host):
            self.wait(f"node {name} registered", functools.partial(self.responding, name))

    def kill_flexmigd(self, host: int) -> None:
        """SIGKILL host ``host``'s flexmigd (a crash: no clean-up of its own) and reap it."""
        proc, self.procs[host] = self.procs[host], None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)

    def stop_flexmigd(self, host: int) -> int | None:
        """SIGTERM host ``host``'s flexmigd and wait (bounded); its exit status."""
        proc, self.procs[host] = self.procs[host], None
        return stop_process(proc, WAIT_S)

    def stop_ctld(self) -> None:
        """Stop slurmctld (as a crash or an administrator would)."""
        stop_pid(int((self.paths.run / "slurmctld.pid").read_text()))

    def start_ctld(self) -> None:
        """Start slurmctld again (it recovers its state) and wait until it answers."""
        subprocess.run(
            [self.testbed.commands.path("slurmctld"), "-i"], env=self.testbed.env(), check=True, timeout=30,
            capture_output=True,
        )  # fmt: skip
        self.testbed.wait_ctld()

    # ------------------------------------------------------------------------------------------ helpers
    def wait(self, what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        """``probe()`` until truthy; AssertionError with the flexmigds' last log lines after ``timeout_s``, or at once
        when a flexmigd the test did not stop exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for host, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(f"host {host}'s flexmigd exited {proc.returncode} waiting for {what}: "
                                         f"{self.log(host)[-3000:]}")  # fmt: skip
            with contextlib.suppress(Exception):
                got = probe()
                if got:
                    return got
            time.sleep(0.2)
        logs = "\n".join(f"--- host {h}: {self.log(h)[-1500:]}" for h in range(self.hosts))
        raise AssertionError(f"{what}: not within {timeout_s:g} s; the flexmigds' logs end:\n{logs}")

    def log(self, host: int) -> str:
        """Host ``host``'s flexmigd log so far."""
        path = self.log_path(host)
        return path.read_text(errors="replace") if path.exists() else ""

    def client(self) -> SlurmClient:
        """A Slurm client on the cluster."""
        return SlurmClient(self.testbed.slurm_commands())

    def slurm_nodes(self) -> tuple[SlurmNode, ...]:
        """Slurm's registered nodes."""
        return asyncio.run(self.client().nodes())

    def slurm_node(self, name: str) -> SlurmNode | None:
        """Slurm's record of node ``name`` (None when not registered)."""
        return asyncio.run(self.client().node(name))

    def responding(self, name: str) -> bool:
        """True when Slurm lists node ``name``, responding."""
        node = self.slurm_node(name)
        return node is not None and bool(node.responding)

    def instances(self, host: int) -> list[tuple[int, int, str]]:
        """Host ``host``'s MIG instances ``(gpu, start, profile)`` as its simulated driver holds them (its state
        file)."""
        by_id = {p.profile_id: p.name for p in parse_node_spec(self.spec).model.profiles}
        doc = json.loads((self.testbed.host_paths(host).flexmig / "sim.json").read_text())
        return sorted(
            (g["index"], gi["start"], by_id[gi["profile_id"]]) for g in doc["gpus"] for gi in g["gpu_instances"]
        )

    def host_of(self, node: str) -> int | None:
        """Which host node ``node`` is of."""
        return next((h for h in range(self.hosts) if node in self.testbed.node_names(h)), None)

    def job(self, job_id: int) -> SlurmJob | None:
        """Slurm's record of job ``job_id``."""
        return next((j for j in asyncio.run(self.client().jobs(finished=True)) if j.job_id == job_id), None)

    def wait_state(self, job_id: int, state: str, timeout_s: float = WAIT_S) -> SlurmJob:
        """Until job ``job_id`` is in ``state``."""
        got: SlurmJob = self.wait(
            f"Slurm job {job_id} {state}", lambda: (j := self.job(job_id)) is not None and j.state == state and j,
            timeout_s,
        )  # fmt: skip
        return got

    def sbatch(self, *args: str, script: str) -> int:
        """Submit ``script`` as the tests' job user; its job ID."""
        return self.testbed.sbatch(*args, script=script)

    def hook_job(self, *args: str, log: Path, step_time: float = 0.02) -> int:
        """``examples/hook_minimal.py`` as a Slurm hook job (``--requeue``, comment ``flexmig:hook``), logging to
        ``log``."""
        script = f"#!/bin/sh\nexec {hook_command(log, '--step-time', str(step_time))}\n"
        return self.sbatch("--requeue", "--comment=flexmig:hook", *args, script=script)

    @staticmethod
    def hook_lines(log: Path) -> list[dict[str, Any]]:
        """The JSON lines a hook job wrote."""
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def scontrol(self, *args: str) -> str:
        """``scontrol`` on the cluster; its output (AssertionError on failure)."""
        res = subprocess.run(
            [self.testbed.commands.path("scontrol"), *args], env=self.testbed.env(), capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"scontrol {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}"
        return res.stdout

    def scancel(self, *jobs: int) -> None:
        """Cancel ``jobs`` (as root, as an administrator would)."""
        res = subprocess.run(
            [self.testbed.commands.path("scancel"), *map(str, jobs)], env=self.testbed.env(), capture_output=True,
            text=True, timeout=30, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"scancel: {res.stderr.strip()}"
