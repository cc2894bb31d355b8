"""Property tests: no text makes the loader fail with anything but a ConfigError that names file, key and line."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexmig.config import Config, ConfigFileError, changed_keys, iter_keys, parse_config, render_toml
from support.toml import toml_string, toml_value

SRC = "/etc/flexmig/flexmig.toml"
KEYS = [key for key, _, _ in iter_keys(Config.default())]
SECTIONS = sorted({k.rsplit(".", 1)[0] for k in KEYS if "." in k})


def dump(tables: dict[str, dict[str, Any]]) -> str:
    """A TOML document: top-level keys first, then one [table] per section."""
    out = [f"{toml_string(k)} = {toml_value(v)}" for k, v in tables.get("", {}).items()]
    for table, items in tables.items():
        if table:
            out.append("[" + ".".join(toml_string(p) for p in table.split(".")) + "]")
            out += [f"{toml_string(k)} = {toml_value(v)}" for k, v in items.items()]
    return "\n".join(out) + "\n"


def assert_clear_error(err: ConfigFileError) -> None:
    assert err.problems, "an error lists its problems"
    for p in err.problems:
        assert p.file == SRC
        assert p.message
        if p.key:
            assert p.line is not None, f"no line for {p.key}"
        else:
            assert p.message.startswith("TOML syntax")
        assert str(p).startswith(SRC)


scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["observe", "advise", "act", "127.0.0.1:9400", "0.0.0.0:1", "[::1]:1", "/var/lib/x", "x/y", "http://h:1/m"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
key_names = st.one_of(st.sampled_from(sorted({k.rsplit(".", 1)[-1] for k in KEYS})), st.text(max_size=12))
section_names = st.one_of(st.sampled_from(["", *SECTIONS]), st.text(max_size=10))
documents = st.dictionaries(section_names, st.dictionaries(key_names, values, max_size=5), max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_structured_documents_give_a_config_or_a_clear_error(tables: dict[str, dict[str, Any]]) -> None:
    text = dump(tables)
    try:
        cfg = parse_config(text, SRC)
    except ConfigFileError as err:
        assert_clear_error(err)
        return
    # Whatever was accepted renders back to the same configuration.
    assert parse_config(render_toml(cfg), SRC) == cfg


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_gives_a_config_or_a_clear_error(text: str) -> None:
    try:
        parse_config(text, SRC)
    except ConfigFileError as err:
        assert_clear_error(err)


lines = st.one_of(
    st.sampled_from([f"[{s}]" for s in SECTIONS] + ["[[jobs]]", "[mqtt", '"""', "'''", "x = '''", "a.b.c = 1"]),
    st.builds(
        lambda k, v: f"{k} = {v}",
        key_names,
        st.sampled_from(["1", "1.5", "true", '"s"', "[1,", "{a=1}", "0o777", "nan"]),
    ),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=15))
def test_toml_ish_line_soup_gives_a_config_or_a_clear_error(soup: list[str]) -> None:
    try:
        parse_config("\n".join(soup), SRC)
    except ConfigFileError as err:
        assert_clear_error(err)


def _leaf_values(meta: Any, default: Any) -> st.SearchStrategy[Any]:
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, (int, float)):
        lo = meta["gt"] if meta["gt"] is not None else meta["lo"]
        return st.floats(min_value=(lo or 0) - 1, max_value=(meta["hi"] or 1e6) + 1, allow_nan=False)
    return st.just(default)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_numbers_near_their_ranges_are_accepted_inside_and_refused_outside_with_the_key(data: st.DataObject) -> None:
    key, default, meta = data.draw(
        st.sampled_from([t for t in iter_keys(Config.default()) if isinstance(t[1], (int, float))])
    )
    value = data.draw(_leaf_values(meta, default))
    if isinstance(default, int) and not isinstance(default, bool):
        value = int(value)
    table, _, name = key.rpartition(".")
    text = dump({table: {name: value}})
    try:
        parse_config(text, SRC)
    except ConfigFileError as err:
        assert_clear_error(err)
        lo, hi, gt = meta["lo"], meta["hi"], meta["gt"]
        in_range = (lo is None or value >= lo) and (hi is None or value <= hi) and (gt is None or value > gt)
        out_of_range = [p for p in err.problems if p.key == key and "out of range" in p.message]
        assert bool(out_of_range) != in_range
    else:
        lo, hi, gt = meta["lo"], meta["hi"], meta["gt"]
        assert (lo is None or value >= lo) and (hi is None or value <= hi) and (gt is None or value > gt)


def _in_range(meta: Any, default: Any) -> st.SearchStrategy[Any]:
    if isinstance(default, bool):
        return st.booleans()
    lo = meta["gt"] if meta["gt"] is not None else meta["lo"]
    hi = meta["hi"]
    if isinstance(default, int):
        return st.integers(min_value=int(lo or 0), max_value=int(hi or 2**31))
    return st.floats(min_value=lo or 0.0, max_value=hi or 1e6, exclude_min=meta["gt"] is not None)


NUMERIC_OR_BOOL = [t for t in iter_keys(Config.default()) if isinstance(t[1], (bool, int, float))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(NUMERIC_OR_BOOL), unique_by=lambda t: t[0], max_size=6), st.data())
def test_accepted_files_round_trip_and_change_only_the_keys_they_set(picked: list[Any], data: st.DataObject) -> None:
    tables: dict[str, dict[str, Any]] = {}
    for key, default, meta in picked:
        table, _, name = key.rpartition(".")
        tables.setdefault(table, {})[name] = data.draw(_in_range(meta, default), label=key)
    tables.setdefault("", {})["mode"] = data.draw(st.sampled_from(["observe", "advise", "act"]))
    try:
        cfg = parse_config(dump(tables), SRC)
    except ConfigFileError as err:
        assert_clear_error(err)
        assert all("out of range" not in p.message for p in err.problems)
        return
    assert parse_config(render_toml(cfg), SRC) == cfg
    set_keys = {f"{t}.{k}" if t else k for t, items in tables.items() for k in items}
    assert set(changed_keys(Config.default(), cfg)) <= set_keys
