"""``flexmig sim``: the simulated node for whole processes: every tool started under it sees the node a daemon runs.

A daemon on a simulated node keeps the node in a state file (``flexmigd --sim SPEC --sim-state FILE``; ``flexmig
demo`` prints its own). With that file:

* ``flexmig sim exec -- CMD [ARG...]`` runs CMD with ``FLEXMIG_SIM_STATE=FILE``: every Python program under it that
  uses NVML through pynvml (nvitop, gpustat, dask, a training script, their children) sees the daemon's GPUs, MIG
  devices and processes, live, and ``nvidia-smi`` on its PATH is the simulator's look-alike;
* ``flexmig sim shell`` starts your shell that way (``exit`` leaves it);
* ``flexmig sim nvidia-smi [ARGS]`` is the look-alike itself (``-L``, ``--query-gpu=... --format=csv``, ``mig -lgip``,
  ``mig -lgi``, ``mig -lci``, the summary table): the simulator's, not NVIDIA's tool.

The file is ``--state FILE`` (before the action), else ``$FLEXMIG_SIM_STATE``. ``exec`` and ``shell`` refuse to run
on a machine with a real NVIDIA driver (they would put a look-alike ``nvidia-smi`` before the real one) unless
``FLEXMIG_SIM_ON_REAL_GPU=1``. The view is read-only: calls that would change the node answer NO_PERMISSION.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import flexmig
from flexmig.errors import ConfigError, FlexmigError
from flexmig.sim import follow as following
from flexmig.sim import smi
from flexmig.simenv import ENV, ON_REAL_GPU_ENV, REAL_DRIVER, SHIM, real_driver

__all__ = ["register", "sim_environment"]


def register(sub: Any) -> None:
    """Add the ``sim`` subcommand and its actions."""
    p: argparse.ArgumentParser = sub.add_parser(
        "sim", help="run tools on a simulated node: exec, shell, the simulator's nvidia-smi", description=__doc__
    )
    p.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the simulated node's state file (default ${ENV})",
    )
    acts = p.add_subparsers(dest="sim_command", metavar="ACTION", required=True)
    e = acts.add_parser("exec", help="run a command whose NVML programs and nvidia-smi see the simulated node")
    e.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]", help="the command to run")
    e.set_defaults(func=_exec)
    s = acts.add_parser("shell", help="start your shell ($SHELL) on the simulated node; exit leaves it")
    s.set_defaults(func=_shell)
    n = acts.add_parser(
        "nvidia-smi",
        help="the simulator's nvidia-smi look-alike (-L, --query-gpu, mig -lgip/-lgi/-lci, the summary table)",
        add_help=False,
        prefix_chars="+",  # every argument, dashes included, is the look-alike's
    )
    n.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="what nvidia-smi takes (-h lists it)")
    n.set_defaults(func=_nvidia_smi)


def _state(args: argparse.Namespace) -> Path:
    given = args.state if args.state is not None else os.environ.get(ENV)
    if not given:
        raise ConfigError(f"no simulated node: give flexmig sim --state FILE, or set {ENV}")
    path = Path(given).absolute()
    following.read_state_file(path)  # a missing or unreadable file is an error now, not in every tool
    return path


@contextlib.contextmanager
def sim_environment(state: Path) -> Iterator[dict[str, str]]:
    """The environment of a process on the simulated node ``state``: ``FLEXMIG_SIM_STATE``, the look-alike
    ``nvidia-smi`` first on PATH, and a ``sitecustomize`` first on PYTHONPATH for interpreters of other environments
    (removed again when the context ends)."""
    tmp = Path(tempfile.mkdtemp(prefix="flexmig-sim-exec-"))
    try:
        bin_dir, py_dir = tmp / "bin", tmp / "python"
        bin_dir.mkdir()
        py_dir.mkdir()
        smi_path = bin_dir / "nvidia-smi"
        smi_path.write_text(
            "#!/bin/sh\n# flexmig's simulated nvidia-smi (flexmig sim exec), not NVIDIA's tool\n"
            f'exec {shlex.quote(sys.executable)} -m flexmig.cli.sim_cmd nvidia-smi "$@"\n'
        )
        smi_path.chmod(0o755)
        # Where the hook's distribution is installed (found, not imported: the daemon imports it as flexmig.hook).
        # None: a namespace package.
        hook_spec = importlib.util.find_spec("flexmig_hook")
        files = [f for f in (flexmig.__file__, hook_spec.origin if hook_spec else None) if f is not None]
        roots = list(dict.fromkeys(str(Path(f).resolve().parents[1]) for f in files))
        (py_dir / "sitecustomize.py").write_text(SHIM.format(roots=roots))
        env = dict(os.environ)
        env[ENV] = str(state)
        env["PATH"] = os.pathsep.join(p for p in (str(bin_dir), env.get("PATH", "")) if p)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(py_dir), env.get("PYTHONPATH", "")) if p)
        yield env
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _refuse_on_real_driver() -> None:
    if real_driver():
        raise ConfigError(
            f"this machine has an NVIDIA driver ({REAL_DRIVER}): flexmig sim would hide its GPUs and its nvidia-smi "
            f"behind the simulated node's; set {ON_REAL_GPU_ENV}=1 to do it anyway"
        )


def _run(command: Sequence[str], env: dict[str, str]) -> int:
    """Run ``command`` in the foreground; Ctrl-C is the command's to handle, and this waits for it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(list(command), env=env)
        status = proc.wait()
    except FileNotFoundError:
        raise FlexmigError(f"{command[0]}: command not found") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    return 128 - status if status < 0 else status


def _exec(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError("flexmig sim exec: give the command to run, e.g. flexmig sim exec -- nvitop")
    state = _state(args)
    _refuse_on_real_driver()
    with sim_environment(state) as env:
        return _run(command, env)


def _shell(args: argparse.Namespace) -> int:
    state = _state(args)
    _refuse_on_real_driver()
    shell = os.environ.get("SHELL") or "/bin/sh"
    print(
        f"flexmig sim shell: NVML programs and nvidia-smi in this shell see the simulated node of {state}; "
        "exit to leave",
        file=sys.stderr,
    )
    with sim_environment(state) as env:
        return _run([shell, "-i"], env)


def _nvidia_smi(args: argparse.Namespace) -> int:
    try:
        state = _state(args)
        following.follow(state)
    except FlexmigError as exc:
        print(f"flexmig sim nvidia-smi: {exc}", file=sys.stderr)
        return 9
    return smi.main(args.args, sys.stdout, sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flexmig.cli.sim_cmd nvidia-smi ARGS``: the look-alike without the rest of the CLI (what the
    ``nvidia-smi`` that ``flexmig sim exec`` puts on PATH runs)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["nvidia-smi"]:
        print("usage: python -m flexmig.cli.sim_cmd nvidia-smi [ARGS]", file=sys.stderr)
        return 2
    return _nvidia_smi(argparse.Namespace(state=None, args=args[1:]))


if __name__ == "__main__":
    sys.exit(main())
