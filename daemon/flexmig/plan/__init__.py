"""Pure planning: (layouts, running jobs, pending requests) -> an ordered, validated Plan of MIG actions."""

from flexmig.plan.planner import Planner
from flexmig.plan.shapes import Shape, profile_for_need, shapes_for, speed_of
from flexmig.plan.types import (
    DISCIPLINES,
    Action,
    CreateInstance,
    DestroyInstance,
    Discipline,
    Instance,
    JobRequest,
    MigrateJob,
    NodeState,
    Plan,
    PlannerSettings,
    RankNeed,
    ResplitJob,
    RunningJob,
    StartJob,
)
from flexmig.plan.validate import Outcome, check_state, validate_plan

__all__ = [
    "DISCIPLINES",
    "Action",
    "CreateInstance",
    "DestroyInstance",
    "Discipline",
    "Instance",
    "JobRequest",
    "MigrateJob",
    "NodeState",
    "Outcome",
    "Plan",
    "Planner",
    "PlannerSettings",
    "RankNeed",
    "ResplitJob",
    "RunningJob",
    "Shape",
    "StartJob",
    "check_state",
    "profile_for_need",
    "shapes_for",
    "speed_of",
    "validate_plan",
]
