"""flexmigd's log never shows the MQTT password, whoever logs it: every handler of the daemon's logging carries the
redacting filter, so a third-party library's line, its traceback and its arguments are scrubbed too.

The daemon is the real ``flexmigd`` entry point (``flexmig.daemon.main``) in a process of its own; a loop added
to it plays a careless library that logs the password it was given (the one thing the test adds).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.wait import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PASSWORD = "Pw-9c1d-leaky"

LEAKY_DAEMON = """
import asyncio, logging, sys
from pathlib import Path
from flexmig import daemon as flexmigd
from flexmig.wiring.component import Loop

secret = Path(sys.argv[1]).read_text().strip()
original = flexmigd.Daemon.__init__

def init(self, *args, **kwargs):
    original(self, *args, **kwargs)

    async def careless_library():
        logging.getLogger("paho.mqtt.client").warning("connecting with password=%s", secret)
        logging.getLogger("aiomqtt").error(f"inline {secret}")
        try:
            raise ConnectionError(f"login refused for {secret}")
        except ConnectionError:
            logging.getLogger("urllib3.connectionpool").exception("with a traceback")
        logging.getLogger("careless").warning("done leaking")
        await asyncio.Event().wait()

    self.add(Loop("careless", careless_library))

flexmigd.Daemon.__init__ = init
sys.exit(flexmigd.main(sys.argv[2:]))
"""


def test_a_third_party_line_with_the_mqtt_password_is_redacted_in_flexmigds_log(tmp_path: Path) -> None:
    secret = tmp_path / "mqtt.password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    config = tmp_path / "flexmig.toml"
    config.write_text(
        'node_name = "node-1"\n[prometheus]\nenabled = false\n'
        f'[mqtt]\nenabled = true\nbroker = "127.0.0.1:{free_port()}"\noutbox = "{tmp_path}/outbox.sqlite3"\n'
        f'username = "node-1"\npassword_file = "{secret}"\n'
    )
    config.chmod(0o600)
    log = tmp_path / "flexmigd.log"
    argv = [sys.executable, "-c", LEAKY_DAEMON, str(secret), "--sim", "h200", "--config", str(config)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--log-level", "DEBUG"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NOTIFY_SOCKET": ""},
        )
    try:
        wait_until(lambda: "done leaking" in log.read_text(), what="the careless library's lines")
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    text = log.read_text()
    assert PASSWORD not in text
    assert "paho.mqtt.client: connecting with password=***" in text
    assert "aiomqtt: inline ***" in text
    assert "ConnectionError: login refused for ***" in text
    assert rc == 0
