"""Configurations that tests build daemons from (not a test module).

:func:`every_part_on`: each optional component of flexmigd on (MQTT with its outbox and commands, dcgm-exporter,
``/metrics``, the control socket, Slurm), in mode act, every path inside one directory, so a test can build the whole
daemon and look at what it is made of (tests/repo/test_architecture_doc.py) or at what building it touched
(tests/daemon/test_wire_builds_nothing.py). The password file is named, not written: building reads no file.
"""

from __future__ import annotations

from pathlib import Path

from flexmig.config import (
    Config,
    ControlConfig,
    DcgmConfig,
    HostPort,
    JobsConfig,
    MqttConfig,
    PrometheusConfig,
    SlurmConfig,
    StateConfig,
)

#: The component names flexmigd has with :func:`every_part_on` on a simulated node, in the order they start.
EVERY_PART = (
    "nvml", "detection", "mqtt", "sampling", "dcgm", "metrics", "actuator", "slurm", "mqtt-commands", "workload",
    "watchdog",
)  # fmt: skip


def every_part_on(d: Path) -> Config:
    """Every optional part on, in mode act, each path inside ``d``."""
    state = d / "state"
    return Config(
        mode="act",
        node_name="node-1",
        prometheus=PrometheusConfig(enabled=True, listen=HostPort("127.0.0.1", 0)),
        mqtt=MqttConfig(
            enabled=True,
            outbox=state / "outbox.sqlite3",
            commands_enabled=True,
            username="flexmig",
            password_file=d / "mqtt.password",
        ),
        dcgm=DcgmConfig(enabled=True),
        control=ControlConfig(enabled=True, socket=d / "control.sock"),
        state=StateConfig(directory=state, journal=state / "journal.sqlite3"),
        jobs=JobsConfig(directory=d / "jobs", allowed_dirs=(d / "work",)),
        slurm=SlurmConfig(enabled=True, gres_conf=d / "gres.conf", gres_map=d / "gres-map.json"),
    )
