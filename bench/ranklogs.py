"""What the rank log writer costs: a rank's output through its pipe and writer (flexmig/act/logpump.py, capped and
rotated) against the same output written straight to a file, as ranks did before (uncapped).

    python bench/ranklogs.py [--mib 256] [--runs 5]

Each run pours ``--mib`` MiB of ``/usr/bin/yes`` output into each rival (through ``head -c``) and times it; it prints
the median and worst MiB/s of each, their ratio, the writer's peak memory (VmHWM) and what each left on disk (the
writer: at most (keep + 1) files of the cap). Rerun on a quiet machine: figures from a loaded shared VM are
provisional.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine

ROOT = Path(__file__).resolve().parents[1]
LOGPUMP = ROOT / "daemon" / "flexmig" / "act" / "logpump.py"
CAP = 16 * 1024 * 1024
KEEP = 2


def pour(mib: int, stdout: int) -> subprocess.Popen[bytes]:
    """``yes | head -c MIB``: what a chatty rank prints, ``mib`` MiB of it, on ``stdout``."""
    yes = subprocess.Popen(["/usr/bin/yes"], stdout=subprocess.PIPE)
    assert yes.stdout is not None
    head = subprocess.Popen(["/usr/bin/head", "-c", str(mib * 1024 * 1024)], stdin=yes.stdout, stdout=stdout)
    yes.stdout.close()
    head.wait()
    yes.kill()
    yes.wait()
    return head


def direct(mib: int, work: Path) -> tuple[float, int]:
    path = work / "direct.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o640)
    t0 = time.perf_counter()
    try:
        pour(mib, fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0, path.stat().st_size


def through_writer(mib: int, work: Path) -> tuple[float, int, int]:
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    for p in logs.iterdir():
        p.unlink()
    dir_fd = os.open(logs, os.O_RDONLY | os.O_DIRECTORY)
    read_end, write_end = os.pipe()
    t0 = time.perf_counter()
    writer = subprocess.Popen(
        [sys.executable, "-I", "-S", str(LOGPUMP), str(dir_fd), "g0001-r0.log", str(CAP), str(KEEP)],
        stdin=read_end,
        pass_fds=(dir_fd,),
    )
    os.close(read_end)
    try:
        pour(mib, write_end)
    finally:
        os.close(write_end)
    hwm = 0
    while writer.poll() is None:
        hwm = max(hwm, _hwm(writer.pid))
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    os.close(dir_fd)
    return elapsed, sum(p.stat().st_size for p in logs.iterdir()), hwm


def _hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (provisional if others load the machine)")
    rates: dict[str, list[float]] = {"direct": [], "writer": []}
    kept = {"direct": 0, "writer": 0}
    peak = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.runs):
            t, size = direct(args.mib, work)
            rates["direct"].append(args.mib / t)
            kept["direct"] = size
            t, size, hwm = through_writer(args.mib, work)
            rates["writer"].append(args.mib / t)
            kept["writer"] = size
            peak = max(peak, hwm)
    for name, r in rates.items():
        print(
            f"{name:6s}: median {statistics.median(r):7.1f} MiB/s, worst {min(r):7.1f} MiB/s, "
            f"left on disk {kept[name] / 2**20:6.1f} MiB"
        )
    ratio = statistics.median(rates["writer"]) / statistics.median(rates["direct"])
    print(f"writer/direct throughput ratio (median): {ratio:.2f}; writer peak memory {peak / 2**20:.1f} MiB")
    print(f"cap: {CAP / 2**20:.0f} MiB x {KEEP + 1} files; output poured: {args.mib} MiB per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
