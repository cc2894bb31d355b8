#!/usr/bin/env python3
"""flexmig's Slurm TaskProlog: gives each task its MIG devices by UUID and the checkpoint hook's variables.

Slurm runs the TaskProlog (slurm.conf ``TaskProlog=``) as the job's user before every task, and adds the
``export NAME=VALUE`` lines it prints to the task's environment (verified on Slurm 22.05.8). Slurm itself sets
``CUDA_VISIBLE_DEVICES`` to the job's GRES *indices* (``0,2``), which CUDA would read as whole GPUs; this script
maps each index to the ``MIG-<uuid>`` of the instance flexmigd registered at that index, from the map flexmigd
writes with the node's gres.conf lines (a map path with ``{node}`` in it is that node's: ``SLURMD_NODENAME``), and
sets:

* ``CUDA_VISIBLE_DEVICES=MIG-<uuid>[,MIG-<uuid>...]`` (and ``FLEXMIG_SLURM_GPUS``, the indices it came from);
* ``FLEXMIG_JOB=slurm-<job id>``, ``FLEXMIG_CHECKPOINT_DIR`` (created, mode 0700), ``FLEXMIG_ACK_PATH`` (in that
  directory, so it travels with the checkpoint), ``FLEXMIG_CHECKPOINT_SIGNAL`` and ``FLEXMIG_ACK_WAIT_S`` (the
  hook waits this long after acknowledging, for flexmig to requeue the job, instead of exiting and completing);
* after a requeue, when the job acknowledged a checkpoint: ``FLEXMIG_RESUME`` and ``FLEXMIG_RESUME_STEP``, read
  from the acknowledgement kept in the job's own checkpoint directory (so the resume step is keyed by the Slurm
  job ID).

Standard library only, no flexmig import: any ``python3`` on the node runs it. It never fails the task: a problem
is one ``print`` line in the job's output. Where there is no map at all (slurm.conf's TaskProlog runs on every node
of the cluster, and a node flexmig does not manage has none), the task keeps Slurm's own variables. Where the node
is flexmig's but its map cannot name the task's instances (unreadable, another node's, an index it lacks, no node
name for a per-node map), a task that asked for GPUs gets ``CUDA_VISIBLE_DEVICES`` empty, so CUDA shows it no GPU:
Slurm's indices would make CUDA pick an instance another job may hold, which fails later and less clearly. Install
it with ``flexmig slurm taskprolog --output FILE`` (which sets the map path).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MAP_PATH = "/run/flexmig/slurm/gres-map.json"
"""Where flexmigd writes the GRES map; ``flexmig slurm taskprolog --map`` writes another path into the copy."""

_MAP_MAX = 1024 * 1024
_ACK_MAX = 64 * 1024
DEFAULT_CHECKPOINT_DIR = "/var/tmp/flexmig-slurm/{user}/{job_id}"  # noqa: S108 - ownership checked in _own_dir
ACK_NAME = "flexmig-ack.json"


def _clean(value: str) -> str:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ValueError(f"refusing a value with a line break: {value[:40]!r}")
    return value


def _read_json(path: Path, limit: int) -> Any:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
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
    path = Path(template.format(job_id=job_id, user=user, uid=uid))
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError(f"checkpoint directory {path} is not an absolute path without '..'")
    return path


def _own_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and refuse it unless it and its parent are real directories of this user.

    Under a shared base such as /var/tmp another user could have made ``{user}`` a symbolic link to a directory
    of theirs, to read this job's checkpoints.
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for p in (path.parent, path):
        st = os.lstat(p)
        if not os.path.isdir(p) or os.path.islink(p) or st.st_uid != os.geteuid():  # noqa: PTH112, PTH114
            raise ValueError(f"{p} is not a directory of this user (uid {os.geteuid()})")


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
        ckpt = checkpoint_dir(
            str(template), env["SLURM_JOB_ID"], env.get("SLURM_JOB_USER", ""), env.get("SLURM_JOB_UID", "")
        )
        _own_dir(ckpt)
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


def main(argv: list[str] | None = None) -> int:
    """Print the lines for this task; always 0 (a TaskProlog failure would only hide the reason)."""
    args = sys.argv[1:] if argv is None else argv
    map_path = args[args.index("--map") + 1] if "--map" in args[:-1] else MAP_PATH
    try:
        for line in lines(os.environ, map_path):
            print(line)
    except Exception as exc:  # never fail the task
        print(f"print flexmig-taskprolog: internal error {exc!r}; devices left as Slurm set them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
