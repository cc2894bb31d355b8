"""systemd hardening: ``systemd-analyze security --offline=true`` of the shipped unit, as shipped and with the act
drop-in (goal: exposure at most 3.2, of which 0.2 is the job cgroups' delegation; tests/systemd/test_systemd_unit.py
holds the same bound).

The unit is written as ``flexmig install-files`` writes it (ExecStart this environment's flexmigd, since the analysis
needs the binary to exist), into a temporary directory, with ``flexmigd.service.d/act.conf`` beside it for the
second figure. The systemd version is printed with the machine.

Run: ``.venv/bin/python bench/hardening.py [--markdown FILE]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from flexmig.cli.install_cmd import render_unit
from flexmig.config import DEFAULT_CONFIG_PATH
from machine import machine

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "flexmigd.service"
ACT = ROOT / "systemd" / "flexmigd.service.d" / "act.conf"
GOAL = 3.2


def exposure(directory: Path, *, act: bool) -> float:
    """The overall exposure level of the unit written into ``directory`` (with the act drop-in if ``act``)."""
    directory.mkdir(parents=True)
    unit = directory / "flexmigd.service"
    unit.write_text(render_unit(UNIT.read_text(), Path(sys.executable).with_name("flexmigd"), DEFAULT_CONFIG_PATH))
    if act:
        (directory / "flexmigd.service.d").mkdir()
        shutil.copy(ACT, directory / "flexmigd.service.d" / "act.conf")
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    m = re.search(
        r"Overall exposure level for flexmigd\.service: (\d+\.\d+)", re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    )
    if m is None:
        raise SystemExit(f"systemd-analyze gave no exposure level: {done.stdout}{done.stderr}")
    return float(m.group(1))


def main(argv: list[str] | None = None) -> int:
    """Print both levels."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path, help="also write the section of docs/results.md to this file")
    args = parser.parse_args(argv)
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, check=False)
    systemd = version.stdout.splitlines()[0] if version.stdout else "systemd (version unknown)"
    started = datetime.now(UTC)
    print(f"machine: {machine()}; {systemd}")
    with tempfile.TemporaryDirectory() as tmp:
        shipped = exposure(Path(tmp) / "observe", act=False)
        acting = exposure(Path(tmp) / "act", act=True)
    print(f"exposure as shipped (observe, no capabilities): {shipped}; with act.conf: {acting}; goal <= {GOAL}")
    if args.markdown:
        ok = "met" if max(shipped, acting) <= GOAL else "missed"
        args.markdown.write_text(
            "\n".join(
                [
                    "## systemd hardening",
                    "",
                    f"`.venv/bin/python bench/hardening.py` ({started:%Y-%m-%d %H:%M} UTC; {machine()}; {systemd}): "
                    f"`systemd-analyze security --offline=true` gives `flexmigd.service` an overall exposure of "
                    f"**{shipped}** as shipped (mode observe, no capabilities) and **{acting}** with "
                    f"`flexmigd.service.d/act.conf` (the capabilities mode act needs); goal at most {GOAL}: {ok}, "
                    "checked by `tests/systemd/test_systemd_unit.py`. What the unit sets is in "
                    "[The systemd unit](operating.md#the-systemd-unit).",
                    "",
                    "<!-- glance -->",
                    f"| `systemd-analyze security --offline=true` (`bench/hardening.py`) | exposure {shipped} as "
                    f"shipped (observe), {acting} with the act drop-in | <= {GOAL} |",
                    "<!-- /glance -->",
                ]
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
