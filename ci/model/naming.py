"""The only maker of names: sessions, release tags and titles, worlds, artifacts.

The title scheme is the anchor's (verl-wheelhouse, stage C), so that the titles of releases it
published still parse; the tag carries the world's CUDA part as well:

- tag:   ``<component>-<sanitized ref>-<cuXY|cpu>-py<X.Y>-torch<torch>``: one release per world
  (CUDA major.minor, or cpu) and Python and torch. The anchor's ``<component>-<ref>-py<X.Y>-torch<T>``
  had no CUDA part, so a CPU row and a CUDA row (or a cu128 and a cu130 row) of one Python and torch
  shared a release, and the second world's wheel of the same file name replaced the first's;
  ``invoke migrate-tags`` renames releases of that form (ci/maintenance/migrate.py)
- title: ``<component> <ref> - [<arch> ]<cuda label> py<python> torch<torch>; ...``
  (one segment per matrix row of that Python and torch, x86_64 left implicit;
  the CUDA label is ``cu<cuda>``, or ``cpu`` for a CPU row, which titles written
  before spelled ``cucpu``: :func:`parse_title` reads both)
- world: ``cu<major><minor>/torch<major>.<minor>`` (``cpu/torch2.13`` for CPU rows)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

DEFAULT_ARCH = "x86_64"
MANIFEST_ASSET = "wheelhouse-build-manifest.json"

_UNSAFE_REF_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_TITLE_SEGMENT = re.compile(
    r"^(?:(?P<arch>\S+)\s+)?(?:cu(?P<cuda>[\w.]+)|cpu)\s+py(?P<python>[\w.]+)\s+torch(?P<torch>[\w.+]+)$"
)
_TITLE = re.compile(r"^(?P<component>\S+)\s+(?P<ref>\S+)\s+-\s+(?P<segments>.+)$")


def sanitize_ref(ref: str) -> str:
    """A git ref made safe for a tag: runs of other characters become '-'."""
    cleaned = _UNSAFE_REF_CHARS.sub("-", ref).strip("-.")
    return cleaned or "unknown"


def version_key(text: str) -> tuple[int, Version | str]:
    """Sort key for a Python, torch or CUDA version as names and titles write it (``3.9`` < ``3.10``).

    packaging's version order; a text that is not a version (a hand-made title) sorts before every
    version, by its text, so sorting never fails.
    """
    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, text)


def cuda_label(cuda: str) -> str:
    """A row's CUDA in titles and logs: ``cu13.0.2``, or ``cpu`` for a CPU row."""
    return "cpu" if cuda == "cpu" else f"cu{cuda}"


def release_tag(component: str, ref: str, cuda: str, python: str, torch: str) -> str:
    """The release of one world's rows of a (component, ref, Python, torch): ``cuda`` is a row's CUDA
    version (``13.0.2``) or ``cpu``, of which the tag keeps the world's part (``cu130``, ``cpu``)."""
    return f"{component}-{sanitize_ref(ref)}-{cuda_tag(cuda)}-py{python}-torch{torch}"


MAX_TAG_LENGTH = 200
"""A release tag is the name of a local-store folder, of a build record (``<tag>-aarch64.build.json``)
and of git's ref file (``refs/tags/<tag>.lock`` while it is written): 200 keeps each of them within
the 255-byte limit of a file name."""

# Bytes git refuses anywhere in a ref name: control characters, DEL, space and ~ ^ : ? * [ \
_REF_FORBIDDEN_BYTES = frozenset(range(0x20)) | frozenset(b"\x7f ~^:?*[\\")


