"""The anchor's push-time skip check, ``ci/generate_matrix.py`` ``release_covers_combo`` (reference
§4.4, §12 item 9), as a measuring stick for benchmarks/skip_plan.py.

Per matrix row, every check failing closed toward "build":

1. ``gh release view <tag> --json name,assets,body`` (cached per tag by ``evaluate_matrix_rows``);
2. the title must equal the expected title;
3. ``wheel_packages`` must be non-empty;
4. the release-wide manifest asset ``wheelhouse-build-manifest.json`` is downloaded with
   ``gh release download <tag> --pattern <name>`` **once per row** and must be schema 3 with a
   ``builds`` list;
5. the row's canonical build config (``json.dumps(sort_keys=True, separators=(",", ":"))``) must be
   one of the stored builds;
6. every ``(package, arch)`` must have a ``.whl`` asset (``py3-none-any`` covers every arch);
7. push mode with ``verify_wheel_archs`` true: every platform wheel of the row's arch whose package
   is listed (none -> build; > 2 GB -> build) is downloaded **whole, once per row**, and scanned with
   ``cuda_archs.wheel_cuda_archs`` (members read whole); the required base arches must be covered.
   A null arch list needs no scan: the reference (§4.4 item 7, §12 item 1) says null-arch components
   get no fatbin check, so nothing is downloaded for them (the reading kindest to the anchor).

``gh release download`` resolves the release (``GET /releases/tags/{tag}``), then fetches each
matching asset through the API (``Accept: application/octet-stream``), which redirects to object
storage; gh drops the Authorization header on that cross-host redirect, as done here.
"""

from __future__ import annotations

import json
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.anchor.cuda_archs import base_arch, wheel_cuda_archs

MANIFEST_ASSET = "wheelhouse-build-manifest.json"
BUILD_CONFIG_SCHEMA = 3
MAX_WHEEL_INSPECT_BYTES = 2_000_000_000
_NORMALIZE = re.compile(r"[-_.]+")
_ARCH_SUFFIXES = {"x86_64": ("x86_64", "amd64"), "aarch64": ("aarch64", "arm64")}


def normalize(name: str) -> str:
    return _NORMALIZE.sub("-", name).lower()


def parse_arch_list(raw: str | None) -> list[str]:
    """``cuda_archs.parse_arch_list``: split on ``[;,\\s]+``, drop ``+PTX``, canonical dotted tokens."""
    out = set()
    for part in re.split(r"[;,\s]+", raw or ""):
        part = re.sub(r"\+ptx$", "", part.strip(), flags=re.IGNORECASE)
        m = re.fullmatch(r"(\d+)\.?(\d)([a-z]?)", part)
        if m:
            out.add(f"{m.group(1)}.{m.group(2)}{m.group(3)}")
    return sorted(out)


def wheel_arches(filename: str, arches: list[str]) -> list[str]:
    """The platform tag (last ``-`` field before ``.whl``) split on ``.``; ``any`` covers every arch."""
    platform = filename[: -len(".whl")].rsplit("-", 1)[-1]
    found = []
    for tag in platform.split("."):
        if tag == "any":
            return list(arches)
        for arch in arches:
            if tag.endswith(_ARCH_SUFFIXES.get(arch, (arch,))) and arch not in found:
                found.append(arch)
    return found


def canonical(config: dict) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass
class Row:
    """What the anchor's matrix row carries for this check."""

    tag: str
    arch: str
    title: str
    wheel_packages: list[str]
    torch_cuda_arch_list: str | None
    verify_wheel_archs: bool
    build_config: dict
    label: str


