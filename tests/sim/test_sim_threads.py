"""The daemon sweeps NVML on a worker thread while tests (or the actuator) change the simulated node."""

from __future__ import annotations

import threading
from ctypes import byref

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.nvml import GpmWindows, Nvml
from flexmig.sim import install, uninstall


def test_sweeps_on_another_thread_survive_concurrent_changes_and_end_consistent() -> None:
    node = install("h200x2:3g.71gb@0+2g.35gb@4+1g.18gb@6")
    try:
        nvml = Nvml.open()
        gpm = GpmWindows(min_interval_s=1e-6)
        stop = threading.Event()
        failures: list[BaseException] = []
        sweeps = 0

        def sweeper() -> None:
            nonlocal sweeps
            try:
                while not stop.is_set() and sweeps < 2000:
                    nvml.sample(gpm)
                    sweeps += 1
            except BaseException as exc:  # reported to the main thread
                failures.append(exc)

        thread = threading.Thread(target=sweeper)
        thread.start()
        try:
            N.nvmlInit()
            dev = N.nvmlDeviceGetHandleByIndex(1)
            for round_ in range(40):
                uuid = node.mig_uuids(0)[round_ % 3]
                pid = node.start_process(uuid, memory_bytes=1 << 20)
                node.set_activity(uuid, sm=0.5)
                gi = N.nvmlDeviceGetGpuInstanceById(dev, node.gpu(1).gi_id_at(6))
                N.nvmlComputeInstanceDestroy(N.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
                N.nvmlGpuInstanceDestroy(gi)
                placement = N.c_nvmlGpuInstancePlacement_t(6, 1)
                gi = N.nvmlDeviceCreateGpuInstanceWithPlacement(dev, 19, byref(placement))
                N.nvmlGpuInstanceCreateComputeInstance(gi, N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
                node.stop_process(pid)
            N.nvmlShutdown()
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not thread.is_alive()
        assert failures == []
        assert sweeps > 0
        final = nvml.sample(gpm)
        assert [d.uuid for g in final for d in g.mig_devices] == list(node.mig_uuids())
        gpm.close()
        nvml.close()
    finally:
        uninstall()
