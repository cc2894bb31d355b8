"""Job specs: the TOML files that say what a job runs, as whom, on how many MIG instances of what size."""

from flexmig.jobspec.spec import (
    RESERVED_ENV,
    HookSettings,
    JobPolicy,
    JobSpec,
    LauncherKind,
    NeedSpec,
    load_job_spec,
    parse_job_spec,
)

__all__ = [
    "RESERVED_ENV",
    "HookSettings",
    "JobPolicy",
    "JobSpec",
    "LauncherKind",
    "NeedSpec",
    "load_job_spec",
    "parse_job_spec",
]
