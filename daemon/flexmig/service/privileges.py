"""Whether this process holds the capabilities mode act needs, said once and plainly when it does not.

The shipped systemd unit gives the daemon no capability at all (observe and advise need none); mode act needs
the drop-in ``flexmigd.service.d/act.conf``. Without it every MIG change fails with NO_PERMISSION and no job can
start as its user, a long way from the cause: the daemon names it at start and on a reload into act.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ACT_CAPABILITIES", "act_privilege_warning", "effective_capabilities", "missing_for_act"]

#: What mode act uses each capability for, by its number in ``linux/capability.h``.
ACT_CAPABILITIES: dict[str, tuple[int, str]] = {
    "CAP_SYS_ADMIN": (21, "create and destroy MIG instances"),
    "CAP_SETUID": (7, "start jobs as their users"),
    "CAP_SETGID": (6, "start jobs with their groups"),
    "CAP_KILL": (5, "signal jobs to checkpoint"),
    "CAP_DAC_READ_SEARCH": (2, "find a job's ranks again after a restart"),
}


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int | None:
    """The ``CapEff`` bit mask of a ``/proc/PID/status`` file; None where there is none (not Linux)."""
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            try:
                return int(value.strip(), 16)
            except ValueError:
                return None
    return None


def missing_for_act(status: Path = Path("/proc/self/status")) -> list[str]:
    """The capabilities of :data:`ACT_CAPABILITIES` this process lacks (empty when unknown)."""
    mask = effective_capabilities(status)
    if mask is None:
        return []
    return [name for name, (bit, _) in ACT_CAPABILITIES.items() if not mask >> bit & 1]


def act_privilege_warning(status: Path = Path("/proc/self/status")) -> str | None:
    """One log line naming what mode act cannot do without the missing capabilities, and the fix; None if none."""
    missing = missing_for_act(status)
    if not missing:
        return None
    uses = "; ".join(f"{name}: {ACT_CAPABILITIES[name][1]}" for name in missing)
    return (
        f"mode act without {', '.join(missing)} ({uses}): those steps will fail. Under systemd install the act "
        "drop-in (flexmig install-files --prefix / --act, then systemctl daemon-reload && systemctl restart flexmigd)"
    )
