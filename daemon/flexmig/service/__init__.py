"""The service layer of the running daemon, below the wiring: what the daemon does with its actuator, each part built
with what it needs through its constructor once the actuator is open.

* :class:`~flexmig.service.actuator_runtime.ActuatorRuntime`: the actuator's state from start to close and what it
  answers while it runs (requests, the mode switch at reload, the drain); :func:`flexmig.wiring.wire` builds one and
  gives it to the actuator component (which keeps it as ``runtime`` and runs its lifecycle), the Slurm part and the
  MQTT commands;
* :class:`~flexmig.act.mode.RuntimeMode` (one object, made by the runtime, read by every part and by ``act``);
* :class:`~flexmig.service.gate.ActionGate`: the action lock and the stop;
* :class:`~flexmig.service.planning_loop.PlanningLoop`: plan, publish, execute, round after round;
* :class:`~flexmig.service.strays.StrayWatch`: ranks of no journalled job;
* :class:`~flexmig.service.action_sink.ActionSink`: the actuator's events into metrics, log lines, fleet events;
* :class:`~flexmig.service.control.DaemonControl`: the control operations (``DaemonOps``) and the handlers of every
  row of the operation table, the acting ones under the gate;
* :mod:`~flexmig.service.standdown`, :mod:`~flexmig.service.daemon_status`, :mod:`~flexmig.service.action_record`
  and :mod:`~flexmig.service.first_step`: what those use;
* :mod:`~flexmig.service.assembly` (the parts put together on the open actuator, and what a configuration gives it),
  :mod:`~flexmig.service.planning` and :mod:`~flexmig.service.plan_now` (what the planner sees, one look now),
  :mod:`~flexmig.service.actuator_host` and :mod:`~flexmig.service.simdirs` (the actuator's paths and locks),
  :mod:`~flexmig.service.privileges` (mode act's capabilities);
* :class:`~flexmig.service.detection.Detector`: detection's step on each published snapshot;
* the Slurm part, built before the actuator: :class:`~flexmig.service.slurm_agents.SlurmAgents` (the one runner of
  ``slurm_reregister``, routing by node and handed to the actuator's constructor; the layout, read without blocking
  by :mod:`~flexmig.service.slurm_layout`; the agents), :class:`~flexmig.service.slurm_rounds.SlurmRounds` (the
  probe loop and the rounds) and :class:`~flexmig.service.slurm_reporting.SlurmReporting` (log lines, metrics,
  events).

The wiring's :class:`flexmig.wiring.actuator.ActuatorComponent` opens the actuator, has its runtime build these on it
(:meth:`~flexmig.service.actuator_runtime.ActuatorRuntime.services_on`) and runs their loops, and
:class:`flexmig.wiring.slurm.SlurmComponent` runs the Slurm part's; they hold no policy of their own.
"""

from flexmig.service.action_sink import ActionSink
from flexmig.service.control import DaemonControl
from flexmig.service.gate import ActionGate
from flexmig.service.planning_loop import PlanningLoop, PlanNow, PlanRound
from flexmig.service.strays import StrayWatch

__all__ = ["ActionGate", "ActionSink", "DaemonControl", "PlanNow", "PlanRound", "PlanningLoop", "StrayWatch"]
