#!/usr/bin/env python3
"""Make DeepEP's extensions find NVSHMEM beside them, not on the build machine.

Upstream's setup.py links deep_ep_cpp with ``-Wl,-rpath,<nvshmem_dir>/lib``:
the absolute directory of the NVSHMEM it compiled against, which on a builder
is the row venv's ``site-packages/nvidia/nvshmem``. A wheel carrying it sends
every user's import to a path that exists only on the build machine (the
wheel checks refuse such a RUNPATH, ci/checks/paths.py).

The nvidia-nvshmem-cu<major> wheel, which torch itself depends on, installs
``nvidia/nvshmem/lib`` into the same site-packages as DeepEP's top-level
extension modules, so the one search path that holds on every machine is
relative to the extension: ``$ORIGIN/nvidia/nvshmem/lib``. The link argument
is passed to the linker without a shell, so ``$ORIGIN`` reaches ld as written.

Usage: deep_ep_relative_nvshmem_rpath.py [DEEPEP_DIR]  (default: the current directory)

Idempotent: a setup.py carrying the marker is left alone. An upstream that
moved on (the anchor absent, or there more than once) fails with one line
naming the file and the text, and nothing is written.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

PROG = "deep_ep_relative_nvshmem_rpath"
MARKER = "DEEP_EP_RELATIVE_NVSHMEM_RPATH"
ANCHOR = "f'-Wl,-rpath,{nvshmem_dir}/lib'"
RELATIVE = "'-Wl,-rpath,$ORIGIN/nvidia/nvshmem/lib'"
COMMENT = f"  # {MARKER}: NVSHMEM beside the extension, where the nvidia-nvshmem wheel installs it"


def patched(path: Path, text: str) -> str | None:
    """The new text of setup.py, or None when it already carries the edit."""
    if MARKER in text:
        return None
    found = text.count(ANCHOR)
    if found != 1:
        raise ValueError(f"{path}: expected the link argument {ANCHOR} once, found it {found} time(s); "
                         f"update patches/{PROG}.py to the new setup.py")
    start = text.index(ANCHOR)
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    # the anchor sits inside a list literal: the marker comment goes after the rest of its line
    return text[:start] + RELATIVE + text[start + len(ANCHOR):line_end] + COMMENT + text[line_end:]


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(f"usage: {PROG}.py [DEEPEP_DIR]", file=sys.stderr)
        return 2
    setup = Path(argv[0] if argv else ".").resolve() / "setup.py"
    try:
        text = patched(setup, setup.read_text())
    except FileNotFoundError:
        print(f"{PROG}: {setup}: no such file; run it in a DeepEP checkout", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{PROG}: {exc}; nothing was changed", file=sys.stderr)
        return 1
    if text is None:
        print(f"{PROG}: already applied in {setup}")
        return 0
    _write_atomically(setup, text)
    print(f"{PROG}: deep_ep_cpp links NVSHMEM through $ORIGIN/nvidia/nvshmem/lib ({setup})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
