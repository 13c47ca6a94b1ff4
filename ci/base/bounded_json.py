"""JSON read within a fixed depth, for every document that comes from outside this process.

``json.loads`` recurses once per level of nesting and ends a deep document (``[[[…]]]`` 100,000 deep, a few
hundred kilobytes) in ``RecursionError``, which the readers' ``except ValueError`` did not catch: a traceback.
:func:`loads` turns that, and any document nested deeper than the documents of this tool ever are, into
:class:`TooDeep`, a ``ValueError``: each reader's own handler turns it into its one line naming the file.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
"""Levels of arrays and objects; the deepest document this tool writes (a CycloneDX SBOM) has 7."""


class TooDeep(ValueError):
    """The document is nested deeper than the reader accepts."""


def loads(data: str | bytes | bytearray, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing a document nested more than ``max_depth`` levels (:class:`TooDeep`)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise TooDeep(f"nested more than {max_depth} levels (far deeper than Python's JSON reader goes)") from None
    if depth(value) > max_depth:
        raise TooDeep(f"nested more than {max_depth} levels; no document of this tool is")
    return value


def depth(value: Any) -> int:
    """Levels of arrays and objects in a parsed document (a scalar is 0), counted without recursion."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        pending.extend((child, level + 1) for child in children)
    return deepest
