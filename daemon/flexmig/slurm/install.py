"""Copies of flexmig's Slurm TaskProlog (and of its Prolog) with a site's interpreter and map path written in.

Slurm runs both with no arguments, so the path of the GRES map is written into the copy (``flexmig slurm taskprolog
--output FILE --map PATH``), as is the interpreter of its first line. The Prolog (``--prolog``) is the same script
with its role set to ``prolog``: slurmd runs it as root before a job's first task, and it makes the job user's
checkpoint base, which no user may make (:func:`flexmig.slurm.taskprolog.prepare_base`).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from flexmig.slurm import taskprolog

__all__ = ["PROLOG", "TASKPROLOG", "render_taskprolog", "write_taskprolog"]

#: Where ``flexmig install-files`` puts the TaskProlog, relative to the installed root, and what ``flexmig slurm
#: conf`` names by default (``/usr/lib/flexmig/slurm-taskprolog``).
TASKPROLOG = PurePosixPath("usr/lib/flexmig/slurm-taskprolog")
#: Where ``flexmig install-files`` puts the Prolog (slurm.conf ``Prolog=``), relative to the installed root.
PROLOG = PurePosixPath("usr/lib/flexmig/slurm-prolog")

_MAP_LINE = re.compile(r'^MAP_PATH = ".*"$', re.MULTILINE)
_ROLE_LINE = re.compile(r'^ROLE = "task"$', re.MULTILINE)


def render_taskprolog(map_path: Path, python: str = "/usr/bin/python3", *, prolog: bool = False) -> str:
    """The TaskProlog's source with ``python`` on its first line and ``map_path`` as its map (``prolog``: the copy
    slurm.conf's ``Prolog=`` names)."""
    if not map_path.is_absolute() or any(c in str(map_path) for c in '"\\\n'):
        raise ValueError(f"the GRES map path must be absolute and plain, not {str(map_path)!r}")
    if not python.startswith("/") or any(c in python for c in " \n"):
        raise ValueError(f"the interpreter must be an absolute path without spaces, not {python!r}")
    source = Path(taskprolog.__file__).read_text()
    body = source.split("\n", 1)[1] if source.startswith("#!") else source
    body, n = _MAP_LINE.subn(f'MAP_PATH = "{map_path}"', body, count=1)
    if n != 1:
        raise RuntimeError("the TaskProlog source lost its MAP_PATH line")
    if prolog:
        body, n = _ROLE_LINE.subn('ROLE = "prolog"', body, count=1)
        if n != 1:
            raise RuntimeError("the TaskProlog source lost its ROLE line")
    return f"#!{python} -I\n" + body


def write_taskprolog(dest: Path, map_path: Path, python: str = "/usr/bin/python3", *, prolog: bool = False) -> None:
    """Write the TaskProlog (``prolog``: the Prolog) to ``dest`` (mode 0755, atomically)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(render_taskprolog(map_path, python, prolog=prolog))
    tmp.chmod(0o755)
    tmp.replace(dest)
