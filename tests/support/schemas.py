"""The repository's published JSON Schemas (``schemas/``), loaded and checked once per test run."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@functools.cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of ``schemas/NAME`` (``event.v1.schema.json``), with format checks; the schema itself is checked
    against its meta-schema first."""
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
