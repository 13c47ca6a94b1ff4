"""The sha256 of a file, read in 1 MiB blocks: wheels and release assets run to gigabytes.

Hex digests, as build records, manifests and ``#sha256=`` index links write them; GitHub's asset
``digest`` field is the same text behind ``sha256:``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO

CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of the file at ``path``, streamed (memory stays flat at any size)."""
    with open(path, "rb") as handle:
        return sha256_stream(handle)


def sha256_stream(stream: IO[bytes]) -> str:
    """Hex sha256 of what is left to read in ``stream``, read a chunk at a time."""
    digest = hashlib.sha256()
    while block := stream.read(CHUNK):
        digest.update(block)
    return digest.hexdigest()
