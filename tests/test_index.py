"""ci.publish.index: worlds, links, hashes, metadata, escaping, duplicates, cache, determinism, speed."""

from __future__ import annotations

import gc
import hashlib
import itertools
import random
import time
from html.parser import HTMLParser

import pytest
from index_helpers import wheel_bytes

from ci.base.errors import WheelhouseError
from ci.publish.index import (
    CACHE_FILE,
    DigestCache,
    build_site,
    derive_worlds,
    render_site,
    site_files,
)
from ci.publish.pages import DirectoryTarget, publish_index
from ci.publish.site_marker import is_digest_cache
from ci.store.model import Asset, Release

BASE = "https://owner.github.io/repo"
DL = "https://example.invalid/releases/download"
TITLE = "comp v1 - cu13.0.2 py3.11 torch2.13.0"


class Anchors(HTMLParser):
    """Every <a> of a page as (attributes, text); also every start tag seen."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self.tags: list[str] = []
        self.metas: list[dict[str, str | None]] = []
        self._current: dict[str, str | None] | None = None
        self._text = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "a":
            self._current, self._text = dict(attrs), ""
        if tag == "meta":
            self.metas.append(dict(attrs))

    def handle_data(self, data):
        if self._current is not None:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "a" and self._current is not None:
            self.anchors.append((self._current, self._text))
            self._current = None


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel_asset(
    name: str, tag: str = "t", *, data: bytes | None = None, digest: bool = True, aid: int = 1, url: str | None = None
) -> Asset:
    data = data if data is not None else name.encode()
    return Asset(name, len(data), url or f"{DL}/{tag}/{name}", f"sha256:{sha(data)}" if digest else None, id=aid)


def sidecar_asset(wheel: Asset, meta: bytes, *, digest: bool = True, aid: int = 2) -> Asset:
    return Asset(
        wheel.name + ".metadata", len(meta), wheel.url + ".metadata", f"sha256:{sha(meta)}" if digest else None, id=aid
    )


def wheel_with_sidecar(
    name: str, meta: bytes, tag: str = "t", *, digest: bool = True, aid: int = 1, side_aid: int = 2
) -> tuple[Asset, Asset, dict[str, bytes]]:
    """A wheel whose METADATA is ``meta``, its ``.metadata`` asset of the same bytes, and the blobs serving both."""
    data = wheel_bytes(name, meta)
    whl = wheel_asset(name, tag, data=data, digest=digest, aid=aid)
    side = sidecar_asset(whl, meta, digest=digest, aid=side_aid)
    return whl, side, {whl.url: data, side.url: meta}


def meta_bytes(name: str, version: str, requires_python: str | None = None) -> bytes:
    text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        text += f"Requires-Python: {requires_python}\n"
    return (text + "\n").encode()


class MemoryFetch:
    """fetch(asset) over a url -> bytes map, counting calls."""

    def __init__(self, blobs: dict[str, bytes] | None = None) -> None:
        self.blobs = dict(blobs or {})
        self.calls: list[str] = []

    def __call__(self, asset: Asset):
        self.calls.append(asset.name)
        data = self.blobs[asset.url]
        for i in range(0, len(data), 7):
            yield data[i : i + 7]


def page(files: dict[str, bytes], rel: str) -> Anchors:
    return Anchors(files[rel].decode())


# --------------------------------------------------------------------------- worlds


@pytest.mark.parametrize(
    ("title", "worlds"),
    [
        ("c v1 - cu13.0.2 py3.12 torch2.13.0", ("cu130/torch2.13",)),
        ("c v1 - cu12.9 py3.12 torch2.13.1", ("cu129/torch2.13",)),
        ("c v1 - cucpu py3.11 torch2.13.0", ("cpu/torch2.13",)),
        ("c v1 - cpu py3.11 torch2.13.0; aarch64 cpu py3.11 torch2.13.0", ("cpu/torch2.13",)),
        ("c v1 - cu13.0.2 py3.12 torch2.13.0; aarch64 cu13.0.2 py3.12 torch2.13.0", ("cu130/torch2.13",)),
        ("c v1 - cu12.9.1 py3.12 torch2.13.0; cu13.0.2 py3.12 torch2.13.0", ("cu129/torch2.13", "cu130/torch2.13")),
        ("c v1 - cu13.0 py3.12 torch2.12.0+cu130; cu13.0 py3.12 torch2.13.0", ("cu130/torch2.12", "cu130/torch2.13")),
    ],
)
def test_worlds_from_title(title, worlds):
    derived = derive_worlds(Release("tag", title))
    assert derived.problem is None
    assert derived.worlds == worlds


@pytest.mark.parametrize(
    "title",
    [
        "",
        "apex",
        "apex v1 - py3.12 torch2.13.0",
        "apex v1 - cuabc py3.12 torch2.13.0",
        "apex v1 - cu13.0 py3.12 torchx",
        "apex v1 - cu13.0 py3.12 torch2.13.0; garbage",
    ],
)
def test_underivable_world_leaves_release_out_with_warning(title):
    assert derive_worlds(Release("t", title)).worlds == ()
    good = Release("good", TITLE, assets=(wheel_asset("a-1.0-py3-none-any.whl", "good"),))
    bad = Release("bad", title, assets=(wheel_asset("b-1.0-py3-none-any.whl", "bad"),))
    site = build_site([good, bad], default_world="cu130/torch2.13")
    assert [p.name for p in site.world("cu130/torch2.13").packages] == ["a"]
    assert len(site.warnings) == 1 and "'bad'" in site.warnings[0] and "left out" in site.warnings[0]


def test_drafts_and_releases_without_wheels_are_silent_and_excluded():
    draft = Release("d", TITLE, draft=True, assets=(wheel_asset("a-1.0-py3-none-any.whl", "d"),))
    notes = Release("n", "not a title", assets=(Asset("notes.txt", 1, f"{DL}/n/notes.txt"),))
    site = build_site([draft, notes], default_world=None)
    assert site.worlds == () and site.warnings == ()


def test_one_wheel_in_every_world_of_its_release():
    rel = Release(
        "t",
        "c v1 - cu12.9 py3.12 torch2.13.0; cucpu py3.12 torch2.13.0",
        assets=(wheel_asset("a-1.0-py3-none-any.whl"),),
    )
    site = build_site([rel], default_world=None)
    assert [w.path for w in site.worlds] == ["cpu/torch2.13", "cu129/torch2.13"]


# --------------------------------------------------------------------------- pages and links


def test_pages_links_hashes_metadata_and_alias():
    meta = meta_bytes("tiny-pkg", "1.0", ">=3.10,<3.13")
    whl, side, blobs = wheel_with_sidecar("Tiny_Pkg-1.0-py3-none-any.whl", meta)
    other = wheel_asset("other-2.0-cp311-cp311-linux_x86_64.whl", aid=3)
    rel = Release("t", TITLE, assets=(whl, side, other, Asset("build.log", 3, f"{DL}/t/build.log")))
    fetch = MemoryFetch(blobs)
    site, files = site_files([rel], base_url=BASE + "/", default_world="cu130/torch2.13", fetch=fetch)
    assert site.warnings == ()
    root = page(files, "cu130/torch2.13/simple/index.html")
    assert [(a["href"], t) for a, t in root.anchors] == [("other/", "other"), ("tiny-pkg/", "tiny-pkg")]
    assert {"name": "pypi:repository-version", "content": "1.0"} in root.metas
    pkg = page(files, "cu130/torch2.13/simple/tiny-pkg/index.html")
    [(attrs, text)] = pkg.anchors
    assert text == whl.name
    assert attrs["href"] == f"{whl.url}#sha256={whl.sha256}"
    assert attrs["data-core-metadata"] == attrs["data-dist-info-metadata"] == f"sha256={sha(meta)}"
    assert attrs["data-requires-python"] == ">=3.10,<3.13"
    assert b'data-requires-python="&gt;=3.10,&lt;3.13"' in files["cu130/torch2.13/simple/tiny-pkg/index.html"]
    assert "data-yanked" not in attrs
    plain = page(files, "cu130/torch2.13/simple/other/index.html")
    [(attrs, _)] = plain.anchors
    assert set(attrs) == {"href"}
    # /simple/ is a copy of the default world's pages
    for rel_path in ("tiny-pkg/index.html", "other/index.html"):
        assert files[f"simple/{rel_path}"] == files[f"cu130/torch2.13/simple/{rel_path}"]
    assert [a["href"] for a, _ in page(files, "simple/index.html").anchors] == ["other/", "tiny-pkg/"]
    assert fetch.calls == [side.name, whl.name]  # the wheel once, to compare the sidecar with its METADATA


def test_landing_page_counts_and_snippets():
    rels = [
        Release("a", TITLE, assets=(wheel_asset("flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl"),)),
        Release(
            "b",
            "b v1 - cu12.9 py3.11 torch2.13.0",
            assets=(
                wheel_asset("apex-0.1-cp311-cp311-linux_x86_64.whl"),
                wheel_asset("deep_ep-1.0-py3-none-any.whl", aid=2),
            ),
        ),
    ]
    _, files = site_files(rels, base_url="http://127.0.0.1:8000/", default_world="cu130/torch2.13")
    landing = files["index.html"].decode()
    # pip: torch, then our wheel from our index alone, then its other dependencies (never --extra-index-url)
    assert ("<pre>pip install --index-url https://download.pytorch.org/whl/cu130 &#x27;torch==2.13.*&#x27;\n"
            "pip install --no-deps --index-url http://127.0.0.1:8000/cu130/torch2.13/simple/ flash-attn==2.8.3\n"
            "pip install flash-attn==2.8.3</pre>") in landing
    assert "--extra-index-url" not in landing
    assert ("<pre>uv pip install --index http://127.0.0.1:8000/cu130/torch2.13/simple/ --index "
            "https://download.pytorch.org/whl/cu130 flash-attn==2.8.3</pre>") in landing
    assert "[[tool.uv.index]]" in landing and "explicit = true" in landing and "[tool.uv.sources]" in landing
    assert "url = &quot;http://127.0.0.1:8000/cu129/torch2.13/simple/&quot;" in landing
    assert "apex = { index = &quot;wheelhouse-cu129-torch2.13&quot; }" in landing
    assert "torch = { index = &quot;pytorch-cu129&quot; }" in landing
    assert "<td>cu129/torch2.13</td><td>2</td><td>2</td>" in landing
    assert "cu130/torch2.13 (also served at /simple/)</td><td>1</td>" in landing
    assert files[".nojekyll"] == b""


def test_default_world_without_wheels_gives_empty_alias_and_warning():
    rel = Release("a", TITLE, assets=(wheel_asset("a-1.0-py3-none-any.whl"),))
    site, files = site_files([rel], base_url=BASE, default_world="cu129/torch2.13")
    assert page(files, "simple/index.html").anchors == []
    assert any("cu129/torch2.13 has no wheels" in w for w in site.warnings)


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(WheelhouseError, match="default world 'cu130' is not a world path"):
        build_site([], default_world="cu130")
    with pytest.raises(WheelhouseError, match="base URL"):
        site_files([], base_url="javascript:alert(1)", default_world=None)
    with pytest.raises(WheelhouseError, match="base URL"):
        site_files([], base_url='https://x/"><script>', default_world=None)


# --------------------------------------------------------------------------- hostile input


def _only_warning_refused(assets: tuple[Asset, ...]) -> tuple[object, dict[str, bytes]]:
    rel = Release("t", TITLE, assets=assets)
    site, files = site_files([rel], base_url=BASE, default_world=None)
    return site, files


def _assert_refused(name: str, url: str | None = None):
    bad = wheel_asset(name, url=url)
    site, files = _only_warning_refused((bad, wheel_asset("ok-1.0-py3-none-any.whl", aid=9)))
    assert len(site.warnings) == 1 and "refused" in site.warnings[0], site.warnings
    assert "\n" not in site.warnings[0]
    body = b"".join(files.values())
    if url is None:
        assert name.encode() not in body
    assert sorted(f for f in files if f.endswith("/index.html") and "/simple/" in f) == [
        "cu130/torch2.13/simple/index.html",
        "cu130/torch2.13/simple/ok/index.html",
    ]


def test_hostile_markup_name_refused():
    _assert_refused("evil-1.0-py3-none-any<script>alert(1)</script>.whl")


def test_hostile_quote_name_refused():
    _assert_refused('evil-1.0-py3-none-any" onmouseover="x.whl')


def test_hostile_path_traversal_name_refused():
    _assert_refused("../../evil-1.0-py3-none-any.whl")
    _assert_refused("..-1.0-py3-none-any.whl")


def test_hostile_unicode_name_refused():
    _assert_refused("pkg\u00e9-1.0-py3-none-any.whl")
    _assert_refused("pkg-1.0-py3-none-any\u202e.whl")


def test_invalid_wheel_filename_refused():
    _assert_refused("pkg-1.0.whl")
    _assert_refused("pkg-notaversion!-py3-none-any.whl")
    _assert_refused("pkg__x-1.0-py3-none-any.whl")


def test_hostile_url_scheme_refused():
    _assert_refused("pkg-1.0-py3-none-any.whl", url="javascript:alert(1)//pkg-1.0-py3-none-any.whl")


_PROJECT_PARTS = ["pkg", "Tiny_Pkg.x", "a+b", "pkg__x", "..", "", "pk\u00e9", "-"]
_TAILS = [
    "1.0-py3-none-any.whl",
    "2.0.post1-1-cp312-cp312-manylinux_2_28_x86_64.whl",
    "1.0-1abc-py3.py2-none-any.whl",
    "1.0-abc-py3-none-any.whl",
    "1.0.whl",
    "notaversion!-py3-none-any.whl",
    "1.0-py3-none-any-x-y.whl",
    "1.0-py3-none-.whl",
    "1.0-py3-none-any\u202e.whl",
    "1.0-py3-none-any.whl\n",
    "1.0-py3-none-any.zip",
    "",
]
_URLS = [
    f"{DL}/t/x.whl",
    "HTTP://example.invalid/x.whl",
    "file:///srv/x.whl",
    "javascript:alert(1)//x.whl",
    f"{DL}/t/x\n.whl",
    " https://example.invalid/x.whl",
]


def test_wheel_checks_by_parts_agree_with_the_checks_one_by_one():
    """The fast path checks a name's part before the first dash and the rest separately (each once per
    build); for every combination, in every cache state, it answers what the checks in sequence answer."""
    from ci.publish.index import _Builder, _wheel_project_checked

    names = [f"{p}-{t}" for p, t in itertools.product(_PROJECT_PARTS, _TAILS)] + ["pkg", "pkg.whl", "-"]
    assets = [Asset(n, 1, url, id=i) for i, (n, url) in enumerate(itertools.product(names, _URLS))]
    answers = {_wheel_project_checked(a) for a in assets}
    assert {a[0] for a in answers if isinstance(a, tuple)} == {"pkg", "tiny-pkg-x"} and any(isinstance(a, str) for a in answers)
    for order in (assets, assets[::-1], random.Random(3).sample(assets, len(assets))):
        builder = _Builder(None, DigestCache())
        for asset in order:
            assert builder.wheel_project(asset) == _wheel_project_checked(asset), (asset.name, asset.url)


def test_site_build_pauses_the_cycle_collector_and_restores_its_state():
    seen: list[bool] = []

    def fetch(asset):
        seen.append(gc.isenabled())
        yield asset.name.encode()

    rel = Release("t", TITLE, assets=(wheel_asset("pkg-1.0-py3-none-any.whl", digest=False),))
    assert gc.isenabled()
    site_files([rel], base_url=BASE, default_world=None, fetch=fetch)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(WheelhouseError):
        site_files([rel], base_url=BASE, default_world="nonsense", fetch=fetch)
    assert gc.isenabled()
    gc.disable()
    try:
        site_files([rel], base_url=BASE, default_world=None, fetch=fetch)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_url_with_markup_or_quotes_is_left_out_and_never_reaches_a_page():
    """Markup in an asset URL cannot reach a page, a record or a printed command: which-wheel refuses such a URL
    in a record, so the index leaves the wheel out, with a warning naming the URL and why."""
    url = f'{DL}/t/"><script>x</script>/pkg-1.0-py3-none-any.whl'
    rel = Release("t", TITLE, assets=(wheel_asset("pkg-1.0-py3-none-any.whl", url=url),))
    site, files = site_files([rel], base_url=BASE, default_world=None)
    assert not any(b"<script>x</script>" in data or b"&lt;script&gt;x" in data for data in files.values())
    assert "cu130/torch2.13/simple/pkg/index.html" not in files
    assert any(url in w and "holds '\"'" in w for w in site.warnings), site.warnings


def test_yanked_and_requires_python_are_escaped():
    meta = meta_bytes("pkg", "1.0", ">=3.10,<3.13")
    whl, side, blobs = wheel_with_sidecar("pkg-1.0-py3-none-any.whl", meta)
    whl2 = wheel_asset("pkg-2.0-py3-none-any.whl", aid=5)
    rel = Release("t", TITLE, assets=(whl, side, whl2))
    reason = 'broken <b>ABI</b> & "quotes"'
    site, files = site_files(
        [rel],
        base_url=BASE,
        default_world=None,
        fetch=MemoryFetch(blobs),
        yanked={whl.name: reason, whl2.name: "", "ghost-1.0-py3-none-any.whl": "x"},
    )
    raw = files["cu130/torch2.13/simple/pkg/index.html"].decode()
    assert "<b>" not in raw
    assert 'data-yanked="broken &lt;b&gt;ABI&lt;/b&gt; &amp; &quot;quotes&quot;"' in raw
    (a1, _), (a2, _) = Anchors(raw).anchors
    assert a1["data-yanked"] == reason and a1["data-requires-python"] == ">=3.10,<3.13"
    assert a2["data-yanked"] == ""
    assert site.warnings == ("yank list names 'ghost-1.0-py3-none-any.whl', which no index holds",)


def test_starter_assets_are_skipped():
    starter = Asset("pkg-1.0-py3-none-any.whl", 0, f"{DL}/t/pkg-1.0-py3-none-any.whl", state="starter")
    site = build_site([Release("t", TITLE, assets=(starter,))], default_world=None)
    assert site.worlds == () and "incomplete" in site.warnings[0]


# --------------------------------------------------------------------------- duplicates


def test_duplicate_filename_keeps_highest_torch_then_tag():
    name = "pkg-1.0-cp311-cp311-linux_x86_64.whl"
    old = Release(
        "pkg-v1-py3.11-torch2.13.0",
        "pkg v1 - cu13.0.2 py3.11 torch2.13.0",
        assets=(wheel_asset(name, "old", data=b"old"),),
    )
    new = Release(
        "aaa-restored", "pkg v1 - cu13.0.2 py3.11 torch2.13.1", assets=(wheel_asset(name, "new", data=b"new"),)
    )
    for order in ([old, new], [new, old]):
        site = build_site(order, default_world=None)
        [link] = site.world("cu130/torch2.13").packages[0].links
        assert link.release == "aaa-restored" and link.sha256 == sha(b"new")
        assert site.warnings == (
            f"duplicate {name} in cu130/torch2.13: kept release aaa-restored, ignored release pkg-v1-py3.11-torch2.13.0",
        )
    # same torch: the greater tag wins
    a = Release("tag-a", TITLE, assets=(wheel_asset(name, "a", data=b"a"),))
    b = Release("tag-b", TITLE, assets=(wheel_asset(name, "b", data=b"b"),))
    site = build_site([b, a], default_world=None)
    assert site.world("cu130/torch2.13").packages[0].links[0].release == "tag-b"
    assert "kept release tag-b, ignored release tag-a" in site.warnings[0]


# --------------------------------------------------------------------------- hashes and cache


def test_mixed_hashes_dropped_for_the_whole_package():
    hashed = wheel_asset("pkg-1.0-py3-none-any.whl")
    unhashed = wheel_asset("pkg-2.0-py3-none-any.whl", digest=False, aid=2)
    fine = wheel_asset("fine-1.0-py3-none-any.whl", aid=3)
    site, files = site_files([Release("t", TITLE, assets=(hashed, unhashed, fine))], base_url=BASE, default_world=None)
    hrefs = [a["href"] for a, _ in page(files, "cu130/torch2.13/simple/pkg/index.html").anchors]
    assert hrefs == [hashed.url, unhashed.url]
    assert (
        page(files, "cu130/torch2.13/simple/fine/index.html").anchors[0][0]["href"].endswith(f"#sha256={fine.sha256}")
    )
    assert len(site.warnings) == 1 and "pkg: hashes dropped" in site.warnings[0] and "pkg-2.0" in site.warnings[0]


def test_failed_fetch_and_wrong_size_drop_hashes():
    a = wheel_asset("pkg-1.0-py3-none-any.whl", digest=False)
    b = Asset("pkg-2.0-py3-none-any.whl", 999, f"{DL}/t/pkg-2.0-py3-none-any.whl", None, id=2)
    fetch = MemoryFetch({b.url: b"short"})
    site = build_site([Release("t", TITLE, assets=(a, b))], default_world=None, fetch=fetch)
    assert all(link.sha256 is None for link in site.worlds[0].packages[0].links)
    assert "download failed" in site.warnings[0] and "asset says 999" in site.warnings[0]


def test_digest_cache_fetches_once_ever_and_rehashes_changed_assets():
    blobs: dict[str, bytes] = {}
    assets = []
    for i in range(3):
        meta = meta_bytes(f"p{i}", "1.0", ">=3.9")
        whl, side, served = wheel_with_sidecar(f"p{i}-1.0-py3-none-any.whl", meta, digest=False, aid=10 + i,
                                               side_aid=20 + i)
        blobs.update(served)
        assets += [whl, side]
    rel = Release("t", TITLE, assets=tuple(assets))
    fetch = MemoryFetch(blobs)
    cache = DigestCache()
    site1, files1 = site_files([rel], base_url=BASE, default_world=None, fetch=fetch, cache=cache)
    # each wheel once (its hash and its METADATA from one download), each sidecar once
    assert len(fetch.calls) == 6 and site1.fetches == 6 and site1.warnings == ()
    link = site1.worlds[0].packages[0].links[0]
    assert link.sha256 == sha(blobs[assets[0].url]) and link.requires_python == ">=3.9" and link.metadata

    fetch2 = MemoryFetch(blobs)
    cache2 = DigestCache.from_json(files1[CACHE_FILE])
    site2, files2 = site_files([rel], base_url=BASE, default_world=None, fetch=fetch2, cache=cache2)
    assert fetch2.calls == [] and site2.fetches == 0
    assert files2 == files1

    # without any fetch at all, the cache alone gives the same site
    _, files3 = site_files([rel], base_url=BASE, default_world=None, cache=DigestCache.from_json(files1[CACHE_FILE]))
    assert files3 == files1

    # p1 re-uploaded (new id, new bytes, the same METADATA): only it is downloaded again
    changed = wheel_bytes(assets[2].name, blobs[assets[3].url], payload=b"changed")
    new_p1 = Asset(assets[2].name, len(changed), assets[2].url, None, id=99)
    blobs[new_p1.url] = changed
    rel4 = Release("t", TITLE, assets=(assets[0], assets[1], new_p1, assets[3], assets[4], assets[5]))
    fetch4 = MemoryFetch(blobs)
    site4, files4 = site_files(
        [rel4], base_url=BASE, default_world=None, fetch=fetch4, cache=DigestCache.from_json(files1[CACHE_FILE])
    )
    assert fetch4.calls == [new_p1.name]
    assert site4.world("cu130/torch2.13").packages[1].links[0].sha256 == sha(changed)
    assert site4.world("cu130/torch2.13").packages[1].links[0].metadata and site4.warnings == ()
    assert DigestCache.asset_key(assets[2]) not in files4[CACHE_FILE].decode()


def test_corrupt_cache_is_a_one_line_error():
    with pytest.raises(WheelhouseError, match=r"is not a digest cache.*delete it"):
        DigestCache.from_json(b"{not json")
    with pytest.raises(WheelhouseError):
        DigestCache.from_json(b'{"version": 42}')
    assert DigestCache.from_json(None).to_json() == DigestCache().to_json()


def test_sidecar_with_wrong_bytes_or_wrong_name_is_not_advertised():
    good_meta = meta_bytes("pkg", "1.0")
    whl, side, blobs = wheel_with_sidecar("pkg-1.0-py3-none-any.whl", good_meta)
    site = build_site(
        [Release("t", TITLE, assets=(whl, side))], default_world=None, fetch=MemoryFetch({side.url: b"tampered"})
    )
    link = site.worlds[0].packages[0].links[0]
    assert not link.metadata and "do not match its digest" in site.warnings[0]

    wrong = meta_bytes("other", "1.0")
    side2 = sidecar_asset(whl, wrong)
    site = build_site(
        [Release("t", TITLE, assets=(whl, side2))], default_world=None, fetch=MemoryFetch({side2.url: wrong})
    )
    assert not site.worlds[0].packages[0].links[0].metadata and "says other 1.0" in site.warnings[0]

    # sidecar at another URL than <wheel url>.metadata: PEP 658 clients would miss it
    moved = Asset(side.name, side.size, f"{DL}/elsewhere/{side.name}", side.digest, id=7)
    site = build_site([Release("t", TITLE, assets=(whl, moved))], default_world=None)
    assert not site.worlds[0].packages[0].links[0].metadata and "not the wheel URL" in site.warnings[0]

    # no fetch and no cached comparison: nothing shows the sidecar is the wheel's METADATA, so it is not advertised
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None)
    link = site.worlds[0].packages[0].links[0]
    assert not link.metadata and "nothing to download pkg-1.0-py3-none-any.whl with" in site.warnings[0]

    # the good pair is advertised, and the comparison is cached: later runs need no fetch
    cache = DigestCache()
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None, fetch=MemoryFetch(blobs),
                      cache=cache)
    assert site.worlds[0].packages[0].links[0].metadata and site.warnings == ()
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None,
                      cache=DigestCache.from_json(cache.to_json()))
    link = site.worlds[0].packages[0].links[0]
    assert link.metadata and link.metadata_sha256 == sha(good_meta) and site.warnings == ()


def test_sidecar_that_differs_from_the_wheels_metadata_is_not_advertised():
    # N2: a sidecar with the wheel's Name and Version and one added Requires-Dist (its digest is its own):
    # pip would resolve evil-dependency-confusion from it without ever opening the wheel
    own = meta_bytes("pkg", "1.0")
    whl, _, blobs = wheel_with_sidecar("pkg-1.0-py3-none-any.whl", own)
    forged = own.rstrip(b"\n") + b"\nRequires-Dist: evil-dependency-confusion\n\n"
    side = sidecar_asset(whl, forged)
    blobs[side.url] = forged
    fetch = MemoryFetch(blobs)
    cache = DigestCache()
    site, files = site_files([Release("t", TITLE, assets=(whl, side))], base_url=BASE, default_world=None,
                             fetch=fetch, cache=cache)
    link = site.worlds[0].packages[0].links[0]
    assert not link.metadata and link.sha256 == whl.sha256
    assert site.warnings == (f"{side.name} (release t): differs from the METADATA inside {whl.name}, so it is not"
                             " advertised (installers would resolve what the wheel does not declare); upload the"
                             " .metadata made from the wheel (invoke release writes it)",)
    assert "data-dist-info-metadata" not in files["cu130/torch2.13/simple/pkg/index.html"].decode()
    assert sorted(fetch.calls) == sorted([side.name, whl.name])
    # nothing about the forged pair is cached as checked: the next run compares again and refuses again
    assert '"sidecars": {}' in cache.to_json().decode()
    # the good pair is cached, and a digests.json holding it is still recognised as ours
    side = sidecar_asset(whl, own)
    blobs[side.url] = own
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None, fetch=MemoryFetch(blobs), cache=cache)
    assert site.worlds[0].packages[0].links[0].metadata
    assert f'"{whl.sha256}": "{sha(own)}"' in cache.to_json().decode() and is_digest_cache(cache.to_json())


@pytest.mark.parametrize(
    ("served", "why"),
    [
        (b"not a zip", "cannot be read"),
        (None, "could not be downloaded"),  # a download that fails
    ],
)
def test_sidecar_whose_wheel_cannot_be_read_is_not_advertised(served, why):
    meta = meta_bytes("pkg", "1.0")
    whl, side, blobs = wheel_with_sidecar("pkg-1.0-py3-none-any.whl", meta)
    if served is None:
        del blobs[whl.url]
    else:
        whl = wheel_asset(whl.name, data=served)
        side = sidecar_asset(whl, meta)
        blobs[whl.url] = served
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None, fetch=MemoryFetch(blobs))
    assert not site.worlds[0].packages[0].links[0].metadata
    assert why in site.warnings[0] and site.warnings[0].startswith(f"{side.name} (release t): not advertised")


def test_sidecar_of_a_wheel_whose_download_differs_from_its_digest_is_not_advertised():
    meta = meta_bytes("pkg", "1.0")
    whl, side, blobs = wheel_with_sidecar("pkg-1.0-py3-none-any.whl", meta)
    blobs[whl.url] = wheel_bytes(whl.name, meta, payload=b"x" * 0)[:-1] + b"!"  # same size, other bytes
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None, fetch=MemoryFetch(blobs))
    assert not site.worlds[0].packages[0].links[0].metadata
    assert "does not match its digest" in site.warnings[0]


# --------------------------------------------------------------------------- determinism, writing, speed


def _many_releases(n: int, per_release: int = 12) -> tuple[list[Release], dict[str, bytes]]:
    blobs: dict[str, bytes] = {}
    releases = []
    components = ["apex", "flash-attn", "flashinfer-python", "deep-ep", "flash-mla", "transformer-engine"]
    worlds = ["cu13.0.2 py{py} torch2.13.0", "cu12.9.1 py{py} torch2.13.0", "cu13.0.2 py{py} torch2.12.0"]
    aid = 0
    for i in range(n):
        comp = components[i % len(components)]
        py = ["3.10", "3.11", "3.12"][i % 3]
        cp = "cp" + py.replace(".", "")
        tag = f"{comp}-v{i}-py{py}-torch2.13"
        title = f"{comp} v{i} - " + worlds[i % 3].format(py=py) + "; aarch64 " + worlds[i % 3].format(py=py)
        assets = []
        for j in range(per_release // 2):
            arch = ["x86_64", "aarch64"][j % 2]
            name = f"{comp.replace('-', '_')}-{i}.{j}-{cp}-{cp}-manylinux_2_28_{arch}.whl"
            meta = meta_bytes(comp, f"{i}.{j}", f">={py}")
            data = wheel_bytes(name, meta)
            whl = Asset(name, len(data), f"{DL}/{tag}/{name}", f"sha256:{sha(data)}", id=(aid := aid + 1))
            blobs[whl.url] = data
            side = Asset(
                name + ".metadata", len(meta), whl.url + ".metadata", f"sha256:{sha(meta)}", id=(aid := aid + 1)
            )
            blobs[side.url] = meta
            assets += [whl, side]
        releases.append(Release(tag, title, assets=tuple(assets), id=i))
    return releases, blobs


def test_output_is_deterministic():
    releases, blobs = _many_releases(30)
    _, a = site_files(releases, base_url=BASE, default_world="cu130/torch2.13", fetch=MemoryFetch(blobs))
    shuffled = releases[:]
    random.Random(7).shuffle(shuffled)
    _, b = site_files(shuffled, base_url=BASE, default_world="cu130/torch2.13", fetch=MemoryFetch(blobs))
    assert a == b and list(a) == sorted(a)


def test_publish_index_writes_and_summarizes(tmp_path):
    releases, blobs = _many_releases(6)
    out = tmp_path / "_site"
    outcome = publish_index(releases, DirectoryTarget(out), base_url=BASE, default_world="cu130/torch2.13",
                            fetch=MemoryFetch(blobs))
    summary = outcome.summary
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == list(summary.files)
    assert CACHE_FILE in summary.files and "index.html" in summary.files
    assert [w.path for w in summary.worlds] == ["cu129/torch2.13", "cu130/torch2.12", "cu130/torch2.13"]
    assert sum(w.links for w in summary.worlds) == 6 * 6 and summary.warnings == ()
    assert summary.fetches == 72  # every sidecar, and every wheel once to compare it with its sidecar
    assert summary.line().startswith("Indexed 36 wheel link(s) across 3 world(s)")
    assert outcome.warnings == ()
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a site")
    with pytest.raises(WheelhouseError, match="is not empty and holds no published site"):
        publish_index(releases, DirectoryTarget(stray), base_url=BASE, default_world=None)


def test_render_site_is_pure():
    releases, _ = _many_releases(3)
    site = build_site(releases, default_world="cu130/torch2.13")
    assert render_site(site, base_url=BASE) == render_site(site, base_url=BASE)


def test_thousand_releases_of_twelve_assets_is_fast(record_property):
    releases, blobs = _many_releases(1000)
    cache = DigestCache()
    t0 = time.perf_counter()
    site, files = site_files(
        releases, base_url=BASE, default_world="cu130/torch2.13", fetch=MemoryFetch(blobs), cache=cache
    )
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    fetch = MemoryFetch(blobs)
    _, files2 = site_files(
        releases,
        base_url=BASE,
        default_world="cu130/torch2.13",
        fetch=fetch,
        cache=DigestCache.from_json(files[CACHE_FILE]),
    )
    warm = time.perf_counter() - t0
    assert fetch.calls == [] and files2 == files
    assert sum(w.link_count for w in site.worlds) == 6000 and site.warnings == ()
    record_property("generation_cold_s", round(cold, 3))
    record_property("generation_warm_s", round(warm, 3))
    print(
        f"\n1000 releases x 12 assets: cold {cold:.2f} s (6000 sidecars and wheels read), warm cache {warm:.2f} s, {len(files)} files"
    )
    assert warm < 5 and cold < 10


def test_over_long_name_refused_instead_of_aborting_the_publication():
    # a 301-character project name used to end the whole publish in "File name too long"
    _assert_refused("a" * 301 + "-1.0-py3-none-any.whl")


def test_sidecar_without_a_name_is_named_as_such():
    whl = wheel_asset("pkg-1.0-py3-none-any.whl")
    nameless = b"Metadata-Version: 2.1\nVersion: 1.0\n"
    side = sidecar_asset(whl, nameless)
    site = build_site([Release("t", TITLE, assets=(whl, side))], default_world=None,
                      fetch=MemoryFetch({side.url: nameless}))
    assert not site.worlds[0].packages[0].links[0].metadata
    assert "lacks Name or Version but the wheel is pkg 1.0" in site.warnings[0], site.warnings


def test_a_wheel_of_a_project_its_component_does_not_publish_is_left_out_with_a_warning():
    fixture = Release("wheelhouse-fixture-0.1.0-py3.11-torch2.13.0", "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0",
                      assets=(wheel_asset("wheelhouse_fixture-0.1.0-py3-none-any.whl", aid=1),
                              wheel_asset("torch-99.0-py3-none-any.whl", aid=2),
                              wheel_asset("Transformer_Engine-99.0-py3-none-any.whl", aid=3)))
    retired = Release("retired-1.0-py3.11-torch2.13.0", "retired 1.0 - cpu py3.11 torch2.13.0",  # not in versions.yaml
                      assets=(wheel_asset("retired-1.0-py3-none-any.whl", aid=4),
                              wheel_asset("flash_attn-9.0-py3-none-any.whl", aid=5)))
    site, _ = site_files([fixture, retired], base_url=BASE, default_world=None,
                         projects={"wheelhouse-fixture": frozenset({"wheelhouse-fixture"})})
    assert [p.name for p in site.worlds[0].packages] == ["retired", "wheelhouse-fixture"]
    assert list(site.warnings) == [
        f"asset {name!r} (release {tag}) left out of every index: project {project!r} is not one component "
        f"{component} publishes ({component}: components.{component}.wheel_packages in versions.yaml, or the "
        "component's own name when it lists none); delete the asset"
        for name, tag, project, component in [
            ("flash_attn-9.0-py3-none-any.whl", retired.tag, "flash-attn", "retired"),
            ("Transformer_Engine-99.0-py3-none-any.whl", fixture.tag, "transformer-engine", "wheelhouse-fixture"),
            ("torch-99.0-py3-none-any.whl", fixture.tag, "torch", "wheelhouse-fixture"),
        ]
    ]


def test_a_rehosted_projects_links_say_the_wheel_is_upstreams():
    """versions.yaml's rehost: flashinfer-cubin is upstream's wheel, the jit-cache beside it is built here."""
    release = Release("flashinfer-v0.6.13-py3.12-torch2.13.0", "flashinfer v0.6.13 - cu13.0.2 py3.12 torch2.13.0",
                      assets=(wheel_asset("flashinfer_cubin-0.6.13-py3-none-any.whl", aid=1),
                              wheel_asset("flashinfer_jit_cache-0.6.13-cp39-abi3-linux_x86_64.whl", aid=2)))
    _, files = site_files([release], base_url=BASE, default_world=None,
                          rehosted={"flashinfer": frozenset({"flashinfer-cubin"})})
    cubin = files["cu130/torch2.13/simple/flashinfer-cubin/index.html"].decode()
    built_here = files["cu130/torch2.13/simple/flashinfer-jit-cache/index.html"].decode()
    assert 'data-wheelhouse-rehosted="upstream">flashinfer_cubin-0.6.13-py3-none-any.whl</a>' in cubin
    assert "data-wheelhouse-rehosted" not in built_here
