"""The anchor's ``ci/build_index.py`` (reference §7.1-§7.3, §12 item 8): N+1 listing and plain pages.

Listing, as the anchor does it with the gh CLI:

1. ``gh release list --repo R --json tagName,name --limit 1000``: gh pages through the releases
   100 at a time and stops at the limit; **everything past 1000 is dropped silently**; drafts are
   not excluded. Reproduced as REST pages of ``per_page=100`` until 1000 (gh asks GitHub's GraphQL
   API for just the two fields, so its pages are smaller than these; the request count is the same).
2. For **each** release: ``gh release view <tag> --repo R --json assets`` = one
   ``GET /repos/{o}/{r}/releases/tags/{tag}``. Each gh call was a fresh process with
   ``check=True`` and no retry (one failure aborts the publish); here each is one plain urllib
   request on a new connection, in process (no process start, no TLS: kinder to the anchor).
3. Only ``*.whl`` assets are kept as ``{name, url, worlds}`` with ``url`` = browser_download_url.

Rendering (§7.2-§7.3): the world comes from each title segment
``cu<cuda> py<python> torch<torch>`` -> ``cu<major><minor>/torch<major>.<minor>``; one root page
per world, one page per package with one ``<a href=url>filename</a><br/>`` per wheel, sorted, and
``simple/`` as a full copy of the default world. No hashes, no metadata, no dedup.
"""

from __future__ import annotations

import html
import json
import re
import urllib.request
from dataclasses import dataclass, field

LIMIT = 1000
_TITLE_SEGMENT_RE = re.compile(r"cu(?P<cuda>[\w.]+)\s+py(?P<python>[\w.]+)\s+torch(?P<torch>[\w.+]+)")
_NORMALIZE = re.compile(r"[-_.]+")


@dataclass
class Listing:
    releases: list[dict] = field(default_factory=list)
    """``{"tag", "name", "assets": [{"name", "url"}]}`` per release, as the anchor holds them."""
    requests: int = 0
    truncated: bool = False


class _Gh:
    """One urllib request per ``gh`` invocation (no retry, like ``check=True``)."""

    def __init__(self, api_url: str, repo: str, token: str) -> None:
        self.api = api_url.rstrip("/")
        self.repo = repo
        self.token = token
        self.requests = 0
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get_json(self, path: str):
        req = urllib.request.Request(f"{self.api}{path}", headers={
            "Authorization": f"token {self.token}", "Accept": "application/vnd.github+json"})
        self.requests += 1
        with self.opener.open(req, timeout=60) as resp:
            return json.loads(resp.read())


def release_list(gh: _Gh, limit: int = LIMIT) -> tuple[list[dict], bool]:
    """``gh release list --json tagName,name --limit <limit>``: (releases, whether more existed)."""
    out: list[dict] = []
    page = 1
    per_page = min(limit, 100)
    while len(out) < limit:
        batch = gh.get_json(f"/repos/{gh.repo}/releases?per_page={per_page}&page={page}")
        out.extend({"tagName": r["tag_name"], "name": r.get("name") or ""} for r in batch)
        if len(batch) < per_page:
            return out[:limit], False
        page += 1
    return out[:limit], True


def release_view_assets(gh: _Gh, tag: str) -> list[dict]:
    """``gh release view <tag> --json assets`` (raises on any error: no retry)."""
    return gh.get_json(f"/repos/{gh.repo}/releases/tags/{urllib.request.quote(tag, safe='')}").get("assets") or []


def list_releases(api_url: str, repo: str, token: str, limit: int = LIMIT) -> Listing:
    """The anchor's N+1 listing (step 1, then step 2 for each release)."""
    gh = _Gh(api_url, repo, token)
    tags, truncated = release_list(gh, limit)
    releases = []
    for entry in tags:
        assets = release_view_assets(gh, entry["tagName"])
        wheels = [{"name": a["name"], "url": a["browser_download_url"]} for a in assets if a["name"].endswith(".whl")]
        releases.append({"tag": entry["tagName"], "name": entry["name"], "assets": wheels})
    return Listing(releases, gh.requests, truncated)


def _world(cuda: str, torch: str) -> str:
    parts = cuda.split(".")
    return f"cu{parts[0]}{parts[1] if len(parts) > 1 else '0'}/torch{'.'.join(torch.split('.')[:2])}"


def _page(title: str, links: list[tuple[str, str]]) -> bytes:
    body = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links)
    return (f'<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"</head>\n<body>\n{body}</body>\n</html>\n").encode()


def render_site(releases: list[dict], default_world: str) -> dict[str, bytes]:
    """``_site/<world>/simple/...``, ``_site/simple/...`` (copy of the default world) and a landing page."""
    worlds: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for rel in releases:
        found = []
        for match in _TITLE_SEGMENT_RE.finditer(rel["name"]):
            world = _world(match["cuda"], match["torch"])
            if world not in found:
                found.append(world)
        if not found:
            continue  # left out of every index, with a warning on stderr
        for asset in rel["assets"]:
            package = _NORMALIZE.sub("-", asset["name"].split("-")[0]).lower()
            for world in found:
                worlds.setdefault(world, {}).setdefault(package, []).append((asset["url"], asset["name"]))
    files: dict[str, bytes] = {}
    for world, packages in worlds.items():
        trees = [(f"{world}/simple", f"verl-wheelhouse {world} simple index")]
        if world == default_world:
            trees.append(("simple", f"verl-wheelhouse simple index ({world})"))
        for prefix, title in trees:
            files[f"{prefix}/index.html"] = _page(title, [(f"{p}/", p) for p in sorted(packages)])
            for package, links in packages.items():
                files[f"{prefix}/{package}/index.html"] = _page(f"Links for {package}", sorted(links, key=lambda x: x[1]))
    landing = [(f"{w}/simple/", f"{w} ({len(p)} packages)") for w, p in sorted(worlds.items())]
    files["index.html"] = _page("verl-wheelhouse", landing)
    return files
