"""Copies of flexmig's Slurm TaskProlog with a site's interpreter and map path written in.

Slurm runs the TaskProlog with no arguments, so the path of the GRES map is written into the copy
(``flexmig slurm taskprolog --output FILE --map PATH``), as is the interpreter of its first line.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from flexmig.slurm import taskprolog

__all__ = ["TASKPROLOG", "render_taskprolog", "write_taskprolog"]

#: Where ``flexmig install-files`` puts the TaskProlog, relative to the installed root, and what ``flexmig slurm
#: conf`` names by default (``/usr/lib/flexmig/slurm-taskprolog``).
TASKPROLOG = PurePosixPath("usr/lib/flexmig/slurm-taskprolog")

_MAP_LINE = re.compile(r'^MAP_PATH = ".*"$', re.MULTILINE)


def render_taskprolog(map_path: Path, python: str = "/usr/bin/python3") -> str:
    """The TaskProlog's source with ``python`` on its first line and ``map_path`` as its map."""
    if not map_path.is_absolute() or any(c in str(map_path) for c in '"\\\n'):
        raise ValueError(f"the GRES map path must be absolute and plain, not {str(map_path)!r}")
    if not python.startswith("/") or any(c in python for c in " \n"):
        raise ValueError(f"the interpreter must be an absolute path without spaces, not {python!r}")
    source = Path(taskprolog.__file__).read_text()
    body = source.split("\n", 1)[1] if source.startswith("#!") else source
    body, n = _MAP_LINE.subn(f'MAP_PATH = "{map_path}"', body, count=1)
    if n != 1:
        raise RuntimeError("the TaskProlog source lost its MAP_PATH line")
    return f"#!{python} -I\n" + body


def write_taskprolog(dest: Path, map_path: Path, python: str = "/usr/bin/python3") -> None:
    """Write the TaskProlog to ``dest`` (mode 0755, atomically)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(render_taskprolog(map_path, python))
    tmp.chmod(0o755)
    tmp.replace(dest)
