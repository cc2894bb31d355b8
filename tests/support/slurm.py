"""A real single-node Slurm (munged, slurmctld, slurmd from the Debian packages) around a simulated MIG node, with
the real actuator and flexmig's Slurm agent on it, for integration tests (not a test module).

:class:`SlurmRig` starts the private testbed (:class:`flexmig.slurm.testbed.Testbed`) under a fresh
world-traversable directory in /tmp (munged runs as user munge and must reach its socket), installs the simulated
node, builds the actuator in mode ``act`` and a :class:`~flexmig.slurm.agent.SlurmAgent`, and registers the node.
Every wait is bounded; leaving the context stops slurmd, slurmctld and munged by their pid files and removes the
directory. :func:`skip_reason` says why these tests cannot run here (no Slurm packages, not root), so that they
skip with that reason; CI installs the packages and runs as root, so there they always run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

from flexmig import sim
from flexmig.act.events import MemorySink
from flexmig.act.journal import StepEvent
from flexmig.act.service import Actuator
from flexmig.errors import SlurmError
from flexmig.jobspec import JobPolicy
from flexmig.mig.nodespec import parse_node_spec
from flexmig.nvml import Nvml, NvmlWorker
from flexmig.plan.types import PlannerSettings
from flexmig.sim import SimProcessTable
from flexmig.slurm.agent import SlurmAgent
from flexmig.slurm.agent_read import SlurmRound
from flexmig.slurm.change import KIND
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.settings import SlurmSettings, slot_node
from flexmig.slurm.sitecheck import version_problem
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.testbed import DEBIAN_PACKAGES, Testbed, free_port, job_python, missing_binaries, stop_pid
from support.processes import stop_process
from support.wait import until

ROOT = Path(__file__).resolve().parents[2]
HOOK_JOB = ROOT / "examples" / "hook_minimal.py"
HOOK_SRC = ROOT / "hook" / "src"
WAIT_S = 60.0
T = TypeVar("T")

def _unit_umask() -> int:
    found = re.search(r"^UMask=([0-7]+)$", (ROOT / "systemd" / "flexmigd.service").read_text(), re.MULTILINE)
    assert found is not None, "systemd/flexmigd.service sets no UMask="
    return int(found[1], 8)


UNIT_UMASK = _unit_umask()
"""The umask flexmigd's shipped unit gives it (0077): every flexmigd the tests start runs under it, so that what
it makes for others (the GRES map the jobs' TaskProlog reads) is made as in production."""

JOB_USERS: list[str] = []
"""The unprivileged users the Slurm tests' jobs run as (made for the run with useradd, removed after:
``tests/slurm/conftest.py``); the first is the rigs' job user, the second another user of the node."""


def job_user() -> str:
    """The user the rigs' jobs run as (AssertionError outside tests/slurm, whose conftest makes the users)."""
    assert JOB_USERS, "the Slurm tests run their jobs as users made for the run: tests/slurm/conftest.py makes them"
    return JOB_USERS[0]


def hook_command(log: Path | str, *args: str) -> str:
    """The command line of ``examples/hook_minimal.py`` as a job of an ordinary user: the system's Python (one under
    /root cannot run as another user) with the hook package's source on its path."""
    return f'env PYTHONPATH={HOOK_SRC} {job_python()} {HOOK_JOB} --log-every 1 --log "{log}" {" ".join(args)}'.rstrip()


def chroot_root() -> Path | None:
    """The chroot of the Slurm under test (``FLEXMIG_SLURM_BIN`` names its wrappers, ``ROOT.bin``), or None: its
    daemons look users up in the chroot's own /etc/passwd."""
    where = slurm_bin()
    if where is None or not where.name.endswith(".bin"):
        return None
    root = where.with_name(where.name.removesuffix(".bin"))
    return root if (root / "etc" / "passwd").is_file() else None


@contextlib.contextmanager
def scratch_users(count: int, prefix: str = "fmj") -> Iterator[list[pwd.struct_passwd]]:
    """``count`` fresh unprivileged users (``useradd --system``, a group of their own, no home, no shell), in the
    chroot of the Slurm under test too (same uid and gid), removed after."""
    chroot = chroot_root()
    made: list[pwd.struct_passwd] = []

    def run(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, timeout=60)

    try:
        for _ in range(count):
            name = f"{prefix}{uuid.uuid4().hex[:8]}"
            run("useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name)
            user = pwd.getpwnam(name)
            made.append(user)
            if chroot is not None:
                run("groupadd", "--root", str(chroot), "--gid", str(user.pw_gid), name)
                run("useradd", "--root", str(chroot), "--uid", str(user.pw_uid), "--gid", str(user.pw_gid),
                    "--no-create-home", "--shell", "/usr/sbin/nologin", name)  # fmt: skip
        yield made
    finally:
        for user in made:
            subprocess.run(["userdel", user.pw_name], check=False, capture_output=True, timeout=60)
            if chroot is not None:
                subprocess.run(["userdel", "--root", str(chroot), user.pw_name], check=False, capture_output=True,
                               timeout=60)  # fmt: skip


def slurm_bin() -> Path | None:
    """Where the tests take Slurm's daemons and commands from: ``FLEXMIG_SLURM_BIN`` (another Slurm than the
    distribution's, e.g. tests/support/slurm_chroot.sh's), else None (``PATH``)."""
    where = os.environ.get("FLEXMIG_SLURM_BIN")
    return Path(where) if where else None


def commands() -> SlurmCommands:
    """The Slurm commands the tests use (see :func:`slurm_bin`)."""
    return SlurmCommands(slurm_bin())


def slurm_version() -> str:
    """The version of the Slurm the tests use (``slurmd -V``: ``slurm-wlm 22.05.8``; the commands need a
    slurm.conf even for ``--version``), '' when it cannot run."""
    try:
        res = subprocess.run([commands().path("slurmd"), "-V"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired, SlurmError):  # no Slurm: the tests skip for skip_reason's reason
        return ""
    return res.stdout.strip()


def per_gpu_capable() -> bool:
    """True when the tests' Slurm runs one dynamic node per GPU (23.11 and later: ``make slurm-newer``)."""
    return version_problem(slurm_version()) is None


def skip_reason() -> str | None:
    """Why real-Slurm tests cannot run on this machine, or None."""
    missing = missing_binaries(commands())
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install {DEBIAN_PACKAGES})"
    if os.geteuid() != 0:
        return "the Slurm testbed runs slurmctld and slurmd as root"
    return None


class SlurmRig:
    """``async with SlurmRig("h200:7g.141gb@0") as rig:`` a registered Slurm node on a simulated MIG node."""

    def __init__(
        self,
        spec: str = "h200:7g.141gb@0",
        *,
        settings: dict[str, Any] | None = None,
        planner: PlannerSettings | None = None,
        register: bool = True,
        on_step: Callable[[StepEvent], None] | None = None,
    ) -> None:
        self.spec = spec
        node_spec = parse_node_spec(spec)
        self.base = Path(tempfile.mkdtemp(prefix="fm-slurm-", dir="/tmp"))
        self.base.chmod(0o755)
        self.testbed = Testbed(
            self.base, node_spec.model, node_spec.count, node="fm-node", commands=commands(), job_user=job_user()
        )
        self.jobs = self.testbed.paths.jobs
        """Where the jobs (their users') write: the testbed's sticky job directory."""
        self.paths = self.testbed.paths
        self.events = MemorySink()
        self.slurm_events: list[tuple[str, dict[str, Any]]] = []
        self.overrides = settings or {}
        self.planner = planner or PlannerSettings(checkpoint_s=1.0, restart_s=1.0)
        self.register_at_start = register
        self.on_step = on_step
        self.node = self.testbed.node
        self._act: Actuator | None = None
        self._offload: NvmlWorker | None = None
        self._nvml: Nvml | None = None

    def settings(self) -> SlurmSettings:
        """The agent's settings: everything under the testbed's directory."""
        p = self.paths
        values: dict[str, Any] = {
            "node": self.node,
            "interval_s": 1.0,
            "conf": p.slurm_conf,
            "bin_dir": slurm_bin(),
            "command_timeout_s": 20.0,
            "gres_conf": p.gres_conf,
            "gres_map": self.testbed.map_path,
            "dev_dir": p.dev,
            "mig_minors": p.mig_minors,
            "slurmd_pid_file": p.slurmd_pid(self.node),
            "slurmd_conf": ("NodeAddr=127.0.0.1", f"CPUs={self.testbed.cpus}"),
            "slurmd_control": "hook",
            "slurmd_hook": tuple(self.testbed.slurmd_hook()),
            "slurmd_env": p.flexmig / "slurmd.env",
            "checkpoint_dir": str(p.checkpoints / "{user}" / "{job_id}"),
            "ack_timeout_s": 30.0,
            "drain_timeout_s": 120.0,
            "register_timeout_s": 30.0,
            "reregister_s": 2.0,
            "min_interval_s": 0.0,
            "hook_settle_s": 0.0,
        }
        values.update(self.overrides)
        return SlurmSettings(**values)

    async def __aenter__(self) -> SlurmRig:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _start(self) -> None:
        tb = self.testbed
        tb.prepare()
        await asyncio.to_thread(tb.start)
        await self.open_flexmig()
        if self.register_at_start:
            res = await self.agent.register("first registration")
            assert res.ok, res.to_json()

    async def open_flexmig(self) -> dict[str, Any]:
        """Build the simulated node (from its state file if there is one), the actuator and the agent, and
        reconcile the journal (what a flexmigd start does); returns the reconciliation summary."""
        self.sim_node = sim.install(self.spec, state_path=self.base / "sim.json")
        self._nvml = Nvml.open()
        self._offload = NvmlWorker()
        self._act = Actuator.build(
            mode="act",
            nvml=self._nvml,
            offload=self._offload.call,
            devices=SimProcessTable(self.sim_node),
            journal_path=self.paths.flexmig / "journal.sqlite3",
            logs_dir=self.paths.flexmig / "logs",
            policy=JobPolicy((self.base,)),
            events=self.events,
            poll_s=0.01,
            on_step=self.on_step,
            runners={KIND: lambda run: self.agent.change.run(run, run.row.payload)},  # as flexmigd's, for one node
        )
        self.agent = SlurmAgent(
            self.settings(),
            self.node,
            executor=self.act.executor,
            planner=self.planner,
            simulated=True,
            on_event=lambda kind, detail: self.slurm_events.append((kind, detail)),
        )
        return await self.act.start()

    async def close_flexmig(self) -> None:
        """Close the actuator and take the simulated node away (a crash leaves the same: journal and state file)."""
        if self._act is not None:
            with contextlib.suppress(Exception):
                await self._act.close()
            self._act = None
        if self._offload is not None:
            self._offload.shutdown()
            self._offload = None
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.close()
            self._nvml = None
        sim.uninstall()

    @property
    def act(self) -> Actuator:
        """The actuator (while flexmig is open)."""
        assert self._act is not None, "flexmig is closed"
        return self._act

    @property
    def nvml(self) -> Nvml:
        """The NVML session (while flexmig is open)."""
        assert self._nvml is not None, "flexmig is closed"
        return self._nvml

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.testbed.stop)  # cancels the jobs, stops the daemons, kills what is left
        await self.close_flexmig()
        if not os.environ.get("FLEXMIG_KEEP_TESTBED"):
            shutil.rmtree(self.base, ignore_errors=True)

    def ctld_alive(self) -> bool:
        """True while the testbed's slurmctld runs."""
        try:
            pid = int((self.paths.run / "slurmctld.pid").read_text())
        except (OSError, ValueError):
            return False
        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE

    # ------------------------------------------------------------------------------------------ helpers
    def run(self, *argv: str) -> str:
        """A Slurm command against the testbed; its output (AssertionError with its error on failure)."""
        res = subprocess.run(
            [self.testbed.commands.path(argv[0]), *argv[1:]],
            env=self.testbed.env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"{' '.join(argv)}: {res.stderr.strip() or res.stdout.strip()}"
        return res.stdout

    def sbatch(self, *args: str, script: str) -> int:
        """Submit a batch script; its job ID."""
        return self.testbed.sbatch(*args, script=script)

    def sleeper(self, *args: str, seconds: float = 600, trap: bool = True) -> int:
        """A job that sleeps (in slices, so a signal is seen) and notes any USR1 it gets in ``signalled-J``."""
        trap_line = f"trap 'echo USR1 >> {self.jobs}/signalled-$SLURM_JOB_ID' USR1\n" if trap else ""
        script = (
            "#!/bin/sh\n"
            f"{trap_line}"
            f'echo "$CUDA_VISIBLE_DEVICES" > {self.jobs}/visible-$SLURM_JOB_ID\n'
            f"end=$(( $(date +%s) + {int(seconds)} ))\n"
            'while [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done\n'
        )
        return self.sbatch(*args, script=script)

    def hook_job(self, *args: str, steps: int = 1_000_000, step_time: float = 0.02) -> int:
        """``examples/hook_minimal.py`` as a Slurm hook job (``--requeue``, comment ``flexmig:hook``)."""
        log = self.jobs / "hooklog-$SLURM_JOB_ID.jsonl"
        script = f"#!/bin/sh\nexec {hook_command(log, '--steps', str(steps), '--step-time', str(step_time))}\n"
        return self.sbatch("--requeue", "--comment=flexmig:hook", *args, script=script)

    def hook_log(self, job: int) -> list[dict[str, Any]]:
        """The JSON lines ``hook_minimal.py`` wrote for Slurm job ``job``."""
        path = self.jobs / f"hooklog-{job}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    async def job(self, job_id: int) -> SlurmJob | None:
        """Slurm's record of job ``job_id``."""
        return next((j for j in await self.agent.client.jobs(finished=True) if j.job_id == job_id), None)

    async def next_backfill_cycle(self, timeout_s: float = WAIT_S) -> None:
        """Until Slurm's backfill scheduler has begun a new cycle (``bf_interval=1`` on the testbed): between two
        rounds that must change nothing, Slurm had its chance to start the waiting jobs."""
        client = self.agent.client
        before = await client.backfill_cycle_start()

        async def probe() -> bool:
            now = await client.backfill_cycle_start()
            return now is not None and (before is None or now > before)

        await until(probe, timeout_s=timeout_s, what="a new backfill cycle", every_s=0.2)

    async def wait_state(self, job_id: int, state: str, timeout_s: float = WAIT_S) -> SlurmJob:
        """Until job ``job_id`` is in ``state``."""

        seen: list[str] = []

        async def probe() -> SlurmJob | None:
            j = await self.job(job_id)
            seen[:] = [f"{j.state} ({j.reason}, restarts {j.restart_count})" if j else "unknown"]
            return j if j is not None and j.state == state else None

        try:
            job: SlurmJob = await until(probe, timeout_s, f"Slurm job {job_id} {state}", not_yet=(Exception,))
            return job
        except AssertionError as exc:
            out = self.paths.jobs / f"job-{job_id}.out"
            tail = out.read_text(errors="replace")[-2000:] if out.exists() else "(no output)"
            raise AssertionError(f"{exc}; it is {seen[0] if seen else '?'}; its output: {tail}") from None

    async def change(self, timeout_s: float = WAIT_S) -> SlurmRound:
        """Rounds in mode act (every 0.3 s) until one carried out a re-registration; that round. A busy node's
        change waits until the waiting demand has paid for closing it (rent or buy), so this may take rounds."""
        seen: list[str] = []

        async def probe() -> SlurmRound | None:
            rnd = await self.agent.round("act")
            seen[:] = [rnd.note or (rnd.verdict.reason if rnd.verdict else "")]
            return rnd if rnd.result is not None else None

        try:
            rnd: SlurmRound = await until(probe, timeout_s, "a re-registration", not_yet=(Exception,))
            return rnd
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last round: {seen[0] if seen else '?'}") from None

    async def started(self, job_id: int, timeout_s: float = WAIT_S) -> None:
        """Until a sleeper job's script runs (it wrote what it sees): Slurm says RUNNING as soon as it started the
        job, while slurmd may still be running the Prolog before the script starts."""
        await until((self.jobs / f"visible-{job_id}").exists, timeout_s, f"job {job_id}'s script started")

    def visible(self, job_id: int) -> str:
        """The ``CUDA_VISIBLE_DEVICES`` a sleeper job saw."""
        path = self.jobs / f"visible-{job_id}"
        return path.read_text().strip() if path.exists() else ""

    @property
    def node_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The agent's ``slurm_node`` events so far, as ``(what, detail)``."""
        return [(k.split(":", 1)[1], d) for k, d in self.slurm_events if k.startswith("slurm_node:")]

    def signals(self, job_id: int) -> int:
        """How many USR1 a sleeper job got."""
        path = self.jobs / f"signalled-{job_id}"
        return len(path.read_text().split()) if path.exists() else 0

    def signalled(self, job_id: int) -> bool:
        """True if a sleeper job ever got USR1."""
        return (self.jobs / f"signalled-{job_id}").exists()


class SlurmDaemon:
    """``with SlurmDaemon("h200:7g.141gb@0") as d:`` the testbed's Slurm with flexmigd (mode act, ``[slurm]`` on)
    as a subprocess on the simulated node, registered; ``mqtt_port`` adds MQTT events to that broker."""

    def __init__(
        self,
        spec: str,
        *,
        mqtt_port: int | None = None,
        node: str = "fm-node",
        interval_s: float | None = 1.0,
        slurm_keys: str = "",
        node_per_gpu: bool = False,
        node_per_instance: bool = False,
        static_nodes: bool = False,
        wait_registered: bool = True,
        start: bool = True,
        scheduler_parameters: str | None = None,
        default_layout: bool = False,
    ) -> None:
        node_spec = parse_node_spec(spec)
        self.spec = spec
        self.base = Path(tempfile.mkdtemp(prefix="fm-slurmd-", dir="/tmp"))
        self.base.chmod(0o755)
        self.testbed = Testbed(
            self.base,
            node_spec.model,
            node_spec.count,
            node=node,
            commands=commands(),
            node_per_gpu=node_per_gpu,
            node_per_instance=node_per_instance,
            static_nodes=static_nodes,
            job_user=job_user(),
            scheduler_parameters=Testbed.scheduler_parameters if scheduler_parameters is None else scheduler_parameters,
        )
        self.node_per_instance = node_per_instance
        self.static_nodes = static_nodes
        self.default_layout = default_layout
        """flexmigd's configuration names no mode (``[slurm] layout``'s default, ``auto``, chooses): the testbed's
        switches (``node_per_instance``, ``instance_nodes``) are left out, what the testbed writes for Slurm stays."""
        self.gpus = node_spec.count
        self.node_per_gpu = node_per_gpu
        self.wait_registered = wait_registered
        self.start_at_enter = start
        self.paths = self.testbed.paths
        self.node = node
        self.mqtt_port = mqtt_port
        self.interval_s = interval_s
        self.slurm_keys = slurm_keys
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SlurmDaemon:
        if self.start_at_enter:
            self.start()
        return self

    def start(self) -> None:
        """Prepare the testbed, start munged and slurmctld, then flexmigd (everything stopped again on failure)."""
        try:
            self.testbed.prepare()
            self.testbed.start()
            self.start_flexmigd()
        except BaseException:
            self.__exit__()
            raise

    def start_flexmigd(self) -> None:
        """Write flexmigd's configuration and start it; wait until the node is registered (bounded)."""
        text = self.testbed.flexmigd_config(metrics_port=self.metrics_port, interval_s=self.interval_s)
        if self.default_layout:  # the testbed names its layout (layout = "node" for the whole-node mode): drop it
            dropped = ("node_per_instance = ", "instance_nodes = ", "node_per_gpu = ", "layout = ")
            text = "\n".join(line for line in text.split("\n") if not line.startswith(dropped))
        text += self.slurm_keys  # more keys of the [slurm] table, the configuration's last
        if self.mqtt_port is not None:
            text += (
                f'[mqtt]\nenabled = true\nbroker = "127.0.0.1:{self.mqtt_port}"\n'
                f'outbox = "{self.paths.flexmig / "outbox.sqlite3"}"\n'
            )
        conf = self.paths.flexmig / "flexmigd.toml"
        conf.write_text(text)
        conf.chmod(0o600)
        argv = [
            sys.executable, "-m", "flexmig.daemon", "--sim", self.spec,
            "--sim-state", str(self.paths.flexmig / "sim.json"), "--config", str(conf),
        ]  # fmt: skip
        with (self.paths.log / "flexmigd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.testbed.env(), umask=UNIT_UMASK
            )
        if not self.wait_registered:
            return
        names = [f"{self.node}-gpu{k}" for k in range(self.gpus)] if self.node_per_gpu else [self.node]
        if self.node_per_instance:  # one node per instance the spec starts with
            names = [f"{self.node}-gpu{k}-{inst.start}" for k in range(self.gpus) for inst in self.first_layout()]
            if self.static_nodes:
                names = [
                    slot_node(self.node, k, inst.start, inst.profile.name)
                    for k in range(self.gpus) for inst in self.first_layout()
                ]  # fmt: skip
        for name in names:
            self.wait(f"node {name} registered", functools.partial(self.responding, name))

    def first_layout(self) -> tuple[Any, ...]:
        """The instances each GPU starts with (the spec's layout)."""
        layout = parse_node_spec(self.spec).layout
        return tuple(layout) if layout is not None else ()

    def responding(self, name: str) -> bool:
        """True when Slurm lists node ``name``, responding."""
        node = self.slurm_node(name)
        return node is not None and bool(node.responding)

    def stop_flexmigd(self) -> int | None:
        """SIGTERM flexmigd and wait (bounded); its exit status."""
        proc, self.proc = self.proc, None
        return stop_process(proc, WAIT_S)

    def __exit__(self, *exc: object) -> None:
        self.stop_flexmigd()
        self.testbed.stop()
        if not os.environ.get("FLEXMIG_KEEP_TESTBED"):
            shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ helpers
    def wait(self, what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
        """``probe()`` until truthy; AssertionError with flexmigd's last log lines after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"flexmigd exited {self.proc.returncode} waiting for {what}: {self.log()[-3000:]}")
            with contextlib.suppress(Exception):
                got = probe()
                if got:
                    return got
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout_s:g} s; flexmigd's log ends: {self.log()[-3000:]}")

    def submit_together(self, n: int, *args: str, script: str) -> list[int]:
        """Submit ``n`` jobs held, then release them in one command: they pend together, as a burst of submissions
        would (one round of flexmig sees them all)."""
        jobs = [self.testbed.sbatch("--hold", *args, script=script) for _ in range(n)]
        subprocess.run(
            [self.testbed.commands.path("scontrol"), "release", ",".join(str(j) for j in jobs)],
            env=self.testbed.env(), check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        return jobs

    def client(self) -> SlurmClient:
        """A Slurm client on this testbed."""
        return SlurmClient(self.testbed.slurm_commands())

    def slurm_node(self, name: str | None = None) -> Any:
        """Slurm's record of the node (or of node ``name``; None when not registered)."""
        return asyncio.run(self.client().node(name or self.node))

    def job(self, job_id: int) -> SlurmJob | None:
        """Slurm's record of job ``job_id``."""
        return next((j for j in asyncio.run(self.client().jobs(finished=True)) if j.job_id == job_id), None)

    def slurmd_pid(self, node: str) -> int | None:
        """The pid of node ``node``'s slurmd (from its pid file; None when there is none)."""
        path = self.paths.slurmd_pid(node)
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text.isdigit() else None

    def rpc_count(self, rpc: str) -> int:
        """How many times slurmctld answered ``rpc`` (sdiag's count; ``REQUEST_JOB_INFO``: squeue, which a
        flexmig round asks once)."""
        res = subprocess.run(
            [self.testbed.commands.path("sdiag")], env=self.testbed.env(), capture_output=True, text=True, timeout=30,
            check=True,
        )  # fmt: skip
        m = re.search(rf"\b{rpc}\s*\(\s*\d+\)\s*count:(\d+)", res.stdout)
        return int(m.group(1)) if m else 0

    def job_reads(self) -> int:
        """How many times slurmctld was asked for its jobs (squeue): a flexmig round reads the queue once, shared by
        all its GPU or instance nodes, so this counts rounds."""
        return self.rpc_count("REQUEST_JOB_INFO")

    def submit_while_watching(self, watched: str, *args: str, script: str, what: str) -> tuple[int, list[str], float]:
        """Submit ``script`` with ``args`` and wait (90 s at most) until it runs, looking at node ``watched`` at every
        poll: the job, the states the node was seen in (``absent``, ``mixed``, ``idle+drain``...) and the seconds
        from submission to running."""
        seen: list[str] = []
        job_id = 0

        def started() -> bool:
            node = self.slurm_node(watched)
            seen.append("absent" if node is None else f"{node.state}{'+drain' if node.drained else ''}")
            job = self.job(job_id)
            return job is not None and job.state == "RUNNING"

        submitted = time.monotonic()
        job_id = self.testbed.sbatch(*args, script=script)
        self.wait(f"job {job_id} running on {what}", started, timeout_s=90)
        return job_id, seen, time.monotonic() - submitted

    def wait_state(self, job_id: int, state: str, timeout_s: float = WAIT_S) -> SlurmJob:
        """Until job ``job_id`` is in ``state``."""
        got: SlurmJob = self.wait(
            f"Slurm job {job_id} {state}",
            lambda: (j := self.job(job_id)) is not None and j.state == state and j,
            timeout_s,
        )
        return got

    def log(self) -> str:
        """flexmigd's log so far."""
        path = self.paths.log / "flexmigd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def metrics(self) -> str:
        """flexmigd's exposition."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def output(self, job_id: int) -> str:
        """A job's output file."""
        path = self.paths.jobs / f"job-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_ctld(self) -> None:
        """Stop slurmctld (as a crash or an administrator would)."""
        pid = int((self.paths.run / "slurmctld.pid").read_text())
        stop_pid(pid)

    def start_ctld(self) -> None:
        """Start slurmctld again (it recovers its state) and wait until it answers."""
        subprocess.run(
            [self.testbed.commands.path("slurmctld"), "-i"],
            env=self.testbed.env(),
            check=True,
            timeout=30,
            capture_output=True,
        )
        self.testbed.wait_ctld()
