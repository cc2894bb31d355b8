"""How the daemon's service layer is put together on an open actuator, and what the configuration gives the actuator.

:func:`build_services` builds the parts (:class:`~flexmig.service.planning_loop.PlanningLoop`,
:class:`~flexmig.service.strays.StrayWatch`, :class:`~flexmig.service.action_sink.ActionSink`,
:class:`~flexmig.service.control.DaemonControl`), each given what it needs through its constructor;
:func:`apply_config` gives the actuator the job policy, planner settings, rank-log limits and queue bound of a
configuration (at start and at each reload); :func:`submit_refusal` says why ``jobs.submit`` is refused.
The actuator's runtime (:class:`~flexmig.service.actuator_runtime.ActuatorRuntime`: ``services_on``, ``reload``)
and the wiring's :class:`flexmig.wiring.actuator.ActuatorComponent` (its start) call them.
"""

from __future__ import annotations

from collections.abc import Callable

from flexmig.act.mode import RuntimeMode
from flexmig.act.ranklogs import RankLogs
from flexmig.act.service import Actuator
from flexmig.config import Config
from flexmig.jobspec.spec import JobPolicy
from flexmig.metrics.actions import ActionMetrics
from flexmig.mqtt.events import Event, EventFactory
from flexmig.service.action_sink import ActionSink
from flexmig.service.control import DaemonControl
from flexmig.service.first_step import FirstSteps
from flexmig.service.gate import ActionGate
from flexmig.service.planning import planner_settings
from flexmig.service.planning_loop import PlanningLoop, PlanNow
from flexmig.service.strays import StrayWatch
from flexmig.telemetry.snapshot import Snapshot

__all__ = ["apply_config", "build_services", "job_policy", "submit_refusal"]


def submit_refusal(config: Config) -> str | None:
    """Why ``jobs.submit`` is refused under ``config``: a node whose jobs come from Slurm takes none of its own."""
    if not config.slurm.enabled:
        return None
    return "this node's jobs come from Slurm ([slurm] enabled = true): submit them with sbatch, not flexmig jobs submit"


def job_policy(cfg: Config) -> JobPolicy:
    """The job policy of ``cfg`` (``[jobs]``: the directories jobs may come from, the acknowledgement timeout)."""
    return JobPolicy(tuple(cfg.jobs.allowed_dirs), default_ack_timeout_s=cfg.jobs.ack_timeout_s)


def apply_config(act: Actuator, cfg: Config) -> None:
    """Give ``act`` the job policy, planner settings, rank-log limits and queue bound of ``cfg``."""
    act.apply(
        policy=job_policy(cfg),
        settings=planner_settings(cfg.planner),
        rank_logs=RankLogs(max_bytes=cfg.jobs.rank_log_max_bytes, keep=cfg.jobs.rank_log_keep),
        max_pending=cfg.jobs.max_pending,
    )


def build_services(
    act: Actuator,
    *,
    mode: RuntimeMode,
    gate: ActionGate,
    config: Callable[[], Config],
    latest: Callable[[], Snapshot | None],
    plan_now: PlanNow,
    metrics: ActionMetrics,
    first_steps: FirstSteps,
    factory: EventFactory,
    fleet: Callable[[Event], None],
    wall: Callable[[], float],
) -> DaemonControl:
    """The service layer on ``act``, each part given what it needs (``config``: read at each use, a reload
    changes it)."""
    interval = lambda: config().planner.interval_s  # noqa: E731 - read at each round: a reload changes it
    loop = PlanningLoop(
        act, mode=mode, gate=gate, plan_now=plan_now, interval_s=interval,
        metrics=metrics, factory=factory, fleet=fleet, wall=wall,
    )  # fmt: skip
    strays = StrayWatch(act, gate=gate, interval_s=interval)
    sink = ActionSink(
        act, mode=mode, metrics=metrics, first_steps=first_steps,
        factory=factory, fleet=fleet, wake=loop.wake, rescan=strays.rescan,
    )  # fmt: skip
    return DaemonControl(
        act, mode=mode, gate=gate, config=config, latest=latest,
        loop=loop, sink=sink, strays=strays, metrics=metrics,
    )  # fmt: skip

