"""Security audit: what flexmig exposes by default, the files it refuses, and secrets that never reach a log.

- By default the metrics listen on loopback only, MQTT and MQTT commands are off, and the control socket is
  owner-only (checked on the real sockets of a running flexmigd and a running control server).
- A password file or TLS key others can read, or a configuration others can write, is refused naming the file,
  the key and the line.
- The broker password never appears in the daemon's log at DEBUG level, with good or bad credentials, with the
  MQTT publisher and the command listener both running; nor in ``flexmig config check`` output, nor in a repr.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from flexmig.act.control import ControlServer
from flexmig.config import Config, ConfigFileError, HostPort, load_config, parse_config
from flexmig.daemon import Daemon
from flexmig.errors import ConfigError
from flexmig.mqtt.commands import CommandSettings, command_listener
from flexmig.mqtt.publisher import PublisherSettings
from support.commands import Operator, password_file
from support.mosquitto import PASSWORDS, WAIT, Brokers, needs_mosquitto
from support.wait import free_port, wait_for_text

FLEXMIGD = Path(sys.executable).with_name("flexmigd")
FLEXMIG = Path(sys.executable).with_name("flexmig")

# flexmigd as it will be wired, plus the MQTT command listener (the three lines the daemon adds for it), at DEBUG.
# flexmigd's Daemon (publisher, command listener, actuator) under plain DEBUG logging: without flexmigd's redacting
# filter, so the audit sees whether anything logs the password at all.
AUDITED_DAEMON = """
import asyncio, logging, sys
from pathlib import Path
from flexmig.config import load_config
from flexmig.daemon import Daemon, serve

path = Path(sys.argv[1])
logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
daemon = Daemon(load_config(path), sim_spec="h200", sim_workload=False, config_path=path)
assert daemon.components.commands is not None
asyncio.run(serve(daemon))
"""


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def isolated(tmp: Path) -> str:
    """Keys that keep a test daemon's files under ``tmp`` (everything else stays at its default)."""
    return (
        f'[control]\nsocket = "{tmp}/control.sock"\n[state]\ndirectory = "{tmp}"\njournal = "{tmp}/journal.sqlite3"\n'
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT)


# ------------------------------------------------------------------------------------------------ defaults
def test_the_defaults_expose_metrics_on_loopback_only_and_no_mqtt_nor_commands() -> None:
    cfg = Config.default()
    assert cfg.mode == "observe"
    assert cfg.prometheus.enabled and cfg.prometheus.listen == HostPort("127.0.0.1", 17400)
    assert cfg.prometheus.listen.is_loopback() and not cfg.prometheus.allow_remote
    assert not cfg.mqtt.enabled and not cfg.mqtt.commands_enabled
    assert not cfg.mqtt.allow_plaintext_password and cfg.mqtt.password_file is None
    assert cfg.control.socket_mode == 0o600
    assert command_listener(cfg, "node-1", ControlServer(Path("/nonexistent"), {}).dispatch) is None


@pytest.mark.parametrize("listen", ["0.0.0.0:9400", "[::]:9400", "10.1.2.3:9400", "gpu-node-7:9400"])
def test_metrics_off_loopback_need_allow_remote_in_the_file_and_on_the_command_line(listen: str) -> None:
    with pytest.raises(ConfigFileError, match=r"flexmig\.toml:2: prometheus\.listen: .* set prometheus\.allow_remote"):
        parse_config(f'[prometheus]\nlisten = "{listen}"\n', "flexmig.toml")
    assert parse_config(f'[prometheus]\nlisten = "{listen}"\nallow_remote = true\n', "f").prometheus.allow_remote
    with pytest.raises(ConfigError, match="not loopback"):
        Daemon(Config.default(), sim_spec="h200", metrics_addr=HostPort.parse(listen))


@pytest.mark.integration
def test_a_running_flexmigd_with_default_settings_listens_on_loopback_only(tmp_path: Path) -> None:
    port = free_port()
    config = write(tmp_path / "flexmig.toml", isolated(tmp_path) + f'[prometheus]\nlisten = "127.0.0.1:{port}"\n')
    log = tmp_path / "flexmigd.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [str(FLEXMIGD), "--sim", "h200", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        wait_for_text(log, f"metrics on http://127.0.0.1:{port}/metrics", proc=proc)
        conns = psutil.Process(proc.pid).net_connections(kind="inet")
        listening = {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
        assert listening == {("127.0.0.1", port)}, conns
        assert all(c.status == psutil.CONN_LISTEN for c in conns), f"no outbound connection (MQTT is off): {conns}"
        for c in psutil.Process(proc.pid).net_connections(kind="unix"):
            if c.laddr and c.status == psutil.CONN_LISTEN:  # the control socket, once the daemon serves one
                assert isinstance(c.laddr, str), c.laddr
                st = os.stat(c.laddr)
                assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), c.laddr
    finally:
        stop(proc)
    assert proc.returncode == 0


@pytest.mark.integration
def test_the_control_socket_is_owner_only_as_served(tmp_path: Path) -> None:
    cfg = Config.default()

    async def serve() -> tuple[int, int]:
        server = ControlServer(tmp_path / "control.sock", {}, mode=cfg.control.socket_mode)
        await server.start()
        try:
            st = server.path.stat()
            return stat.S_IMODE(st.st_mode), st.st_uid
        finally:
            await server.close()

    assert asyncio.run(serve()) == (0o600, os.geteuid())


@pytest.mark.parametrize("mode", ["0o666", "0o606", "0o644", "0o400", "0o1600"])
def test_a_control_socket_others_could_reach_is_refused_in_the_configuration(mode: str) -> None:
    with pytest.raises(ConfigFileError, match=r"control\.socket_mode"):
        parse_config(f"[control]\nsocket_mode = {mode}\n", "flexmig.toml")


