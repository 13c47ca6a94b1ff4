"""The fixture's versions file, and its text for tests that build other sources under its component."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURE_VERSIONS = Path(__file__).resolve().parent / "fixtures" / "versions.yaml"
_SMOKE_TEST = re.compile(r"^    # the extension imported[^\n]*\n    smoke_test:\n(?:      [^\n]*\n)+", re.M)


def without_smoke_test(text: str | None = None) -> str:
    """The fixture's versions text without its smoke test, which imports the fixture's own package."""
    text = FIXTURE_VERSIONS.read_text() if text is None else text
    stripped = _SMOKE_TEST.sub("", text)
    assert stripped != text, "the fixture's versions file has no smoke test to take out"
    return stripped
