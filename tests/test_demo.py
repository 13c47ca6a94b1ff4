"""The README's main job, end to end: build, release, index, and a pip install that works."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ci.flows import demo
from ci.publish import which_wheel

REPO = Path(__file__).resolve().parent.parent


def test_demo_installs_from_the_index_it_wrote(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="wheelhouse")
    command = demo.run(cache_dir=REPO / ".cache", store_root=tmp_path / "store", dist_root=tmp_path / "dist")
    lines = caplog.messages
    site = tmp_path / "store" / "site"
    assert command == f"pip install --index-url {site.as_uri()}/cpu/torch2.13/simple/ wheelhouse-fixture"
    assert any("wheelhouse_fixture.scaled_add = [1.0, 3.0, 5.0, 7.0]" in line for line in lines)
    assert any("raised ValueError as designed" in line for line in lines)
    page = (site / "cpu" / "torch2.13" / "simple" / "wheelhouse-fixture" / "index.html").read_text()
    assert "#sha256=" in page and 'data-core-metadata="sha256=' in page
    # /simple/ is the default world's alias
    assert (site / "simple" / "wheelhouse-fixture" / "index.html").read_text() == page
    releases = list((tmp_path / "store" / "releases").iterdir())
    assert [r.name for r in releases] == ["wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0"]
    assert json.loads((releases[0] / "release.json").read_text())["title"] == "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0"
    # the wheel it publishes links torch: it and the index's metadata file pin the row's torch line
    (sidecar,) = (releases[0] / "assets").glob("*.whl.metadata")
    assert "\nRequires-Dist: torch==2.13.*\n" in sidecar.read_text()
    # which-wheel, in this interpreter (torch 2.13 CPU), finds the demo's world and its wheel in the site it wrote
    answer = which_wheel.which_wheel(which_wheel.read_index(str(site)), which_wheel.read_environment(),
                                     location=str(site))
    assert answer.world.path == "cpu/torch2.13" and answer.exit_code == 0
    assert f"  pip install --no-deps --index-url {site.as_uri()}/cpu/torch2.13/simple/ wheelhouse-fixture==0.1.0" in (
        answer.render().splitlines())
