"""The README's first command, ``make demo``: flexmigd in mode act on a simulated node, fed demo jobs.

* the Makefile's demo target, run for real (with this test's venv as the demo's, so nothing is installed), finds
  fragmentation, makes a plan and completes a migration; the metrics URL and the status line it prints work while
  it runs, exactly as printed;
* the venv the target builds on a fresh checkout holds the package without extras (no torch, mypy, hypothesis);
* Ctrl-C stops it cleanly: the jobs and the daemon are gone, and so is its private directory;
* with ``--broker`` it publishes its events to a real mosquitto, where the ``flexmig events`` line it prints sees them;
* its jobs show in ``flexmig status`` busy, with their memory, and nvitop, gpustat and the simulator's nvidia-smi, run
  through the ``flexmig sim ... exec`` line it prints, show its GPU, instances and jobs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.mosquitto import Mosquitto, needs_mosquitto
from support.prometheus import http_get
from support.wait import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)


class Lines(threading.Thread):
    """Collects a process's stdout lines as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.lines: list[str] = []

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 90.0) -> re.Match[str]:
        """The first line matching ``pattern`` (AssertionError with every line so far, after the bound or once the
        process ended without one)."""

        def found() -> re.Match[str] | None:
            m = next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)
            if m is None and self.proc.poll() is not None and not self.is_alive():
                raise RuntimeError("the process ended")
            return m

        try:
            match: re.Match[str] = wait_until(found, timeout_s, f"a line matching {pattern!r}", every_s=0.1)
            return match
        except (AssertionError, RuntimeError):
            raise AssertionError(
                f"no line matching {pattern!r} within {timeout_s} s:\n" + "\n".join(self.lines)
            ) from None


def started(argv: list[str]) -> tuple[subprocess.Popen[str], Lines]:
    """``argv`` run from the repository's root, its output (stderr too) collected line by line."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = Lines(proc)
    lines.start()
    return proc, lines


def demo_dir(lines: Lines) -> Path:
    return Path(lines.wait_for(r"state, logs, socket\s+(\S+)").group(1))


def left_in(base: Path) -> list[int]:
    """Processes still working in ``base``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and (p.cwd() + os.sep).startswith(str(base) + os.sep):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_readme_starts_with_make_demo() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines()[0].startswith("make demo ")


