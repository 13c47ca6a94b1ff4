"""A small link checker over a built site's files: every ``href`` and ``src`` of every HTML page resolves.

A relative link, or an absolute one under the site's base URL, must name a file of the site (a folder
link, its ``index.html``, as GitHub Pages serves it); a ``file://`` link outside the site, an existing file
or folder; a link whose
fragment is ``#sha256=<hex>``, a file of that sha256. Anything else (``http(s)`` outside the site) is
returned as external, for the caller to judge: nothing here goes to the network.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urljoin, urlsplit


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append(value)


@dataclass
class LinkReport:
    checked: int = 0
    broken: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)


def _target(path: Path) -> Path | None:
    if path.is_dir():
        path = path / "index.html"
    return path if path.exists() else None


def check_site(root: Path, base_url: str) -> LinkReport:
    report = LinkReport()
    base = base_url.rstrip("/") + "/"
    for page in sorted(root.rglob("*.html")):
        rel = page.relative_to(root).as_posix()
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for link in parser.links:
            report.checked += 1
            url, fragment = urldefrag(urljoin(base + rel, link))
            if url.startswith(base) or url == base.rstrip("/"):
                found = _target(root / unquote(url[len(base):]))
            elif urlsplit(url).scheme == "file":  # a local store's release folder: a browser lists it
                outside = Path(unquote(urlsplit(url).path))
                found = outside if outside.exists() else None
            else:
                report.external.append(f"{rel}: {link}")
                continue
            if found is None:
                report.broken.append(f"{rel}: {link} (nothing at {url})")
            elif fragment.startswith("sha256=") and hashlib.sha256(found.read_bytes()).hexdigest() != fragment[7:]:
                report.broken.append(f"{rel}: {link} (the file's sha256 differs)")
    return report
