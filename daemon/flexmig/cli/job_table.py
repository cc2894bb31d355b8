"""The job table that ``flexmig status`` and ``flexmig jobs list`` both print: one layout, one set of headers.

A job that ended (stopped, failed, done) holds no instance (``JobRecord.summary`` lists none): its ``instances`` cell
is ``-``, so a finished job never seems to claim an instance that another job holds now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flexmig.cli.table import Row, render_rows

__all__ = ["HEADERS", "job_rows", "render_jobs", "where"]

HEADERS = ("name", "state", "ranks", "gen", "ack step", "instances")


def where(job: Mapping[str, Any]) -> str:
    """``gpu0:1g.18gb@2, gpu0:1g.18gb@3``: the instances a job holds (GPU, profile, first memory slice)."""
    return ", ".join(f"gpu{i['gpu']}:{i['profile']}@{i['start']}" for i in job.get("instances") or ())


def job_rows(jobs: Sequence[Mapping[str, Any]]) -> list[Row]:
    """One row per job; its error (and what it waits for) on lines of their own under it."""
    rows = []
    for j in jobs:
        ack = j["last_ack"]["step"] if j.get("last_ack") else "-"
        details = [f"error: {j['error']}"] if j.get("error") else []
        if j.get("waiting"):
            details.append(f"waiting: {j['waiting']}")
        cells = (j["name"], j["state"], str(j["ranks"]), str(j["generation"]), str(ack), where(j) or "-")
        rows.append(Row(cells, details))
    return rows


def render_jobs(jobs: Sequence[Mapping[str, Any]], width: int | None) -> list[str]:
    """The table's lines, at most ``width`` wide."""
    return render_rows(HEADERS, job_rows(jobs), width)
