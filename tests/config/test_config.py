"""The configuration file: defaults, the documented example, strict validation with file/key/line, reload."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexmig.cli.main import main as cli_main
from flexmig.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigFileError,
    HostPort,
    find_key_line,
    iter_keys,
    load_config,
    load_config_deferring,
    parse_config,
    reload_config,
    render_toml,
)
from flexmig.errors import ConfigError
from flexmig.mqtt.publisher import PublisherSettings
from flexmig.security import Secret

SRC = "/etc/flexmig/flexmig.toml"


def problems_of(text: str) -> list[tuple[str, int | None, str]]:
    """(key, line, message) of every problem parse_config reports for ``text``."""
    with pytest.raises(ConfigFileError) as info:
        parse_config(text, SRC)
    assert all(p.file == SRC for p in info.value.problems)
    return [(p.key, p.line, p.message) for p in info.value.problems]


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# ---------------------------------------------------------------------------------------------------- defaults


def test_an_empty_file_is_the_default_configuration() -> None:
    assert parse_config("") == Config.default()


def test_the_default_observes_and_keeps_everything_on_loopback_or_off() -> None:
    cfg = Config.default()
    assert cfg.mode == "observe"
    assert cfg.prometheus.listen == HostPort("127.0.0.1", 17400)
    assert cfg.prometheus.listen.is_loopback()
    assert not cfg.mqtt.enabled
    assert not cfg.mqtt.commands_enabled
    assert not cfg.dcgm.enabled
    assert cfg.control.socket_mode == 0o600
    assert cfg.sampling.interval_s == 1.0
    assert cfg.mqtt.topic_prefix == "flexmig/v1"


def test_the_example_parses_to_the_defaults() -> None:
    assert parse_config(render_toml(), "example") == Config.default()


def test_every_key_of_config_appears_in_the_example_with_a_comment() -> None:
    example = render_toml()
    lines = example.split("\n")
    for key, value, meta in iter_keys(Config.default()):
        assert meta["doc"], f"{key} is undocumented"
        table, _, name = key.rpartition(".")
        if value is None:
            # Optional keys are shown commented out with an example value, inside their own table.
            start = lines.index(f"[{table}]")
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
            hits = [i for i in range(start, end) if lines[i].startswith(f"# {name} = ")]
            assert len(hits) == 1, key
            line = hits[0] + 1
        else:
            found = find_key_line(example, key)
            assert found is not None, key
            line = found
            assert lines[line - 1].startswith(f"{name} = "), key
        assert lines[line - 2].startswith("# "), f"{key} has no comment above it"


def test_commented_optional_keys_sit_in_their_table() -> None:
    example = render_toml()
    table = None
    seen = {}
    for line in example.split("\n"):
        if line.startswith("["):
            table = line.strip("[]")
        m = re.match(r"# (\w+) = ", line)
        if m:
            seen[m.group(1)] = table
    assert seen["password_file"] == "mqtt"
    assert seen["tls_ca"] == "mqtt"
    assert seen["username"] == "mqtt"


def test_uncommenting_the_optional_examples_gives_a_valid_file() -> None:
    example = render_toml()
    text = re.sub(r"^# (\w+ = )", r"\1", example, flags=re.M)
    text = text.replace("tls = false", "tls = true")
    cfg = parse_config(text)
    assert cfg.mqtt.username == "flexmig-node"
    assert cfg.mqtt.password_file == Path("/etc/flexmig/mqtt.password")


def test_a_changed_configuration_renders_and_parses_back() -> None:
    cfg = replace(
        Config.default(),
        mode="act",
        node_name="gpu-7",
        prometheus=replace(Config.default().prometheus, listen=HostPort("::1", 9500)),
        mqtt=replace(Config.default().mqtt, enabled=True, username="n", password_file=Path("/etc/flexmig/pw")),
    )
    assert parse_config(render_toml(cfg)) == cfg


def test_node_name_defaults_to_the_first_label_of_the_host_name() -> None:
    cfg = Config.default()
    assert cfg.node(lambda: "gpu-node-3.cluster.example") == "gpu-node-3"
    assert cfg.node(lambda: "weird+name#1") == "weird-name-1"
    assert replace(cfg, node_name="n1").node(lambda: "ignored") == "n1"
    # the MQTT client ID is made from the node name (the publisher's, flexmig.mqtt.publisher)
    assert PublisherSettings.from_config(cfg.mqtt, cfg.node(lambda: "h")).identifier == "flexmig-h"


# ---------------------------------------------------------------------------------------------------- errors


def test_an_unknown_key_is_an_error_with_a_suggestion_file_and_line() -> None:
    text = 'mode = "observe"\n\n[mqtt]\nenabled = false\nbrokr = "10.0.0.1:1883"\n'
    assert problems_of(text) == [("mqtt.brokr", 5, "unknown key (did you mean 'broker'?)")]
    with pytest.raises(ConfigError, match=r"^/etc/flexmig/flexmig.toml:5: mqtt.brokr: unknown key"):
        parse_config(text, SRC)


def test_an_unknown_section_is_an_error_with_a_suggestion() -> None:
    assert problems_of("[sampl]\ninterval_s = 2\n") == [("sampl", 1, "unknown section (did you mean 'sampling'?)")]


def test_an_unknown_top_level_key_without_any_close_match() -> None:
    assert problems_of("\nzzz = 1\n") == [("zzz", 2, "unknown key")]


def test_an_inline_password_is_refused_and_the_value_never_printed() -> None:
    (problem,) = problems_of('[mqtt]\npassword = "hunter2"\n')
    assert problem[:2] == ("mqtt.password", 2)
    assert "password_file" in problem[2]
    with pytest.raises(ConfigError) as info:
        parse_config('[mqtt]\npassword = "hunter2"\n', SRC)
    assert "hunter2" not in str(info.value)


def test_every_problem_is_reported_at_once_in_line_order() -> None:
    text = 'mode = "acts"\n[sampling]\ninterval_s = "fast"\n[planner]\nspread_efficiency = 0\n'
    assert problems_of(text) == [
        ("mode", 1, "'acts' is not one of observe, advise, act"),
        ("sampling.interval_s", 3, "expected a number, got a string"),
        ("planner.spread_efficiency", 5, "0 is out of range (must be > 0 and <= 1)"),
    ]


# What a topic prefix may be, as the error says it (no raw regular expression).
TOPIC_PREFIX_RULE = "1 to 8 '/'-separated levels of letters, digits, '.', '_' or '-' (no wildcards, no empty level)"


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("[mqtt]\nkeepalive_s = 30.5", "mqtt.keepalive_s", "expected an integer, got a float"),
        ("[mqtt]\nkeepalive_s = true", "mqtt.keepalive_s", "expected an integer, got a boolean"),
        ("[sampling]\ninterval_s = true", "sampling.interval_s", "expected a number, got a boolean"),
        ("[sampling]\ninterval_s = nan", "sampling.interval_s", "expected a finite number, got nan"),
        ("[sampling]\ninterval_s = inf", "sampling.interval_s", "expected a finite number, got inf"),
        ("[sampling]\ngpm = 1", "sampling.gpm", "expected true or false, got an integer"),
        ('[mqtt]\nenabled = "yes"', "mqtt.enabled", "expected true or false, got a string"),
        ('[jobs]\nallowed_dirs = "/srv"', "jobs.allowed_dirs", "expected an array, got a string"),
        ('[jobs]\nallowed_dirs = ["srv"]', "jobs.allowed_dirs[0]", "'srv' is not an absolute path"),
        ('[state]\njournal = "journal.db"', "state.journal", "'journal.db' is not an absolute path"),
        ("sampling = 3", "sampling", "expected a table, got an integer"),
        ("[sampling]\ninterval_s = 0.01", "sampling.interval_s", "0.01 is out of range (must be >= 0.05 and <= 3600)"),
        (
            "[control]\nsocket_mode = 0o1777",
            "control.socket_mode",
            "0o1777 must give the owner read/write (0o600) and others nothing (at most 0o770)",
        ),
        (
            'node_name = "a/b"',
            "node_name",
            "'a/b' is not allowed here: empty, or up to 63 letters, digits, '.', '_' or '-' starting with a letter or "
            "digit",
        ),
        (
            '[mqtt]\ntopic_prefix = "flexmig/#"',
            "mqtt.topic_prefix",
            "'flexmig/#' is not allowed here: " + TOPIC_PREFIX_RULE,
        ),
        (
            '[mqtt]\ntopic_prefix = "a//b"',
            "mqtt.topic_prefix",
            "'a//b' is not allowed here: " + TOPIC_PREFIX_RULE,
        ),
        ('[mqtt]\nclient_id = "a\\u0000b"', "mqtt.client_id", "contains a NUL character"),
    ],
)
def test_wrong_types_and_ranges_name_the_key_and_line(text: str, key: str, message: str) -> None:
    assert problems_of(text) == [(key, 2 if "\n" in text else 1, message)]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9400", "'9400' is not host:port (write IPv6 hosts in brackets: [::1]:9400)"),
        ("::1:9400", "'::1:9400' is not host:port (write IPv6 hosts in brackets: [::1]:9400)"),
        ("127.0.0.1:0", "port 0 is outside 1-65535"),
        ("127.0.0.1:70000", "port 70000 is outside 1-65535"),
        ("[fe80::zz]:1", "'[fe80::zz]:1' is not host:port (write IPv6 hosts in brackets: [::1]:9400)"),
        ("[1.2.3.4]:1", "'1.2.3.4' is not an IPv6 address"),
        ("-bad-:1", "'-bad-' is neither an IP address nor a host name"),
    ],
)
def test_malformed_addresses_are_refused(value: str, message: str) -> None:
    assert problems_of(f'[mqtt]\nbroker = "{value}"\n') == [("mqtt.broker", 2, message)]


def test_addresses_parse_ipv4_ipv6_and_host_names() -> None:
    assert HostPort.parse("[::1]:9400") == HostPort("::1", 9400)
    assert str(HostPort("::1", 9400)) == "[::1]:9400"
    assert HostPort.parse("broker.example.org:8883") == HostPort("broker.example.org", 8883)
    assert HostPort.parse("localhost:1").is_loopback()
    assert HostPort.parse("127.0.0.2:1").is_loopback()
    assert not HostPort.parse("0.0.0.0:1").is_loopback()
    assert not HostPort.parse("[::]:1").is_loopback()


def test_metrics_on_a_non_loopback_address_need_allow_remote() -> None:
    text = '[prometheus]\nlisten = "0.0.0.0:9400"\n'
    ((key, line, message),) = problems_of(text)
    assert (key, line) == ("prometheus.listen", 2)
    assert "allow_remote = true" in message
    cfg = parse_config(text + "allow_remote = true\n")
    assert cfg.prometheus.listen == HostPort("0.0.0.0", 9400)
    assert parse_config('[prometheus]\nlisten = "[::1]:9400"\n').prometheus.listen.is_loopback()


def test_a_password_needs_a_user_name() -> None:
    assert problems_of('[mqtt]\npassword_file = "/etc/flexmig/pw"\n') == [
        ("mqtt.password_file", 2, "a password needs mqtt.username")
    ]


def test_a_password_does_not_cross_the_network_in_clear() -> None:
    text = '[mqtt]\nbroker = "10.1.2.3:1883"\nusername = "u"\npassword_file = "/etc/flexmig/pw"\n'
    ((key, line, message),) = problems_of(text)
    assert (key, line) == ("mqtt.password_file", 4)
    assert "mqtt.tls = true" in message
    assert parse_config(text + "tls = true\n").mqtt.tls
    assert parse_config(text + "allow_plaintext_password = true\n").mqtt.allow_plaintext_password
    assert parse_config(text.replace("10.1.2.3", "127.0.0.1")).mqtt.password_file == Path("/etc/flexmig/pw")


def test_mqtt_commands_need_credentials() -> None:
    assert problems_of("[mqtt]\ncommands_enabled = true\n") == [
        ("mqtt.commands_enabled", 2, "commands need broker credentials: set mqtt.username and mqtt.password_file")
    ]


def test_tls_files_need_tls_and_cert_and_key_go_together() -> None:
    assert problems_of('[mqtt]\ntls_ca = "/etc/ca.pem"\n') == [
        ("mqtt.tls_ca", 2, "set mqtt.tls = true to use TLS files")
    ]
    assert problems_of('[mqtt]\ntls = true\ntls_cert = "/etc/c.pem"\n') == [
        ("mqtt.tls_cert", 3, "tls_cert and tls_key go together")
    ]


def test_dcgm_url_must_be_http_without_credentials() -> None:
    assert problems_of('[dcgm]\nurl = "ftp://h/metrics"\n') == [
        ("dcgm.url", 2, "'ftp://h/metrics': scheme must be http or https")
    ]
    ((key, line, message),) = problems_of('[dcgm]\nurl = "http://user:s3cret@h:9400/metrics"\n')
    assert (key, line, message) == ("dcgm.url", 2, "must not carry credentials")
    assert problems_of('[dcgm]\nurl = "http://h:99999/"\n')[0][:2] == ("dcgm.url", 2)


def test_jobs_may_not_be_allowed_everywhere() -> None:
    assert problems_of('[jobs]\nallowed_dirs = ["/srv", "/"]\n') == [
        ("jobs.allowed_dirs[1]", 2, "'/' would let a job write anywhere")
    ]


def test_the_watchdog_stall_limit_must_exceed_two_sweeps() -> None:
    text = "[sampling]\ninterval_s = 20\n"
    assert problems_of(text) == [
        ("sampling.interval_s", 2, "sampling.stall_s (30) must be at least twice sampling.interval_s (20)")
    ]
    text = "[sampling]\ninterval_s = 20\nstall_s = 39\n"
    assert problems_of(text)[0][:2] == ("sampling.stall_s", 3), "reported at the first key of the rule the file sets"


def test_history_must_cover_the_detection_windows() -> None:
    assert problems_of("[detect]\nunderuse_window_s = 7200\n") == [
        ("detect.underuse_window_s", 2, "sampling.retention_s (3600) is shorter than detect.underuse_window_s (7200)")
    ]


def test_demand_mix_needs_one_positive_weight() -> None:
    text = "[detect.demand_mix]\n1g = 0\n2g = 0\n3g = 0\n4g = 0\n7g = 0\n"
    assert problems_of(text) == [("detect.demand_mix", 1, "at least one weight must be positive")]
    cfg = parse_config("[detect.demand_mix]\n1g = 4\n7g = 0\n")
    assert cfg.detect.demand_mix.weights() == {1: 4.0, 2: 0.25, 3: 0.2, 4: 0.1, 7: 0.0}


def test_a_control_socket_open_to_others_is_refused() -> None:
    assert problems_of("[control]\nsocket_mode = 0o666\n")[0][:2] == ("control.socket_mode", 2)
    assert problems_of("[control]\nsocket_mode = 0o400\n")[0][:2] == ("control.socket_mode", 2)
    assert parse_config("[control]\nsocket_mode = 0o660\n").control.socket_mode == 0o660


def test_a_too_long_socket_path_is_refused() -> None:
    path = "/run/" + "x" * 110
    assert problems_of(f'[control]\nsocket = "{path}"\n') == [
        ("control.socket", 2, "longer than 107 bytes, the limit of a unix socket path")
    ]


def test_toml_syntax_errors_name_the_line() -> None:
    assert problems_of('mode = "observe"\n[mqtt\n') == [
        ("", 2, "TOML syntax: Expected ']' at the end of a table declaration (at line 2, column 6)")
    ]
    ((key, line, _),) = problems_of("a = [1,\n2")
    assert (key, line) == ("", 2)


def test_absurd_nesting_is_a_syntax_error_not_a_crash() -> None:
    ((key, _, message),) = problems_of("x = " + "[" * 5000 + "]" * 5000)
    assert key == ""
    assert message.startswith("TOML syntax")


# ---------------------------------------------------------------------------------------------------- key lines


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("a = 1\n[mqtt]\nbroker = 1\n", "mqtt.broker", 3),
        ("[mqtt]  # comment\n  broker=1\n", "mqtt.broker", 2),
        ("mqtt.broker = 1\n", "mqtt.broker", 1),
        ('[ "mqtt" ]\n"broker" = 1\n', "mqtt.broker", 2),
        ("[detect.demand_mix]\n'1g' = 1\n", "detect.demand_mix.1g", 2),
        ("[detect]\ndemand_mix.1g = 1\n", "detect.demand_mix.1g", 2),
        ('[x]\ns = """\nbroker = 1\n"""\n[mqtt]\nbroker = 2\n', "mqtt.broker", 6),
        ("[mqtt]\nenabled = true\n", "mqtt.broker", 1),
        ("\n\nmqtt = { broker = 1 }\n", "mqtt.broker", 3),
        ("[sampling]\n\n[mqtt]\n", "mqtt", 3),
        ("[[x]]\nbroker = 1\n", "x.broker", 2),
        ("[mqtt]\nbroker = 1\n", "sampling.interval_s", None),
        ("[mqtt]\r\nbroker = 1\r\n", "mqtt.broker", 2),
        ("s = 'a\x0cb'\n[mqtt]\nbroker = 1\n", "mqtt.broker", 3),
    ],
)
def test_find_key_line_locates_keys_in_toml_text(text: str, key: str, line: int | None) -> None:
    assert find_key_line(text, key) == line


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ('a = ["""\n[mqtt]\nbroker = 1\n"""]\n[mqtt]\nbroker = 2\n', "mqtt.broker", 6),
        ("t = { s = '''\nbroker = 1\n''' }\nbroker = 2\n", "broker", 4),
    ],
)
def test_find_key_line_skips_multi_line_strings_inside_arrays_and_inline_tables(
    text: str, key: str, line: int | None
) -> None:
    assert find_key_line(text, key) == line


_DECOYS = ["[hook]", "[[x]]", "k0 = 1", "t0.k1 = 2", "# c", "", "{ k0 = 1 }", "'", '"', "''", '""', "\\"]


def _string_value(draw: st.DrawFn) -> str:
    """A TOML string of one of the four kinds whose content reads like headers and keys."""
    lines = draw(st.lists(st.sampled_from(_DECOYS), min_size=1, max_size=4))
    kind = draw(st.sampled_from(["basic", "literal", "multi-basic", "multi-literal"]))
    if kind == "basic":
        return '"' + " ".join(lines).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if kind == "literal":
        return "'" + " ".join(lines).replace("'", "") + "'"
    if kind == "multi-basic":
        return '"""\n' + "\n".join(lines).replace("\\", "\\\\").replace('"', '\\"') + '\n"""'
    return "'''\n" + "\n".join(lines).replace("'", "") + "\n'''"


@st.composite
def _documents(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """A TOML text of tables whose values are strings, arrays and inline tables, with each key's line."""
    out: list[str] = []
    where: dict[str, int] = {}
    for t in range(draw(st.integers(0, 3))):
        table = f"t{t}"
        out.append(f"[{table}]")
        for k in range(draw(st.integers(1, 3))):
            key, form = f"{table}.k{k}", draw(st.sampled_from(["string", "array", "inline"]))
            where[key] = len(out) + 1
            if form == "string":
                out.extend(f"k{k} = {_string_value(draw)}".split("\n"))
            elif form == "array":
                items = [_string_value(draw) for _ in range(draw(st.integers(1, 3)))]
                sep = draw(st.sampled_from([", ", ",\n  "]))
                out.extend(f"k{k} = [{sep.join(items)}]".split("\n"))
            else:
                where[f"{key}.i"] = where[key]
                out.extend(f"k{k} = {{ i = {_string_value(draw)} }}".split("\n"))
    return "\n".join(out) + "\n", where


