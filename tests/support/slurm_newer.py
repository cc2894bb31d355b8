"""A newer Slurm beside the distribution's, for running the Slurm tests against it: Debian 13's Slurm 24.11 in a
chroot, its daemons and commands reached through wrapper scripts in one directory (``FLEXMIG_SLURM_BIN``).

Debian 12 ships Slurm 22.05; clusters run 23.x and 24.x too, whose ``--json`` answers changed form
(:mod:`flexmig.slurm.dataparser`). Debian 13's packages need its newer C library, so they run in a chroot made with
``debootstrap`` (about 50 s and 100 MB from Debian's mirror); what the tests and flexmig share with it is bind-mounted
at the same paths (``/tmp``, where testbeds live; ``/proc``, ``/sys``, ``/dev``; the repository and the Python that
runs the tests, for the TaskProlog and the hook jobs). The host's munged serves both (its socket is a path in the
testbed's directory).

``python tests/support/slurm_newer.py up ROOT`` makes the chroot if ROOT is missing, mounts what it shares, writes
the wrappers in ``ROOT.bin`` and prints that directory; ``down ROOT`` unmounts everything below ROOT (what ``up``
mounted). ``make slurm-newer`` runs the Slurm tests against it between the two. ``build ROOT`` only makes the
chroot, in a detached process (its output in ``ROOT.log``), so that ``make test`` makes it while the other suites
run; one build at a time (a lock beside ROOT): ``up`` waits for a build under way, and makes the chroot itself if
that build failed (its error then shows).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "python3")
SBIN = ("slurmctld", "slurmd")
BIN = ("scontrol", "squeue", "sinfo", "sbatch", "scancel", "sdiag", "srun", "sacct")
READY = ".flexmig-ready"
REPO = Path(__file__).resolve().parents[2]


def shared() -> list[Path]:
    """What the chroot shares with the host, at the same paths (the order they are mounted in)."""
    return [Path("/proc"), Path("/sys"), Path("/dev"), Path("/tmp"), REPO, Path(sys.base_prefix).resolve()]


def shadowing_prefix() -> str | None:
    """Why the venv's Python cannot be shared with the chroot, or None. It is mounted at its own path: a Python of
    the system (prefix /usr) would hide the chroot's /usr, its Slurm among it, and the tests would run the host's
    Slurm again while they say they run the newer one."""
    prefix = Path(sys.base_prefix).resolve()
    if prefix in (Path("/"), Path("/usr"), Path("/bin"), Path("/etc"), Path("/var")):
        return (
            f"the venv's Python lives in {prefix}, which the chroot has its own of (its Slurm is in /usr): make the "
            "venv from a Python installed elsewhere (pyenv, /opt, /usr/local) to run the tests against the newer Slurm"
        )
    return None


def build(root: Path) -> None:
    """Make the chroot (if it is not made yet), one build at a time: a build under way is waited for."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / READY).exists():
            return
        prefix = str(root).rstrip("/") + "/"
        if root.exists() and not any(m.startswith(prefix) for m in _mounted()):
            shutil.rmtree(root)  # what a failed build left (nothing is mounted in a chroot that was never ready)
        print(f"making a Debian {SUITE} chroot with Slurm in {root} (debootstrap, about a minute)", flush=True)
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), MIRROR],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (root / READY).write_text(SUITE + "\n")


def build_detached(root: Path) -> None:
    """Start :func:`build` in a process of its own session, its output in ``ROOT.log``, and return at once."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".log"), "w") as log:
        subprocess.Popen(
            [sys.executable, __file__, "build-here", str(root)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _mounted() -> list[str]:
    """Mount points, from /proc/self/mountinfo (octal escapes as they are)."""
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def up(root: Path) -> Path:
    """Make, mount and wrap; the wrappers' directory."""
    build(root)
    mounted = set(_mounted())
    for path in shared():
        inside = root / str(path).lstrip("/")
        if str(inside) in mounted:
            continue
        inside.mkdir(parents=True, exist_ok=True)
        if path == Path("/proc"):
            subprocess.run(["mount", "-t", "proc", "proc", str(inside)], check=True)
        else:
            subprocess.run(["mount", "--rbind", str(path), str(inside)], check=True)
            subprocess.run(["mount", "--make-rslave", str(inside)], check=True)
    bin_dir = root.with_name(root.name + ".bin")
    bin_dir.mkdir(exist_ok=True)
    for names, where in ((SBIN, "/usr/sbin"), (BIN, "/usr/bin")):
        for name in names:
            wrapper = bin_dir / name
            wrapper.write_text(
                "#!/bin/sh\n# Slurm's " + name + " of the chroot " + str(root) + " (tests/support/slurm_newer.py)\n"
                f"exec /usr/sbin/chroot {shlex.quote(str(root))} /bin/sh -c "
                + shlex.quote('cd "$1" 2>/dev/null || cd /; shift; exec "$@"')
                + f' sh "$PWD" {where}/{name} "$@"\n'
            )
            wrapper.chmod(0o755)
    munged = bin_dir / "munged"
    if not munged.exists():
        munged.symlink_to("/usr/sbin/munged")  # the host's: its socket path is what the chroot's daemons use
    return bin_dir


def down(root: Path) -> None:
    """Unmount what :func:`up` mounted below ``root`` (deepest first)."""
    prefix = str(root).rstrip("/") + "/"
    for point in sorted((m for m in _mounted() if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=("up", "down", "build", "build-here"))
    ap.add_argument("root", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("slurm_newer.py: needs root (debootstrap, chroot, mount)", file=sys.stderr)
        return 2
    root = args.root.resolve()
    if args.verb == "up":
        problem = shadowing_prefix()
        if problem is not None:
            print(f"slurm_newer.py: {problem}", file=sys.stderr)
            return 2
        print(up(root))
    elif args.verb == "build":
        build_detached(root)
    elif args.verb == "build-here":
        build(root)
    else:
        down(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
