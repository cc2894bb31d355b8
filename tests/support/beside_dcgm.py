"""A GPU node as operators have it: dcgm-exporter on its default port 9400, then flexmigd started on defaults.

Run as ``python -m support.beside_dcgm FLEXMIGD WORKDIR`` inside a fresh network namespace (``unshare --net``), so
that ports 9400 and 17400 are this node's alone whatever else runs on the machine. It brings the namespace's
loopback up, serves a dcgm-exporter stand-in on 127.0.0.1:9400, starts ``flexmigd --sim`` twice (on an empty
configuration, then with ``[dcgm] enabled = true`` and nothing else), and prints one JSON object: for each run
whether flexmigd served its metrics, on which address, its ``flexmig_dcgm_up`` samples, how many scrapes the stand-in
saw, and the exit status after SIGTERM. The test reads that object (tests/config/test_default_ports.py).
"""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DCGM_ADDR = ("127.0.0.1", 9400)
FLEXMIGD_METRICS = "http://127.0.0.1:17400/metrics"
WAIT_S = 60.0

# What dcgm-exporter 4.x prints for one MIG instance (the UUID matches no simulated GPU: this is about ports).
DCGM_BODY = (
    "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n"
    "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",device="nvidia0",'
    'modelName="NVIDIA H200",GPU_I_PROFILE="1g.18gb",GPU_I_ID="13",Hostname="node"} 0.25\n'
)


class _Exporter(http.server.BaseHTTPRequestHandler):
    scrapes = 0

    def do_GET(self) -> None:
        type(self).scrapes += 1
        data = DCGM_BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def _run(flexmigd: str, config: Path, want_dcgm: bool) -> dict[str, object]:
    """Start flexmigd on ``config``, wait for its metrics (and, with DCGM on, a scrape of the stand-in), stop it."""
    before = _Exporter.scrapes
    proc = subprocess.Popen(
        [flexmigd, "--sim", "h200", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    served: str | None = None
    dcgm_up: list[tuple[dict[str, str], float]] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            served = _fetch(FLEXMIGD_METRICS)
            if served is not None:
                dcgm_up = [
                    (s.labels, s.value)
                    for f in text_string_to_metric_families(served)
                    for s in f.samples
                    if s.name == "flexmig_dcgm_up"
                ]
                if not want_dcgm or any(v == 1.0 for _, v in dcgm_up):
                    break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
    return {
        "served": served is not None and "flexmig_" in served,
        "dcgm_up": dcgm_up,
        "scrapes": _Exporter.scrapes - before,
        "returncode": proc.returncode,
        "stderr": err[-4000:],
    }


def main() -> int:
    """Bring loopback up, serve the stand-in on 9400, run flexmigd twice, print the findings as JSON."""
    flexmigd, workdir = sys.argv[1], Path(sys.argv[2])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    server = http.server.ThreadingHTTPServer(DCGM_ADDR, _Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        empty = workdir / "empty.toml"
        empty.write_text("")
        empty.chmod(0o644)
        dcgm = workdir / "dcgm.toml"
        dcgm.write_text("[dcgm]\nenabled = true\n")
        dcgm.chmod(0o644)
        result = {"defaults": _run(flexmigd, empty, want_dcgm=False), "dcgm": _run(flexmigd, dcgm, want_dcgm=True)}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
