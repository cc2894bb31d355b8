"""The ``flexmigd`` command: hold SIGHUP first, then load and run the daemon (:func:`flexmig.daemon.main`).

Loading the daemon (asyncio, prometheus_client, NVML's ctypes bindings, SQLite, the simulator) takes a good part of
a second, and SIGHUP's default action would end the process during it. This module imports nothing heavy, so the
signal is held (:mod:`flexmig.signals`) within a few milliseconds of the interpreter's start, before anything else.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from flexmig import signals

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flexmigd`` console script; returns the daemon's exit status."""
    signals.hold()
    from flexmig.daemon import main as daemon_main  # noqa: PLC0415 - after the signals are held, on purpose

    return daemon_main(argv)


if __name__ == "__main__":
    sys.exit(main())
