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

A caller that knows its records' shape writes them itself, which is faster still than one C call (the C encoder
builds, sorts and walks a dict per record; a record's text is one ``%`` of :func:`dict_template` with its values
encoded by :data:`string`): an :class:`Encoded` value in a document is written by its own function, at the
depth where it stands, and :func:`list_parts` puts records into a list.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from typing import Any

string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A string's JSON text as json.dumps writes it (``ensure_ascii``), in C."""


class Encoded:
    """A value of a document whose text ``write(depth)`` gives, in parts joined as they are: what :func:`dumps`
    would write at ``depth`` (parts, not their join: a world's record is tens of megabytes, each copy counts)."""

    __slots__ = ("write",)

    def __init__(self, write: Callable[[int], list[str]]) -> None:
        self.write = write


_CONTAINERS = (dict, list, tuple)
_NESTED = (*_CONTAINERS, Encoded)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def dumps(document: Any, depth: int = 0, end: str = "") -> str:
    """What ``json.dumps(document, indent=1, sort_keys=True) + end`` returns; with ``depth``, the text of ``document``
    as a value at that depth of a larger document (its lines after the first indented by ``depth``)."""
    parts: list[str] = []
    _encode(document, depth, parts)
    parts.append(end)  # joined with the rest: a world's record is tens of megabytes, each copy counts
    return "".join(parts)


@functools.lru_cache(maxsize=64)
def dict_template(keys: Sequence[str], depth: int) -> str:
    """The text :func:`dumps` writes for a dict of ``keys`` (sorted, each a string) at ``depth``, with ``%s`` in
    place of each value: ``template % values`` with the values' texts at ``depth + 1``, in the keys' order."""
    if list(keys) != sorted(keys) or len(set(keys)) != len(keys):
        raise ValueError(f"dict_template needs distinct keys in sorted order, got {keys!r}")
    inner, outer = " " * (depth + 1), " " * depth
    items = (inner + string(key).replace("%", "%%") + ": %s" for key in keys)
    return "{\n" + ",\n".join(items) + "\n" + outer + "}" if keys else "{}"


def list_parts(items: Sequence[str], depth: int) -> list[str]:
    """The text :func:`dumps` writes for a list at ``depth`` whose items' texts (at ``depth + 1``) are ``items``, in
    parts: the items and what stands between them."""
    if not items:
        return ["[]"]
    inner = " " * (depth + 1)
    parts = list(chain.from_iterable(zip(repeat(",\n" + inner), items)))
    parts[0] = "[\n" + inner
    parts.append("\n" + " " * depth + "]")
    return parts


def _flat(values: Callable[[], Iterable[Any]]) -> bool:
    """Whether every value ``values()`` yields is a scalar or an empty container (the types first: one pass in C)."""
    return set(map(type, values())) <= _SCALARS or all(not value or not isinstance(value, _NESTED)
                                                       for value in values())


def _compact(obj: Any, depth: int) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",\n" + " " * depth, ": "))


def _encode(obj: Any, depth: int, out: list[str]) -> None:
    kind = type(obj)
    inner, outer = " " * (depth + 1), " " * depth
    if kind is Encoded:
        out += obj.write(depth)
        return
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
            out.append((separator if position else "") + string(key) + ": ")
            _encode(value, depth + 1, out)
        out.append("\n" + outer + "}")
    else:
        out.append("[\n" + inner)
        for position, value in enumerate(obj):
            if position:
                out.append(separator)
            _encode(value, depth + 1, out)
        out.append("\n" + outer + "]")
