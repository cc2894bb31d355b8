"""Reading the node's baseline from a mig-parted configuration file (``[baseline]`` of the configuration).

The file steers which instances flexmig creates, so it is read like the configuration itself (owner, mode, size,
encoding: :func:`~flexmig.config.trusted.read_trusted_text`), parsed with PyYAML's safe loader (no tags, no
objects; on libyaml where PyYAML has it), and checked by mig-parted's own rules
(:func:`flexmig.mig.migparted.parse_spec`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml

from flexmig.config.problems import ConfigFileError
from flexmig.config.schema import BaselineConfig
from flexmig.config.trusted import read_trusted_text
from flexmig.errors import ConfigError
from flexmig.mig.migparted import MigPartedEntry, MigPartedSpec, parse_spec

__all__ = ["Baseline", "load_baseline", "parse_mig_parted_text", "read_mig_parted"]

_MAX_FILE_BYTES = 1 << 20

_SAFE_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader, on libyaml where PyYAML has it (its wheels do): the same documents and error lines (libyaml
words a fault its own way), 10 times faster on NVIDIA's own config file, which a reload reads again."""


@dataclass(frozen=True, slots=True)
class Baseline:
    """The baseline: the file, the configuration's name, and its entries."""

    file: Path
    name: str
    entries: tuple[MigPartedEntry, ...]

    def describe(self) -> str:
        """``all-balanced (/etc/nvidia-mig-manager/config.yaml)``."""
        return f"{self.name} ({self.file})"


def parse_mig_parted_text(text: str, source: str) -> MigPartedSpec:
    """A mig-parted file's text, parsed and checked; ConfigError names ``source`` and the fault."""
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader: no tags, no objects)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from None
    return parse_spec(data, source)


def read_mig_parted(path: Path, *, trusted_uids: Collection[int] | None = None) -> MigPartedSpec:
    """The mig-parted file at ``path``, read as a trusted file, parsed and checked; ConfigError otherwise. Blocks on
    the file system."""
    try:
        text = read_trusted_text(path, what="mig-parted configuration", max_bytes=_MAX_FILE_BYTES,
                                 trusted_uids=trusted_uids)  # fmt: skip
    except ConfigFileError as exc:
        raise ConfigError(str(exc)) from None
    return parse_mig_parted_text(text, str(path))


def load_baseline(config: BaselineConfig, *, trusted_uids: Collection[int] | None = None) -> Baseline | None:
    """The configured baseline (None when ``mig_parted_file`` is unset); ConfigError says what is wrong with the
    file or the name. Blocks on the file system."""
    path = config.mig_parted_file
    if path is None:
        return None
    spec = read_mig_parted(path, trusted_uids=trusted_uids)
    entries = spec.select(config.mig_parted_config or None)
    name = config.mig_parted_config or next(iter(spec.configs))
    return Baseline(path, name, entries)
