"""flexmigd's log lines: a time stamp of their own on a terminal or in a file, none under journald.

journald stamps every line it reads, so a second time stamp only makes lines longer. systemd tells a service that
its stderr is the journal by ``$JOURNAL_STREAM`` (``DEV:INODE`` of that stream, systemd.exec(5)); a child whose
stderr goes elsewhere inherits the variable, hence the comparison with the stream itself. Under journald each line
starts with its syslog priority (``<4>`` for a warning), which journald turns into the entry's priority.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import logging
from flexmig.daemon import setup_logging
setup_logging("INFO")
logging.getLogger("flexmig.test").info("one line")
logging.getLogger("flexmig.test").warning("two\\nlines")
"""


def log_of(tmp_path: Path, journal_stream: str | None) -> list[str]:
    """Run the daemon's logging set-up with stderr to a file, ``$JOURNAL_STREAM`` as given; the file's lines."""
    log = tmp_path / "stderr.log"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with log.open("wb") as err:
        if journal_stream == "this file":
            st = os.fstat(err.fileno())
            journal_stream = f"{st.st_dev}:{st.st_ino}"
        if journal_stream is not None:
            env["JOURNAL_STREAM"] = journal_stream
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=err, env=env, check=True, timeout=60)
    return log.read_text().splitlines()


def test_under_journald_lines_carry_no_timestamp_and_start_with_their_priority(tmp_path: Path) -> None:
    assert log_of(tmp_path, "this file") == [
        "<6>INFO flexmig.test: one line",
        "<4>WARNING flexmig.test: two",
        "<4>lines",
    ]


@pytest.mark.parametrize("journal_stream", [None, "1:2", "garbage"])
def test_elsewhere_each_line_starts_with_the_time(tmp_path: Path, journal_stream: str | None) -> None:
    lines = log_of(tmp_path, journal_stream)
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO flexmig.test: one line$", lines[0]), lines
