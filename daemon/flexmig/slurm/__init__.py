"""Slurm: the node's MIG layout follows Slurm's pending demand, the thing Slurm cannot do by itself.

Demand in (``squeue --json``, ``sinfo --json``, read into typed values by :mod:`~flexmig.slurm.squeue` and
:mod:`~flexmig.slurm.nodes`), supply out (gres.conf lines and a dynamic-node re-registration,
:mod:`~flexmig.slurm.gresconf` and :mod:`~flexmig.slurm.slurmd`), and the TaskProlog that gives jobs their MIG
devices by UUID (:mod:`~flexmig.slurm.taskprolog`). :mod:`~flexmig.slurm.testbed` runs a private Slurm for the
tests and ``flexmig slurm testbed``.
"""
