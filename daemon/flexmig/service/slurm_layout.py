"""What the Slurm part reads to choose the host's layout (``[slurm] layout = "auto"``), without blocking the event
loop: slurmd's version (``slurmd -V``, which needs no slurmctld) through the command runner the agents use
(:meth:`flexmig.slurm.client.SlurmClient.run`: a subprocess the loop waits on, killed past
``[slurm] command_timeout_s``), and slurm.conf (read on a worker thread). The choice itself is
:func:`flexmig.slurm.layout.choose_layout`, pure.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from flexmig.config import SlurmConfig
from flexmig.errors import SlurmError
from flexmig.slurm.client import SlurmClient, SlurmCommands
from flexmig.slurm.layout import declared_instance_nodes, slurm_conf_path

__all__ = ["read_layout_inputs"]

_MAX_CONF_BYTES = 16 * 1024 * 1024


def _conf_text(conf: Path) -> str:
    """slurm.conf's text (its first 16 MiB), or "" when it cannot be read."""
    try:
        with conf.open("rb") as f:
            return f.read(_MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


async def read_layout_inputs(cfg: SlurmConfig, host: str) -> tuple[str, int, str]:
    """What ``auto`` chooses by: slurmd's version (the first line ``slurmd -V`` prints; "" when it cannot be run,
    fails or does not answer within ``command_timeout_s``), the number of this host's static instance nodes slurm.conf
    declares, and slurm.conf's path. Only for ``auto``: an explicit layout reads nothing."""
    conf = slurm_conf_path(cfg)
    text = await asyncio.to_thread(_conf_text, conf)
    client = SlurmClient(SlurmCommands(cfg.bin_dir, cfg.conf, cfg.command_timeout_s))
    try:
        out = await client.run("slurmd", ["-V"])
        version = out.decode("utf-8", "replace").strip().splitlines()[0]
    except (SlurmError, IndexError):
        version = ""
    return version, len(declared_instance_nodes(text, host)), str(conf)