@given(_documents())
def test_find_key_line_names_every_key_where_it_is_written_whatever_its_strings_hold(
    doc: tuple[str, dict[str, int]],
) -> None:
    text, where = doc
    tomllib.loads(text)  # the generator writes valid TOML
    assert {key: find_key_line(text, key) for key in where} == where


# ---------------------------------------------------------------------------------------------------- files


def test_load_config_reads_a_safe_file(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "advise"\n', 0o644)
    assert load_config(path).mode == "advise"


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o777])
def test_a_config_file_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "act"\n', mode)
    with pytest.raises(
        ConfigFileError, match=rf"^{re.escape(str(path))}: refused: mode {mode:04o} lets group or others write"
    ):
        load_config(path)


def test_a_config_file_owned_by_an_untrusted_user_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", "", 0o644)
    other = os.stat(path).st_uid + 4242
    with pytest.raises(ConfigFileError, match=r"refused: owned by uid \d+, must be owned by uid"):
        load_config(path, trusted_uids={other})


def test_a_missing_file_and_a_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"nope.toml: no such file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigFileError, match=r"not a regular file"):
        load_config(tmp_path)


def test_a_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "flexmig.toml"
    path.write_bytes(b'mode = "observe"\nnode_name = "\xff"\n')
    with pytest.raises(ConfigFileError, match=r"flexmig.toml:2: not UTF-8 text"):
        load_config(path)


