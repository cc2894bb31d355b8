"""The documented example file (``flexmig config example``): every key with its default and its documentation.

Rendered from the schema's field metadata, so the example cannot drift from what the loader accepts; the output
parses back to the configuration it was rendered from.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import fields, is_dataclass
from typing import Any

from flexmig.config.address import HostPort
from flexmig.config.keys import join_key, toml_string
from flexmig.config.reload import applies_at_next_start
from flexmig.config.schema import Config, iter_keys, toml_name

__all__ = ["render_keys_markdown", "render_toml"]


def _toml_value(value: Any, meta: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"0o{value:o}" if meta.get("octal") else str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v, meta) for v in value) + "]"
    return toml_string(str(value))


def _comment(text: str, indent: str = "") -> list[str]:
    text = " ".join(text.replace("``", "").split())  # a docstring's line breaks and indents are not the text's
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 100 - len(indent))] if text else []


def render_toml(cfg: Config | None = None, *, header: bool = True) -> str:
    """A complete, commented TOML file for ``cfg`` (default: :meth:`Config.default`) that parses back to it.

    Keys whose value is unset (optional files, user name) appear commented out with an example value.
    """
    cfg = Config.default() if cfg is None else cfg
    out: list[str] = []
    if header:
        out += [
            "# flexmig configuration: /etc/flexmig/flexmig.toml (see `flexmig config check`).",
            "# Every key is shown with its default; delete what you do not change. Unknown keys are errors.",
            "# The file must be owned by root and writable only by its owner (chmod 0644 or 0600).",
            "# After an edit: `systemctl reload flexmigd` (a file with errors is refused; the old one stays).",
            "",
        ]
    _render_table(cfg, "", out)
    return "\n".join(out).rstrip("\n") + "\n"


def _render_table(obj: Any, prefix: str, out: list[str]) -> None:
    subtables = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        name = toml_name(f)
        if is_dataclass(value) and not isinstance(value, HostPort):
            subtables.append((name, value, f.metadata))
            continue
        out += _comment(f.metadata.get("doc", ""))
        key = join_key("", name)
        if value is None:
            out.append(f"# {key} = {_toml_value(f.metadata.get('example') or '', f.metadata)}")
        else:
            out.append(f"{key} = {_toml_value(value, f.metadata)}")
        out.append("")
    for name, value, meta in subtables:
        table = join_key(prefix, name)
        out += _comment(meta.get("doc", ""))
        out.append(f"[{table}]")
        out.append("")
        _render_table(value, table, out)


def render_keys_markdown(cfg: Config | None = None) -> str:
    """The configuration reference as a Markdown table: every key, its default, whether a reload applies it at once
    or only the next start, and its documentation (the same text :func:`render_toml` prints). docs/configuration.md
    holds this table; a test keeps the two equal (``flexmig config keys --markdown`` prints it)."""
    cfg = Config.default() if cfg is None else cfg
    rows = ["| key | default | on reload | meaning |", "|---|---|---|---|"]
    for key, value, meta in iter_keys(cfg):
        if value is None:
            default = f"unset (e.g. `{_toml_value(meta.get('example') or '', meta)}`)"
        else:
            default = f"`{_toml_value(value, meta)}`"
        reload = "next start" if applies_at_next_start(key) else "at once"
        doc = " ".join(str(meta.get("doc", "")).replace("``", "").split())
        doc = re.sub(r"\bdocs/([a-z-]+)\.md\b", r"[\1](\1.md)", doc).replace("|", "\\|")
        rows.append(f"| `{key}` | {default.replace('|', chr(92) + '|')} | {reload} | {doc} |")
    return "\n".join(rows) + "\n"
