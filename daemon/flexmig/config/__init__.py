"""The daemon's configuration: one TOML file (``/etc/flexmig/flexmig.toml``) read into frozen dataclasses.

Validation is strict because this file steers a root daemon: unknown keys are errors (with a "did you mean"),
types are exact (``true`` is not a number, ``1.5`` is not an integer), numbers have ranges, paths are
absolute, listen addresses are loopback unless ``allow_remote`` says otherwise, and credentials only ever come
from files. Every problem is reported at once, each naming the file, the dotted key and the line.

One idea per module: :mod:`~flexmig.config.schema` (the tables and their defaults), :mod:`~flexmig.config.keys`
(where a key sits in TOML text), :mod:`~flexmig.config.checks` (types, ranges, rules between keys),
:mod:`~flexmig.config.load` (text and files to a configuration), :mod:`~flexmig.config.trusted` (reading a file
that steers the daemon; job specs are read the same way), :mod:`~flexmig.config.reload`,
:mod:`~flexmig.config.render` (the example file), :mod:`~flexmig.config.address` and
:mod:`~flexmig.config.problems`. This package re-exports the public names.
"""

from flexmig.config.address import HostPort
from flexmig.config.keys import find_key_line
from flexmig.config.load import (
    DEFAULT_CONFIG_PATH,
    DEFERRABLE_KEYS,
    load_config,
    load_config_deferring,
    parse_config,
)
from flexmig.config.problems import ConfigFileError, ConfigProblem
from flexmig.config.reload import ReloadResult, applies_at_next_start, as_applied, changed_keys, reload_config
from flexmig.config.render import render_keys_markdown, render_toml
from flexmig.config.schema import (
    BaselineConfig,
    Config,
    ControlConfig,
    DcgmConfig,
    DemandMixConfig,
    DetectConfig,
    JobsConfig,
    Mode,
    MqttConfig,
    PlannerConfig,
    PrometheusConfig,
    SamplingConfig,
    SlurmConfig,
    StateConfig,
    iter_keys,
)

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFERRABLE_KEYS",
    "BaselineConfig",
    "Config",
    "ConfigFileError",
    "ConfigProblem",
    "ControlConfig",
    "DcgmConfig",
    "DemandMixConfig",
    "DetectConfig",
    "HostPort",
    "JobsConfig",
    "Mode",
    "MqttConfig",
    "PlannerConfig",
    "PrometheusConfig",
    "ReloadResult",
    "SamplingConfig",
    "SlurmConfig",
    "StateConfig",
    "applies_at_next_start",
    "as_applied",
    "changed_keys",
    "find_key_line",
    "iter_keys",
    "load_config",
    "load_config_deferring",
    "parse_config",
    "reload_config",
    "render_keys_markdown",
    "render_toml",
]
