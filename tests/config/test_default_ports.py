"""flexmigd's default metrics port is taken by no common exporter: on a node where dcgm-exporter holds 9400,
flexmigd starts on its defaults, serves on 17400, and (with ``[dcgm] enabled = true``) reads dcgm-exporter there.

The node runs in a network namespace of its own (``unshare --net``), so the two well-known ports are free for it
whatever else this machine runs; see tests/support/beside_dcgm.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from flexmig.config import Config
from flexmig.config.schema import DCGM_EXPORTER_PORT, DEFAULT_METRICS_PORT
from support.systemd import run_support_module


def test_the_default_metrics_port_is_neither_dcgm_exporters_nor_node_exporters() -> None:
    cfg = Config.default()
    assert cfg.prometheus.listen.port == DEFAULT_METRICS_PORT == 17400
    assert cfg.dcgm.url == f"http://127.0.0.1:{DCGM_EXPORTER_PORT}/metrics"
    # 9100-9999 is the Prometheus project's (full) range of exporter defaults: node_exporter 9100, dcgm-exporter
    # 9400, nvidia_gpu_exporter 9835 among them; 32768-60999 is Linux's ephemeral range.
    assert not 9100 <= DEFAULT_METRICS_PORT <= 9999
    assert not 32768 <= DEFAULT_METRICS_PORT <= 60999


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_flexmigd_starts_on_defaults_beside_dcgm_exporter_on_9400_and_reads_it(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        pytest.fail("unshare (util-linux) and ip (iproute2) are needed: apt-get install util-linux iproute2")
    flexmigd = str(Path(sys.executable).with_name("flexmigd"))
    done = run_support_module([unshare, "--net", "--"], "beside_dcgm", flexmigd, str(tmp_path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)

    defaults = result["defaults"]
    assert defaults["served"], f"flexmigd on an empty configuration served nothing on 17400: {defaults['stderr']}"
    assert defaults["returncode"] == 0, defaults["stderr"]
    assert defaults["dcgm_up"] == [], "dcgm-exporter is off by default"
    assert defaults["scrapes"] == 0

    dcgm = result["dcgm"]
    assert dcgm["served"], dcgm["stderr"]
    assert dcgm["returncode"] == 0, dcgm["stderr"]
    assert dcgm["scrapes"] >= 1, "flexmigd never scraped dcgm-exporter on 9400"
    ((labels, up),) = dcgm["dcgm_up"]
    assert labels["url"] == "http://127.0.0.1:9400/metrics"
    assert up == 1.0
