"""``json.dumps(document, indent=1, sort_keys=True)``, byte for byte, at the speed of the C encoder.

Python's json module encodes with its C encoder only without ``indent``; with it, a pure-Python
generator visits every value (1.4 s for a world record of 144,000 wheels, 0.3 s compact). The site's
records are indented (their bytes are published and diffed), so this module indents them itself and
leaves the bulk to the C encoder:

- a container whose values are all scalars or empty containers is one C call, with ``",\\n" + indent``
  as the item separator: the indented form differs from it only after the opening and before the
  closing bracket;
- a list of such dicts is one C call too: its items are then separated by ``},\\n<indent>{``, which
  nothing inside a flat dict can produce (a dict's items start with a key's ``"``, and no encoded
  string holds a raw newline), so the list's own separators are found and re-indented exactly;
- anything else is walked here, its parts encoded by the same rules.

A dict with a key that is not a string, a subclass of dict or list, and a scalar go to ``json.dumps`` whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

_CONTAINERS = (dict, list, tuple)
_SCALARS = frozenset({str, int, float, bool, type(None)})
_encode_string = json.encoder.encode_basestring_ascii


def dumps(document: Any) -> str:
    """What ``json.dumps(document, indent=1, sort_keys=True)`` returns."""
    parts: list[str] = []
    _encode(document, 0, parts)
    return "".join(parts)


def _flat(values: Callable[[], Iterable[Any]]) -> bool:
    """Whether every value ``values()`` yields is a scalar or an empty container (the types first: one pass in C)."""
    return set(map(type, values())) <= _SCALARS or all(not value or not isinstance(value, _CONTAINERS)
                                                       for value in values())


def _compact(obj: Any, depth: int) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",\n" + " " * depth, ": "))


def _encode(obj: Any, depth: int, out: list[str]) -> None:
    kind = type(obj)
    inner, outer = " " * (depth + 1), " " * depth
    if kind in _SCALARS or (kind in _CONTAINERS and not obj):
        out.append(json.dumps(obj))  # one line whatever the indent: "[]" and "{}" included
        return
    if kind not in _CONTAINERS or (kind is dict and not all(type(key) is str for key in obj)):
        out.append(json.dumps(obj, indent=1, sort_keys=True).replace("\n", "\n" + outer))
    elif _flat(obj.values if kind is dict else lambda: obj):
        text = _compact(obj, depth + 1)
        out.append(f"{text[0]}\n{inner}{text[1:-1]}\n{outer}{text[-1]}")
    elif kind is not dict and _flat_dicts_only(obj):
        out.append(_flat_dicts(obj, depth))
    else:
        _walk(obj, depth, out)


def _flat_dicts_only(items: list | tuple) -> bool:
    return set(map(type, items)) == {dict} and all(items) and _flat(lambda: chain.from_iterable(map(dict.values, items)))


def _flat_dicts(items: list[dict] | tuple[dict, ...], depth: int) -> str:
    """A non-empty list of non-empty flat dicts at ``depth``, in one C call."""
    outer, middle, inner = " " * depth, " " * (depth + 1), " " * (depth + 2)
    text = _compact(items, depth + 2)  # "[{...},\n<inner>{...}]": the dicts' own items already indented
    body = text[2:-2].replace("},\n" + inner + "{", f"\n{middle}}},\n{middle}{{\n{inner}")
    return f"[\n{middle}{{\n{inner}{body}\n{middle}}}\n{outer}]"


def _walk(obj: Any, depth: int, out: list[str]) -> None:
    inner, outer = " " * (depth + 1), " " * depth
    separator = ",\n" + inner
    if type(obj) is dict:
        out.append("{\n" + inner)
        for position, (key, value) in enumerate(sorted(obj.items())):
            out.append((separator if position else "") + _encode_string(key) + ": ")
            _encode(value, depth + 1, out)
        out.append("\n" + outer + "}")
    else:
        out.append("[\n" + inner)
        for position, value in enumerate(obj):
            if position:
                out.append(separator)
            _encode(value, depth + 1, out)
        out.append("\n" + outer + "]")
