"""docs/results.md from one command: every benchmark run, each writing its own section, with the machine and date.

Each benchmark under ``bench/`` is a section here (:data:`SECTIONS`): the command that runs it in full and quick, and
whether it writes its own Markdown (``--markdown FILE``: a ``## Title`` section with its tables, its command, machine
line, date and load average, and the rows it adds to the at-a-glance table between ``<!-- glance -->`` and
``<!-- /glance -->``). A benchmark that does not write Markdown yet is shown as its own output, verbatim, under the
date and the command. A benchmark that cannot run here (it needs root, or a Debian package) keeps the section it had
in the file, if any, and the run says so; nothing is written that no command produced.

To plug in a benchmark: give it ``--markdown FILE`` (and, for a smoke run, ``--quick``), and add a :class:`Section`.

Run: ``make bench`` (``.venv/bin/python bench/results.py``: every section, in full, into docs/results.md; hours on
a 2-core machine) or ``make bench-quick`` (``--quick --out out/results-quick.md``: every section's quick run, for a
smoke test, never over the published file). ``--only NAME[,NAME]`` reruns some sections and keeps the others as the
file has them. The load average is printed beside each section: figures measured on a busy machine say so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results.md"
GLANCE_BEGIN, GLANCE_END = "<!-- glance -->", "<!-- /glance -->"


def _root_and(*commands: str) -> Callable[[], str | None]:
    def check() -> str | None:
        missing = [c for c in commands if shutil.which(c) is None]
        if os.geteuid() != 0:
            missing.insert(0, "root")
        return f"needs {', '.join(missing)}" if missing else None

    return check


def _has(*commands: str) -> Callable[[], str | None]:
    def check() -> str | None:
        missing = [c for c in commands if shutil.which(c) is None]
        return f"needs {', '.join(missing)}" if missing else None

    return check


@dataclass(frozen=True)
class Section:
    """One benchmark: its section's name, title, full and quick arguments (after ``bench/<script>``), whether it
    writes Markdown itself, and what it needs to run (a check that names what is missing, or None)."""

    name: str
    title: str
    script: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)
    markdown: bool = True
    needs: Callable[[], str | None] = field(default=lambda: None)


SECTIONS: tuple[Section, ...] = (
    Section("sampling", "Sampling cost", "sampling.py"),
    Section("scrape", "Scrape cost", "scrape.py"),
    Section("planner", "Planning time", "planner.py"),
    Section("replay", "Replay", "replay.py"),
    Section("malleable", "Malleable jobs on traces they were not tuned on", "malleable.py"),
    Section("reference", "The baselines against an independent implementation", "reference.py", markdown=False),
    Section(
        "migration",
        "Migration cost",
        "migration.py",
        ("--runs", "5"),
        ("--runs", "1", "--examples", "stdlib"),
        markdown=False,
    ),
    Section(
        "slurm",
        "Slurm",
        "slurm.py",
        ("--runs", "5"),
        ("--runs", "1"),
        markdown=False,
        needs=_root_and("slurmctld", "slurmd", "sbatch", "munged"),
    ),
    Section(
        "hardening",
        "systemd hardening",
        "hardening.py",
        quick=(),
        needs=_has("systemd-analyze"),
    ),
)


def marker(name: str) -> tuple[str, str]:
    """The lines that open and close section ``name`` in docs/results.md."""
    return f"<!-- section: {name} -->", f"<!-- end of section: {name} -->"


def sections_of(text: str) -> dict[str, str]:
    """The sections a generated results file holds, by name (their text between the markers)."""
    out = {}
    for s in SECTIONS:
        begin, end = marker(s.name)
        if begin in text and end in text:
            out[s.name] = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    return out


def run(section: Section, quick: bool, log: Path) -> str:
    """Run one benchmark; its section's Markdown (raises CalledProcessError when it fails)."""
    args = section.quick if quick else section.full
    cmd = [sys.executable, str(ROOT / "bench" / section.script), *args]
    shown = " ".join(["bench/" + section.script, *args])
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "section.md"
        if section.markdown:
            cmd += ["--markdown", str(md)]
        t0 = time.monotonic()
        with log.open("ab") as out:
            out.write(f"\n===== {shown} ({started:%Y-%m-%d %H:%M} UTC)\n".encode())
            out.flush()
            done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=out, check=False, timeout=6 * 3600)
            out.write(done.stdout)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout)
        wall = time.monotonic() - t0
        if section.markdown:
            return md.read_text().strip("\n") + f"\n\n({wall:.0f} s of wall time.)"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"## {section.title}\n\n`.venv/bin/python {shown}` ({started:%Y-%m-%d %H:%M} UTC; load average {load} at the "
        f"end; {wall:.0f} s), its output as printed:\n\n```\n{done.stdout.decode().strip()}\n```"
    )


