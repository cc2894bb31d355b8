"""Where a benchmark ran: one line naming the CPU model, the core count, Python and the OS, printed first by every
benchmark here (figures from a shared 2-core VM and from a workstation are not comparable)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["machine"]


def machine() -> str:
    """CPU model, cores, Python version, OS and kernel, e.g. ``AMD EPYC 7B13, 2 cores, Python 3.11.7, Linux 6.18.0``."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )
