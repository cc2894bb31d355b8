"""``flexmig slurm testbed``: a private Slurm cluster on one machine (:class:`flexmig.slurm.testbed.Testbed`), one
flexmigd in mode act on each simulated host, until SIGINT or SIGTERM.

The layout is the best the Slurm on ``PATH`` (or in ``FLEXMIG_SLURM_BIN``, another Slurm's commands, as the tests'
24.11 chroot has them) can run, said in one line at start (:func:`flexmig.slurm.testbed_layout.choose_layout`). A
host's flexmigd that exits is reported and the other hosts go on; the testbed stops when none is left. Stopping
cancels the testbed's jobs and stops every flexmigd, slurmd, slurmctld and munged it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from flexmig.errors import FlexmigError, SlurmError
from flexmig.mig.nodespec import parse_node_spec
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.testbed import Testbed, free_port
from flexmig.slurm.testbed_layout import choose_layout
from flexmig.slurm.testbed_proc import slurmd_version

__all__ = ["run_testbed", "seed_sim_state"]

_REGISTER_WAIT_S = 60.0
SLURM_BIN_ENV = "FLEXMIG_SLURM_BIN"
"""Where another Slurm's daemons and commands are (a directory), instead of ``PATH``."""


def run_testbed(args: argparse.Namespace) -> int:
    """Run the testbed until SIGINT or SIGTERM (see the module docstring)."""
    spec = parse_node_spec(args.sim)
    where = os.environ.get(SLURM_BIN_ENV)
    commands = SlurmCommands(Path(where) if where else None)
    layout = choose_layout(args.layout, slurmd_version(commands), args.hosts)
    tb = Testbed(
        args.dir.absolute(), spec.model, spec.count, node=args.node, cpus=args.cpus, commands=commands,
        hosts=args.hosts, node_per_gpu=layout.node_per_gpu, node_per_instance=layout.node_per_instance,
        static_nodes=layout.static_nodes,
    )  # fmt: skip
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        _say(layout.line)
        _say(f"preparing {tb.root} (munge key, slurm.conf, stand-in devices of {args.hosts} x {args.sim})")
        tb.prepare()
        tb.start()
        _say(f"slurmctld up on 127.0.0.1:{tb.ctld_port}; starting {args.hosts} flexmigd (mode act) on {args.sim}")
        for host in range(tb.hosts):
            daemons.append(_start_flexmigd(tb, args, host))
        registered = _wait_registered(tb, daemons, _expected_nodes(tb, args.sim), stop)
        if not stop.is_set():  # a signal while starting: straight to stopping
            _ready(tb, args, registered)
            _watch(tb, daemons, stop)
    finally:
        _say("stopping flexmigd, slurmd, slurmctld, munged")
        _stop_all(daemons)
        tb.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say("stopped")
    return 0


def _say(text: str) -> None:
    print(f"flexmig slurm testbed: {text}", file=sys.stderr, flush=True)


def _ready(tb: Testbed, args: argparse.Namespace, registered: int) -> None:
    """The export line, and how to use the testbed."""
    conf = tb.paths.slurm_conf
    print(f"export SLURM_CONF={conf}", flush=True)
    hosts = ", ".join(tb.host_node(h) for h in range(tb.hosts))
    _say(f"ready: {tb.hosts} host(s) ({hosts}), {registered} node(s) registered. In another shell:")
    _say(f"  export SLURM_CONF={conf}")
    _say("  sbatch --gres=gpu:1g.18gb:1 --wrap 'echo $CUDA_VISIBLE_DEVICES; sleep 60'; squeue; sinfo -N")
    state = tb.host_paths(0).flexmig / "sim.json"
    _say(f"  flexmig inventory --sim {args.sim} --sim-state {state}")
    _say(f"logs in {tb.paths.log} ({', '.join(_log(tb, h).name for h in range(tb.hosts))}, slurmctld.log, "
         f"slurmd-<node>.log); checkpoints in {tb.paths.checkpoints}; Ctrl-C stops everything")  # fmt: skip


def _log(tb: Testbed, host: int) -> Path:
    """Host ``host``'s flexmigd log."""
    return tb.paths.log / ("flexmigd.log" if tb.hosts == 1 else f"flexmigd-h{host + 1}.log")


