"""Whether a Slurm job's checkpoint hook is really on: the TaskProlog's word, read back by root with no link followed.

A job asks for the hook with ``--requeue`` and the hook token in its comment, but only the TaskProlog can give it
the hook: it makes the job's checkpoint directory below the user's base (which the Prolog made, as root) and hands
the job its variables. Where it could not (no base, a base that is not the user's, a directory another user
planted), the job runs without them, and a checkpoint signal would end it with its work lost. So the TaskProlog
writes a marker (:data:`~flexmig.slurm.taskprolog.MARKER_NAME`) in the checkpoint directory once the hook is set
up, and flexmigd counts a hook job as movable only when the marker is there: in the job's directory, reached from
``/`` with no symlink followed, the directory and the marker both the job user's, naming this job and this run of
it (``SLURM_RESTART_COUNT``; a marker left by the run before a requeue does not count).

Only the job's user (or root) can write in that directory, so a marker there says what that user's TaskProlog saw;
a user who writes one by hand can only get their own job checkpointed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from flexmig.act.userpaths import UserPathError, open_dir
from flexmig.hook.boundedjson import JsonBoundsError, loads
from flexmig.slurm.squeue import SlurmJob
from flexmig.slurm.taskprolog import MARKER_NAME, checkpoint_parts, resolve_fixed

__all__ = ["hook_problem", "job_checkpoint_dir"]

_MARKER_MAX = 4096


def job_checkpoint_dir(template: str, job_id: int | str, user: str, uid: int | str) -> Path:
    """The job's checkpoint directory as flexmigd reaches it: the template's fixed part (the operator's, perhaps
    below root's symlinks such as /var/tmp -> /tmp) resolved, the part the user owns as it is. ValueError for a
    template or names that do not make a path."""
    fixed, base, below = checkpoint_parts(template, job_id, user, uid)
    return resolve_fixed(fixed).joinpath(base, *below)


def hook_problem(template: str, job: SlurmJob) -> str | None:
    """None when ``job``'s TaskProlog set up its checkpoint hook for the run under way; else why it is not on."""
    try:
        where = job_checkpoint_dir(template, job.job_id, job.user, job.user_id)
    except ValueError as exc:
        return str(exc)
    marker = where / MARKER_NAME
    try:
        fd = open_dir(where)
    except FileNotFoundError:
        return f"{where} does not exist"
    except (UserPathError, OSError) as exc:
        return f"{where}: {exc}"
    try:
        if os.fstat(fd).st_uid != job.user_id:
            return f"{where} is not the job user's (uid {job.user_id})"
        try:
            mfd = os.open(MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except FileNotFoundError:
            return f"no {marker}: the TaskProlog did not set the hook up"
        except OSError as exc:
            return f"{marker}: {exc.strerror}"
        try:
            st = os.fstat(mfd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != job.user_id:
                return f"{marker} is not a file of the job user's (uid {job.user_id})"
            data = os.read(mfd, _MARKER_MAX + 1)
        finally:
            os.close(mfd)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    try:
        doc = loads(data, max_bytes=_MARKER_MAX, max_depth=2)
    except JsonBoundsError as exc:
        return f"{marker}: {exc}"
    if not isinstance(doc, dict) or doc.get("job_id") != job.job_id:
        return f"{marker} is not this job's"
    if doc.get("restart") != job.restart_count:
        return f"{marker} is of run {doc.get('restart')!r} of the job, not of run {job.restart_count} (under way)"
    return None