def ref_format_problem(name: str) -> str | None:
    """Why ``git check-ref-format --allow-onelevel`` refuses ``name``; None when it accepts it.

    git's rules (git help check-ref-format), by its numbers; rule 2 (at least one '/') is the one
    --allow-onelevel waives, as for a branch or tag name written without ``refs/heads/``:

    1. no '/'-separated part begins with '.' or ends with '.lock';
    3. no '..' anywhere;
    4. no control character (below 0x20 or DEL), space, '~', '^' or ':';
    5. no '?', '*' or '[';
    6. no '/' at the start or the end, and no '//';
    7. no '.' at the end;
    8. no '@{';
    9. not the single character '@';
    10. no '\\'.

    git checks bytes, so the name is checked as UTF-8; bytes from 0x80 up are allowed.
    """
    raw = name.encode()
    if not raw:
        return "is empty"
    if raw == b"@":
        return "is '@' alone"
    forbidden = next((byte for byte in raw if byte in _REF_FORBIDDEN_BYTES), None)
    if forbidden is not None:
        return f"contains {chr(forbidden)!r}"
    for sequence in ("..", "@{"):
        if sequence in name:
            return f"contains '{sequence}'"
    parts = name.split("/")
    if "" in parts:
        return "begins or ends with '/' or contains '//'"
    for part in parts:
        if part.startswith("."):
            return f"has a part that begins with '.' ('{part}')"
        if part.endswith(".lock"):
            return f"has a part that ends in '.lock' ('{part}')"
    if name.endswith("."):
        return "ends with '.'"
    return None


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot be a release tag (too long for the file names made from it, or a name git
    refuses); None when it can."""
    if len(tag.encode()) > MAX_TAG_LENGTH:
        return f"is {len(tag.encode())} characters long, more than {MAX_TAG_LENGTH}"
    return ref_format_problem(tag)


@dataclass(frozen=True)
class TitleSegment:
    arch: str
    cuda: str
    python: str
    torch: str

    def render(self) -> str:
        prefix = "" if self.arch == DEFAULT_ARCH else f"{self.arch} "
        return f"{prefix}{cuda_label(self.cuda)} py{self.python} torch{self.torch}"


def release_title(component: str, ref: str, segments: Iterable[TitleSegment]) -> str:
    return f"{component} {ref} - " + "; ".join(segment.render() for segment in segments)


@dataclass(frozen=True)
class ParsedTitle:
    component: str
    ref: str
    segments: tuple[TitleSegment, ...]


def parse_title(title: str) -> ParsedTitle | None:
    """Inverse of :func:`release_title`; None when the title does not follow the scheme."""
    match = _TITLE.match(title.strip())
    if not match:
        return None
    segments = []
    for raw in match["segments"].split(";"):
        seg = _TITLE_SEGMENT.match(raw.strip())
        if not seg:
            return None
        segments.append(TitleSegment(seg["arch"] or DEFAULT_ARCH, seg["cuda"] or "cpu", seg["python"], seg["torch"]))
    return ParsedTitle(match["component"], match["ref"], tuple(segments))


def cuda_tag(cuda: str) -> str:
    """``13.0.2`` -> ``cu130``; ``cpu`` -> ``cpu``."""
    if cuda == "cpu":
        return "cpu"
    parts = cuda.split(".")
    return "cu" + "".join(parts[:2])


def torch_tag(torch: str) -> str:
    """``2.13.0`` -> ``torch2.13``: torch's ABI is taken as stable within major.minor."""
    public = torch.split("+", 1)[0]
    return "torch" + ".".join(public.split(".")[:2])


def world_path(cuda: str, torch: str) -> str:
    return f"{cuda_tag(cuda)}/{torch_tag(torch)}"


def session_name(component: str, python: str) -> str:
    return f"build-{component}-{python}"


def artifact_name(component: str, arch: str, cuda: str, python: str, torch: str) -> str:
    """CI workflow artifact name of one row's wheels (the anchor's scheme, parsed by restore)."""
    return f"wheel-{component}-{arch}-cu{cuda}-py{python}-torch{torch}"


_ARCH_SUFFIXES = {"x86_64": ("x86_64", "amd64"), "aarch64": ("aarch64", "arm64")}


def wheel_covers_arch(filename: str, arch: str) -> bool:
    """Whether a wheel of this file name installs on a machine of ``arch`` (``x86_64``, ``aarch64``): a platform
    tag of that arch, or ``any``; False for a name that is not a wheel's."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    platforms = {tag.platform for tag in tags}
    return "any" in platforms or any(p.endswith(_ARCH_SUFFIXES.get(arch, (arch,))) for p in platforms)
