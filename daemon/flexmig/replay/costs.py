"""The action costs trace replay assumes: those of large training jobs, not of the daemon's measured examples.

The planner's defaults (:class:`~flexmig.plan.types.PlannerSettings`, and so ``flexmigd``'s ``[planner]`` table)
are the costs measured on this repository's examples: a checkpoint in 3 s, a restart in 6 s. The replayed trace
holds production jobs of whole and fractional GPUs, whose checkpoints and restarts take longer, so replay charges
more for every move and moves less eagerly:

* ``checkpoint_s`` 20: a training step boundary plus writing a state dict of a few GB to local disk;
* ``restart_s`` 30: process launch, a CUDA context on the new MIG device, loading the checkpoint;
* ``reconfigure_s`` 2: one GPU-instance create or destroy (public sources say only "order of seconds");
* ``settling_s`` 600: no job moves twice within ten minutes;
* ``gain_margin`` 1: a move must gain at least twice what it costs.

The replay results published for flexmig were computed with these costs; ``flexmig simulate`` takes them as its
defaults, and its ``--checkpoint-s``, ``--restart-s``, ``--reconfigure-s``, ``--settling-s`` and ``--gain-margin``
change them (``--daemon-costs`` starts from the daemon's instead).
"""

from __future__ import annotations

from flexmig.plan.types import PlannerSettings

__all__ = ["REPLAY_SETTINGS"]

REPLAY_SETTINGS = PlannerSettings(
    checkpoint_s=20.0,
    restart_s=30.0,
    standby_restart_s=30.0,  # the traces' jobs have no standby ranks: every move restarts cold
    reconfigure_s=2.0,
    settling_s=600.0,
    gain_margin=1.0,
)
"""Planner settings for replaying large-model traces (see the module docstring)."""
