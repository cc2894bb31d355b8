"""``flexmig install-files --prefix DIR``: put the unit, configuration, dashboards, rules and schemas in place.

What a distribution package would install, from the files this installation carries
(:mod:`flexmig.cli.shipped_files`), under ``DIR`` (``/`` for this machine):

* ``etc/systemd/system/flexmigd.service``: the unit, its ``ExecStart`` the ``flexmigd`` of this installation and
  its ``--config`` the file below (with ``--act`` also ``flexmigd.service.d/act.conf``, the capabilities of mode
  act);
* ``etc/flexmig/flexmig.toml`` (the commented default configuration) and ``etc/flexmig/jobs/``;
* ``usr/share/flexmig/``: ``dashboards/`` (Grafana JSON, ``provisioning/`` pointing at that folder, ``rules/``),
  ``schemas/`` and ``systemd/`` (the unit's act drop-in and the example configuration, for later);
* ``usr/share/doc/flexmig/LICENSE``.

An existing configuration file (and act drop-in) is kept unless ``--force``; the unit and the shared files are
replaced when they differ. ``--dry-run`` prints the same lines and writes nothing. Files are written whole
(a temporary file renamed over the old one), mode 0644, directories 0755.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from flexmig.cli.shipped_files import ShippedFilesMissing, shipped_files, shipped_root
from flexmig.errors import FlexmigError

__all__ = ["Item", "plan_install", "register", "render_unit"]

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
    """One file to put in place: where (``dest``, absolute), what, and whether an existing one is kept."""

    dest: Path
    content: bytes
    kind: ItemKind
    note: str = ""

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


def plan_install(prefix: Path, flexmigd: Path, *, act: bool = False, root: Path | None = None) -> list[Item]:
    """Every file ``install-files`` writes under ``prefix``, in order, with its content (nothing is touched)."""
    src = shipped_root() if root is None else root
    under = prefix.resolve()

    def at(rel: PurePosixPath | str) -> Path:
        return under / rel

    def read(rel: str) -> str:
        return (src / rel).read_text(encoding="utf-8")

    config = at(CONFIG)
    unit = render_unit(read("systemd/flexmigd.service"), flexmigd, config)
    items = [
        Item(at(UNIT), unit.encode(), "unit", f"ExecStart={flexmigd} --config {config}"),
        Item(at(CONFIG), (src / "systemd/flexmig.toml").read_bytes(), "config", "mode observe, keys at defaults"),
    ]
    if act:
        items.append(Item(at(ACT_DROP_IN), (src / "systemd/flexmigd.service.d/act.conf").read_bytes(), "config"))
    dashboards = at(SHARE / "dashboards")
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
    return items


def _directories(prefix: Path) -> list[Path]:
    return [prefix.resolve() / JOBS_DIR]


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


def _write(path: Path, content: bytes) -> None:
    """Write ``path`` whole: a temporary file beside it, fsynced, renamed over it (a symlink is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fchmod(f.fileno(), 0o644)
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
    prefix = Path(args.prefix)
    if not prefix.is_absolute():
        prefix = prefix.absolute()
    flexmigd = Path(args.flexmigd).absolute() if args.flexmigd else find_flexmigd()
    try:
        items = plan_install(prefix, flexmigd, act=args.act)
    except ShippedFilesMissing as exc:
        raise FlexmigError(str(exc)) from None
    dry = args.dry_run
    head = "would " if dry else ""
    print(f"flexmig install-files --prefix {prefix}{' (dry run: nothing is written)' if dry else ''}")
    written = 0
    try:
        for d in _directories(prefix):
            if not d.is_dir():
                print(f"  {head}create  {d}/")
                if not dry:
                    d.mkdir(parents=True, exist_ok=True, mode=0o755)
        for item in items:
            old = _existing(item.dest)
            note = f"  ({item.note})" if item.note else ""
            if old == item.content:
                print(f"  same    {item.dest}")
                continue
            if old is not None and item.keep_existing and not args.force:
                print(f"  keep    {item.dest}  (exists; --force replaces it)")
                continue
            verb = "create " if old is None else "replace"
            print(f"  {head}{verb} {item.dest}{note}")
            if not dry:
                _write(item.dest, item.content)
                written += 1
    except PermissionError as exc:
        raise FlexmigError(
            f"cannot write {exc.filename}: permission denied (run as root, or --prefix a directory you own)"
        ) from None
    except OSError as exc:
        raise FlexmigError(f"cannot write {exc.filename or prefix}: {exc.strerror or exc}") from None
    if not dry:
        print(f"{written} file(s) written")
    _next_steps(prefix, args.act)
    return 0


def _next_steps(prefix: Path, act: bool) -> None:
    unit = prefix.resolve() / UNIT
    print("next:")
    if prefix.resolve() == Path("/"):
        print(f"  flexmig config check {prefix.resolve() / CONFIG}")
        print(f"  systemd-analyze verify {unit}")
        print("  systemctl daemon-reload && systemctl enable --now flexmigd")
    else:
        print(f"  systemd-analyze verify {unit}   (the unit is active only where systemd reads {unit.parent})")
    if act:
        print(f'  mode act: set mode = "act" in {prefix.resolve() / CONFIG}, then systemctl restart flexmigd')
    else:
        print("  mode act later: flexmig install-files --prefix ... --act, set mode = \"act\", restart flexmigd")


def register(sub: Any) -> None:
    """Add the ``install-files`` subcommand."""
    p: argparse.ArgumentParser = sub.add_parser(
        "install-files",
        help="install the systemd unit, configuration, dashboards, alert rules and schemas under a prefix",
        description=(
            "Write the systemd unit (ExecStart: this installation's flexmigd), the default configuration (an existing "
            "one is kept unless --force), and the dashboards, provisioning, alert rules, schemas and LICENSE under "
            "PREFIX/usr/share. --dry-run prints the same lines and writes nothing."
        ),
    )
    p.add_argument("--prefix", required=True, help="the root to install under: / for this machine")
    p.add_argument("--dry-run", action="store_true", help="print what would be written and write nothing")
    p.add_argument("--force", action="store_true", help="replace an existing configuration file and act drop-in")
    p.add_argument(
        "--act", action="store_true", help="also install the drop-in that grants mode act its capabilities"
    )
    p.add_argument(
        "--flexmigd",
        metavar="PATH",
        help="the flexmigd the unit starts (default: the one beside this Python, else on PATH)",
    )
    p.set_defaults(func=run)
