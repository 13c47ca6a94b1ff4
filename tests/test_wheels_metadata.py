"""PEP 658 metadata files."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from ci.formats.metadata import extract_metadata


def test_extract_metadata(tmp_path: Path, fixture_wheel: Path) -> None:
    record = extract_metadata(fixture_wheel, tmp_path / "index")
    assert record.path == tmp_path / "index" / f"{fixture_wheel.name}.metadata"
    with zipfile.ZipFile(fixture_wheel) as zf:
        original = zf.read("wheelhouse_fixture-0.1.0.dist-info/METADATA")
    assert record.path.read_bytes() == original
    assert record.metadata_sha256 == hashlib.sha256(original).hexdigest()
    assert record.wheel_sha256 == hashlib.sha256(fixture_wheel.read_bytes()).hexdigest()
    assert (record.name, record.version, record.requires_python) == ("wheelhouse-fixture", "0.1.0", ">=3.10")
