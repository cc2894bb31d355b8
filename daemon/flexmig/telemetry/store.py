"""Turns one sweep's raw readings into the next :class:`Snapshot`, keeping per-instance history in ring buffers.

Inputs are the values ``flexmig.nvml`` returns (an :class:`Inventory` and a tuple of :class:`GpuSample`), the
last dcgm-exporter scrape, and host facts per PID; time is passed in. The store owns the only mutable telemetry
state: one ring buffer per instance and quantity, and when each instance was first seen and last busy.

Identity: an instance is (GPU UUID, GI ID, CI ID, MIG UUID, profile, start). NVML reuses GI IDs after a destroy,
so a recreated instance with the same numeric ID is a *new* instance with fresh history (and a reseeded GPM
window). History of an instance that left is kept for one window in case it was only missing
from one sweep (an NVML error on it), then dropped, so memory stays bounded while instances churn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flexmig.errors import LayoutError
from flexmig.mig import GpuModel, Layout, model_for
from flexmig.nvml.types import GpuInfo, GpuInstanceInfo, GpuSample, Inventory, MigDeviceInfo, MigDeviceSample
from flexmig.telemetry.dcgm import DcgmInstance, DcgmScrape
from flexmig.telemetry.ring import RingBuffer, capacity_for
from flexmig.telemetry.settings import TelemetrySettings
from flexmig.telemetry.snapshot import (
    DcgmStatus,
    GpuInstanceSnapshot,
    GpuSnapshot,
    HostProcess,
    InstanceActivity,
    InstanceSnapshot,
    ProcessSnapshot,
    SamplingStats,
    Snapshot,
)

__all__ = ["HistoryKey", "TelemetryStore", "pids_of"]

HistoryKey = tuple[str, int, int, str, int, int]
"""What keys one instance's history: GPU UUID, GI ID, CI ID, MIG UUID, profile ID, start (a change in any of them
starts a new history; detection's ``flexmig.detect.InstanceKey`` is the GPU index and start alone)."""


@dataclass(slots=True)
class _History:
    first_seen: float
    last_busy: float | None
    last_seen: float
    sm_active: RingBuffer
    memory_used: RingBuffer


@dataclass(frozen=True, slots=True)
class _GpuStatic:
    """What one inventory says about one GPU, computed once per inventory (the layout maths is not free)."""

    model_name: str
    model: GpuModel | None
    instances: Mapping[int, GpuInstanceInfo]  # GI ID -> GI
    devices: Mapping[str, MigDeviceInfo]  # MIG UUID -> device
    free_compute: int | None
    free_memory: int | None
    creatable: Mapping[str, int]
    profile_names: Mapping[int, str]  # GI ID -> profile name
    compute_slices: Mapping[int, int | None]  # GI ID -> compute slices
    gpu_instances: tuple[GpuInstanceSnapshot, ...]  # every GI, with or without a MIG device


@dataclass(slots=True)
class _InventoryView:
    inventory: Inventory
    gpus: dict[str, _GpuStatic] = field(default_factory=dict)


def pids_of(samples: tuple[GpuSample, ...]) -> set[int]:
    """Every PID on any MIG device of the sweep (what the host source is asked about)."""
    return {p.pid for g in samples for d in g.mig_devices if d.processes for p in d.processes}


