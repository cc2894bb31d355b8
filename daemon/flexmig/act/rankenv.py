"""What each rank of a job is started with: its user, its environment, its command line.

Each rank gets ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``, the hook variables and the daemon's markers; with the ``plain``
launcher the world of torch.distributed too, with ``torchrun`` one elastic agent per instance meeting in a c10d
rendezvous on loopback (:mod:`flexmig.act.supervisor` says why). Pure functions of the job record, apart from the
user database lookup and :func:`free_port`; the supervisor starts what they describe.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
from collections.abc import Mapping
from pathlib import Path

from flexmig.act.procs import LaunchRequest
from flexmig.act.ranklogs import DEFAULT_RANK_LOGS, RankLogs
from flexmig.act.records import AckPlacement, JobRecord
from flexmig.hook.protocol import (
    ENV_ACK_PATH,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_SIGNAL,
    ENV_DIST_BACKEND,
    ENV_GENERATION,
    ENV_JOB,
    ENV_JOB_ID,
    ENV_RESUME,
    ENV_RESUME_STEP,
    ENV_SLOT,
    ENV_STANDBY_FD,
    Ack,
)
from flexmig.jobspec.spec import JobSpec

__all__ = ["LOOPBACK", "free_port", "mig_visible", "rank_requests", "rank_world"]

LOOPBACK = "127.0.0.1"
"""Where a job's ranks meet (one node: never another address)."""
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (for a job's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _identity(user: str, group: str | None) -> tuple[int | None, int | None, tuple[int, ...] | None, str]:
    """(uid, gid, groups, home) to switch to, or Nones when no switch is needed (or possible)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise OSError(f"no such user {user!r}") from None
    home = pw.pw_dir or "/"
    if os.geteuid() != 0:
        return None, None, None, home
    gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    if pw.pw_uid == 0 and gid == 0:
        return None, None, None, home
    return pw.pw_uid, gid, tuple(os.getgrouplist(user, gid)), home


def mig_visible(uuid: str) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for a MIG device UUID (NVML's UUIDs already start with ``MIG-``)."""
    return uuid if uuid.startswith("MIG-") else f"MIG-{uuid}"


def rank_world(rec: JobRecord, slot: int, *, port: int, resume: Ack | None, host: str = LOOPBACK) -> dict[str, str]:
    """The variables that place slot ``slot`` of ``rec`` in its world: the checkpoint to resume from and, with the
    ``plain`` launcher, torch.distributed's ``RANK``, ``WORLD_SIZE``, ``LOCAL_*``, ``MASTER_*`` (torchrun sets
    those itself). In a rank's environment from the start, or handed to a standby rank when its move comes."""
    env: dict[str, str] = {}
    if resume is not None:
        env[ENV_RESUME] = resume.checkpoint
        env[ENV_RESUME_STEP] = str(resume.step)
    if rec.spec.launcher == "plain":
        env.update(
            RANK=str(slot),
            WORLD_SIZE=str(len(rec.slots)),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=host,
            MASTER_PORT=str(port),
        )
    return env


def rank_requests(
    rec: JobRecord,
    logs_dir: Path,
    *,
    port: int,
    resume: Ack | None,
    host: str = LOOPBACK,
    acks: AckPlacement | None = None,
    log_limits: RankLogs = DEFAULT_RANK_LOGS,
    standby: Mapping[int, int] | None = None,
) -> list[LaunchRequest]:
    """The launch requests of every rank of ``rec`` (its ``slots``, ``generation`` and spec), in slot order.

    ``standby`` maps slots to start as standby ranks to the descriptor of their channel: those get
    ``FLEXMIG_STANDBY_FD`` and inherit it, and get their world only at the handover (:func:`rank_world`).
    """
    spec = rec.spec
    uid, gid, groups, home = _identity(spec.user, spec.group)
    base = _job_env(rec, home, acks or AckPlacement())
    out = []
    for slot, place in enumerate(rec.slots):
        env = dict(base)
        env["CUDA_VISIBLE_DEVICES"] = mig_visible(place.uuid)
        env[ENV_SLOT] = str(slot)
        fd = (standby or {}).get(slot)
        if fd is not None:
            env[ENV_STANDBY_FD] = str(fd)
        else:
            env.update(rank_world(rec, slot, port=port, resume=resume, host=host))
        out.append(
            LaunchRequest(
                argv=_argv(rec, slot, host=host, port=port),
                env=env,
                cwd=spec.working_dir,
                log_path=logs_dir / spec.name / f"g{rec.generation:04d}-r{slot}.log",
                uid=uid,
                gid=gid,
                groups=groups,
                ignore_signal=int(spec.hook.signal),
                launcher_kind=spec.launcher,
                log_limits=log_limits,
                pass_fds=(fd,) if fd is not None else (),
            )
        )
    return out


def _job_env(rec: JobRecord, home: str, acks: AckPlacement) -> dict[str, str]:
    """The variables every rank of ``rec`` shares: a plain login environment, the spec's, the hook's, the markers."""
    spec: JobSpec = rec.spec
    return {
        "PATH": _BASE_PATH,
        "HOME": home,
        "USER": spec.user,
        "LOGNAME": spec.user,
        "LANG": "C.UTF-8",
        **dict(spec.env),
        ENV_JOB: spec.name,
        ENV_CHECKPOINT_DIR: str(spec.checkpoint_dir),
        ENV_ACK_PATH: str(acks.path(rec)),
        ENV_CHECKPOINT_SIGNAL: spec.hook.signal.name,
        ENV_CHECKPOINT_KEEP: str(spec.hook.keep),
        ENV_DIST_BACKEND: "gloo",
        ENV_JOB_ID: rec.uid,
        ENV_GENERATION: str(rec.generation),
    }


def _argv(rec: JobRecord, slot: int, *, host: str, port: int) -> tuple[str, ...]:
    """Slot ``slot``'s command line: the spec's own (``plain``), or one torch elastic agent of the world
    (``torchrun``)."""
    spec = rec.spec
    if spec.launcher == "plain":
        return tuple(spec.argv)
    n = len(rec.slots)
    return (
        spec.argv[0],
        "-m",
        "torch.distributed.run",
        "--nnodes",
        f"{n}:{n}",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{host}:{port}",
        "--rdzv-id",
        f"{rec.uid}-g{rec.generation}",
        "--rdzv-conf",
        f"is_host={'true' if slot == 0 else 'false'}",
        "--local-addr",
        host,
        "--max-restarts",
        "0",
        "--",  # the script's own options must not be read as (abbreviated) torchrun options
        *spec.argv[1:],
    )
