"""The landing page and a world's page as a person sees them: headless Chromium (Debian's ``chromium``) renders
them from the built site over file://, at a desktop's width (1366 px) and a phone's (390 px), and we read back
what it drew, the DOM it built, and what its layout measured. The screenshots of the landing page are saved as
docs/landing-page-desktop.png and docs/landing-page-phone.png with WHEELHOUSE_UPDATE_SNAPSHOTS=1.

The measurements come from a page of the test's own that holds the site's page in a frame of the width wanted
(``--allow-file-access-from-files`` lets it read the frame's layout): no horizontal overflow, and the selector
(the pasted one-liner's output) shows only the world it names. Without JavaScript, everything is still there.

Skipped, saying so, where chromium is not installed (``apt-get install -y chromium``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from index_helpers import REPO
from install_clients import RETIRED_WORLD, WORLD, build_indexes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTHS = {"desktop": 1366, "phone": 390}
"""CSS pixels: a common laptop's width and a common phone's."""
SCREENSHOTS = {name: REPO / "docs" / f"landing-page-{name}.png" for name in WIDTHS}

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install -y chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    # the URLs a site published to GitHub Pages names, as in the screenshots
    return build_indexes(tmp_path_factory.mktemp("browser-site"), retired_world=True,
                         public=("https://owner.github.io/wheelhouse", "https://download.pytorch.org/whl/cu130"))


def chromium(tmp: Path, url: str, *args: str, width: int = WIDTHS["phone"], height: int = 1800) -> str:
    assert CHROMIUM
    profile = tmp / "profile"
    shutil.rmtree(profile, ignore_errors=True)
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={width},{height}",
               "--virtual-time-budget=5000", *args, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


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


MEASURE = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="page" src="%(url)s" style="width:%(width)spx;height:900px;border:0"></iframe><pre id="out">pending</pre>
<script>
document.getElementById("page").onload = function () {
  var d = this.contentDocument, w = this.contentWindow, out = {};
  function visible() {
    return Array.from(d.querySelectorAll("section.world")).filter(function (s) { return !s.hidden; })
      .map(function (s) { return s.dataset.world; });
  }
  out.scrollWidth = d.documentElement.scrollWidth;
  out.clientWidth = d.documentElement.clientWidth;
  out.worldsRight = d.querySelector("table.worlds").getBoundingClientRect().right;
  out.before = visible();
  var form = d.querySelector("form.picker");
  out.pickerShown = w.getComputedStyle(form).display !== "none";
  out.copyButtons = Array.from(d.querySelectorAll("button.copy")).filter(function (b) {
    return w.getComputedStyle(b).display !== "none"; }).length;
  form.paste.value = %(paste)s;
  form.paste.dispatchEvent(new w.Event("input"));
  out.said = form.said.value;
  out.after = visible();
  out.python = form.python.value;
  out.cellsShown = Array.from(d.querySelectorAll("td[data-python]")).filter(function (c) { return !c.hidden; }).length;
  document.getElementById("out").textContent = JSON.stringify(out);
};
</script></body></html>"""


def measure(tmp: Path, page: Path, width: int, paste: str) -> dict:
    wrapper = tmp / f"measure-{width}.html"
    wrapper.write_text(MEASURE % {"url": page.as_uri(), "width": width, "paste": json.dumps(paste)})
    dom = chromium(tmp, wrapper.as_uri(), "--allow-file-access-from-files", "--dump-dom", width=width + 40)
    found = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
    assert found and found[1] != "pending", dom[-2000:]
    return json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.parametrize("name", sorted(WIDTHS))
def test_the_landing_page_at_a_desktops_and_a_phones_width(name, site, tmp_path):
    width = WIDTHS[name]
    shot = tmp_path / "page.png"
    chromium(tmp_path, (site.site / "index.html").as_uri(), f"--screenshot={shot}", width=width, height=1600)
    assert png_size_and_colours(shot)[:2] == (width, 1600)
    assert png_size_and_colours(shot)[2] > 64, "the screenshot is (nearly) blank"
    if os.environ.get("WHEELHOUSE_UPDATE_SNAPSHOTS") == "1":  # the docs' pictures, written when asked, as snapshots are
        shutil.copyfile(shot, SCREENSHOTS[name])

    seen = measure(tmp_path, site.site / "index.html", width, "2.13.0+cu130 13.0 3.11 x86_64")
    assert seen["scrollWidth"] <= seen["clientWidth"], seen  # nothing sticks out sideways
    assert seen["worldsRight"] <= seen["clientWidth"], seen  # the world table's every column is on screen
    assert seen["pickerShown"] and seen["copyButtons"] >= 6, seen
    assert seen["before"] == [RETIRED_WORLD, WORLD], seen
    assert (seen["said"], seen["after"], seen["python"]) == (f"your world: {WORLD}", [WORLD], "3.11"), seen


def test_a_torch_the_site_does_not_serve_is_said_so(site, tmp_path):
    seen = measure(tmp_path, site.site / "index.html", WIDTHS["phone"], "2.99.0+cu140 14.0 3.11 x86_64")
    assert seen["said"] == "no world of this site serves torch 2.99.0+cu140 (cu140/torch2.99)", seen


def test_without_javascript_the_page_shows_the_tables_and_every_command(site, tmp_path):
    """The page with its one script removed, as a browser with scripts off has it (headless Chromium needs
    scripts for its own screenshot and DOM dump): the tables, the direct wheel links and the commands are all
    drawn; the selector and the copy buttons, which need the script, are not."""
    served = (site.site / "index.html").read_text()
    static = tmp_path / "site"
    shutil.copytree(site.site, static)
    (static / "index.html").write_text(re.sub(r"<script>.*?</script>", "", served, flags=re.S))
    shot = tmp_path / "no-js.png"
    chromium(tmp_path, (static / "index.html").as_uri(), f"--screenshot={shot}", width=WIDTHS["phone"], height=1600)
    assert png_size_and_colours(shot)[2] > 64
    seen = measure(tmp_path, static / "index.html", WIDTHS["phone"], "")
    assert (seen["pickerShown"], seen["copyButtons"]) == (False, 0), seen
    assert seen["scrollWidth"] <= seen["clientWidth"] and seen["before"] == [RETIRED_WORLD, WORLD], seen
    assert "<small>sm 8.0, 9.0, 10.0</small>" in served and "<small>torch==2.13.*</small>" in served
    assert "pip install --no-deps --index-url " in served and "uv pip install --index " in served
    assert re.search(r'<a href="[^"]+/flash_attn-2\.8\.3-[^"]+\.whl#sha256=[0-9a-f]{64}"', served)


def test_a_worlds_page_at_a_phones_width(site, tmp_path):
    shot = tmp_path / "page.png"
    url = (site.site / WORLD / "index.html").as_uri()
    chromium(tmp_path, url, f"--screenshot={shot}")
    assert png_size_and_colours(shot)[2] > 64
    dom = chromium(tmp_path, url, "--dump-dom")
    assert "<small>sm 8.0, 9.0, 10.0</small>" in dom and "pylock.flash-attn.toml" in dom
