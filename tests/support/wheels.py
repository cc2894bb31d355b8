"""Build flexmig's wheels from a copy of the checkout and install them into fresh virtual environments.

The builds run offline and in bounded time: ``pip wheel --no-deps --no-build-isolation`` with the setuptools of
this environment, from a copy of the tracked files (so the checkout gets no ``build/`` or ``*.egg-info``). A fresh
environment is made ``--without-pip``; this environment's pip installs into it (``pip --python``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300
_SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def source_copy(dest: Path) -> Path:
    """The checkout's files that git does not ignore (without git: the tree less caches and venvs) under ``dest``."""
    git = shutil.which("git")
    argv = [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"] if git is not None else None
    listed = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=60, check=False) if argv else None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        files = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    else:
        files = [
            p
            for p in ROOT.rglob("*")
            if p.is_file() and not _SKIP.intersection(p.relative_to(ROOT).parts) and not p.name.endswith(".egg-info")
        ]
    for src in files:
        if not src.is_file():  # deleted in the work tree but still tracked
            continue
        target = dest / src.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def build_wheel(project: Path, out: Path) -> Path:
    """Build ``project``'s wheel into ``out`` and return its path (the build's output names any failure)."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*argv, "-w", str(out), str(project)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def fresh_venv(path: Path) -> Path:
    """A new virtual environment without pip or any package; returns its python."""
    venv.EnvBuilder(with_pip=False, clear=True, symlinks=True).create(path)
    return path / "bin" / "python"


def pip_into(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This environment's pip acting on the environment of ``python`` (asserting success)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def install_wheels(python: Path, *wheels: Path) -> None:
    """Install ``wheels`` into the environment of ``python``, offline, without resolving dependencies."""
    pip_into(python, "install", "--no-deps", "--no-index", "--no-compile", *map(str, wheels))
