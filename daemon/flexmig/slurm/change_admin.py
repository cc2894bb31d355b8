"""What an administrator did to a Slurm node, as flexmig reads it: down, failing, rebooting or powered
(:func:`admin_down`), held by a drain or a reservation (:func:`admin_hold`: flexmig then leaves the node alone), and
the attributes set with ``scontrol update`` that a re-registration must set again (:func:`admin_attributes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from flexmig.slurm.nodes import SlurmNode
from flexmig.slurm.reservations import SlurmReservation, flexmig_name

__all__ = ["ADMIN_FLAGS", "admin_attributes", "admin_down", "admin_hold"]


ADMIN_FLAGS = frozenset(
    {"FAIL", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP",
     "POWER_DRAIN", "MAINTENANCE"}
)  # fmt: skip
"""Node state flags that only an administrator (``scontrol update state=fail``, ``scontrol reboot``, power saving,
a maintenance reservation) puts on a node: flexmig leaves such a node alone. A re-registration would lose them
(``scontrol delete`` forgets a pending reboot), and a slurmd started again would answer a reboot or power-down
Slurm is waiting for."""


def admin_down(node: SlurmNode | None) -> str | None:
    """Why node ``node`` is down, failing, rebooting or powered by an administrator's (or Slurm's power saving's)
    decision, or None. slurmd must not be started on such a node even when it crashed: with
    ``ReturnToService=2`` a DOWN node that registers comes back into service (verified on 22.05.8), which would undo
    the administrator's ``state=down``."""
    if node is None:
        return None
    reason = node.reason or "no reason given"
    if node.state == "down" and node.reason and not node.reason.startswith(("Not responding", "flexmig")):
        return f"node {node.name} is down ({reason}); flexmig leaves it as it is"
    flags = sorted(node.flags & ADMIN_FLAGS)
    if flags:
        return f"node {node.name} is {'+'.join(flags)} ({reason}); flexmig leaves it as it is"
    return None


def admin_hold(node: SlurmNode | None, reservations: Sequence[SlurmReservation], name: str) -> str | None:
    """Why an administrator holds node ``name`` (flexmig then changes nothing about it), or None.

    Held: drained by anyone but flexmig (its reasons start with ``flexmig``), down for any reason but Slurm's own
    ``Not responding`` (slurmd is flexmig's to bring back), failing, rebooting or powered down or up
    (:data:`ADMIN_FLAGS`), or named by any reservation but flexmig's, whenever it starts (a re-registration would
    take the node out of it, and slurmctld deletes a reservation left without nodes).
    """
    if node is not None:
        reason = node.reason or "no reason given"
        if node.drained and not node.reason.startswith("flexmig"):
            return f"node {name} is drained ({reason}); flexmig leaves it as it is"
        down = admin_down(node)
        if down is not None:
            return down
    for r in reservations:
        if name in r.nodes and r.name != flexmig_name(name):
            return f"node {name} is in reservation {r.name}; flexmig leaves it as it is (no re-registration)"
    return None


def admin_attributes(node: SlurmNode, conf: str | None) -> dict[str, str]:
    """What someone set on ``node`` with ``scontrol update`` (features, active features, weight, comment, extra)
    beyond what its registration's ``--conf`` (``conf``: ``Feature=mig Weight=1 ...``) gave it: the attributes a
    re-registration must set again. A dynamic node that is deleted and registered again gets ``--conf`` only."""
    given: dict[str, str] = {}
    for word in (conf or "").split():
        key, _, value = word.partition("=")
        given[key.lower()] = value
    registered = {
        "features": given.get("features", given.get("feature", "")),
        "weight": given.get("weight", "1"),
        "comment": "",
        "extra": "",
    }
    now = node.attributes()
    out = {k: v for k, v in now.items() if k in registered and v != registered[k]}
    if now["activefeatures"] != now["features"]:
        out["activefeatures"] = now["activefeatures"]
    return out