class TelemetryStore:
    """History of every live instance and the builder of snapshots. Not thread-safe: one sampling loop owns it."""

    def __init__(self, settings: TelemetrySettings, hostname: str) -> None:
        self._settings = settings
        self._hostname = hostname
        self._capacity = capacity_for(settings.history_s, settings.interval_s)
        self._history: dict[HistoryKey, _History] = {}
        self._view: _InventoryView | None = None

    # ------------------------------------------------------------------------------------------ inventory
    def set_inventory(self, inventory: Inventory) -> None:
        """Adopt a new inventory (after start-up or a re-inventory); per-GPU layout maths is done once here."""
        view = _InventoryView(inventory)
        for gpu in inventory.gpus:
            view.gpus[gpu.uuid] = _static_of(gpu)
        self._view = view

    @property
    def inventory(self) -> Inventory | None:
        """The inventory snapshots are currently built against."""
        return None if self._view is None else self._view.inventory

    def matches(self, samples: tuple[GpuSample, ...]) -> bool:
        """True when every sampled MIG device is known to the inventory and every GPU's device set is the same.

        False is the signal to re-inventory: an instance was created or destroyed since the last inventory.
        """
        view = self._view
        if view is None:
            return False
        for g in samples:
            static = view.gpus.get(g.uuid)
            if static is None:
                return False
            if g.lost:
                continue
            sampled = {d.uuid for d in g.mig_devices}
            if sampled != set(static.devices):
                return False
        return True

    def tracked(self) -> int:
        """Instances with history (live ones plus those kept for one window after they left)."""
        return len(self._history)

    # ------------------------------------------------------------------------------------------ snapshot
    def build(
        self,
        samples: tuple[GpuSample, ...],
        *,
        now: float,
        wall: float,
        stats: SamplingStats,
        dcgm: DcgmScrape | None = None,
        dcgm_status: DcgmStatus | None = None,
        host: Mapping[int, HostProcess] | None = None,
    ) -> Snapshot:
        """Record this sweep in the rings and return the snapshot of the node at ``now``."""
        view = self._view
        if view is None:
            raise RuntimeError("TelemetryStore.build before set_inventory")
        settings = self._settings
        by_uuid = {g.uuid: g for g in samples}
        gpus: list[GpuSnapshot] = []
        live: set[HistoryKey] = set()
        for info in view.inventory.gpus:
            static = view.gpus[info.uuid]
            sample = by_uuid.get(info.uuid)
            instances: list[InstanceSnapshot] = []
            if sample is not None and not sample.lost:
                for dev in sample.mig_devices:
                    inst = self._instance(info, static, dev, now=now, dcgm=dcgm, host=host, live=live)
                    if inst is not None:
                        instances.append(inst)
            gpus.append(_gpu_snapshot(info, static, sample, tuple(instances)))
        self._forget(now - settings.window_s, live)
        return Snapshot(
            taken_at=wall,
            monotonic=now,
            hostname=self._hostname,
            driver_version=view.inventory.driver_version,
            nvml_version=view.inventory.nvml_version,
            window_s=settings.window_s,
            gpus=tuple(gpus),
            stats=stats,
            dcgm=dcgm_status,
        )

    def _forget(self, keep_after: float, live: set[HistoryKey]) -> None:
        """Drop the history of instances not seen in this sweep nor since ``keep_after``."""
        for key in [k for k, h in self._history.items() if k not in live and h.last_seen < keep_after]:
            del self._history[key]

    def _history_of(self, key: HistoryKey, now: float, live: set[HistoryKey]) -> _History:
        """The history of instance ``key`` (a fresh one for an instance seen for the first time), marked seen now."""
        hist = self._history.get(key)
        if hist is None:
            hist = _History(now, None, now, RingBuffer(self._capacity), RingBuffer(self._capacity))
            self._history[key] = hist
        hist.last_seen = now
        live.add(key)
        return hist

    def _instance(
        self,
        info: GpuInfo,
        static: _GpuStatic,
        dev: MigDeviceSample,
        *,
        now: float,
        dcgm: DcgmScrape | None,
        host: Mapping[int, HostProcess] | None,
        live: set[HistoryKey],
    ) -> InstanceSnapshot | None:
        gi = static.instances.get(dev.gpu_instance_id)
        known = static.devices.get(dev.uuid)
        if gi is None or known is None:
            return None  # created after the inventory; the loop re-inventories and it shows next sweep
        key: HistoryKey = (info.uuid, dev.gpu_instance_id, dev.compute_instance_id, dev.uuid, gi.profile_id, gi.start)
        hist = self._history_of(key, now, live)
        profile_name = static.profile_names[gi.id]
        row = None if dcgm is None else _joinable(dcgm, info, dev.gpu_instance_id, profile_name, hist.first_seen)
        activity = _activity(dev, row)
        mem_total = dev.memory_total_bytes
        mem_used = dev.memory_used_bytes
        if row is not None:
            mem_total = mem_total if mem_total is not None else row.fb_total_bytes
            mem_used = mem_used if mem_used is not None else row.fb_used_bytes

        settings = self._settings
        sm = None if activity is None else activity.sm_active
        if sm is not None:
            hist.sm_active.append(now, sm)
        if mem_used is not None:
            hist.memory_used.append(now, float(mem_used))
        processes = _processes(dev, host)
        idle = _idle_seconds(hist, processes, sm, settings.idle_threshold, now)
        return InstanceSnapshot(
            gpu_index=info.index,
            gpu_uuid=info.uuid,
            model_name=static.model_name,
            mig_uuid=dev.uuid,
            mig_index=known.index,
            gpu_instance_id=dev.gpu_instance_id,
            compute_instance_id=dev.compute_instance_id,
            profile_id=gi.profile_id,
            profile_name=profile_name,
            start=gi.start,
            memory_slices=gi.size,
            compute_slices=static.compute_slices[gi.id],
            memory_total_bytes=mem_total,
            memory_used_bytes=mem_used,
            processes=processes,
            activity=activity,
            sm_active_window=hist.sm_active.window(now, settings.window_s),
            memory_used_window=hist.memory_used.window(now, settings.window_s),
            idle_seconds=idle,
            first_seen=hist.first_seen,
            pci_bus_id=info.pci_bus_id,
        )


