"""A gate before the slurmd hook of some nodes: the crash tests kill flexmigd while it waits for a slurmd to start,
at the one moment they mean, and then let the start go on (or see that nothing starts once flexmigd is gone)."""

from __future__ import annotations

from pathlib import Path

_GATE = """#!/bin/sh
# Before the slurmd hook of the nodes matching {pattern}: once the test armed it, a start says it was reached, then
# waits (bounded) until the test opens it; a start whose flexmigd is gone by then (SIGKILLed) starts nothing.
for verb; do :; done
case "$FLEXMIG_SLURMD_NODE:$verb" in
  {pattern}:start|{pattern}:restart)
    if [ -e {gate}/armed ]; then
      touch {gate}/reached
      i=0
      while [ ! -e {gate}/open ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
      kill -0 $PPID 2>/dev/null || exit 1
    fi ;;
esac
exec "$@"
"""


def slurmd_gate(base: Path, pattern: str) -> tuple[Path, tuple[str, str]]:
    """A gate below ``base`` for the nodes whose names match the shell ``pattern``: its directory (the test touches
    ``armed`` and ``open`` there, and waits for ``reached``) and the hook prefix that puts it before the slurmd hook."""
    gate = base / "gate"
    gate.mkdir()
    script = base / "gate.sh"
    script.write_text(_GATE.format(gate=gate, pattern=pattern))
    return gate, ("/bin/sh", str(script))
