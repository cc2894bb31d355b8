"""The operator's files that ship with flexmig, and where this installation keeps them.

A wheel carries them under ``flexmig/share/`` (the build copies them there, see setup.py), laid out as in the
repository: ``systemd/`` (the unit, its act drop-in, the example configuration, slurmd's drop-in, the per-GPU
template unit ``slurmd@.service`` and the static instance nodes' ``slurmd-static@.service``), ``dashboards/`` (the
Grafana JSON, ``provisioning/``, ``rules/``), ``schemas/`` and ``LICENSE``. An editable install from a checkout has
no ``share/``; the checkout itself holds the same paths. ``flexmig install-files`` reads them from here.

Standard library only, and no flexmig import: setup.py loads this file by its path at build time.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SHIPPED", "ShippedFilesMissing", "shipped_files", "shipped_root"]

#: What ships, as globs relative to the repository root (and to ``flexmig/share/`` in a wheel).
SHIPPED: tuple[str, ...] = (
    "LICENSE",
    "systemd/flexmigd.service",
    "systemd/flexmigd.service.d/act.conf",
    "systemd/flexmig.toml",
    "systemd/slurmd.service.d/flexmig.conf",
    "systemd/slurmd@.service",
    "systemd/slurmd-static@.service",
    "dashboards/*.json",
    "dashboards/provisioning/*/*.yaml",
    "dashboards/provisioning/*/*.yml",
    "dashboards/rules/*.yml",
    "schemas/*.json",
)

_PACKAGE = Path(__file__).resolve().parents[1]  # .../flexmig


class ShippedFilesMissing(LookupError):
    """This installation carries no operator files: neither a wheel's ``flexmig/share/`` nor a checkout."""


def shipped_files(root: Path) -> list[Path]:
    """Every shipped file under ``root``, as sorted paths relative to it."""
    found = {p.relative_to(root) for pattern in SHIPPED for p in root.glob(pattern) if p.is_file()}
    return sorted(found)


def shipped_root(package: Path = _PACKAGE) -> Path:
    """The directory that holds the shipped files: the wheel's ``flexmig/share/``, else the checkout's root."""
    share = package / "share"
    if (share / "systemd" / "flexmigd.service").is_file():
        return share
    checkout = package.parents[1]  # daemon/flexmig -> the repository root
    if (checkout / "pyproject.toml").is_file() and (checkout / "systemd" / "flexmigd.service").is_file():
        return checkout
    raise ShippedFilesMissing(
        f"this flexmig installation ({package}) carries no operator files: install flexmig from its wheel "
        "(or a checkout of the repository) to get the unit, configuration, dashboards and rules"
    )
