"""A journal that is gone or empty never makes running ranks disappear from view.

A job's rank runs under flexmigd on a simulated node; the daemon stops (the rank goes on). An empty journal in
its place is refused (one line; the rank is left alone); with the journal moved away, the daemon starts on a new
one and reports the rank that no journal knows: in the ``reconciled`` event, in ``flexmig status`` and as
``flexmig_unknown_ranks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import psutil
import pytest

from flexmig.act.procs import PsutilScanner
from flexmig.hook.protocol import ENV_GENERATION, ENV_JOB, ENV_JOB_ID, ENV_SLOT
from support.flexmigd import act_node, collect_events, open_session, short_base
from support.hostile import scratch_user
from support.jobs import counter_spec, flexmig, job_uid, write_spec
from support.mosquitto import Mosquitto, needs_mosquitto
from support.wait import wait_until

pytestmark = [pytest.mark.integration, needs_mosquitto]

SIM = "h200x1:1g.18gb@0+1g.18gb@1"
SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "event.v1.schema.json").read_text())


@pytest.fixture
def base() -> Iterator[Path]:
    with short_base("fm-unknown-") as d:
        yield d


def test_ranks_no_journal_knows_are_refused_for_an_empty_journal_and_reported_with_a_new_one(
    base: Path, broker: Mosquitto
) -> None:
    open_session(broker.port, "lost-node", "lost-watcher")
    with act_node(base, SIM, node_name="lost-node", broker=broker.address) as node:
        flexmig(node.sock, "submit", str(write_spec(base / "c.toml", counter_spec(base, "c"))))
        uid = job_uid(node.journal, "c")
        assert uid is not None
        (rank,) = wait_until(lambda: PsutilScanner().find(uid), what="the rank")
        assert node.stop() == 0
        assert psutil.pid_exists(rank.pid), "ranks outlive their daemon"

        with node.journal.open("r+b") as f:  # what a full disk or a careless hand can leave
            f.truncate(0)
        for companion in ("-wal", "-shm"):
            Path(f"{node.journal}{companion}").unlink(missing_ok=True)
        node.write_config()
        out = subprocess.run(
            [sys.executable, "-m", "flexmig.daemon", "--sim", node.spec, "--sim-state", str(node.sim_state),
             "--config", str(node.config), "--metrics-addr", f"127.0.0.1:{node.port}"],
            capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "NOTIFY_SOCKET": ""},
        )  # fmt: skip
        assert out.returncode != 0
        assert f"{node.journal}: refused: the file is empty (0 bytes)" in out.stderr
        assert "Traceback" not in out.stderr
        assert node.journal.stat().st_size == 0, "left as it was"
        assert psutil.pid_exists(rank.pid), "the rank is left alone"

        node.journal.rename(base / "journal.empty")  # the operator moves it away, as the line says
        node.start()
        status = node.cli_json("status")
        (unknown,) = status["unknown_ranks"]
        assert (unknown["pid"], unknown["job"], unknown["job_id"]) == (rank.pid, "c", uid)
        assert unknown["instance"].startswith("MIG-")
        assert node.metric("flexmig_unknown_ranks") == 1.0
        assert "rank(s) of job c (FLEXMIG_JOB_ID " in node.log.read_text()
        assert psutil.pid_exists(rank.pid)
    events = collect_events(broker.port, "lost-node", client_id="lost-watcher")
    reconciled = [e for e in events if e.kind.value == "reconciled"]
    assert reconciled, [e.kind.value for e in events]
    last = reconciled[-1]
    jsonschema.validate(json.loads(last.to_json()), SCHEMA)
    (reported,) = last.payload["unknown_ranks"]
    assert reported["pid"] == rank.pid and reported["job_id"] == uid
    assert "1 rank(s) of no journalled job" in last.payload["reason"]


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as a user made for the test")
def test_a_marked_process_that_appears_after_the_start_is_reported_at_the_next_interval_though_none_was_before(
    base: Path,
) -> None:
    """Unknown ranks are looked for every planning interval (and after every stop and move), not only while some are
    already known: before, a list that was empty at the start stayed empty whatever appeared later."""
    with scratch_user("fmx") as other, act_node(base, SIM, node_name="rescan-node") as node:
        flexmig(node.sock, "submit", str(write_spec(base / "c.toml", counter_spec(base, "c"))))
        uid = job_uid(node.journal, "c")
        assert uid is not None
        wait_until(lambda: PsutilScanner().find(uid), what="the rank")
        assert node.cli_json("status")["unknown_ranks"] == []
        env = {"PATH": "/usr/bin:/bin", ENV_JOB: "c", ENV_JOB_ID: uid, ENV_GENERATION: "99", ENV_SLOT: "0"}
        decoy = subprocess.Popen(
            ["/bin/sleep", "600"], user=other.pw_uid, group=other.pw_gid, extra_groups=[], env=env, cwd="/"
        )
        try:
            (seen,) = wait_until(lambda: node.cli_json("status")["unknown_ranks"], 30, "the new process reported")
            assert (seen["pid"], seen["job_id"], seen["user"]) == (decoy.pid, uid, other.pw_name)
        finally:
            decoy.kill()
            decoy.wait(10)
