"""A stand-in for slurmd's systemd unit where systemd is not PID 1 (the testbed, containers): the hook command
``python -m flexmig.slurm.standin --pid-file P start|stop|restart``.

flexmigd asks it to restart slurmd exactly as it asks systemd (:class:`flexmig.slurm.slurmd.HookSlurmd`), so the
testbed exercises the production path: flexmig writes the environment file (``FLEXMIG_SLURMD_ENV``), the stand-in
runs ``slurmd -Z -N $FLEXMIG_SLURMD_NODE --conf "$FLEXMIG_SLURMD_CONF"`` from it (``slurmd -N
$FLEXMIG_SLURMD_NODE`` for a static node of slurm.conf, ``FLEXMIG_SLURMD_MODE=static``; slurmd daemonizes and writes
its pid file), and stops it by that pid file (SIGTERM, SIGKILL after 20 s). Like Debian's unit it does not restart a
crashed slurmd by itself: flexmig does. Exit status 0 on success, 1 with one line on standard output otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flexmig.slurm.slurmd import ENV_CONF, ENV_MODE, ENV_NODE, read_env_file

_STOP_S = 20.0
_START_S = 20.0


def _pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        return state != b"Z" and Path(f"/proc/{pid}/comm").read_bytes().strip().startswith(b"slurmd")
    except (OSError, IndexError):
        return False


def stop(pid_file: Path) -> None:
    """SIGTERM the slurmd of ``pid_file``, SIGKILL after a while; returns once it is gone."""
    pid = _pid(pid_file)
    if pid is None or not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_S
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def start(slurmd: str, pid_file: Path, env_file: Path) -> None:
    """Run slurmd as the environment file says; returns once it wrote its pid file (RuntimeError if not)."""
    values = read_env_file(env_file.read_text()[:65536])
    node, conf = values.get(ENV_NODE), values.get(ENV_CONF)
    if not node or not conf:
        raise RuntimeError(f"{env_file}: no {ENV_NODE} or {ENV_CONF}")
    with contextlib.suppress(FileNotFoundError):
        if (pid := _pid(pid_file)) is None or not _alive(pid):
            pid_file.unlink()  # a crashed slurmd's: the new one writes its own
    res = subprocess.run(
        [slurmd, "-N", node] if values.get(ENV_MODE) == "static" else [slurmd, "-Z", "-N", node, "--conf", conf],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_START_S, check=False,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"slurmd exited {res.returncode}: {(res.stderr or res.stdout).strip()[-200:]}")
    deadline = time.monotonic() + _START_S
    while (pid := _pid(pid_file)) is None or not _alive(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"slurmd started but wrote no pid to {pid_file}")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """The hook's command line."""
    ap = argparse.ArgumentParser(prog="python -m flexmig.slurm.standin", description=__doc__.splitlines()[0])
    ap.add_argument("--pid-file", type=Path, required=True, help="slurm.conf's SlurmdPidFile for this node")
    ap.add_argument("--slurmd", default="slurmd", help="the slurmd binary")
    ap.add_argument("verb", choices=("start", "stop", "restart"))
    args = ap.parse_args(argv)
    try:
        if args.verb in ("stop", "restart"):
            stop(args.pid_file)
        if args.verb in ("start", "restart"):
            start(args.slurmd, args.pid_file, Path(os.environ["FLEXMIG_SLURMD_ENV"]))
    except (OSError, RuntimeError, KeyError, subprocess.TimeoutExpired) as exc:
        print(f"slurmd stand-in {args.verb}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
