"""``flexmig install-files [--root DIR] [--prefix DIR]``: put the unit, configuration, dashboards, rules, schemas and
the Slurm TaskProlog in place.

What a distribution package would install, from the files this installation carries
(:mod:`flexmig.cli.shipped_files`). Two directories, as packaging tools have them (``make install DESTDIR=...``):
``--prefix`` (default ``/``) is where the files are on the system that runs flexmigd, and is what the files that
name each other (the unit's ``--config``, Grafana's dashboard folder, Prometheus' rule file) say; ``--root`` (alias
``--destdir``, default ``/``) is where that system's tree is written: an image or a package's build directory. Under
``ROOT/PREFIX``:

* ``etc/systemd/system/flexmigd.service``: the unit, its ``ExecStart`` the ``flexmigd`` of this installation and
  its ``--config`` the file below (with ``--act`` also ``flexmigd.service.d/act.conf``, the capabilities of mode
  act);
* ``etc/flexmig/flexmig.toml`` (the commented default configuration) and ``etc/flexmig/jobs/``;
* ``usr/share/flexmig/``: ``dashboards/`` (Grafana JSON, ``provisioning/`` pointing at that folder, ``rules/``),
  ``schemas/`` and ``systemd/`` (the unit's act drop-in, the example configuration, slurmd's drop-in and the
  template units of per-GPU and static instance nodes, for later);
* ``usr/share/doc/flexmig/LICENSE``;
* ``usr/lib/flexmig/slurm-taskprolog`` (mode 0755), the TaskProlog that ``flexmig slurm conf`` names.

An existing configuration file (and act drop-in) is kept unless ``--force``; the unit and the shared files are
replaced when they differ. ``--dry-run`` prints the same lines and writes nothing. Files are written whole
(a temporary file renamed over the old one), mode 0644 (the TaskProlog 0755), directories 0755.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from flexmig.cli.shipped_files import ShippedFilesMissing, shipped_files, shipped_root
from flexmig.errors import FlexmigError
from flexmig.slurm.install import PROLOG, TASKPROLOG, render_taskprolog
from flexmig.slurm.taskprolog import MAP_PATH

__all__ = ["Item", "destination", "plan_install", "register", "render_unit"]

UNIT = PurePosixPath("etc/systemd/system/flexmigd.service")
ACT_DROP_IN = PurePosixPath("etc/systemd/system/flexmigd.service.d/act.conf")
CONFIG = PurePosixPath("etc/flexmig/flexmig.toml")
JOBS_DIR = PurePosixPath("etc/flexmig/jobs")
SHARE = PurePosixPath("usr/share/flexmig")
DOC = PurePosixPath("usr/share/doc/flexmig")

# The lines of the shipped files that name where other installed files are; each must be in its file exactly once.
_GRAFANA_PATH = "      path: /var/lib/grafana/dashboards/flexmig\n"
_RULES_PATH = "  - /etc/prometheus/flexmig.rules.yml\n"
_EXEC_START = "ExecStart=@FLEXMIGD@ --config @CONFIG@"

ItemKind = Literal["unit", "config", "file"]


@dataclass(frozen=True)
class Item:
    """One file to put in place: where it is written (``dest``, absolute, under the root), what, its mode, and
    whether an existing one is kept."""

    dest: Path
    content: bytes
    kind: ItemKind
    note: str = ""
    mode: int = 0o644

    @property
    def keep_existing(self) -> bool:
        """A configuration the operator may have edited is never replaced without ``--force``."""
        return self.kind == "config"


def render_unit(template: str, flexmigd: Path, config: Path) -> str:
    """The shipped unit with its ``ExecStart=@FLEXMIGD@ --config @CONFIG@`` filled in (absolute paths)."""
    for name, value in (("flexmigd", flexmigd), ("config", config)):
        if not value.is_absolute():
            raise FlexmigError(f"the unit needs an absolute path for {name}, not {value}")
        if any(c.isspace() or c in "%$\\\"'" for c in str(value)):
            raise FlexmigError(f"{value}: a path in ExecStart must not hold spaces, quotes, '%', '$' or '\\'")
    line = f"{_EXEC_START}\n"
    if template.count(line) != 1:
        raise FlexmigError(f"the shipped unit has no single line {_EXEC_START!r} to fill in: a broken installation")
    return template.replace(line, f"ExecStart={flexmigd} --config {config}\n")


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise FlexmigError(f"{what}: expected the line {old.strip()!r} once: a broken installation")
    return text.replace(old, new)


def plan_install(
    prefix: Path,
    flexmigd: Path,
    *,
    act: bool = False,
    root: Path = Path("/"),
    source: Path | None = None,
) -> list[Item]:
    """Every file ``install-files`` writes, in order, with its content (nothing is touched): written under
    ``root``/``prefix``, naming each other under ``prefix``. ``source`` holds the shipped files (this installation's
    by default)."""
    src = shipped_root() if source is None else source
    if not prefix.is_absolute() or not root.is_absolute():
        raise FlexmigError(f"the prefix and the root must be absolute paths, not {prefix} and {root}")
    base = Path(os.path.normpath(prefix))

    def there(rel: PurePosixPath | str) -> Path:
        """Where a file is on the system that runs flexmigd: what other files say."""
        return base / rel

    def at(rel: PurePosixPath | str) -> Path:
        """Where it is written now."""
        return destination(root, there(rel))

    def read(rel: str) -> str:
        return (src / rel).read_text(encoding="utf-8")

    config = there(CONFIG)
    unit = render_unit(read("systemd/flexmigd.service"), flexmigd, config)
    items = [
        Item(at(UNIT), unit.encode(), "unit", f"ExecStart={flexmigd} --config {config}"),
        Item(at(CONFIG), (src / "systemd/flexmig.toml").read_bytes(), "config", "mode observe, keys at defaults"),
    ]
    if act:
        items.append(Item(at(ACT_DROP_IN), (src / "systemd/flexmigd.service.d/act.conf").read_bytes(), "config"))
    dashboards = there(SHARE / "dashboards")
    for rel in shipped_files(src):
        name = rel.as_posix()
        if name == "systemd/flexmigd.service":
            continue  # written above, filled in
        if name == "LICENSE":
            items.append(Item(at(DOC / "LICENSE"), (src / rel).read_bytes(), "file"))
            continue
        data = (src / rel).read_bytes()
        note = ""
        if name == "dashboards/provisioning/dashboards/flexmig.yaml":
            data = _replace_once(data.decode(), _GRAFANA_PATH, f"      path: {dashboards}\n", name).encode()
            note = f"Grafana reads the dashboards from {dashboards}"
        elif name == "dashboards/provisioning/prometheus/prometheus.yml":
            rules = dashboards / "rules" / "flexmig.rules.yml"
            data = _replace_once(data.decode(), _RULES_PATH, f"  - {rules}\n", name).encode()
            note = f"rule_files: {rules}"
        items.append(Item(at(SHARE / name), data, "file", note))
    prolog = render_taskprolog(Path(MAP_PATH)).encode()
    items.append(Item(at(TASKPROLOG), prolog, "file", f"Slurm: TaskProlog={there(TASKPROLOG)}", mode=0o755))
    root_prolog = render_taskprolog(Path(MAP_PATH), prolog=True).encode()
    items.append(Item(at(PROLOG), root_prolog, "file", f"Slurm: Prolog={there(PROLOG)}", mode=0o755))
    return items


def destination(root: Path, installed: Path) -> Path:
    """Where the file that the installed system has at ``installed`` (absolute) is written: below ``root``."""
    return Path(os.path.normpath(root / installed.relative_to(installed.anchor)))


def _directories(root: Path, prefix: Path) -> list[Path]:
    return [destination(root, Path(os.path.normpath(prefix)) / JOBS_DIR)]


def find_flexmigd() -> Path:
    """The ``flexmigd`` console script of this installation (beside this Python's scripts), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "flexmigd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("flexmigd")
    if found is not None:
        return Path(found).absolute()
    raise FlexmigError(
        f"cannot find the flexmigd of this installation (not at {beside}, not on PATH): give --flexmigd PATH"
    )


def _write(path: Path, content: bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole: a temporary file beside it, fsynced, renamed over it (a symlink is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def _existing(path: Path) -> bytes | None:
    """The content of the file at ``path``, None when there is none (a symlink counts as a file that differs)."""
    if path.is_symlink():
        return b""
    if not path.exists():
        return None
    if not path.is_file():
        raise FlexmigError(f"{path} exists and is not a regular file: move it away first")
    return path.read_bytes()


def run(args: argparse.Namespace) -> int:
    """Plan, then write (or, with --dry-run, print) every file."""
    prefix = Path(args.prefix).absolute()
    root = Path(args.root).absolute()
    flexmigd = Path(args.flexmigd).absolute() if args.flexmigd else find_flexmigd()
    try:
        items = plan_install(prefix, flexmigd, act=args.act, root=root)
    except ShippedFilesMissing as exc:
        raise FlexmigError(str(exc)) from None
    dry = args.dry_run
    head = "would " if dry else ""
    under = f" --root {root}" if root != Path("/") else ""
    print(f"flexmig install-files --prefix {prefix}{under}{' (dry run: nothing is written)' if dry else ''}")
    written = 0
    try:
        for d in _directories(root, prefix):
            if not d.is_dir():
                print(f"  {head}create  {d}/")
                if not dry:
                    d.mkdir(parents=True, exist_ok=True, mode=0o755)
        for item in items:
            old = _existing(item.dest)
            note = f"  ({item.note})" if item.note else ""
            if old == item.content and _mode(item.dest) == item.mode:
                print(f"  same    {item.dest}")
                continue
            if old is not None and item.keep_existing and not args.force:
                print(f"  keep    {item.dest}  (exists; --force replaces it)")
                continue
            verb = "create " if old is None else "replace"
            print(f"  {head}{verb} {item.dest}{note}")
            if not dry:
                _write(item.dest, item.content, item.mode)
                written += 1
    except PermissionError as exc:
        raise FlexmigError(
            f"cannot write {exc.filename}: permission denied (run as root, or --root a directory you own)"
        ) from None
    except OSError as exc:
        raise FlexmigError(f"cannot write {exc.filename or root}: {exc.strerror or exc}") from None
    if not dry:
        print(f"{written} file(s) written")
    _next_steps(root, prefix, args.act)
    return 0


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.lstat().st_mode)
    except OSError:
        return None


def _next_steps(root: Path, prefix: Path, act: bool) -> None:
    config = Path(os.path.normpath(prefix)) / CONFIG
    unit = destination(root, Path(os.path.normpath(prefix)) / UNIT)
    print("next:")
    if root == Path("/") and Path(os.path.normpath(prefix)) == Path("/"):
        print(f"  flexmig config check {config}")
        print(f"  systemd-analyze verify {unit}")
        print("  systemctl daemon-reload && systemctl enable --now flexmigd")
    elif root != Path("/"):
        inside = Path(os.path.normpath(prefix)) / UNIT
        print(f"  the files name each other as the system that boots {root} will see them ({config}, ...)")
        print(f"  on that system: flexmig config check {config}; systemd-analyze verify {inside}")
    else:
        print(f"  systemd-analyze verify {unit}   (the unit is active only where systemd reads {unit.parent})")
    if act:
        print(f'  mode act: set mode = "act" in {config}, then systemctl restart flexmigd')
    else:
        print('  mode act later: flexmig install-files ... --act, set mode = "act", restart flexmigd')


def register(sub: Any) -> None:
    """Add the ``install-files`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "install-files",
        help="install the systemd unit, configuration, dashboards, alert rules, schemas and the Slurm TaskProlog",
        description=(
            "Write the systemd unit (ExecStart: this installation's flexmigd), the default configuration (an existing "
            "one is kept unless --force), the dashboards, provisioning, alert rules, schemas and LICENSE under "
            "PREFIX/usr/share, and the Slurm TaskProlog. The files are written under ROOT/PREFIX and name each other "
            "under PREFIX: --root is an image or a package's build directory (DESTDIR), --prefix where the files are "
            "on the system that runs flexmigd. --dry-run prints the same lines and writes nothing."
        ),
    )
    p.add_argument(
        "--prefix",
        default="/",
        help="where the files are on the system that runs flexmigd, as they name each other (default /)",
    )
    p.add_argument(
        "--root",
        "--destdir",
        dest="root",
        default="/",
        help="write that system's tree under this directory: an image, a package's build root (default /)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be written and write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing configuration file and act drop-in")
    p.add_argument("--act", action="store_true", help="also install the drop-in that grants mode act its capabilities")
    p.add_argument(
        "--flexmigd",
        metavar="PATH",
        help="the flexmigd the unit starts (default: the one beside this Python, else on PATH)",
    )
    p.set_defaults(func=run)
