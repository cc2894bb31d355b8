"""Telling Slurm what the node now hosts: flexmig's block of gres.conf, the TaskProlog's map, and on a simulated node
the stand-in device files and MIG minors table.

Files are replaced atomically (written beside, then renamed), so slurmd and the TaskProlog never read half a file.
A simulated node has no driver to create ``/dev/nvidia*``: its stand-ins are character devices with /dev/null's
numbers (gres.conf refuses plain files), made only under a directory that is not ``/dev`` itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexmig.config.trusted import read_trusted_text
from flexmig.errors import ConfigError, SlurmError
from flexmig.mig.catalogue import model_by_name
from flexmig.nvml.types import Inventory
from flexmig.plan.types import Instance
from flexmig.slurm.gresconf import GresRecord, drop_block, gres_map, gres_records, merge_block, parse_gres_map
from flexmig.slurm.minors import MigMinors, parse_mig_minors, render_mig_minors

__all__ = ["Supply", "atomic_write", "make_public_dirs", "unreadable_by_others"]

log = logging.getLogger(__name__)

_MAX_FILE = 4 * 1024 * 1024
MAP_DIR_MODE = 0o755
"""The mode of the directories flexmig makes for the GRES map: the TaskProlog runs as the job's user and must reach
the map; nothing secret is in it (MIG UUIDs, GRES indices, the hook's settings). flexmigd's unit has ``UMask=0077``,
so a plain ``mkdir`` would make them 0700 and every task of every ordinary user would get no GPU."""


def make_public_dirs(path: Path, mode: int = MAP_DIR_MODE) -> None:
    """Make ``path`` and its missing parents with exactly ``mode``, whatever the process's umask; directories that
    exist are left as they are (an administrator's)."""
    missing: list[Path] = []
    for d in [path, *path.parents]:
        if d.is_dir():
            break
        missing.append(d)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode)
            d.chmod(mode)  # mkdir's mode passes through the umask, chmod's does not


def unreadable_by_others(path: Path) -> str | None:
    """Why a user other than the owner cannot read ``path`` (a directory on the way others may not search, or the
    file not readable by others), or None."""
    try:
        own = path.stat().st_mode
        if not own & stat.S_IROTH:
            return f"{path} is mode {stat.S_IMODE(own):04o}"
        for d in path.parents:
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                return f"directory {d} is mode {stat.S_IMODE(mode):04o}"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    return None


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` (mode ``mode``) in one rename."""
    tmp = path.with_name(f".{path.name}.flexmig-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    tmp.chmod(mode)
    tmp.replace(path)


def _read_trusted(path: Path, what: str) -> str:
    """The text of a file flexmig rewrites (gres.conf, its GRES map), empty when it does not exist yet; only if root
    (or this user) owns it and nobody else can change it or its directories, as for flexmig's own configuration."""
    try:
        path.lstat()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise SlurmError(f"{path}: cannot read {what}: {exc.strerror}") from None
    try:
        return read_trusted_text(path, what=what, max_bytes=_MAX_FILE)
    except ConfigError as exc:
        raise SlurmError(str(exc)) from None


def _read_small(path: Path, what: str) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise SlurmError(f"{path}: cannot read {what}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise SlurmError(f"{path}: {what} is not a regular file; refused")
    if st.st_size > _MAX_FILE:
        raise SlurmError(f"{path}: {what} is larger than {_MAX_FILE} bytes; refused")
    return path.read_text()


@dataclass
class Supply:
    """Writes what Slurm and the TaskProlog read about node ``node``.

    ``simulated``: the node is flexmig's simulator, so the MIG minors table is rendered (when ``mig_minors`` does
    not exist yet) and stand-in devices are made under ``dev_dir``. ``gpu``: the node is that one GPU's (``[slurm]
    node_per_gpu``): only its MIG devices are the node's; None: every GPU's. ``start`` (with ``gpu``): the node is
    the one MIG instance at that memory slice (``[slurm] node_per_instance``); ``profile`` (with ``start``): only an
    instance of that MIG profile (a static node's, ``[slurm] instance_nodes = static``). ``places``: the node is
    these MIG instances, ``(gpu, start)``, of the host (a pool node, :mod:`flexmig.slurm.pool`; set by its maker).
    """

    node: str
    gres_conf: Path
    map_path: Path
    dev_dir: Path = Path("/dev")
    mig_minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    simulated: bool = False
    hook: dict[str, Any] = field(default_factory=dict)
    gpu: int | None = None
    start: int | None = None
    profile: str | None = None
    places: frozenset[tuple[int, int]] | None = None
    _map_problem: str | None = field(default=None, init=False, repr=False, compare=False)

    def minors(self, gpus: int) -> MigMinors:
        """The MIG minors table (the driver's; on a simulated node, ours, written once)."""
        if self.simulated and not self.mig_minors.exists():
            self.mig_minors.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.mig_minors, render_mig_minors(max(1, gpus)))
        text = _read_small(self.mig_minors, "the MIG minors table")
        if not text:
            raise SlurmError(f"{self.mig_minors} is missing: is the NVIDIA driver loaded with MIG enabled?")
        return parse_mig_minors(text, str(self.mig_minors))

    def records(self, inv: Inventory) -> tuple[GresRecord, ...]:
        """The node's MIG devices as gres records (GRES index order)."""
        records = gres_records(inv, self.minors(len(inv.gpus)), str(self.dev_dir))
        if self.places is not None:
            return tuple(r for r in records if (r.gpu, r.start) in self.places)
        if self.gpu is None:
            return records
        return tuple(
            r for r in records
            if r.gpu == self.gpu and (self.start is None or r.start == self.start)
            and (self.profile is None or r.type == self.profile)
        )  # fmt: skip

    def gres_conf_text(self) -> str:
        """gres.conf's text, read as :meth:`write` would (SlurmError when flexmig may not rewrite it)."""
        return _read_trusted(self.gres_conf, "gres.conf")

    def write(self, inv: Inventory) -> tuple[GresRecord, ...]:
        """Write gres.conf's block, the map, and (simulated) the stand-ins for ``inv``; returns the records."""
        records = self.records(inv)
        if self.simulated:
            self._stand_ins(records)
        existing = _read_trusted(self.gres_conf, "gres.conf")
        text = merge_block(existing, self.node, records, str(self.gres_conf))
        if text != existing:
            self.gres_conf.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.gres_conf, text)
        make_public_dirs(self.map_path.parent)
        doc = gres_map(self.node, records, self.hook)
        atomic_write(self.map_path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
        why = unreadable_by_others(self.map_path)
        if why != self._map_problem:
            self._map_problem = why
            if why is not None:
                log.warning(
                    "the GRES map %s cannot be read by the jobs' users (%s): the TaskProlog runs as the job's user, "
                    "so their tasks get no GPU; let others search every directory on the way (chmod o+x)",
                    self.map_path, why,
                )  # fmt: skip
        return records

    def retire(self) -> None:
        """Remove what :meth:`write` wrote for the node (its gres.conf block and map): the node is gone for good."""
        existing = _read_trusted(self.gres_conf, "gres.conf")
        text = drop_block(existing, self.node, str(self.gres_conf))
        if text != existing:
            atomic_write(self.gres_conf, text)
        with contextlib.suppress(FileNotFoundError):
            self.map_path.unlink()

    def index_map(self) -> dict[int, tuple[int, int, str]]:
        """GRES index -> (GPU, start, profile) as last written (empty before the first write)."""
        text = _read_trusted(self.map_path, "the GRES map")
        if not text:
            return {}
        doc = parse_gres_map(text, str(self.map_path))
        out: dict[int, tuple[int, int, str]] = {}
        for d in doc["devices"]:
            try:
                out[int(d["index"])] = (int(d["gpu"]), int(d["start"]), str(d["type"]))
            except (KeyError, TypeError, ValueError):
                raise SlurmError(f"{self.map_path}: malformed device entry {d!r}") from None
        return out

    def instances(self, inv: Inventory) -> dict[int, Instance]:
        """GRES index -> the planner's instance, for the indices whose instance still exists with its profile."""
        out: dict[int, Instance] = {}
        models = {g.index: model_by_name(g.name) if g.name else None for g in inv.gpus}
        for index, (gpu, start, profile) in self.index_map().items():
            model = models.get(gpu)
            if model is None:
                continue
            try:
                out[index] = Instance(gpu, start, model.profile(profile))
            except KeyError:
                continue
        return out

    def _stand_ins(self, records: tuple[GresRecord, ...]) -> None:
        dev = self.dev_dir.resolve()
        if dev == Path("/dev") or Path("/dev") in dev.parents:
            raise SlurmError(f"[slurm] dev_dir {self.dev_dir} is under /dev: a simulated node's stand-ins go elsewhere")
        for r in records:
            for name in r.files:
                path = Path(name)
                try:
                    st = path.lstat()
                except FileNotFoundError:
                    try:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
                    except OSError as exc:
                        raise SlurmError(
                            f"{path}: cannot make a stand-in device: {exc.strerror} (needs root)"
                        ) from None
                    continue
                if not stat.S_ISCHR(st.st_mode):
                    raise SlurmError(f"{path} exists and is not a character device; gres.conf needs one")