@dataclass(frozen=True)
class Verdict:
    row: Row
    skip: bool
    reason: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class GhClient:
    """``gh`` as the anchor calls it: one request per API call, no retry."""

    def __init__(self, api_url: str, repo: str, token: str) -> None:
        self.api = api_url.rstrip("/")
        self.repo = repo
        self.token = token
        self.requests = 0
        self.downloaded = 0
        self._open = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect()).open

    def _auth(self, accept: str = "application/vnd.github+json") -> dict[str, str]:
        return {"Authorization": f"token {self.token}", "Accept": accept}

    def release_view(self, tag: str) -> dict | None:
        """``gh release view <tag> --json name,assets,body``; any error -> None."""
        try:
            self.requests += 1
            req = urllib.request.Request(f"{self.api}/repos/{self.repo}/releases/tags/{tag}", headers=self._auth())
            with self._open(req, timeout=60) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def release_download(self, tag: str, name: str, dest: Path) -> Path:
        """``gh release download <tag> --pattern <name> --dir <dest> --clobber``."""
        release = self.release_view(tag)
        if release is None:
            raise RuntimeError(f"release {tag} not found")
        asset = next(a for a in release.get("assets") or () if a["name"] == name)
        self.requests += 1
        req = urllib.request.Request(asset["url"], headers=self._auth("application/octet-stream"))
        try:
            resp = self._open(req, timeout=900)
        except urllib.error.HTTPError as redirect:
            if redirect.code not in (301, 302, 303, 307, 308):
                raise
            location = redirect.headers["Location"]
            redirect.close()
            self.requests += 1
            resp = self._open(urllib.request.Request(location, headers={"Accept": "application/octet-stream"}),
                              timeout=900)
        target = dest / name
        with resp, target.open("wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                self.downloaded += len(chunk)
        return target


def release_covers_combo(gh: GhClient, row: Row, views: dict[str, dict | None], *, verify_wheels: bool = True) -> Verdict:  # noqa: C901 - the anchor's check transcribed step by step, to measure it as it is
    if row.tag not in views:
        views[row.tag] = gh.release_view(row.tag)
    release = views[row.tag]
    if release is None:
        return Verdict(row, False, "release not found or unreadable; it would be created")
    if release.get("name") != row.title:
        return Verdict(row, False, f"title mismatch: expected {row.title}, found {release.get('name')}")
    if not row.wheel_packages:
        return Verdict(row, False, "no wheel_packages")
    assets = release.get("assets") or []
    stored = None
    with tempfile.TemporaryDirectory(prefix="anchor-skip-") as tmp:
        if any(a["name"] == MANIFEST_ASSET for a in assets):
            try:
                data = json.loads(gh.release_download(row.tag, MANIFEST_ASSET, Path(tmp)).read_bytes())
                if data.get("schema") == BUILD_CONFIG_SCHEMA and isinstance(data.get("builds"), list):
                    stored = data
            except (RuntimeError, OSError, ValueError, urllib.error.URLError):
                stored = None
        if stored is None:
            return Verdict(row, False, "no stored build config")
        if canonical(row.build_config) not in {canonical(b) for b in stored["builds"]}:
            return Verdict(row, False, f"build config mismatch for {row.arch}")
        present = {(normalize(a["name"].split("-", 1)[0]), arch)
                   for a in assets if a["name"].endswith(".whl") for arch in wheel_arches(a["name"], [row.arch])}
        missing = [p for p in row.wheel_packages if (normalize(p), row.arch) not in present]
        if missing:
            return Verdict(row, False, "missing wheel package(s): " + ", ".join(f"{p} ({row.arch})" for p in missing))
        required = {base_arch(a) for a in parse_arch_list(row.torch_cuda_arch_list)}
        if not (verify_wheels and row.verify_wheel_archs) or not required:
            return Verdict(row, True, "covered (no fatbin check)")
        wanted = {normalize(p) for p in row.wheel_packages}
        candidates = [a for a in assets if a["name"].endswith(".whl") and not a["name"].endswith("-any.whl")
                      and normalize(a["name"].split("-", 1)[0]) in wanted and wheel_arches(a["name"], [row.arch])]
        if not candidates:
            return Verdict(row, False, "no platform-specific wheel to verify; keeping build")
        found: set[str] = set()
        for asset in candidates:
            if int(asset.get("size") or 0) > MAX_WHEEL_INSPECT_BYTES:
                return Verdict(row, False, f"{asset['name']} too large to inspect; keeping build")
            path = gh.release_download(row.tag, asset["name"], Path(tmp))
            found |= {base_arch(a) for a in wheel_cuda_archs(str(path))}
            path.unlink()
        if not required <= found:
            return Verdict(row, False, f"wheel fatbin lacks {sorted(required - found)}")
    return Verdict(row, True, "covered; wheel fatbin verified")


def evaluate_matrix_rows(gh: GhClient, rows: list[Row], *, verify_wheels: bool = True) -> list[Verdict]:
    views: dict[str, dict | None] = {}
    return [release_covers_combo(gh, row, views, verify_wheels=verify_wheels) for row in rows]