def _processes(dev: MigDeviceSample, host: Mapping[int, HostProcess] | None) -> tuple[ProcessSnapshot, ...] | None:
    """The device's processes with the host's facts joined (None: NVML would not list them)."""
    if dev.processes is None:
        return None
    return tuple(
        ProcessSnapshot(p.pid, p.used_memory_bytes, None if host is None else host.get(p.pid)) for p in dev.processes
    )


def _idle_seconds(
    hist: _History, processes: tuple[ProcessSnapshot, ...] | None, sm: float | None, threshold: float, now: float
) -> float | None:
    """Seconds since the instance last ran a process or showed activity above ``threshold`` (0 while it does; None
    when neither is known); records ``now`` as its last busy time when it is busy."""
    busy = bool(processes) or (sm is not None and sm > threshold)
    if busy:
        hist.last_busy = now
    if processes is None and sm is None:
        return None
    return 0.0 if busy else now - (hist.last_busy if hist.last_busy is not None else hist.first_seen)


def _gpu_snapshot(
    info: GpuInfo, static: _GpuStatic, sample: GpuSample | None, instances: tuple[InstanceSnapshot, ...]
) -> GpuSnapshot:
    """One GPU of the snapshot: the inventory's facts, this sweep's readings (none when it was not sampled)."""
    lost = info.lost or (sample is not None and sample.lost)
    return GpuSnapshot(
        index=info.index,
        uuid=info.uuid,
        model_name=static.model_name,
        memory_total_bytes=info.memory_total_bytes,
        power_w=None if sample is None else sample.power_w,
        temperature_c=None if sample is None else sample.temperature_c,
        sm_clock_mhz=None if sample is None else sample.sm_clock_mhz,
        mem_clock_mhz=None if sample is None else sample.mem_clock_mhz,
        mig_current=info.mig_current if sample is None else sample.mig_current,
        lost=lost,
        free_compute_slices=None if lost else static.free_compute,
        free_memory_slices=None if lost else static.free_memory,
        creatable={} if lost else static.creatable,
        instances=instances,
        gpu_instances=() if lost else static.gpu_instances,
        pci_bus_id=info.pci_bus_id,
        power_limit_w=info.power_limit_w,
        offers=info.offers,
    )


