"""The site's records are written by ci/base/json_text.py, faster than ``json.dumps(indent=1, sort_keys=True)`` and
byte for byte the same: on random documents of every shape json accepts, and on every JSON file of a real
published site (wheel facts, statuses, a retired world). The site is built from the same model as before, so
its digest does not change (benchmarks/RESULTS.md, figure 1, gives the whole site's digest before and after).
"""

from __future__ import annotations

import collections
import json
import random

import pytest
from install_clients import build_indexes
from packaging.utils import parse_wheel_filename

from ci.base import json_text
from ci.publish import index
from ci.store.model import Asset, Release

_SCALARS = (None, True, False, 0, -7, 2**70, 1.5, 1e300, float("nan"), float("inf"), "", "plain",
            'a"b\\c\n\t\u00e9\U0001f600', "},\n  {", "[{x}]", "\x00")
_KEYS = ("a", "b", "},\n  {", "\u00e9", "z", "", '"')


def _document(rnd: random.Random, depth: int = 0):
    """A random JSON document: scalars, empty and nested containers, lists of flat dicts, tuples."""
    choice = rnd.random()
    if depth > 4 or choice < 0.35:
        return rnd.choice(_SCALARS)
    if choice < 0.45:
        return rnd.choice(({}, [], ()))
    if choice < 0.7:
        return {rnd.choice(_KEYS) + str(rnd.randint(0, 3)): _document(rnd, depth + 1) for _ in range(rnd.randint(1, 4))}
    if choice < 0.85:
        return [_document(rnd, depth + 1) for _ in range(rnd.randint(1, 4))]
    if choice < 0.95:  # the records of a world: a list of flat dicts
        return [{rnd.choice(_KEYS): rnd.choice((*_SCALARS, {}, [])) for _ in range(rnd.randint(1, 3))}
                for _ in range(rnd.randint(1, 3))]
    return tuple(_document(rnd, depth + 1) for _ in range(rnd.randint(1, 3)))


def test_random_documents_are_written_as_json_writes_them():
    rnd = random.Random(45)
    for _ in range(5000):
        document = _document(rnd)
        assert json_text.dumps(document) == json.dumps(document, indent=1, sort_keys=True), document


@pytest.mark.parametrize("document", [
    {1: "a", 2: {"b": [1]}},  # keys json converts
    collections.OrderedDict(b=[1, {"c": 2}], a=1),  # a dict subclass
    {"a": collections.OrderedDict(z=1), "b": [collections.OrderedDict()]},
    ({"a": 1}, {"b": 2}),
    [{"a": 1}, {}],  # an empty dict among flat ones
    [{"a": 1}, [1]],
    {"x": [{"a": {}}, {"a": []}]},
])
def test_the_shapes_with_a_path_of_their_own(document):
    assert json_text.dumps(document) == json.dumps(document, indent=1, sort_keys=True)


def test_every_json_file_of_a_published_site_is_written_as_json_writes_it(tmp_path):
    site = build_indexes(tmp_path, retired_world=True).site
    records = sorted(path for path in site.rglob("*.json") if path.name != "wheelhouse-site.json")  # the marker: ci/publish/site_marker.py
    assert {path.name for path in records} == {"wheelhouse-index.json", "wheelhouse-world.json", "digests.json"}
    assert len(records) == 4  # the index record, two worlds' records (one of them retired) and the digest cache
    assert any('"facts": {' in path.read_text() for path in records)  # nested records, not only flat ones
    for path in records:
        assert path.read_text() == json.dumps(json.loads(path.read_text()), indent=1, sort_keys=True) + "\n", path


def test_the_catalog_takes_each_wheels_version_as_packaging_parses_it():
    """site_catalog gives each entry its version from the name's second part, parsed once per version."""
    names = ["pkg-1.0-cp312-cp312-linux_x86_64.whl", "pkg-1.0-1-cp312-cp312-linux_x86_64.whl",
             "pkg-2.0.post1+cu130torch2.13-cp311-cp311-linux_x86_64.whl", "other_pkg-0.1.0rc1-py3-none-any.whl",
             "pkg-3.0.dev2-1abc-py3-none-any.whl", "pkg-01.0-py3-none-any.whl"]
    releases = [Release(f"rel-{i}", f"rel-{i} v1 - cu13.0.2 py3.12 torch2.13.0",
                        assets=(Asset(name, 1, f"https://example.invalid/rel-{i}/{name}", "sha256:" + "0" * 64),))
                for i, name in enumerate(names)]
    site = index.build_site(releases, default_world=None)
    entries = [wheel for world in index.site_catalog(site, base_url="https://example.invalid").worlds
               for project in world.projects for wheel in project.wheels]
    assert sorted(entry.filename for entry in entries) == sorted(names)
    for entry in entries:
        parsed = parse_wheel_filename(entry.filename)[1]
        assert entry.version == parsed and str(entry.version) == str(parsed), entry.filename


@pytest.mark.parametrize("url", [
    "https://github.com/o/r/releases/download/t1/x-1.0-py3-none-any.whl",
    "https://github.com/o/r/releases/download/t1/releases/download/t1/x-1.0-py3-none-any.whl",
    "file:///store/releases/t1/assets/x-1.0-py3-none-any.whl",
    "file:///store/releases/t1/x-1.0-py3-none-any.whl",
    "https://mirror.example/releases/download/t1x/x-1.0-py3-none-any.whl",
])
def test_the_release_page_is_taken_once_per_folder_and_is_the_catalogs(url):
    from ci.publish.catalog import release_page

    folder = url.rpartition("/")[0]
    assert index._release_page(folder, "t1") == release_page(url, "t1")


def _encoded(document, rnd: random.Random):
    """``document`` with some of its values replaced by json_text.Encoded values that write the same text."""
    if isinstance(document, dict) and type(document) is dict and all(type(k) is str for k in document):
        return {key: _encoded(value, rnd) for key, value in document.items()}
    if type(document) in (list, tuple):
        return [_encoded(value, rnd) for value in document]
    if rnd.random() < 0.5:
        return json_text.Encoded(lambda depth, value=document: [json_text.dumps(value, depth)])
    return document


def test_encoded_values_are_written_where_they_stand_by_their_own_function():
    rnd = random.Random(46)
    for _ in range(3000):
        document = _document(rnd)
        wrapped = {"a": [document, {"b": document}], "c": document}
        expected = json.dumps(wrapped, indent=1, sort_keys=True)
        assert json_text.dumps(_encoded(wrapped, rnd)) == expected, wrapped


def test_a_dict_template_filled_with_its_values_texts_is_the_dict_as_json_writes_it():
    rnd = random.Random(47)
    for _ in range(2000):
        record = {rnd.choice(_KEYS) + rnd.choice(("", "%", "%s", "%%")): _document(rnd, 3) for _ in range(rnd.randint(0, 5))}
        records = [record] * rnd.randint(0, 3)
        depth = rnd.randint(0, 6)
        keys = tuple(sorted(record))
        texts = [json_text.dict_template(keys, depth + 1) % tuple(json_text.dumps(r[k], depth + 2) for k in keys)
                 for r in records]
        assert "".join(json_text.list_parts(texts, depth)) == json_text.dumps(records, depth), records
        assert json_text.dumps(records, depth) == json.dumps(records, indent=1, sort_keys=True).replace(
            "\n", "\n" + " " * depth)


def test_a_dict_template_refuses_keys_out_of_order():
    with pytest.raises(ValueError, match="sorted order"):
        json_text.dict_template(("b", "a"), 0)
