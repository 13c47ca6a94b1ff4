"""A JSON document against its JSON Schema (draft 2020-12): the first problem, as a phrase for one line.

Each record format the library writes and reads back has its schema beside the package that owns it
(``<package>/schemas/<format>.schema.json``); a reader refuses a document that breaks it in one line naming the
file, the JSON path of the bad value (``$.wheels[0].sha256``) and what is wrong with it. A schema's
``description`` of a value with a ``pattern``, ``const`` or ``enum`` says what the value must be ("a sha256 hex
digest"): the message reads ``$.wheels[0].sha256 is 'abc', not a sha256 hex digest``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

_TYPE_NAMES = {"object": "an object", "array": "an array", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}
_SHOWN = 80
"""The most characters of a bad value a message quotes."""


@functools.cache
def validator(schema: Path) -> Any:
    """The validator of the schema file ``schema`` (read once per process)."""
    return jsonschema.Draft202012Validator(json.loads(schema.read_text(encoding="utf-8")))


def problem(document: Any, schema: Path) -> str | None:
    """``'<JSON path> <what is wrong>'`` of the most telling problem of ``document``; None when it satisfies
    ``schema``."""
    error = jsonschema.exceptions.best_match(validator(schema).iter_errors(document))
    return None if error is None else describe(error)


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, as a message names it ("an integer", "true or false")."""
    if isinstance(value, bool):
        return _TYPE_NAMES["boolean"]
    if isinstance(value, int):
        return _TYPE_NAMES["integer"]
    kinds = {dict: "object", list: "array", str: "string", float: "number", type(None): "null"}
    return _TYPE_NAMES.get(kinds.get(type(value), ""), type(value).__name__)


def shown(value: Any) -> str:
    """A value as a message quotes it: a string in quotes, anything else as JSON, a long one cut with its length."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 20]}…({len(text)} characters)"


def describe(error: Any) -> str:
    """One jsonschema error as ``'<JSON path> <problem>'``."""
    path, kind, value, schema = error.json_path, error.validator, error.instance, error.schema
    if kind == "required":
        missing = next(name for name in error.validator_value if name not in value)
        return f"{_child(path, missing)} is missing"
    if kind == "additionalProperties":
        extra = sorted(set(value) - set(schema.get("properties", {})))[0]
        return f"{_child(path, extra)} is an unknown field (a newer format?)"
    if kind == "type":
        wanted: list[str] = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"{path} is {json_type(value)}, not {' or '.join(_TYPE_NAMES.get(w) or w for w in wanted)}"
    if kind in ("pattern", "const", "enum", "anyOf", "oneOf", "not") and "description" in schema:
        return f"{path} is {shown(value)}, not {schema['description']}"
    if kind in ("const", "enum"):
        allowed = [error.validator_value] if kind == "const" else error.validator_value
        return f"{path} is {shown(value)}, not {' or '.join(json.dumps(v) for v in allowed)}"
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"{path} is {value}, out of range ({kind} {error.validator_value})"
    if kind in ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"):
        return f"{path} has too {'few' if kind.startswith('min') else 'many'} entries or characters ({kind} " \
               f"{error.validator_value})"
    return f"{path} is {shown(value)}: {error.message[:_SHOWN * 2]}"


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"
