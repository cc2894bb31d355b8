#!/usr/bin/env python3
"""flexmig's Slurm TaskProlog: gives each task its MIG devices by UUID and the checkpoint hook's variables.

Slurm runs the TaskProlog (slurm.conf ``TaskProlog=``) as the job's user before every task, and adds the
``export NAME=VALUE`` lines it prints to the task's environment (verified on Slurm 22.05.8). Slurm itself sets
``CUDA_VISIBLE_DEVICES`` to the job's GRES *indices* (``0,2``), which CUDA would read as whole GPUs; this script
maps each index to the ``MIG-<uuid>`` of the instance flexmigd registered at that index, from the map flexmigd
writes with the node's gres.conf lines (a map path with ``{node}`` in it is that node's: ``SLURMD_NODENAME``), and
sets:

* ``CUDA_VISIBLE_DEVICES=MIG-<uuid>[,MIG-<uuid>...]`` (and ``FLEXMIG_SLURM_GPUS``, the indices it came from);
* ``FLEXMIG_JOB=slurm-<job id>``, ``FLEXMIG_CHECKPOINT_DIR`` (created, mode 0700, below the user's base, with no
  symlink followed), ``FLEXMIG_ACK_PATH`` (in that directory, so it travels with the checkpoint),
  ``FLEXMIG_CHECKPOINT_SIGNAL`` and ``FLEXMIG_ACK_WAIT_S`` (the hook waits this long after acknowledging, for
  flexmig to requeue the job, instead of exiting and completing); and it writes :data:`MARKER_NAME` there, which
  tells flexmigd that the hook is on for this run of the job (:mod:`flexmig.slurm.hookcheck`): only then may the
  job be checkpointed and requeued;
* after a requeue, when the job acknowledged a checkpoint: ``FLEXMIG_RESUME`` and ``FLEXMIG_RESUME_STEP``, read
  from the acknowledgement kept in the job's own checkpoint directory (so the resume step is keyed by the Slurm
  job ID).

The checkpoint directory is ``[slurm] checkpoint_dir`` cut in three (:func:`checkpoint_parts`): the directories
before its first placeholder are root's, the first with one is the user's *base*, and the rest are the job's. No
user may make a base, or another user could own it (or its parents) and turn off everyone's hook: the same script,
as slurm.conf's ``Prolog=`` (:data:`ROLE` ``prolog``; slurmd runs it as root before the job's first task), makes
the root part (0755) and the user's base (0700, the user's) with :func:`prepare_base`, taking back one another user
planted in a directory anybody may write in (a sticky one such as /var/tmp). The TaskProlog then only checks that
they are so, and makes the job's part.

Standard library only, no flexmig import: any ``python3`` on the node runs it. It never fails the task: a problem
is one ``print`` line in the job's output. Where there is no map at all (slurm.conf's TaskProlog runs on every node
of the cluster, and a node flexmig does not manage has none), the task keeps Slurm's own variables. Where the node
is flexmig's but its map cannot name the task's instances (unreadable, another node's, an index it lacks, no node
name for a per-node map), a task that asked for GPUs gets ``CUDA_VISIBLE_DEVICES`` empty, so CUDA shows it no GPU:
Slurm's indices would make CUDA pick an instance another job may hold, which fails later and less clearly. Install
it with ``flexmig slurm taskprolog --output FILE`` (which sets the map path).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MAP_PATH = "/run/flexmig/slurm/gres-map.json"
"""Where flexmigd writes the GRES map; ``flexmig slurm taskprolog --map`` writes another path into the copy."""

ROLE = "task"
"""What this copy is: ``task``, the TaskProlog (run as the job's user; prints ``export`` lines), or ``prolog``,
slurm.conf's Prolog (run as root by slurmd; makes the user's checkpoint base). ``flexmig slurm taskprolog
--prolog`` writes the copy with ``prolog`` here."""

_MAP_MAX = 1024 * 1024
_ACK_MAX = 64 * 1024
DEFAULT_CHECKPOINT_DIR = "/var/lib/flexmig-slurm/{user}/{job_id}"
ACK_NAME = "flexmig-ack.json"


def _clean(value: str) -> str:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError(f"refusing a value with a line break: {value[:40]!r}")
    return value


def _read_json(path: Path, limit: int, *, roots: bool = False) -> Any:
    """``path`` decoded (no symlink followed, at most ``limit`` bytes); ``roots``: only a file of root's that nobody
    else may write (the Prolog runs as root and must not take its orders from a user's file)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if roots and (st.st_uid != 0 or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode)):
            raise ValueError(f"{path} is not a file of root's that only root may write")
        for d in path.parents if roots else ():
            if not _trusted_dir(d.stat()):
                raise ValueError(f"{path}: directory {d} is not root's alone (others could put another map there)")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return json.loads(data.decode("utf-8"))


def _indices(env: Mapping[str, str]) -> list[int]:
    text = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    out: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def checkpoint_dir(template: str, job_id: int | str, user: str, uid: int | str) -> Path:
    """The checkpoint directory of a job: ``template`` with ``{job_id}``, ``{user}`` and ``{uid}`` filled in.

    flexmigd computes the same path to read the job's acknowledgement, so both sides agree by construction.
    """
    fixed, base, below = checkpoint_parts(template, job_id, user, uid)
    return fixed.joinpath(base, *below)


def checkpoint_parts(template: str, job_id: int | str, user: str, uid: int | str) -> tuple[Path, str, list[str]]:
    """``template`` cut in three: the directories before its first placeholder (root's: the *fixed* part), the first
    directory with one (the user's *base*, made by root for the user: the Prolog), and the names below it (made by
    the TaskProlog, as the user). ValueError for a template that is not absolute, has ``..``, or no placeholder."""
    raw = Path(template)
    if not raw.is_absolute() or ".." in raw.parts:
        raise ValueError(f"checkpoint directory {template} is not an absolute path without '..'")
    parts = raw.parts
    first = next((i for i, part in enumerate(parts) if "{" in part), None)
    if first is None:
        raise ValueError(f"checkpoint directory {template} has no {{job_id}}, {{user}} or {{uid}}")
    names = [part.format(job_id=job_id, user=user, uid=uid) for part in parts[first:]]
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\x00" in name:
            raise ValueError(f"checkpoint directory {template}: {name!r} is not a directory name")
    return Path(*parts[:first]), names[0], names[1:]


def _trusted_dir(st: os.stat_result) -> bool:
    """Root's, and nobody else can put another entry in its place: not writable by group or others, or sticky."""
    mode = stat.S_IMODE(st.st_mode)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and (not mode & 0o022 or bool(mode & stat.S_ISVTX))


def _open_nofollow(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def resolve_fixed(fixed: Path) -> Path:
    """``fixed`` with root's symlinks on the way resolved (the operator's, such as /var/tmp -> /tmp); a symlink of
    anybody else's is left as it is, for the walk to refuse or take back (it was planted)."""
    cur = Path("/")
    for name in fixed.parts[1:]:
        nxt = cur / name
        with contextlib.suppress(OSError):
            st = os.lstat(nxt)
            if stat.S_ISLNK(st.st_mode) and st.st_uid == 0:
                nxt = Path(os.path.realpath(nxt))
        cur = nxt
    return cur


def _walk_fixed(fixed: Path, take_back: bool, out: list[str]) -> int:
    """A descriptor of the template's fixed part, every directory of it root's (:func:`_trusted_dir`); ``take_back``
    (the Prolog, as root): missing directories are made (0755) and one that another user made in a directory where
    anybody may (sticky, like /var/tmp) is put aside for a fresh one of root's. ValueError when it is not root's."""
    real = resolve_fixed(fixed)
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = Path("/")
        for name in real.parts[1:]:
            parent = os.fstat(fd)
            where = where / name
            try:
                nxt = _open_nofollow(name, fd)
            except FileNotFoundError:
                if not take_back:
                    raise ValueError(f"{where} does not exist (flexmig's Prolog makes it, as root)") from None
                nxt = _make_dir_or_open(fd, name)
            except OSError:  # a symlink or not a directory, planted after realpath
                nxt = -1
            st = os.fstat(nxt) if nxt >= 0 else os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not _trusted_dir(st):
                if nxt >= 0:
                    os.close(nxt)
                if not (take_back and _open_to_all(parent)):
                    raise ValueError(f"{where} is {_owner(st)}, not root's alone: it must be a directory of root's "
                                     "that nobody else may write in")
                nxt = _take_back(fd, where, (0, 0, 0o755), st, out)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _owner(st: os.stat_result) -> str:
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
    return f"{kind} of uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


def _open_to_all(st: os.stat_result) -> bool:
    """Anybody may make entries in this directory (a shared scratch directory such as /tmp or /var/tmp)."""
    return bool(stat.S_IMODE(st.st_mode) & 0o002)


def _make_dir(dir_fd: int, name: str, uid: int, gid: int, mode: int) -> int:
    """Make ``name`` in ``dir_fd`` with exactly ``mode`` (whatever the umask), owned by ``uid``:``gid``; its fd."""
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = _open_nofollow(name, dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"{name}: replaced while it was made")
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_dir_or_open(dir_fd: int, name: str) -> int:
    """Make root's directory ``name`` (0755); where someone made it first (a race in a directory anybody may write
    in), its descriptor, or -1 when it is not a directory, for the caller to judge."""
    try:
        return _make_dir(dir_fd, name, 0, 0, 0o755)
    except FileExistsError:
        try:
            return _open_nofollow(name, dir_fd)
        except OSError:
            return -1


_RENAME_EXCHANGE = 2


def _exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap entries ``a`` and ``b`` of ``dir_fd`` in one step (``renameat2(RENAME_EXCHANGE)``): no moment without
    either, so nobody can make ``b`` again in between."""
    import ctypes  # noqa: PLC0415 - only the Prolog's rare take-back needs it

    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(38, "renameat2 is not available")
    if fn(dir_fd, a.encode(), dir_fd, b.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _take_back(dir_fd: int, where: Path, owner: tuple[int, int, int], st: os.stat_result, out: list[str]) -> int:
    """Put another user's ``name`` (in a directory anybody may write in) aside for a fresh directory with ``owner``
    (uid, gid, mode), swapped in atomically; the fresh one's descriptor. The other user's entry is kept, renamed."""
    uid, gid, mode = owner
    name = where.name
    aside = f".{name}.flexmig-{os.getpid()}-{st.st_uid}"
    fd = _make_dir(dir_fd, aside, uid, gid, mode)
    try:
        _exchange(dir_fd, aside, name)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(aside, dir_fd=dir_fd)
        raise
    out.append(f"{where} was {_owner(st)} (not made by flexmig): put aside as {where.parent / aside}, "
               f"made again for uid {uid}")  # fmt: skip
    return fd


def prepare_base(template: str, job_id: int | str, user: str, uid: int, gid: int) -> list[str]:
    """The Prolog's work (as root): the template's fixed part made (root's, 0755) and the job user's base in it made
    for that user (mode 0700), so that no user ever makes another's; what was done or refused, one line each.

    A base that exists stays as it is if it is the user's own directory. One another user made (or a symlink) is
    taken back where anybody may make entries (a sticky shared directory); elsewhere it is refused, naming it."""
    out: list[str] = []
    fixed, base, _ = checkpoint_parts(template, job_id, user, uid)
    fd = _walk_fixed(fixed, True, out)
    try:
        try:
            bfd = _open_nofollow(base, fd)
        except FileNotFoundError:
            try:
                os.close(_make_dir(fd, base, uid, gid, 0o700))
                return out
            except FileExistsError:  # someone made it in between: judged below like any other
                bfd = -1
        except OSError:
            bfd = -1
        st = os.fstat(bfd) if bfd >= 0 else os.stat(base, dir_fd=fd, follow_symlinks=False)
        if bfd >= 0:
            os.close(bfd)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return out
        if not _open_to_all(os.fstat(fd)):
            raise ValueError(f"{fixed / base} is {_owner(st)}, not user {user}'s (uid {uid}): chown it to the "
                             "user or remove it")  # fmt: skip
        os.close(_take_back(fd, fixed / base, (uid, gid, 0o700), st, out))
        return out
    finally:
        os.close(fd)


MARKER_NAME = "flexmig-hook.json"
"""The file the TaskProlog writes in the job's checkpoint directory once the hook is set up for the job: flexmigd
checkpoints and requeues a hook job only when it finds it there, the job user's, for this run of the job."""


def _job_dir(template: str, env: Mapping[str, str]) -> Path:
    """The job's checkpoint directory, made below the user's base (which must be this user's own, made by the
    Prolog) with no symlink followed, and the marker that tells flexmigd the hook is on written in it."""
    job, user, uid = env["SLURM_JOB_ID"], env.get("SLURM_JOB_USER", ""), env.get("SLURM_JOB_UID", "")
    fixed, base, below = checkpoint_parts(template, job, user, uid)
    me = os.geteuid()
    fd = _walk_fixed(fixed, False, [])
    try:
        where = fixed / base
        try:
            nxt = _open_nofollow(base, fd)
        except FileNotFoundError:
            raise ValueError(f"{where} does not exist (flexmig's Prolog makes it, as root, for each user)") from None
        except OSError as exc:
            raise ValueError(f"{where} is not a directory of this user's ({exc.strerror})") from None
        os.close(fd)
        fd = nxt
        for name in [None, *below]:
            if name is not None:
                where = where / name
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    nxt = _open_nofollow(name, fd)
                except OSError as exc:
                    raise ValueError(f"{where} is not a directory of this user's ({exc.strerror})") from None
                os.close(fd)
                fd = nxt
            if os.fstat(fd).st_uid != me:
                raise ValueError(f"{where} is not a directory of this user (uid {me})")
        _write_marker(fd, job, env.get("SLURM_RESTART_COUNT", "0"))
        return where
    finally:
        os.close(fd)


def _write_marker(dir_fd: int, job: str, restarts: str) -> None:
    doc = {"version": 1, "job_id": int(job), "restart": int(restarts or "0")}
    tmp = f".{MARKER_NAME}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, json.dumps(doc).encode() + b"\n")
    finally:
        os.close(fd)
    os.rename(tmp, MARKER_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def lines(env: Mapping[str, str], map_path: str = MAP_PATH) -> list[str]:
    """What the TaskProlog prints for a task with environment ``env``."""
    out: list[str] = []
    job = env.get("SLURM_JOB_ID")
    indices = _indices(env)
    if not job:
        return out
    node = env.get("SLURMD_NODENAME")
    if "{node}" in map_path:  # one map per node on the host ([slurm] node_per_gpu): this task's node's
        if not node or "/" in node or node.startswith("."):
            return _no_gpu(indices, f"no usable SLURMD_NODENAME for {map_path}")
        map_path = map_path.replace("{node}", node)
    try:
        doc = _read_json(Path(map_path), _MAP_MAX)
    except FileNotFoundError:
        return [f"print flexmig-taskprolog: no GRES map at {map_path}; CUDA_VISIBLE_DEVICES left as Slurm set it"]
    except (OSError, ValueError) as exc:
        return _no_gpu(indices, f"cannot read {map_path} ({exc})")
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return _no_gpu(indices, f"{map_path} is not a flexmig GRES map of version 1")
    if node and doc.get("node") not in (None, node):
        return _no_gpu(indices, f"{map_path} describes node {doc.get('node')}, not {node}")
    devices = {d.get("index"): d for d in doc.get("devices", []) if isinstance(d, dict)}
    if indices:
        uuids = []
        for i in indices:
            dev = devices.get(i)
            uuid = dev.get("uuid") if dev else None
            if not isinstance(uuid, str) or not uuid.startswith("MIG-"):
                return _no_gpu(indices, f"GRES index {i} is not in {map_path}")
            uuids.append(uuid)
        out.append(f"export CUDA_VISIBLE_DEVICES={_clean(','.join(uuids))}")
        out.append(f"export FLEXMIG_SLURM_GPUS={','.join(str(i) for i in indices)}")
    hook = doc.get("hook")
    out.extend(_hook_lines(env, hook if isinstance(hook, dict) else {}))
    return out


def _no_gpu(indices: list[int], why: str) -> list[str]:
    """The lines for a task on a flexmig node whose map cannot name its instances (``why``): no GPU for CUDA when
    the task asked for some (``indices``), rather than Slurm's indices, which CUDA reads as another instance."""
    if not indices:
        return [f"print flexmig-taskprolog: {why}"]
    return [
        f"print flexmig-taskprolog: {why}; CUDA_VISIBLE_DEVICES emptied, so this task sees no GPU "
        f"(Slurm gave it GRES index {','.join(str(i) for i in indices)})",
        "export CUDA_VISIBLE_DEVICES=",
    ]


def _hook_lines(env: Mapping[str, str], hook: Mapping[str, Any]) -> list[str]:
    template = hook.get("checkpoint_dir") if isinstance(hook.get("checkpoint_dir"), str) else DEFAULT_CHECKPOINT_DIR
    try:
        ckpt = _job_dir(str(template), env)
    except (OSError, KeyError, ValueError) as exc:
        return [f"print flexmig-taskprolog: no checkpoint directory ({exc}); the checkpoint hook is off for this job"]
    ack = ckpt / ACK_NAME
    sig = hook.get("signal") if isinstance(hook.get("signal"), str) else "SIGUSR1"
    given = hook.get("ack_wait_s")
    wait = float(given) if isinstance(given, int | float) and not isinstance(given, bool) else 600.0
    out = [
        f"export FLEXMIG_JOB=slurm-{env['SLURM_JOB_ID']}",
        f"export FLEXMIG_CHECKPOINT_DIR={_clean(str(ckpt))}",
        f"export FLEXMIG_ACK_PATH={_clean(str(ack))}",
        f"export FLEXMIG_CHECKPOINT_SIGNAL={_clean(str(sig))}",
        f"export FLEXMIG_ACK_WAIT_S={wait:g}",
    ]
    try:
        got = _read_json(ack, _ACK_MAX)
    except FileNotFoundError:
        return out
    except (OSError, ValueError) as exc:
        return [*out, f"print flexmig-taskprolog: ignoring unreadable acknowledgement {ack} ({exc}); starting afresh"]
    step, path = (got.get("step"), got.get("checkpoint")) if isinstance(got, dict) else (None, None)
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0 and isinstance(path, str) and path:
        out += [f"export FLEXMIG_RESUME={_clean(path)}", f"export FLEXMIG_RESUME_STEP={step}"]
    return out


def prolog_lines(env: Mapping[str, str], map_path: str = MAP_PATH) -> list[str]:
    """The Prolog's work for a job with environment ``env`` (slurmd runs it as root before the job's first task):
    the user's checkpoint base made for them (:func:`prepare_base`); what it did or why not, one line each (for
    slurmd's log). Nothing where the node has no map (not flexmig's)."""
    job, user, uid_text = env.get("SLURM_JOB_ID"), env.get("SLURM_JOB_USER", ""), env.get("SLURM_JOB_UID", "")
    if not job or not uid_text.isdigit():
        return []
    node = env.get("SLURMD_NODENAME")
    if "{node}" in map_path:
        if not node or "/" in node or node.startswith("."):
            return [f"no usable SLURMD_NODENAME for {map_path}"]
        map_path = map_path.replace("{node}", node)
    try:
        doc = _read_json(Path(map_path), _MAP_MAX, roots=True)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        return [f"cannot read {map_path} ({exc}): no checkpoint base made for job {job}"]
    hook = doc.get("hook") if isinstance(doc, dict) else None
    template = hook.get("checkpoint_dir") if isinstance(hook, dict) else None
    uid = int(uid_text)
    gid_text = env.get("SLURM_JOB_GID", "")
    try:
        gid = int(gid_text) if gid_text.isdigit() else _user_gid(uid)
        return prepare_base(template if isinstance(template, str) else DEFAULT_CHECKPOINT_DIR, job, user, uid, gid)
    except (OSError, ValueError, KeyError) as exc:
        return [f"no checkpoint base for job {job} of {user} (uid {uid}): {exc}; its checkpoint hook is off"]


def _user_gid(uid: int) -> int:
    import pwd  # noqa: PLC0415 - only when Slurm did not say

    return pwd.getpwuid(uid).pw_gid


def main(argv: list[str] | None = None) -> int:
    """Print the lines for this task (or, as the Prolog, make the checkpoint base); always 0: a TaskProlog failure
    would only hide the reason, and a Prolog failure drains the node and requeues the job."""
    args = sys.argv[1:] if argv is None else argv
    map_path = args[args.index("--map") + 1] if "--map" in args[:-1] else MAP_PATH
    if ROLE == "prolog" or "--prolog" in args:
        try:
            for line in prolog_lines(os.environ, map_path):
                print(f"flexmig-prolog: {line}", file=sys.stderr)
        except Exception as exc:  # never fail the job
            print(f"flexmig-prolog: internal error {exc!r}; no checkpoint base made", file=sys.stderr)
        return 0
    try:
        for line in lines(os.environ, map_path):
            print(line)
    except Exception as exc:  # never fail the task
        print(f"print flexmig-taskprolog: internal error {exc!r}; devices left as Slurm set them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