STORED_BEGIN, STORED_END = "<!-- glance rows:", "end of glance rows -->"
"""How a section keeps its at-a-glance rows in the written file (an HTML comment, so they show only in the table
at the top, and a rerun of other sections finds them)."""


def glance(sections: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The at-a-glance rows of every section, and the sections with their rows kept in the stored form."""
    rows: list[str] = []
    clean: dict[str, str] = {}
    for name, text in sections.items():
        body, mine = text, []
        for begin, end in ((GLANCE_BEGIN, GLANCE_END), (STORED_BEGIN, STORED_END)):
            if begin in body and end in body:
                before, rest = body.split(begin, 1)
                block, after = rest.split(end, 1)
                mine += [ln for ln in block.splitlines() if ln.startswith("|")]
                body = (before.rstrip("\n") + "\n" + after.lstrip("\n")).strip("\n")
        rows += mine
        clean[name] = body + ("\n\n" + "\n".join([STORED_BEGIN, *mine, STORED_END]) if mine else "")
    return rows, clean


def compose(sections: dict[str, str], quick: bool) -> str:
    """The whole results file."""
    rows, clean = glance(sections)
    out = [
        "# Results",
        "",
        "Every figure flexmig claims, each written by the benchmark that measured it (`make bench`, that is "
        "`.venv/bin/python bench/results.py`, reruns them all and rewrites this file; `--only NAME` reruns one "
        "section). Each benchmark runs its rivals in the same process or run, prints ratios, medians and the worst "
        "case, and the machine it ran on; each section gives its command, the machine, the date and the load "
        "average, since the machine these ran on is shared and a busy one slows every figure of time.",
        "",
    ]
    if quick:
        out += ["**Quick run (`make bench-quick`): smoke-test figures, not for publication.**", ""]
    if rows:
        out += ["## At a glance", "", "| what | figure | goal |", "|---|---|---|", *rows, ""]
    for s in SECTIONS:
        if s.name in clean:
            begin, end = marker(s.name)
            out += [begin, clean[s.name], end, ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and write the results file."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick run")
    parser.add_argument("--only", help="comma-separated sections to rerun; the others are kept from --out")
    parser.add_argument("--out", type=Path, help="the file to write (default docs/results.md; --quick: required)")
    parser.add_argument("--log", type=Path, default=ROOT / "out" / "bench.log", help="the benchmarks' output")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    args = parser.parse_args(argv)
    if args.list:
        for s in SECTIONS:
            print(f"{s.name:10} bench/{s.script} {' '.join(s.full)}  (quick: {' '.join(s.quick)})")
        return 0
    out = args.out or (None if args.quick else RESULTS)
    if out is None:
        print("results: --quick writes smoke-test figures: give --out (make bench-quick does)", file=sys.stderr)
        return 2
    wanted = {s.name for s in SECTIONS} if not args.only else set(args.only.split(","))
    unknown = wanted - {s.name for s in SECTIONS}
    if unknown:
        print(f"results: unknown section(s) {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    old = sections_of(out.read_text()) if out.exists() else {}
    args.log.parent.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; output of the benchmarks in {args.log}")
    new: dict[str, str] = {}
    failed = []
    for s in SECTIONS:
        if s.name not in wanted:
            if s.name in old:
                new[s.name] = old[s.name]
            continue
        why = s.needs()
        if why is not None:
            print(f"  {s.name}: not run ({why}); {'kept as it was' if s.name in old else 'left out'}")
            if s.name in old:
                new[s.name] = old[s.name]
            continue
        t0 = time.monotonic()
        print(f"  {s.name}: bench/{s.script} ...", flush=True)
        try:
            new[s.name] = run(s, args.quick, args.log)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            failed.append(s.name)
            print(f"  {s.name}: FAILED ({exc}); see {args.log}", flush=True)
            if s.name in old:
                new[s.name] = old[s.name]
            continue
        print(f"  {s.name}: done in {time.monotonic() - t0:.0f} s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(compose(new, args.quick))
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