def _joinable(
    scrape: DcgmScrape, info: GpuInfo, gi_id: int, profile_name: str, first_seen: float
) -> DcgmInstance | None:
    """dcgm-exporter's row for GPU instance ``gi_id`` of ``info``, if it can only be about the instance we see now.

    dcgm-exporter keys its rows by (``gpu``, ``GPU_I_ID``), and drivers hand a destroyed instance's ID to the next
    one on the same slices (or, on another driver, to any instance of its size): a row keyed like ours may describe
    the instance that had the ID before. So a row joins only if its GPU UUID is this GPU's (DCGM and NVML number
    GPUs alike), its ``GPU_I_PROFILE`` is this instance's profile, and the scrape was taken after this instance
    was first seen (an older scrape can only have measured its predecessor).
    """
    row = scrape.instances.get((info.index, gi_id))
    if row is None:
        return None
    if row.gpu_uuid is not None and row.gpu_uuid != info.uuid:
        return None  # DCGM's GPU numbering disagrees with NVML's: joining would mislabel figures
    if row.profile is not None and row.profile.removeprefix("MIG ") != profile_name:
        return None  # another instance under the same ID: a destroyed one, or one created since
    if scrape.taken_at < first_seen:
        return None  # scraped before this instance existed for us: the figures are its predecessor's
    return row


def _activity(dev: MigDeviceSample, row: DcgmInstance | None) -> InstanceActivity | None:
    """DCGM's figures where it has them, GPM's for the rest; None when neither source said anything."""
    gpm = dev.activity
    if row is not None and any(
        v is not None
        for v in (row.sm_active, row.sm_occupancy, row.dram_active, row.tensor_active, row.gr_engine_active)
    ):
        return InstanceActivity(
            source="dcgm",
            window_s=None if gpm is None else gpm.window_s,
            sm_active=_first(row.sm_active, None if gpm is None else gpm.sm_active),
            sm_occupancy=_first(row.sm_occupancy, None if gpm is None else gpm.sm_occupancy),
            dram_active=_first(row.dram_active, None if gpm is None else gpm.dram_bw),
            tensor_active=_first(row.tensor_active, None if gpm is None else gpm.tensor_active),
            gr_engine_active=row.gr_engine_active,
        )
    if gpm is None:
        return None
    return InstanceActivity(
        source="gpm",
        window_s=gpm.window_s,
        sm_active=gpm.sm_active,
        sm_occupancy=gpm.sm_occupancy,
        dram_active=gpm.dram_bw,
        tensor_active=gpm.tensor_active,
    )


def _first(a: float | None, b: float | None) -> float | None:
    return a if a is not None else b


def _static_of(gpu: GpuInfo) -> _GpuStatic:
    model = model_for(gpu.name, gpu.offers)  # as its driver offers it: only its profiles count as creatable
    model_name = gpu.name or "unknown"
    names: dict[int, str] = {}
    slices: dict[int, int | None] = {}
    layout: Layout | None = None if model is None or not gpu.mig_current else Layout.empty(model)
    for gi in gpu.gpu_instances:
        profile = None
        if model is not None:
            try:
                profile = model.profile_by_id(gi.profile_id)
            except KeyError:
                profile = None
        names[gi.id] = gi.profile_name or (profile.name if profile is not None else "unknown")
        slices[gi.id] = None if profile is None else profile.compute_slices
        if layout is not None:
            if profile is None:
                layout = None
            else:
                try:
                    layout = layout.place(profile, gi.start)
                except LayoutError:
                    layout = None  # NVML shows a layout our catalogue thinks impossible: claim nothing
    return _GpuStatic(
        model_name=model_name,
        model=model,
        instances={gi.id: gi for gi in gpu.gpu_instances},
        devices={d.uuid: d for d in gpu.mig_devices},
        free_compute=None if layout is None else layout.free_compute_slices(),
        free_memory=None if layout is None else len(layout.free_memory_slices()),
        creatable={} if layout is None else layout.capacity(),
        profile_names=names,
        compute_slices=slices,
        gpu_instances=tuple(
            GpuInstanceSnapshot(
                gpu_instance_id=gi.id,
                profile_id=gi.profile_id,
                profile_name=names[gi.id],
                start=gi.start,
                memory_slices=gi.size,
                compute_slices=slices[gi.id],
                compute_instances=len(gi.compute_instances),
            )
            for gi in sorted(gpu.gpu_instances, key=lambda gi: (gi.start, gi.id))
        ),
    )
