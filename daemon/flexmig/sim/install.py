"""Put a simulated node under pynvml for this process, and take it away again.

``pynvml.nvmlLib`` is a plain module global that pynvml loads lazily (only while it is None); assigning our
:class:`~flexmig.sim.library.SimLibrary` to it makes every pynvml wrapper, in any code in this process (our
``flexmig.nvml``, nvitop's API, a script), talk to the simulator through the real ctypes protocol. The installed
library remembers what it replaced, so no state of our own lives at module level.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path

import pynvml as N  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from flexmig.errors import SimError
from flexmig.mig import NodeSpec, parse_node_spec
from flexmig.sim.ciprofiles import ci_shape_for_slices
from flexmig.sim.drivers import DriverRelease, driver_release
from flexmig.sim.faults import FaultTable
from flexmig.sim.gi_ids import GiIdPolicy, policy_from
from flexmig.sim.library import SimLibrary, library_for
from flexmig.sim.node import SimNode
from flexmig.sim.persist import load_state, save_state
from flexmig.sim.recorded import PREFIX as RECORDING
from flexmig.sim.recorded import RecordedAnswers, load_recording, state_from_recording
from flexmig.sim.state import SimNodeState

__all__ = ["install", "installed", "uninstall"]


def install(
    spec: str,
    *,
    state_path: Path | None = None,
    clock: Callable[[], float] = time.monotonic,
    seed: int = 0,
    ids: str | None = None,
) -> SimNode:
    """Install a simulated node described by ``spec`` (``h200x2:3g.71gb@0+2g.35gb@4``) under pynvml.

    ``recording:PATH`` builds the node from a ``flexmig nvml record`` document instead, answering as the
    recorded driver did (:mod:`flexmig.sim.recorded`).

    With ``state_path``, every change is saved there, and an existing file is restored instead of building the
    node from the spec (its model and GPU count must match the spec). ``clock`` drives GPM counters; ``seed``
    fixes the UUIDs and the synthetic workload. ``ids`` says how GPU-instance IDs are handed out (``driver``, as
    real drivers do, or ``adversarial[:SEED]``; None: the ``FLEXMIG_SIM_IDS`` environment variable, see
    :mod:`flexmig.sim.gi_ids`). A simulator already installed is replaced.
    Raises NodeSpecError for a bad spec and SimError for an unreadable or mismatched state file.
    """
    policy = policy_from(ids)
    answers: RecordedAnswers | None = None
    release: DriverRelease
    if spec.startswith(RECORDING):
        if state_path is not None:
            raise SimError("a node built from a recording keeps no state file: drop the state path")
        path = Path(spec.removeprefix(RECORDING))
        state, node_spec, answers = state_from_recording(load_recording(path), path, clock, ids=policy)
        release = state.driver
    else:
        node_spec = parse_node_spec(spec)
        release = driver_release(node_spec.driver)
        release.check(node_spec.model)
        if state_path is not None and state_path.exists():
            state = load_state(state_path, node_spec.model, node_spec.count, clock, ids=policy, driver=release)
        else:
            state = _build(spec, node_spec, clock, seed, ids=policy, release=release)
    faults = FaultTable()
    library = library_for(release)(state, faults)
    library.answers = answers
    node = SimNode(node_spec, state, faults, library, state_path=state_path, seed=seed)
    if state_path is not None:
        save_state(state, state_path)
    with N.libLoadLock:
        previous = N.nvmlLib
        library.previous = previous.previous if isinstance(previous, SimLibrary) else previous
        N.nvmlLib = library
        N._nvmlGetFunctionPointer_cache.clear()
        N._nvmlLib_refcount = 0
    return node


def _build(
    spec: str, node_spec: NodeSpec, clock: Callable[[], float], seed: int, *, ids: GiIdPolicy, release: DriverRelease
) -> SimNodeState:
    """A fresh node from the spec: UUIDs derived from the spec and seed, the layout created on every GPU."""
    node_id = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"flexmig-sim/{spec.strip()}/{seed}")
    state = SimNodeState(node_spec.model, node_spec.count, node_id=node_id, clock=clock, ids=ids, driver=release)
    for inst in node_spec.layout or ():
        if not release.offers(node_spec.model, inst.profile):
            raise SimError(f"node spec {spec.strip()!r}: driver {release.version} offers no {inst.profile.name}")
    for gpu in state.gpus:
        if node_spec.layout is None:
            gpu.mig_current = gpu.mig_pending = False
            gpu.layout = None
            continue
        for inst in node_spec.layout:
            gi = state.create_gi(gpu, inst.profile, inst.start, inst.profile.memory_slices)
            state.create_ci(gi, ci_shape_for_slices(gpu.model, inst.profile, inst.profile.compute_slices).index, None)
    return state


def installed() -> bool:
    """True while a simulated library sits under pynvml."""
    return isinstance(N.nvmlLib, SimLibrary)


def uninstall() -> None:
    """Take the simulator away and put back whatever pynvml had before (usually nothing: loaded on next init)."""
    with N.libLoadLock:
        current = N.nvmlLib
        if isinstance(current, SimLibrary):
            N.nvmlLib = current.previous
        N._nvmlGetFunctionPointer_cache.clear()
        N._nvmlLib_refcount = 0
