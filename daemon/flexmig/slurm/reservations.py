"""Slurm's reservations as typed values, read from ``scontrol show reservation --oneliner`` (22.05 has no ``--json``
for scontrol), and the one reservation flexmig makes per node.

Facts verified on Slurm 22.05.8 that shape flexmig's use of reservations:

* a reservation with a start in the future on a node that runs jobs (``Flags=IGNORE_JOBS``) leaves the node open to
  jobs whose time limit ends before it starts: backfill starts them; a job whose limit reaches into it pends
  ("ReqNodeNotAvail, May be reserved for other job") and does not delay it; its start can be moved earlier while
  jobs run;
* an active reservation shows as ``RESERVED`` in the node's ``state_flags``;
* ``scontrol delete nodename=N`` is refused while N is in an *active* reservation ("can't be delete because it's in
  a reservation"), but a reservation that has not started yet loses the node, and when it had no other node
  slurmctld deletes it ("Reservation maint has no nodes left, deleting it"): a dynamic node's re-registration would
  destroy an administrator's future maintenance reservation, so flexmig never re-registers a node that any
  reservation other than its own names;
* ``Nodes=`` is a host list (``n[1-3],n7``); a reservation made with ``Nodes=ALL`` lists every node and has the flag
  ``ALL_NODES``.

One line per reservation, ``KEY=VALUE`` words; "No reservations in the system" when there are none. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from flexmig.errors import SlurmError
from flexmig.slurm.hostlist import expand_hostlist

__all__ = ["PREFIX", "SlurmReservation", "flexmig_name", "parse_reservations"]

PREFIX = "flexmig-"
"""flexmig's reservations are named ``flexmig-<node>``; the site-wide limit counts them."""

_MAX_LINES = 100_000
_MAX_LINE = 64 * 1024


def flexmig_name(node: str) -> str:
    """The name of flexmig's reservation on ``node``."""
    return f"{PREFIX}{node}"


@dataclass(frozen=True, slots=True)
class SlurmReservation:
    """One reservation: its name, window (epoch seconds), nodes, flags and state (``ACTIVE``/``INACTIVE``)."""

    name: str
    start_s: float
    end_s: float
    nodes: tuple[str, ...]
    flags: frozenset[str]
    state: str

    @property
    def flexmig(self) -> bool:
        """Made by flexmig (its name has flexmig's prefix)."""
        return self.name.startswith(PREFIX)

    def active(self, now_s: float) -> bool:
        """Started and not ended at ``now_s``."""
        return self.state == "ACTIVE" or self.start_s <= now_s < self.end_s

    def overlaps(self, start_s: float, end_s: float) -> bool:
        """Its window meets ``[start_s, end_s)``."""
        return self.start_s < end_s and start_s < self.end_s


def _time(text: str, where: str) -> float:
    """Slurm's local ISO time (``2026-12-01T22:53:02``) as epoch seconds."""
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SlurmError(f"{where}: {text!r} is not a time like 2026-12-01T22:53:02") from None


def parse_reservations(text: str | bytes) -> tuple[SlurmReservation, ...]:
    """Every reservation of ``scontrol show reservation --oneliner``; SlurmError names the first bad line."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = text.splitlines()
    if len(lines) > _MAX_LINES:
        raise SlurmError(f"scontrol show reservation: more than {_MAX_LINES} lines; refused")
    out: list[SlurmReservation] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("No reservations"):
            continue
        where = f"scontrol show reservation line {number}"
        if len(line) > _MAX_LINE:
            raise SlurmError(f"{where}: longer than {_MAX_LINE} characters; refused")
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        name = words.get("ReservationName")
        if not name:
            raise SlurmError(f"{where}: no ReservationName= in {line[:80]!r}")
        nodes_text = words.get("Nodes", "")
        nodes = () if nodes_text in ("", "(null)") else expand_hostlist(nodes_text)
        flags = frozenset(f for f in words.get("Flags", "").split(",") if f and f != "(null)")
        out.append(
            SlurmReservation(
                name=name,
                start_s=_time(words.get("StartTime", ""), where),
                end_s=_time(words.get("EndTime", ""), where),
                nodes=nodes,
                flags=flags,
                state=words.get("State", ""),
            )
        )
    return tuple(out)