# ------------------------------------------------------------------------------------------------ files
def mqtt_config(tmp: Path, secret: Path, extra: str = "") -> Path:
    return write(
        tmp / "flexmig.toml",
        f'[mqtt]\nenabled = true\nusername = "node-1"\npassword_file = "{secret}"\n'
        f'outbox = "{tmp}/outbox.sqlite3"\n{extra}',
        0o644,
    )


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o666, 0o601])
def test_a_password_file_others_can_read_is_refused_naming_file_key_and_line(tmp_path: Path, mode: int) -> None:
    secret = write(tmp_path / "mqtt.password", "s3cret-Value-1\n", mode)
    config = mqtt_config(tmp_path, secret)
    with pytest.raises(ConfigFileError) as info:
        load_config(config)
    (problem,) = info.value.problems
    assert (problem.file, problem.key, problem.line) == (str(config), "mqtt.password_file", 4)
    assert "lets others read a credential" in problem.message or "lets group or others write" in problem.message
    assert "s3cret-Value-1" not in str(info.value)
    secret.chmod(0o640)
    assert load_config(config).mqtt.password_file == secret


def test_a_password_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file away")
    secret = write(tmp_path / "mqtt.password", "s3cret-Value-2\n")
    os.chown(secret, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(ConfigFileError, match=r"mqtt\.password_file: .*owned by uid"):
        load_config(mqtt_config(tmp_path, secret))


def test_a_tls_key_others_can_read_and_a_configuration_others_can_write_are_refused(tmp_path: Path) -> None:
    key = write(tmp_path / "mqtt.key", "-----BEGIN PRIVATE KEY-----\n", 0o644)
    cert = write(tmp_path / "mqtt.crt", "-----BEGIN CERTIFICATE-----\n", 0o644)
    secret = write(tmp_path / "mqtt.password", "s3cret-Value-3\n")
    config = mqtt_config(tmp_path, secret, f'tls = true\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    with pytest.raises(ConfigFileError, match=r"mqtt\.tls_key: .*lets others read a credential"):
        load_config(config)
    key.chmod(0o600)
    config.chmod(0o664)
    with pytest.raises(ConfigFileError, match=r"lets group or others write it"):
        load_config(config)


# ------------------------------------------------------------------------------------------------ secrets
@pytest.mark.integration
def test_config_check_never_prints_a_secret(tmp_path: Path) -> None:
    secret = write(tmp_path / "mqtt.password", "s3cret-Value-4\n")
    config = mqtt_config(tmp_path, secret, 'password = "inline-Secret-5"\n')
    out = subprocess.run(
        [str(FLEXMIG), "config", "check", str(config)], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert out.returncode == 2
    assert "mqtt.password: unknown key: secrets are never written in the configuration" in out.stderr
    for text in (out.stdout, out.stderr):
        assert "inline-Secret-5" not in text and "s3cret-Value-4" not in text
    write(config, config.read_text().replace('password = "inline-Secret-5"\n', ""), 0o644)
    out = subprocess.run(
        [str(FLEXMIG), "config", "check", str(config)], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert out.returncode == 0 and "OK" in out.stdout
    assert "s3cret-Value-4" not in out.stdout + out.stderr


def test_no_settings_object_shows_the_password(tmp_path: Path) -> None:
    secret = write(tmp_path / "mqtt.password", "s3cret-Value-6\n")
    cfg = load_config(mqtt_config(tmp_path, secret))
    password = cfg.mqtt.password()
    assert password is not None and password.reveal() == "s3cret-Value-6"
    shown = [
        repr(cfg),
        str(cfg),
        repr(password),
        f"{password}",
        repr(PublisherSettings.from_config(cfg.mqtt, "node-1")),
        repr(CommandSettings.from_config(cfg, "node-1")),
    ]
    assert all("s3cret-Value-6" not in text for text in shown)


@pytest.mark.integration
@needs_mosquitto
@pytest.mark.timeout(180)
@pytest.mark.parametrize("credentials", ["good", "bad"])
def test_the_password_never_reaches_the_log_at_debug_level(
    tmp_path: Path, mosquitto: Brokers, credentials: str
) -> None:
    """The real daemon (publisher and command listener) against a mosquitto that checks passwords."""
    broker = mosquitto(secured=True)
    wrong = "Wrong-Secret-77"
    secret = password_file(tmp_path, password=None if credentials == "good" else wrong)
    config = write(
        tmp_path / "flexmig.toml",
        'node_name = "node-1"\n[sampling]\ninterval_s = 0.2\n[prometheus]\nenabled = false\n'
        + isolated(tmp_path)
        + f'[mqtt]\nenabled = true\nbroker = "{broker.address}"\nusername = "node-1"\n'
        f'password_file = "{secret}"\ncommands_enabled = true\noutbox = "{tmp_path}/outbox.sqlite3"\n',
    )
    log = tmp_path / "daemon.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", AUDITED_DAEMON, str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        if credentials == "good":
            wait_for_text(log, "MQTT commands: listening on", proc=proc)
            wait_for_text(broker.dir / "mosquitto.log", "as flexmig-node-1 (", "as flexmig-node-1-commands (")
            operator = Operator(broker)
            try:
                result = operator.ask("migrate", {"id": "audit-1", "args": {"name": "train"}})
                assert result["ok"] is False and "no job named 'train'" in result["error"], result
            finally:
                operator.close()
        else:
            wait_for_text(log, "refused the login of user 'node-1'", "MQTT commands: broker", proc=proc)
    finally:
        stop(proc)
    text = log.read_text(errors="replace")
    assert "DEBUG" in text, "the log was at DEBUG level"
    assert PASSWORDS["node-1"] not in text and wrong not in text
