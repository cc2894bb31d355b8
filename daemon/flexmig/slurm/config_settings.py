"""The ``[slurm]`` table of the configuration as the Slurm agent's settings
(:class:`flexmig.slurm.settings.SlurmSettings`).

The one place this mapping lives: the daemon's component and its reload build an agent's settings here.
"""

from __future__ import annotations

from flexmig.config import SlurmConfig
from flexmig.config.checks import per_slice_params
from flexmig.slurm.settings import SlurmSettings

__all__ = ["slurm_settings"]


def slurm_settings(cfg: SlurmConfig) -> SlurmSettings:
    """The ``[slurm]`` table as the agent's settings (the one place this mapping lives)."""
    return SlurmSettings(
        node=cfg.node,
        partitions=tuple(cfg.partitions),
        interval_s=cfg.interval_s,
        conf=cfg.conf,
        bin_dir=cfg.bin_dir,
        command_timeout_s=cfg.command_timeout_s,
        gres_conf=cfg.gres_conf,
        gres_map=cfg.gres_map,
        dev_dir=cfg.dev_dir,
        mig_minors=cfg.mig_minors,
        slurmd_pid_file=cfg.slurmd_pid_file,
        slurmd_conf=tuple(cfg.slurmd_conf.split()),
        slurmd_conf_per_slice=per_slice_params(cfg.slurmd_conf_per_slice),
        slurmd_env=cfg.slurmd_env,
        slurmd_control=cfg.slurmd_control,
        slurmd_unit=cfg.slurmd_unit,
        slurmd_hook=tuple(cfg.slurmd_hook),
        hook_token=cfg.hook_token,
        hook_settle_s=cfg.hook_settle_s,
        checkpoint_dir=cfg.checkpoint_dir,
        checkpoint_signal=cfg.checkpoint_signal,
        ack_wait_s=cfg.ack_wait_s,
        ack_timeout_s=cfg.ack_timeout_s,
        drain_timeout_s=cfg.drain_timeout_s,
        register_timeout_s=cfg.register_timeout_s,
        reregister_s=cfg.reregister_s,
        min_interval_s=cfg.min_interval_s,
        max_wait_s=cfg.max_wait_s,
        probe_s=cfg.probe_s,
        max_closed_nodes=cfg.max_closed_nodes,
        node_per_gpu=cfg.node_per_gpu,
        node_per_instance=cfg.node_per_instance,
        instance_nodes=cfg.instance_nodes,
        hold_after_s=cfg.hold_after_s,
        hold_when_idle=cfg.hold_when_idle,
        max_moves_per_job=cfg.max_moves_per_job,
        slurmd_port_base=cfg.slurmd_port_base,
    )
