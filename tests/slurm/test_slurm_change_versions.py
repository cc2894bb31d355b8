"""Which Slurm versions need the wait for a backfill cycle before a node is deleted (22.05.8 and earlier crash
without it, 22.05.9 and later do not), from the version ``scontrol show config`` reports."""

from __future__ import annotations

import pytest

from flexmig.slurm.change import planned_delete_crashes


@pytest.mark.parametrize("version", ["22.05.8", "22.05.0", "21.08.8-2", "20.11.9", "22.05", "", "unknown", "24.x.1"])
def test_versions_before_the_fix_or_unreadable_wait(version: str) -> None:
    assert planned_delete_crashes(version)


@pytest.mark.parametrize("version", ["22.05.9", "22.05.11", "23.02.0", "23.11.4", "24.11.5", "25.05.0-0rc1", "26.05.1"])
def test_versions_with_the_fix_do_not(version: str) -> None:
    assert not planned_delete_crashes(version)