def test_make_demo_finds_fragmentation_migrates_a_job_and_prints_working_metrics_and_status_lines() -> None:
    port = free_port()
    args = f"--until-move --timeout 150 --metrics-addr 127.0.0.1:{port}"
    proc, lines = started(
        ["make", "--no-print-directory", "-o", f"{VENV}/bin/flexmig", "demo", f"DEMO_VENV={VENV}", f"DEMO_ARGS={args}"]
    )
    try:
        base = demo_dir(lines)
        url = lines.wait_for(r"metrics\s+(http://\S+)").group(1)
        assert url == f"http://127.0.0.1:{port}/metrics"
        assert b"flexmig_actions_total" in http_get(url)
        # the status line, run exactly as printed (environment assignment, then the command), from where make ran
        printed = lines.wait_for(r"^\s+(FLEXMIG_CONTROL_SOCKET=\S+ \S+ status --watch)$").group(1)
        assignment, *command = shlex.split(printed)
        name, _, sock = assignment.partition("=")
        assert name == "FLEXMIG_CONTROL_SOCKET" and sock == str(base / "control.sock")
        assert (ROOT / command[0]).exists() or Path(command[0]).is_absolute()
        env = {**os.environ, name: sock}
        once = subprocess.run(command[:-1], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert once.returncode == 0, once.stderr
        assert "GPU 0: NVIDIA H200" in once.stdout and "mode act" in once.stdout
        assert proc.wait(200) == 0, "\n".join(lines.lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    lines.join(10)
    out = "\n".join(lines.lines)
    assert re.search(r"finding: fragmentation on GPU 0", out), out
    assert re.search(r"flexmigd: planner executing: .*migrate", out), out
    assert re.search(
        r"action #\d+ migrate train-\w done in [0-9.]+ s \(estimated [0-9.]+ s\) "
        r"\(flexmig's share of the job's pause [0-9.]+ s\)",
        out,
    ), out
    # The planner's figures are the demo jobs' own, not those of hours-long training on hardware: its move costs
    # (0.3 s checkpoint + 0.5 s restart, 0.05 s per instance change), and waits from the jobs' stated run times
    # (30-80 s); the measured durations are printed beside the estimates.
    plan = re.search(r"planner executing: 8 action\(s\) .*, estimated ([0-9.]+) s", out)
    assert plan is not None and float(plan.group(1)) <= 5.0, out
    assert re.search(r"flexmigd: plan \d+ completed in [0-9.]+ s \(estimated [0-9.]+ s\)", out), out
    spared = re.search(r"spares ~(\d+)s of waiting for (\d+)s of moves", out)
    assert spared is not None and 0 < int(spared.group(1)) <= 80, out
    assert "never frees up" not in out
    assert re.search(r"job wide-e: running on gpu0:3g\.71gb@4", out), out
    assert re.search(r"first move completed [0-9.]+ s after the demo started", out), out
    assert not base.exists(), "the demo removes its directory"
    assert left_in(base) == []


def test_the_demo_venv_holds_the_package_without_extras(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo", f"DEMO_VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    installs = [line for line in dry if "pip install" in line]
    assert installs == [f"{venv}/bin/pip install -q -e ./hook -e ."], dry  # the hook's distribution, then flexmig
    assert dry[-1] == f"{venv}/bin/flexmig demo "


def test_ctrl_c_stops_the_jobs_and_the_daemon_and_removes_the_demo_directory() -> None:
    address = f"127.0.0.1:{free_port()}"
    proc, lines = started([sys.executable, "-m", "flexmig.cli.main", "demo", "--metrics-addr", address])
    try:
        base = demo_dir(lines)
        lines.wait_for(r"job train-d: running on")
        daemon = [p for p in psutil.Process(proc.pid).children() if "flexmig.daemon" in " ".join(p.cmdline())]
        assert len(daemon) == 1
        assert left_in(base), "the jobs run in the demo's directory"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, "\n".join(lines.lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    lines.join(10)
    out = "\n".join(lines.lines)
    assert "stopping: the jobs, then flexmigd" in out and "flexmigd stopped (status 0)" in out
    assert not daemon[0].is_running() or daemon[0].status() == psutil.STATUS_ZOMBIE
    assert not base.exists()
    assert left_in(base) == []


@needs_mosquitto
def test_the_demo_publishes_its_events_to_a_broker_and_the_events_line_it_prints_shows_them(
    broker: Mosquitto,
) -> None:
    argv = [sys.executable, "-m", "flexmig.cli.main", "demo", "--broker", broker.address]
    proc, lines = started([*argv, "--metrics-addr", f"127.0.0.1:{free_port()}", "--until-move", "--timeout", "150"])
    events: subprocess.Popen[str] | None = None
    try:
        printed = lines.wait_for(r"^\s+MQTT events\s+(.+ events --broker \S+ --node demo)$").group(1)
        events, seen = started(shlex.split(printed))
        seen.wait_for(r"^# demo is online$")  # the node's retained status
        seen.wait_for(r"\bdemo\s+action_completed\s+migrate ", timeout_s=150)
        assert proc.wait(200) == 0, "\n".join(lines.lines)
    finally:
        for p in (proc, events):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:  # never left behind, and the failure that brought us here stands
                    p.kill()
                    p.wait(10)
    out = "\n".join(lines.lines)
    assert "cannot open" not in out and re.search(r"first move completed", out), out
    assert events is not None and events.returncode in (0, 130, -signal.SIGINT), "flexmig events ends on Ctrl-C"


def test_nvitop_gpustat_and_the_nvidia_smi_look_alike_in_another_shell_show_the_demos_gpus_instances_and_jobs() -> None:
    argv = [sys.executable, "-m", "flexmig.cli.main", "demo", "--metrics-addr", f"127.0.0.1:{free_port()}"]
    proc, lines = started([*argv, "--timeout", "200"])
    env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FLEXMIG_SIM_STATE", None)

    def run(cmd: list[str]) -> str:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        printed = lines.wait_for(r"^\s+(\S+ sim --state \S+ exec -- nvitop)$").group(1)
        on_node = shlex.split(printed)[:-1]  # the line as printed, up to the tool it names
        sock = lines.wait_for(r"FLEXMIG_CONTROL_SOCKET=(\S+) ").group(1)
        lines.wait_for(r"job wide-e: running on gpu0:3g\.71gb@4", timeout_s=150)
        flexmig = str(VENV / "bin" / "flexmig")

        def busy() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]] | None:
            doc = json.loads(run([flexmig, "status", "--json", "--socket", sock]))
            instances = [i for g in doc["gpus"] for i in g["instances"]]
            wide = next((i for i in instances if i.get("job") == "wide-e"), None)  # None until a sweep saw it run
            if wide is None:
                return None
            if (wide.get("sm_active") or 0) >= 0.5 and (wide.get("memory_used_bytes") or 0) >= 10 << 30:
                return doc, instances, wide
            return None

        # The job's footprint shows in status once a sweep has measured it (GPM: two samples).
        doc, instances, wide = wait_until(busy, 60, "wide-e's instance busy in status", every_s=0.5)
        (wide_pid,) = [p["pid"] for p in wide["processes"]]

        listed = run([*on_node, "nvidia-smi", "-L"])
        assert f"(UUID: {doc['gpus'][0]['uuid']})" in listed
        assert {line.rsplit("UUID: ", 1)[1].rstrip(")") for line in listed.splitlines() if "MIG" in line} == {
            i["uuid"] for i in instances
        }
        apps = run([*on_node, "nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        used = {int(pid): int(mib) for pid, mib in (line.split(", ") for line in apps.splitlines())}
        assert used[wide_pid] > 1024  # the job's footprint, not an idle instance's few MiB

        top = run([*on_node, "nvitop", "-1"])
        assert "3g.71gb @ GI/CI" in top and f" {wide_pid} " in top
        stat = json.loads(run([*on_node, "gpustat", "--json"]))
        assert [g["uuid"] for g in stat["gpus"]] == [doc["gpus"][0]["uuid"]]
        assert wide_pid in {p["pid"] for p in stat["gpus"][0]["processes"]}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(90)
    lines.join(10)