def _start_flexmigd(tb: Testbed, args: argparse.Namespace, host: int) -> subprocess.Popen[bytes]:
    """Host ``host``'s flexmigd: its configuration written (mode 0600), started with its simulated GPUs."""
    f = tb.host_paths(host).flexmig
    if host > 0:
        seed_sim_state(args.sim, f / "sim.json", host)
    conf = f / "flexmigd.toml"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(tb.flexmigd_config(metrics_port=free_port(), host=host))
    argv = [
        sys.executable, "-m", "flexmig.daemon", "--sim", args.sim, "--sim-state", str(f / "sim.json"),
        "--config", str(conf), "--log-level", args.log_level,
    ]  # fmt: skip
    log = _log(tb, host).open("ab")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=tb.env(host))
    finally:
        log.close()


def seed_sim_state(spec: str, path: Path, seed: int) -> None:
    """Make host ``seed``'s simulated node state at ``path`` unless there is one: the simulator derives its UUIDs from
    the spec and a seed, and every host of a cluster has GPUs and MIG devices of its own UUIDs (made in a process of
    its own: installing the simulator replaces this process's NVML)."""
    if path.exists():
        return
    code = "import sys; from pathlib import Path; from flexmig import sim; "
    code += "sim.install(sys.argv[1], state_path=Path(sys.argv[2]), seed=int(sys.argv[3]))"
    res = subprocess.run(
        [sys.executable, "-c", code, spec, str(path), str(seed)], capture_output=True, text=True, timeout=60,
        check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if res.returncode != 0:
        raise SlurmError(f"simulated host {seed + 1} ({spec}): {(res.stderr or res.stdout).strip()[-300:]}")


def _expected_nodes(tb: Testbed, sim: str) -> int:
    """How many nodes each host registers at start: one per instance of SPEC's layout, per GPU, or the host's."""
    if tb.node_per_instance:
        layout = parse_node_spec(sim).layout
        return len(layout or ()) * tb.gpus
    return tb.gpus if tb.node_per_gpu else 1


def _wait_registered(
    tb: Testbed, daemons: Sequence[subprocess.Popen[bytes]], expected: int, stop: threading.Event
) -> int:
    """Until every host has ``expected`` nodes registered and responding (bounded); how many there are."""
    client = SlurmClient(tb.slurm_commands())
    deadline = time.monotonic() + _REGISTER_WAIT_S
    mine = [set(tb.node_names(h)) for h in range(tb.hosts)]
    counts = [0] * tb.hosts
    while time.monotonic() < deadline and not stop.is_set():
        for host, daemon in enumerate(daemons):
            if daemon.poll() is not None:
                raise SlurmError(
                    f"host {tb.host_node(host)}: flexmigd exited with status {daemon.returncode}; see {_log(tb, host)}"
                )
        with contextlib.suppress(FlexmigError):
            up = {n.name for n in asyncio.run(client.nodes()) if n.responding}
            counts = [len(up & names) for names in mine]
            if all(c >= expected for c in counts):
                return sum(counts)
        time.sleep(0.3)
    if stop.is_set():
        return sum(counts)
    late = [tb.host_node(h) for h, c in enumerate(counts) if c < expected]
    raise SlurmError(f"host(s) {', '.join(late)} did not register within {_REGISTER_WAIT_S:g} s; see {tb.paths.log}")


def _watch(tb: Testbed, daemons: Sequence[subprocess.Popen[bytes]], stop: threading.Event) -> None:
    """Until ``stop``: a host's flexmigd that exits is reported once, the others go on; SlurmError when none is
    left."""
    reported: set[int] = set()
    while not stop.wait(0.5):
        for host, daemon in enumerate(daemons):
            if daemon.poll() is not None and host not in reported:
                reported.add(host)
                _say(
                    f"host {tb.host_node(host)}: flexmigd exited with status {daemon.returncode} (its nodes' jobs "
                    f"run on; see {_log(tb, host)})"
                )
        if len(reported) == len(daemons):
            raise SlurmError(f"every flexmigd exited; see {tb.paths.log}")


def _stop_all(daemons: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every flexmigd at once, then wait for each (bounded), SIGKILL what is left."""
    for daemon in daemons:
        if daemon.poll() is None:
            daemon.terminate()
    deadline = time.monotonic() + 60
    for daemon in daemons:
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(max(0.1, deadline - time.monotonic()))
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
