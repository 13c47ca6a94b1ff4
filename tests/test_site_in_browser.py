"""The landing page and a world's page as a person sees them: headless Chromium (Debian's ``chromium``) renders
each at a phone's width, from the built site over file://, and we read back what it drew and the DOM it
built. docs/landing-page-phone.png is one such screenshot.

Slow (a browser start per page): ``nox -s tests -- -m slow``. Skipped, saying so, where chromium is not
installed (``apt-get install -y chromium``).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from install_clients import RETIRED_WORLD, WORLD, build_indexes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PHONE = (412, 1800)
"""CSS pixels: a common phone's width, and room for the first screens of the page."""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install -y chromium")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # the URLs a site published to GitHub Pages names, as in docs/landing-page-phone.png
    return build_indexes(tmp_path_factory.mktemp("browser-site"), retired_world=True,
                         public=("https://owner.github.io/wheelhouse", "https://download.pytorch.org/whl/cu130"))


def chromium(tmp: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM
    profile = tmp / "profile"
    shutil.rmtree(profile, ignore_errors=True)
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={PHONE[0]},{PHONE[1]}",
               *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of its pixel data): a blank page has a handful."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    chunks, at = [], 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            chunks.append(data[at + 8:at + 8 + length])
        at += 12 + length
    return width, height, len(set(zlib.decompress(b"".join(chunks))))


@pytest.mark.parametrize("page", ["index.html", f"{WORLD}/index.html"])
def test_chromium_renders_the_page_at_a_phones_width(page, site, tmp_path):
    url = (site.site / page).as_uri()
    shot = tmp_path / "page.png"
    drawn = chromium(tmp_path, url, f"--screenshot={shot}")
    assert drawn.returncode == 0 and shot.is_file(), drawn.stderr[-2000:]
    width, height, colours = png_size_and_colours(shot)
    assert (width, height) == PHONE
    assert colours > 64, "the screenshot is (nearly) blank"

    dom = chromium(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = dom.stdout
    # what a reader needs is in what the browser built: the table cell, the commands, the lock file
    assert "<small>sm 8.0, 9.0, 10.0</small>" in rendered and "<small>torch==2.13.*</small>" in rendered
    assert "pip install --no-deps --index-url " in rendered and "uv pip install --index " in rendered
    assert "pylock.flash-attn.toml" in rendered
    if page == "index.html":
        assert f"The world {RETIRED_WORLD} is archived" in rendered
