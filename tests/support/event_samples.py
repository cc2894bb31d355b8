"""Sample events of every kind, as the actuator and the Slurm agent emit them: the scenarios that the schema,
events and metrics tests (tests/mqtt, tests/metrics, tests/slurm) all validate, kept in one place."""

from __future__ import annotations

from flexmig.act.events import ActEvent
from flexmig.mig import H200
from flexmig.mig.layout import Layout
from flexmig.mqtt.action_events import ActionEventTranslator, ActionFacts, plan_event
from flexmig.mqtt.events import Event, EventFactory
from flexmig.mqtt.slurm_events import carving_event, job_event, node_event, reachable_event, unreachable_event
from flexmig.mqtt.slurm_events import plan_event as slurm_plan_event
from flexmig.plan.carving import Waiting, carve
from flexmig.plan.reregistration import Verdict
from flexmig.plan.types import CreateInstance, DestroyInstance, Instance, MigrateJob, Plan, StartJob
from flexmig.slurm.instances import CarvingReport, HostLayouts, carving_report
from flexmig.slurm.settings import instance_node

T0 = 1_700_000_000.0


def facts(action_id: int) -> ActionFacts:
    """The journal's facts about the actions of :func:`act_events`."""
    return {
        1: ActionFacts(plan_id=1, origin="planner", target="gpu0:1g.18gb@2"),
        2: ActionFacts(plan_id=1, origin="planner", downtime_s=0.031),
        3: ActionFacts(plan_id=2, origin="control", downtime_s=0.5),
        4: ActionFacts(plan_id=2, origin="control"),
        5: ActionFacts(plan_id=2, origin="control"),
    }.get(action_id, ActionFacts())


def act_events() -> list[ActEvent]:
    """One of everything the actuator emits, as it emits it."""
    steps = (("clear_ack", 0.001), ("request", 0.0), ("await_ack", 0.02), ("await_exit", 2.1), ("launch", 0.03))
    return [
        ActEvent(
            "reconciled",
            T0,
            detail={"adopted": {"train": [101, 102]}, "killed_stale": {}, "plans": [{}], "settled": [], "pruned": []},
        ),
        ActEvent("action_started", T0, action="create_instance", action_id=1, reason="start train"),
        ActEvent(
            "action_completed",
            T0 + 1,
            action="create_instance",
            action_id=1,
            duration_s=0.004,
            steps=(("create:0@2", 0.004),),
        ),
        ActEvent(
            "action_started", T0 + 2, action="migrate", action_id=2, job="train", reason="", detail={"resumed": True}
        ),
        ActEvent("job_exited", T0 + 3, job="train", detail={"slot": 0, "pid": 101, "generation": 1, "exit_code": 0}),
        ActEvent(
            "job_started",
            T0 + 4,
            job="train",
            detail={
                "generation": 2,
                "pids": {"0": 201, "1": 202},
                "instances": ["gpu0:1g.18gb@2", "gpu0:1g.18gb@3"],
                "resume_step": 41,
            },
        ),
        ActEvent("action_completed", T0 + 4, action="migrate", action_id=2, job="train", duration_s=2.2, steps=steps),
        ActEvent(
            "action_failed",
            T0 + 5,
            action="resplit",
            action_id=3,
            job="train",
            duration_s=3.0,
            error="INSUFFICIENT_RESOURCES; rolled back",
        ),
        ActEvent(
            "action_cancelled",
            T0 + 6,
            action="migrate",
            action_id=4,
            job="train",
            duration_s=30.0,
            error="job train did not acknowledge the checkpoint within 30 s",
        ),
        ActEvent(
            "action_skipped",
            T0 + 6,
            action="destroy_instance",
            action_id=5,
            error="an earlier action of the plan did not complete",
        ),
        ActEvent("job_failed", T0 + 7, job="train", error="rank 1 exited with status 3"),
        ActEvent("job_exited", T0 + 8, job="train", detail={"state": "done"}),
    ]


def actuator_events(factory: EventFactory) -> list[Event]:
    """Fleet events of every actuator kind and a ``plan_proposed`` (the schema test's scenario uses these)."""
    translate = ActionEventTranslator(factory, facts)
    out = [e for e in (translate(a) for a in act_events()) if e is not None]
    start = Instance(0, 2, H200.profile("1g.18gb"))
    plan = Plan(
        (
            CreateInstance(0, 2, H200.profile("1g.18gb"), "start queued", 5.0),
            StartJob("queued", (start,), "queued fits as requested", 0.0),
            MigrateJob("train", (Instance(0, 0, H200.profile("1g.18gb")),), (start,), "make room", 9.0),
        ),
        T0,
        ("queued waits",),
    )
    out.append(plan_event(factory, plan, "advise", T0))
    return out


def slurm_events(fac: EventFactory) -> list[Event]:
    """One of each Slurm event kind, with realistic payloads."""
    plan = Plan(
        (
            DestroyInstance(0, 0, H200.profile("7g.141gb"), "make room", 3.0),
            CreateInstance(0, 0, H200.profile("1g.18gb"), "start slurm-7", 3.0),
        )
    )
    verdict = Verdict(True, 7.0, 3582.0, 70.0, "serves 1 waiting job(s): empty in ~7 s", ("slurm-7",))
    return [
        unreachable_event(fac, "n1", "squeue --json: no answer within 30 s (is slurmctld up?)"),
        reachable_event(fac, "n1", 42.0),
        slurm_plan_event(fac, "n1", "act", verdict, plan, checkpoint=[5]),
        job_event(fac, "n1", "slurm_job_signalled", {"slurm_job": 5, "signal": "USR1"}),
        job_event(fac, "n1", "slurm_job_requeued", {"slurm_job": 5, "step": 120}),
        job_event(fac, "n1", "slurm_job_released", {"slurm_job": 5}),
        node_event(fac, "n1", "slurmd_restarted", {"reason": "slurmd crashed", "gres": "gpu:3g.71gb:2"}),
        node_event(fac, "n1", "change_waiting", {"reason": "serves 1 waiting job(s)", "start_in_s": 42.0}),
        node_event(fac, "n1", "ack_missed", {"slurm_job": 5, "reason": "not asked again while it runs"}),
        carving_event(fac, "n1", "act", sample_carving(waited_s=60.0)),
        carving_event(fac, "n1", "advise", sample_carving(waited_s=3600.0)),
    ]


def sample_carving(waited_s: float) -> CarvingReport:
    """A carving of GPU 1 of ``n1`` (3g.71gb@0 busy for 600 s more, 3g.71gb@4 idle) for a 7g job that waited
    ``waited_s`` and a 1g job, as :func:`flexmig.plan.carving.carve` decides it: the 1g job gets an instance carved
    from the idle 3g, or (the 7g job waited long enough) the 7g job holds the GPU."""
    hl = HostLayouts(H200, (1,), (Layout.of(H200, [("3g.71gb", 0), ("3g.71gb", 4)]),), frozenset())
    queue = [Waiting("slurm-8", "7g.141gb", 3600.0, waited_s), Waiting("slurm-9", "1g.18gb", 600.0, 5.0)]
    c = carve(H200, hl.layouts, {(0, 0): 600.0}, queue, now_s=T0, numbers=hl.gpus)
    return carving_report(lambda gpu, start, _: instance_node("n1", gpu, start), hl, c, now_s=T0)