def test_a_password_file_readable_by_others_is_refused_with_key_and_line(tmp_path: Path) -> None:
    pw = write(tmp_path / "pw", "s3cret\n", 0o644)
    path = write(tmp_path / "flexmig.toml", f'[mqtt]\nusername = "u"\npassword_file = "{pw}"\n')
    with pytest.raises(ConfigFileError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert (problem.file, problem.key, problem.line) == (str(path), "mqtt.password_file", 3)
    assert "lets others read a credential (chmod o-rwx" in problem.message
    pw.chmod(0o640)
    cfg = load_config(path)
    secret = cfg.mqtt.password()
    assert isinstance(secret, Secret)
    assert secret.reveal() == "s3cret"
    assert "s3cret" not in repr(cfg)
    assert "s3cret" not in repr(secret) + str(secret) + f"{secret}"


def test_a_missing_password_file_is_refused_at_load(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", f'[mqtt]\nusername = "u"\npassword_file = "{tmp_path}/none"\n')
    with pytest.raises(ConfigFileError, match=r"flexmig.toml:3: mqtt.password_file: .*none: no such file"):
        load_config(path)


def test_a_world_readable_tls_key_is_refused(tmp_path: Path) -> None:
    cert = write(tmp_path / "c.pem", "x", 0o644)
    key = write(tmp_path / "k.pem", "x", 0o604)
    path = write(tmp_path / "f.toml", f'[mqtt]\ntls = true\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    with pytest.raises(ConfigFileError, match=r"f.toml:4: mqtt.tls_key: .*lets others read a credential"):
        load_config(path)


# ---------------------------------------------------------------------------------------------------- deferring


def test_a_file_whose_only_problem_is_the_broker_address_loads_with_it_deferred(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "advise"\n[mqtt]\nenabled = true\nbroker = "no-port"\n')
    cfg, deferred = load_config_deferring(path)
    ((file, key, line),) = [(p.file, p.key, p.line) for p in deferred]
    assert (file, key, line) == (str(path), "mqtt.broker", 4)
    assert "'no-port' is not host:port" in deferred[0].message
    assert cfg.mode == "advise" and cfg.mqtt.enabled  # the rest of the file applies
    assert cfg.mqtt.broker == Config.default().mqtt.broker  # the bad key is left at its default
    with pytest.raises(ConfigFileError, match=r"flexmig.toml:4: mqtt.broker"):
        load_config(path)  # strict everywhere else: config check, reload


def test_a_valid_file_has_nothing_deferred(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", '[mqtt]\nbroker = "mqtt.lan:8883"\n')
    assert load_config_deferring(path) == (load_config(path), ())


@pytest.mark.parametrize(
    ("text", "others"),
    [
        ('[mqtt]\nbroker = "no-port"\nkeepalive_s = 1\n', [("mqtt.keepalive_s", 3)]),
        # cross-checks only run once every value is valid: the broker hid this one
        ('[sampling]\ninterval_s = 5\nstall_s = 6\n[mqtt]\nbroker = "no-port"\n', [("sampling.stall_s", 3)]),
        (
            '[mqtt]\nbroker = "no-port"\nusername = "u"\npassword_file = "/nonexistent/pw"\n',
            [("mqtt.password_file", 4)],
        ),
    ],
)
def test_any_other_problem_beside_the_broker_address_is_still_fatal_and_both_are_named(
    tmp_path: Path, text: str, others: list[tuple[str, int]]
) -> None:
    path = write(tmp_path / "flexmig.toml", text)
    with pytest.raises(ConfigFileError) as info:
        load_config_deferring(path)
    found = [(p.key, p.line) for p in info.value.problems]
    assert ("mqtt.broker", text.split("\n").index('broker = "no-port"') + 1) in found
    assert all(o in found for o in others), found


# ---------------------------------------------------------------------------------------------------- reload


def test_a_reload_with_errors_keeps_the_old_configuration(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "advise"\n')
    current = load_config(path)
    write(path, 'mode = "act"\n[sampling]\ninterval_s = -1\n')
    result = reload_config(current, path)
    assert not result.ok
    assert result.config is current
    assert result.error is not None
    assert f"{path}:3: sampling.interval_s" in str(result.error)


def test_a_reload_reports_what_changed_and_what_needs_a_restart(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "advise"\n')
    current = load_config(path)
    write(path, 'mode = "act"\n[prometheus]\nlisten = "127.0.0.1:9500"\n[detect]\nfragmentation_exit = 0.1\n')
    result = reload_config(current, path)
    assert result.ok
    assert result.config.mode == "act"
    assert result.changed == ("mode", "prometheus.listen", "detect.fragmentation_exit")
    assert result.needs_restart == ("prometheus.listen",)


def test_a_reload_of_a_file_made_unsafe_keeps_the_old_configuration(tmp_path: Path) -> None:
    path = write(tmp_path / "flexmig.toml", "")
    current = load_config(path)
    write(path, 'mode = "act"\n', 0o666)
    result = reload_config(current, path)
    assert result.config is current
    assert "lets group or others write" in str(result.error)


# ---------------------------------------------------------------------------------------------------- CLI


def test_config_check_prints_one_ok_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "advise"\n')
    assert cli_main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == f"{path}: OK (mode advise, metrics 127.0.0.1:17400, mqtt off)\n"


def test_config_check_prints_every_problem_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "flexmig.toml", 'mode = "x"\n[mqtt]\nbrokr = 1\n')
    assert cli_main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}:1: mode: 'x' is not one of observe, advise, act",
        f"{path}:3: mqtt.brokr: unknown key (did you mean 'broker'?)",
        f"flexmig: {path}: 2 problems; flexmigd would refuse to start with this file, and a reload would keep the "
        "running one",
    ]


@pytest.mark.skipif(DEFAULT_CONFIG_PATH.exists(), reason=f"{DEFAULT_CONFIG_PATH} exists on this machine")
def test_config_check_without_a_file_says_flexmigd_starts_on_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{DEFAULT_CONFIG_PATH}: no such file; flexmigd starts on its built-in defaults (mode ")


def test_config_check_of_a_named_file_that_is_missing_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.toml"
    assert cli_main(["config", "check", str(missing)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{missing}: no such file"
    assert err[-1].startswith(f"flexmig: {missing}: 1 problem; flexmigd would refuse to start")


def test_config_check_says_a_bad_broker_alone_only_stops_mqtt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "flexmig.toml", '[mqtt]\nenabled = true\nbroker = "nohost"\n')
    assert cli_main(["config", "check", str(path)]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"flexmig: {path}: 1 problem; flexmigd would start with MQTT publishing off")


@pytest.mark.integration
def test_config_example_output_is_a_file_that_config_check_accepts(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "flexmig.cli.main", "config", "example"], capture_output=True, text=True, check=True
    ).stdout
    assert out == render_toml()
    path = write(tmp_path / "flexmig.toml", out)
    assert cli_main(["config", "check", str(path)]) == 0


def test_dcgm_on_by_defaults_reads_dcgm_exporter_on_9400_beside_flexmigds_own_port() -> None:
    cfg = parse_config("[dcgm]\nenabled = true\n", SRC)
    assert cfg.dcgm.enabled and cfg.dcgm.url == "http://127.0.0.1:9400/metrics"
    assert cfg.prometheus.listen.port not in (9100, 9400), "node_exporter's and dcgm-exporter's default ports"


def test_dcgm_url_on_flexmigds_own_metrics_address_is_refused() -> None:
    ((key, line, message),) = problems_of('[dcgm]\nenabled = true\nurl = "http://localhost:17400/metrics"\n')
    assert (key, line) == ("dcgm.url", 3)
    assert "flexmigd's own metrics address" in message and "dcgm-exporter (port 9400 by default)" in message


# ------------------------------------------------------------------------------------ every problem in one round


def test_per_key_problems_and_rules_between_keys_come_in_one_round() -> None:
    text = 'mode = "acts"\n[sampling]\ninterval_s = 10\nstall_s = 15\n[mqtt]\nkeepalive_s = "30"\n'
    assert [(k, line) for k, line, _ in problems_of(text)] == [
        ("mode", 1),
        ("sampling.stall_s", 4),  # a rule between two valid keys, reported beside the per-key problems
        ("mqtt.keepalive_s", 6),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '[sampling]\ninterval_s = "ten"\nstall_s = 1\n',  # interval_s is bad: no rule judges its default
        "sampling = 3\n",  # the whole table is bad
        '[sampling]\nintreval_s = 10\nstall_s = 15\n',  # misspelt: the file meant interval_s, not its default
    ],
)
def test_a_rule_is_not_judged_on_a_default_that_stands_in_for_a_bad_or_misspelt_key(text: str) -> None:
    assert [k for k, _, _ in problems_of(text)] in (["sampling.interval_s"], ["sampling"], ["sampling.intreval_s"])
