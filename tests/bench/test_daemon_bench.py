"""bench/daemon.py's split of the daemon's CPU: what it counts as the simulation, and what as flexmig's own."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flexmig import sim

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
bench: Any = importlib.import_module("daemon")  # bench/daemon.py (mypy would take the name for the daemon/ folder)


def test_the_simulation_is_timed_per_sweep_and_the_library_is_left_as_it_was() -> None:
    cost = bench.sim_cost(True, 12)
    # 8 GPUs x (5 readings + a MIG handle count) and 56 MIG devices x 6 calls, plus an inventory's share.
    assert 380 <= cost.calls <= 420
    assert cost.library_s > 0 and cost.workload_s > 0
    assert not sim.installed()  # uninstalled, the timers gone with it


def test_a_stack_inside_an_nvml_call_is_the_library_and_pynvml_s_own_python_is_flexmig_s() -> None:
    sweep = "SamplingLoop.sweep (flexmig/telemetry/sampler.py:130);Nvml.sample (flexmig/nvml/client.py:250)"
    call = f"{sweep};nvmlDeviceGetUUID (pynvml.py:3590)"
    inside = f"{call};SimLibrary.nvmlDeviceGetUUID (flexmig/sim/library.py:264)"
    assert bench.classify(inside) == "simulated library"
    assert bench.classify(call) == "flexmig"
    step = "demo_workload_loop.<locals>.step (flexmig/wiring/sampling.py:1);SimNode.step_workload (flexmig/sim/node.py)"
    assert bench.classify(step) == "simulated workload"
    assert bench.classify(sweep) == "flexmig"


def test_a_section_shows_the_arguments_it_was_run_with_but_not_where_it_was_written() -> None:
    assert bench._shown(["--runs", "5", "--seconds", "20", "--markdown", "/tmp/section.md"]) == [
        "--runs", "5", "--seconds", "20",
    ]  # fmt: skip
    assert bench._shown(["--markdown=/tmp/section.md", "--quick"]) == ["--quick"]
    assert bench._shown([]) == []


def test_a_thread_s_cpu_is_read_exactly_from_its_schedstat() -> None:
    procstat: Any = importlib.import_module("procstat")
    pid, tid = os.getpid(), threading.get_native_id()
    before, cpu0 = procstat.thread_cpu_s(pid, tid), time.thread_time()
    while time.thread_time() - cpu0 < 0.05:  # burn 50 ms of this thread's CPU
        pass
    burnt = time.thread_time() - cpu0
    got = procstat.thread_cpu_s(pid, tid) - before
    assert burnt - 0.002 <= got <= burnt + 0.05  # ns-exact where /proc/PID/stat would say 0, 40 or 50 ms
    assert procstat.thread_cpu_s(pid, pid) > 0  # the main thread's TID is the PID


def test_a_window_sums_every_thread_and_refuses_one_that_ended() -> None:
    procstat: Any = importlib.import_module("procstat")
    before = {1: 1.0, 2: 0.5}
    assert procstat.window_cpu_s(before, {1: 1.25, 2: 0.75, 3: 0.125}) == 0.625  # a new thread counts from 0
    assert procstat.window_cpu_s(before, {1: 1.25}) is None  # thread 2's last slice would be lost
    here = procstat.threads_cpu_s(os.getpid())
    assert threading.get_native_id() in here and os.getpid() in here
