"""What the home directory held when this test run began, and where CI's fresh home is (``.ci/fresh-home``).

``.ci/fresh-home`` runs the suite in a home directory made for the run, with every cache, config and data directory
inside it, and names it in ``FLEXMIG_FRESH_HOME``. tests/conftest.py imports this module before any test runs, so
:data:`AT_START` is what that directory held then: nothing, unless the run was started some other way.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["AT_START", "FRESH", "VARIABLES"]

#: The fresh home directory of this run, None when the suite was not started through .ci/fresh-home.
FRESH: Path | None = Path(os.environ["FLEXMIG_FRESH_HOME"]) if os.environ.get("FLEXMIG_FRESH_HOME") else None

#: The variables that point programs at per-user state; under .ci/fresh-home each lies in :data:`FRESH`.
VARIABLES = (
    "HOME",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "MPLCONFIGDIR",
    "HYPOTHESIS_STORAGE_DIRECTORY",
)


def _listing(path: Path | None) -> tuple[str, ...] | None:
    if path is None:
        return None
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return None


#: The names in :data:`FRESH` when the run began (None without a fresh home, or when it could not be read).
AT_START: tuple[str, ...] | None = _listing(FRESH)
