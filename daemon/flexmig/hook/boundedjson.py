"""``flexmig.hook.boundedjson``: :mod:`flexmig_hook.boundedjson` (JSON read within bounds of size, depth and digits)
under the daemon package's name; the daemon reads its own files (outbox rows, the simulator's state) with it too."""

from __future__ import annotations

from flexmig_hook.boundedjson import MAX_DEPTH, MAX_INT_DIGITS, JsonBoundsError, depth, loads

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "JsonBoundsError", "depth", "loads"]
