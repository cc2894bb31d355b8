"""A job spec (and the configuration file, read by the same TOML parser) that nests without end or holds numbers
past every bound is refused with one error naming the file and the key, never an exception out of the parser:
tomllib recurses into nested arrays (RecursionError) and converts integers of any length (ValueError past 4,300
digits), and float() of a 400-digit integer overflows."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexmig.config import ConfigFileError, parse_config
from flexmig.errors import JobSpecError
from flexmig.jobspec.spec import JobPolicy, parse_job_spec

BASE = 'name = "x"\nargv = ["/bin/true"]\nuser = "root"\nworking_dir = "/tmp"\ncheckpoint_dir = "/tmp/c"\n'


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        ('[need]\nprofile = "1g.18gb"\n[ranks]\nmax = ' + "9" * 5000 + "\n", "not valid TOML"),
        ('[need]\nprofile = "1g.18gb"\n[hook]\nack_timeout_s = ' + "9" * 400 + "\n", "ack_timeout_s: is out of range"),
        ("[need]\nmemory_gib = " + "9" * 400 + "\n", "need.memory_gib: is out of range"),
        ("[need]\nmemory_gib = nan\n", "need.memory_gib: must be a finite number"),
        ('[need]\nprofile = "1g.18gb"\n[hook]\nack_timeout_s = inf\n', "must be a finite number"),
        ("deep = " + "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
    ],
)
def test_a_spec_out_of_every_bound_is_one_error_naming_the_file(tail: str, why: str) -> None:
    with pytest.raises(JobSpecError, match=why) as info:
        parse_job_spec(BASE + tail, JobPolicy((Path("/tmp"),), check_permissions=False), source=Path("/etc/j.toml"))
    assert str(info.value).startswith("/etc/j.toml")


@pytest.mark.parametrize("text", ["mode = " + "[" * 50_000 + "]" * 50_000, "[sampling]\ninterval_s = " + "9" * 5000])
def test_a_configuration_out_of_every_bound_is_one_error_naming_the_file(text: str) -> None:
    with pytest.raises(ConfigFileError) as info:
        parse_config(text, "/etc/flexmig/flexmig.toml")
    assert "/etc/flexmig/flexmig.toml" in str(info.value)
