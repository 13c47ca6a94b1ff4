"""The built site as a whole: every link resolves, the pages say what the JSON records say, a retired world
stays with PEP 792 markers, and the pages are static and fit a phone.

The site is the stand-in one of tests/install_clients.py (a real fat binary in a real wheel, published
through ci/publish/pages.py), published twice: the second time without the cu129/torch2.13 release, as after a prune.
"""

from __future__ import annotations

import html
import json
import re
import sys

import pytest
from install_clients import RETIRED_WORLD, WORLD, build_indexes
from link_check import check_site

from ci.publish import landing
from ci.publish.catalog import INDEX_RECORD, WORLD_RECORD
from ci.publish.which_wheel import SERVED_NAME, parse_world, served_copy


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_indexes(tmp_path_factory.mktemp("site-pages"), retired_world=True)


def test_every_link_of_the_site_resolves(site):
    report = check_site(site.site, site.base_url)
    assert report.broken == [] and report.external == []
    pages = len(list(site.site.rglob("*.html")))
    assert pages >= 9 and report.checked > 2 * pages  # the landing page, world pages, simple pages and alias


def test_the_link_checker_finds_a_missing_file_and_a_wrong_hash(site, tmp_path):
    """The checker can fail: a copy of the site whose wheel link points at other bytes, and a page gone."""
    copy = tmp_path / "site"
    for path in site.site.rglob("*"):
        if path.is_file():
            (copy / path.relative_to(site.site)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(site.site)).write_bytes(path.read_bytes())
    page = copy / WORLD / "simple" / "flash-attn" / "index.html"
    page.write_text(re.sub(r"#sha256=[0-9a-f]{64}", "#sha256=" + "0" * 64, page.read_text()))
    (copy / WORLD / "wheelhouse-world.json").unlink()
    report = check_site(copy, copy.as_uri())
    assert any("sha256 differs" in b for b in report.broken), report.broken
    assert any("wheelhouse-world.json (nothing at" in b for b in report.broken), report.broken


def test_the_world_page_shows_what_the_world_record_says(site):
    record = json.loads((site.site / WORLD / WORLD_RECORD).read_text())
    (project,) = record["projects"]
    (raw,) = project["wheels"]
    (wheel,) = parse_world((site.site / WORLD / WORLD_RECORD).read_bytes(), WORLD_RECORD).projects[0].wheels
    assert (record["world"], record["status"], project["name"], project["newest"]) == (WORLD, "active", "flash-attn",
                                                                                       "2.8.3")
    assert raw["facts"]["cubins"] == ["8.0", "9.0", "10.0"] and raw["facts"]["torch_pin"] == "==2.13.*"
    assert raw["facts"]["built_with"]["cuda"] == "13.0" and raw["size"] == (site.site.parent / "releases").joinpath(
        raw["release"], raw["filename"]).stat().st_size
    page = (site.site / WORLD / "index.html").read_text()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cell = (f'<td data-python="{python}" data-arch="x86_64"><a href="{raw["url"]}#sha256={raw["sha256"]}" '
            f'title="{raw["filename"]}">2.8.3</a><small>sha256 <code>{raw["sha256"][:16]}…</code></small>'
            f"<small>sm 8.0, 9.0, 10.0</small><small>{landing.size_text(wheel.size)}</small><small>torch==2.13.*</small>"
            f'<small><a href="{raw["release_url"]}">release</a></small></td>')
    assert cell in page
    simple = (site.site / WORLD / "simple" / "flash-attn" / "index.html").read_text()
    assert f'href="{raw["url"]}#sha256={raw["sha256"]}"' in simple
    index = json.loads((site.site / INDEX_RECORD).read_text())
    assert [(w["world"], w["status"], w["record"]) for w in index["worlds"]] == [
        (RETIRED_WORLD, "archived", f"{RETIRED_WORLD}/{WORLD_RECORD}"), (WORLD, "active", f"{WORLD}/{WORLD_RECORD}")]


def test_a_retired_world_stays_with_its_status(site):
    """PEP 792: the project page keeps its name, says archived and why, and links no file."""
    page = (site.site / RETIRED_WORLD / "simple" / "flash-attn" / "index.html").read_text()
    assert '<meta name="pypi:repository-version" content="1.4">' in page
    assert '<meta name="pypi:project-status" content="archived">' in page
    assert ('<meta name="pypi:project-status-reason" content="retired: no release of the store holds it for this '
            'world any more">') in page
    assert "<a " not in page
    assert 'href="flash-attn/"' in (site.site / RETIRED_WORLD / "simple" / "index.html").read_text()
    landing_page = (site.site / "index.html").read_text()
    assert f"<tr><td>{RETIRED_WORLD}</td><td>0</td><td>0</td><td>archived: " in landing_page
    world_page = (site.site / RETIRED_WORLD / "index.html").read_text()
    assert f"The world {RETIRED_WORLD} is archived: retired:" in world_page
    # the active world's pages carry no status and keep API version 1.0
    active = (site.site / WORLD / "simple" / "flash-attn" / "index.html").read_text()
    assert "pypi:project-status" not in active and 'content="1.0"' in active


@pytest.mark.parametrize("page", ["index.html", f"{WORLD}/index.html", f"{RETIRED_WORLD}/index.html"])
def test_the_pages_are_static_html_that_a_script_only_filters_and_fit_a_phone(site, page):
    """Everything is in the HTML as served: the script (the selector and the copy buttons) hides, shows and copies
    what is there and writes no content; wide tables scroll in their box, the world table fits the width."""
    text = (site.site / page).read_text()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text
    (script,) = re.findall(r"<script>(.*?)</script>", text, re.S)
    assert not re.search(r"innerHTML|outerHTML|document\.write|insertAdjacent|createElement|fetch\(", script)
    assert text.count('<div class="scroll"><table>') + text.count('<table class="worlds">') == text.count("<table")
    if page != f"{RETIRED_WORLD}/index.html":
        assert "pip install --no-deps --index-url " in text and "uv pip install --index " in text


def test_the_landing_page_says_how_to_tell_ones_world_and_links_the_script_that_tells_it(site):
    text = (site.site / "index.html").read_text()
    assert html.escape(landing.ONE_LINER, quote=True) in text
    assert f'<a href="{SERVED_NAME}">{SERVED_NAME}</a>' in text
    assert html.escape(f"python3 <(curl -fsSL {site.base_url}/{SERVED_NAME})", quote=True) in text
    assert (site.site / SERVED_NAME).read_bytes() == served_copy(site.base_url)
    assert f'<option value="{WORLD}">{WORLD}</option>' in text and f'<option value="{RETIRED_WORLD}">' not in text
