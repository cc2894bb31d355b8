"""Which agent of a host serves which Slurm node (``[slurm] node_per_gpu`` and ``node_per_instance``), and the
settings each agent runs with.

A host runs one agent (key None), one per MIG GPU (key: the GPU), or one per MIG instance (key ``(gpu, start)``,
or ``(gpu, start, profile)`` for static nodes). :func:`agent_settings` names an agent's node and gives its settings;
:func:`instance_of_action` and :func:`gpu_of_action` route a journalled re-registration to the agent of the node its
payload names, or refuse it with one line when this host's settings do not manage that node.
"""

from __future__ import annotations

import re

from flexmig.config import SlurmConfig
from flexmig.errors import SlurmError
from flexmig.mig.catalogue import MODELS
from flexmig.slurm.config_settings import slurm_settings
from flexmig.slurm.settings import SlurmSettings, gpu_node, instance_node, instance_port, parse_instance_node, slot_node

__all__ = ["AgentKey", "agent_settings", "example_node", "gpu_of_action", "instance_of_action", "slot_profile"]

AgentKey = int | tuple[int, int] | tuple[int, int, str] | str | None
"""An agent's key: None (the one node), a GPU (``node_per_gpu``), ``(gpu, start)`` (``node_per_instance``),
``(gpu, start, profile)`` (``node_per_instance`` with ``instance_nodes = static``: a node per profile and place), or
a pool node's name (``node_per_instance``: a node over several instances, :mod:`flexmig.slurm.pool`)."""


def agent_settings(
    host: str, key: AgentKey, slurm: SlurmConfig, *, port: int | None = None
) -> tuple[str, SlurmSettings]:
    """The node name and settings of the agent of GPU ``key`` of host node ``host`` (None: the one node's;
    ``(gpu, start)``: that instance's; a name: that pool node's, with its slurmd's ``port`` when it is a dynamic
    node)."""
    settings = slurm_settings(slurm)
    if key is None:
        return host, settings.for_node(host)
    if isinstance(key, str):  # a pool node: a static one's Port= is slurm.conf's
        return key, settings.for_node(key, port=port)
    if isinstance(key, tuple):
        gpu, start = key[0], key[1]
        if len(key) == 3:  # a static node: its Port= is slurm.conf's
            node = slot_node(host, gpu, start, key[2])
            return node, settings.for_node(node)
        node = instance_node(host, gpu, start)
        return node, settings.for_node(node, port=instance_port(slurm.slurmd_port_base, gpu, start))
    node = gpu_node(host, key)
    return node, settings.for_node(node, port=slurm.slurmd_port_base + key)


def example_node(host: str, *, static: bool) -> str:
    """The name of the first instance node of host node ``host``, for messages."""
    return f"{instance_node(host, 0, 0)}-<profile>" if static else instance_node(host, 0, 0)


def slot_profile(host: str, name: str) -> str:
    """The MIG profile of static node ``name`` of host node ``host`` (:func:`flexmig.slurm.settings.slot_node`), or
    "" when the name is no such node."""
    where = parse_instance_node(host, name)
    if where is None:
        return ""
    for model in MODELS:
        for p in model.profiles:
            if slot_node(host, *where, p.name) == name:
                return p.name
    return ""


def instance_of_action(host: str, node: str, *, static: bool) -> tuple[int, int, str]:
    """``(gpu, start, profile)`` of the instance node ``node`` a journalled re-registration names (``profile``: ""
    for a dynamic node); SlurmError when host node ``host`` does not manage that node as ``static`` says."""
    where = parse_instance_node(host, node)
    profile = slot_profile(host, node) if static else ""
    ours = bool(profile) if static else where is not None and node == instance_node(host, *where)
    if where is None or not ours:
        kind = "static" if static else "dynamic"
        raise SlurmError(
            f"a re-registration of node {node!r} is in the journal, but with [slurm] node_per_instance "
            f"and instance_nodes = {kind} flexmig manages {example_node(host, static=static)}, ...: finish it with "
            "the settings it was made with, or re-register that node by hand"
        )
    return (*where, profile)


def gpu_of_action(host: str, node: str) -> int:
    """The GPU of the GPU node ``node`` a journalled re-registration names (``node_per_gpu``); SlurmError when it
    is no GPU node of host node ``host``."""
    m = re.fullmatch(re.escape(host) + r"-gpu([0-9]{1,4})", node)
    if m is None:
        raise SlurmError(
            f"a re-registration of node {node!r} is in the journal, but with [slurm] node_per_gpu flexmig "
            f"manages {gpu_node(host, 0)}, {gpu_node(host, 1)}, ...: finish it with node_per_gpu = "
            "false, or re-register that node by hand"
        )
    return int(m.group(1))
