"""Shards of one build (ci/model/shards.py): a stable assignment, and a set that is complete or refused in one line.

The module list is the real one: flashinfer 0.6.13's AOT list for sm_90a (793 modules, 3962 CUDA
sources), as build_scripts/lib/flashinfer_aot.py wrote it from upstream's ``gen_all_modules``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.base.errors import UsageError, WheelhouseError
from ci.model import shards

REPO = Path(__file__).resolve().parent.parent
SM90 = REPO / "tests/fixtures/flashinfer-0.6.13-aot-modules-sm90a.json"


def _costs() -> dict[str, int]:
    return {m["name"]: max(1, m["cuda_sources"]) for m in json.loads(SM90.read_text())["modules"]}


@pytest.mark.parametrize(("text", "index", "count", "name"), [("3/16", 3, 16, "shard-03-of-16"), ("1/1", 1, 1, "shard-1-of-1"),
                                                                ("12/256", 12, 256, "shard-012-of-256")])
def test_shard_spec_reads_i_of_n(text, index, count, name):
    spec = shards.ShardSpec.parse(text)
    assert (spec.index, spec.count, str(spec), spec.dir_name) == (index, count, text, name)


@pytest.mark.parametrize("text", ["0/4", "5/4", "3", "a/b", "1/300", "-1/2", "3/16/2"])
def test_shard_spec_refuses_what_is_not_i_of_n(text):
    with pytest.raises(UsageError) as error:
        shards.ShardSpec.parse(text)
    assert str(error.value) == f"--shard {text!r}: write I/N with 1 <= I <= N <= 256, e.g. 3/16"
    assert error.value.exit_code == 2


def test_every_module_is_in_exactly_one_shard_and_the_shards_are_balanced():
    costs = _costs()
    assert (len(costs), sum(costs.values())) == (793, 3963)  # spdlog has no CUDA source: it counts one
    for count in (1, 2, 7, 16, 64):
        split = shards.assign(costs, count)
        names = [name for shard in split for name in shard]
        assert sorted(names) == sorted(costs) and len(names) == len(set(names))
        loads = [sum(costs[name] for name in shard) for shard in split]
        # largest first to the least loaded: no shard exceeds another by more than the largest module
        assert max(loads) - min(loads) <= max(costs.values()), (count, loads)
    sixteen = [sum(costs[name] for name in shard) for shard in shards.assign(costs, 16)]
    assert max(sixteen) == 248 and min(sixteen) == 247  # 3963 over 16: as even as whole modules allow


def test_the_assignment_depends_on_the_list_only():
    """Every shard job computes it alone, in its own process: the order a dict was filled in, the hash seed
    and the machine change nothing; an unchanged list gives the same shards again."""
    costs = _costs()
    split = shards.assign(costs, 16)
    assert shards.assign(dict(reversed(list(costs.items()))), 16) == split
    script = (f"import json, sys; sys.path.insert(0, {str(REPO)!r}); from ci.model import shards; "
              f"costs = {{m['name']: max(1, m['cuda_sources']) for m in json.load(open({str(SM90)!r}))['modules']}}; "
              "print(json.dumps(shards.assign(costs, 16)))")
    for seed in ("1", "4242"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        assert json.loads(out) == split
    assert shards.select(costs, shards.ShardSpec(3, 16)) == split[2]
    where = shards.shard_of(costs, 16)
    assert "fused_moe_90" in split[where["fused_moe_90"] - 1]


def _shard(root: Path, index: int, count: int, modules: dict[str, bytes], *, digest: str = "a" * 64,
           fingerprint: str | None = "f" * 64) -> Path:
    spec = shards.ShardSpec(index, count)
    directory = root / spec.dir_name
    results = {}
    for name, data in modules.items():
        path = directory / "jit_cache" / name / f"{name}.so"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        results[name] = shards.ModuleResult(f"jit_cache/{name}/{name}.so", hashlib.sha256(data).hexdigest(),
                                            len(data), 1.5)
    directory.mkdir(parents=True, exist_ok=True)
    shards.ShardManifest(spec, digest, results, fingerprint).write(directory)
    return directory


def test_a_complete_set_is_collected(tmp_path):
    _shard(tmp_path, 1, 2, {"a": b"1"})
    _shard(tmp_path, 2, 2, {"b": b"2", "c": b"3"})
    (tmp_path / "shard-2-of-2.partial").mkdir()  # an interrupted move: not a shard
    found = shards.collect(tmp_path)
    assert found.count == 2 and sorted(found.modules()) == ["a", "b", "c"]
    assert [manifest.spec for _, manifest in found.shards] == [shards.ShardSpec(1, 2), shards.ShardSpec(2, 2)]
    shards.check_covers(found, ["a", "b", "c"], {"a": 1, "b": 1, "c": 1})


def test_a_missing_shard_is_named_in_one_line(tmp_path):
    _shard(tmp_path, 1, 3, {"a": b"1"})
    _shard(tmp_path, 3, 3, {"c": b"3"})
    with pytest.raises(UsageError) as error:
        shards.collect(tmp_path, how_to_build="nox -s build-flashinfer-3.12 -- --shard {shard}")
    assert str(error.value) == (f"shard 2/3 is missing from {tmp_path}: its job failed or its files were not brought "
                                "here; build it: nox -s build-flashinfer-3.12 -- --shard 2/3")
    assert error.value.exit_code == 2
    with pytest.raises(UsageError, match="holds no shard-<i>-of-<n> directory"):
        shards.collect(tmp_path / "nothing")


def test_mixed_splits_lists_and_inputs_are_refused(tmp_path):
    _shard(tmp_path / "counts", 1, 2, {"a": b"1"})
    _shard(tmp_path / "counts", 1, 3, {"a": b"1"})
    with pytest.raises(UsageError, match="holds shards of 2 and of 3; keep the shards of one split only"):
        shards.collect(tmp_path / "counts")
    _shard(tmp_path / "lists", 1, 2, {"a": b"1"})
    _shard(tmp_path / "lists", 2, 2, {"b": b"2"}, digest="b" * 64)
    with pytest.raises(UsageError, match=r"shard 2/2 .* was built from other module list than shard 1/2"):
        shards.collect(tmp_path / "lists")
    _shard(tmp_path / "inputs", 1, 2, {"a": b"1"})
    _shard(tmp_path / "inputs", 2, 2, {"b": b"2"}, fingerprint="e" * 64)
    with pytest.raises(UsageError, match=r"other build inputs \(fingerprint\)"):
        shards.collect(tmp_path / "inputs")
    _shard(tmp_path / "twice", 1, 2, {"a": b"1"})
    _shard(tmp_path / "twice", 2, 2, {"a": b"1"})
    with pytest.raises(UsageError, match="module a is in shard 1/2 and in shard 2/2"):
        shards.collect(tmp_path / "twice")


def test_a_module_file_that_is_not_the_manifests_is_refused(tmp_path):
    directory = _shard(tmp_path, 1, 1, {"a": b"compiled"})
    (directory / "jit_cache/a/a.so").write_bytes(b"changed!")
    with pytest.raises(UsageError, match=r"shard 1/1: .*a\.so is not the file its manifest names \(sha256\)"):
        shards.collect(tmp_path)
    (directory / "jit_cache/a/a.so").unlink()
    with pytest.raises(UsageError, match="is missing, which its manifest lists for module a"):
        shards.collect(tmp_path)


def test_a_set_without_a_listed_module_names_the_shard_that_should_hold_it(tmp_path):
    costs = {"big": 10, "small": 1, "tiny": 1}
    assert shards.assign(costs, 2) == [["big"], ["small", "tiny"]]
    _shard(tmp_path, 1, 2, {"big": b"1"})
    _shard(tmp_path, 2, 2, {"small": b"2"})
    found = shards.collect(tmp_path)
    with pytest.raises(WheelhouseError) as error:
        shards.check_covers(found, costs, costs)
    assert str(error.value) == (f"module tiny is in no shard of {tmp_path}, though shard 2/2 should hold it; "
                                "build that shard again")
    with pytest.raises(WheelhouseError, match="holds module small, which the module list of these sources does not"):
        shards.check_covers(found, ["big"], {"big": 10})


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100 + "1" + "}" * 100])
def test_a_manifest_nested_past_the_json_readers_depth_is_one_line(tmp_path, text):
    """What assemble-shards and the jit-cache pack read (adversarial R9: a RecursionError traceback)."""
    directory = tmp_path / "shard-1-of-1"
    directory.mkdir()
    (directory / shards.MANIFEST).write_text(text)
    with pytest.raises(UsageError) as error:
        shards.collect(tmp_path)
    assert str(error.value).startswith(f"{directory / shards.MANIFEST}: not a readable shard manifest (nested more "
                                       "than 64 levels")
    assert str(error.value).endswith("; build the shard again") and "\n" not in str(error.value)


def test_a_manifest_that_is_not_one_is_refused(tmp_path):
    directory = tmp_path / "shard-1-of-1"
    directory.mkdir()
    (directory / shards.MANIFEST).write_text('{"schema": 1, "shard": 2, "shards": 1, "modules_sha256": "x", '
                                             '"modules": {}}')
    with pytest.raises(UsageError, match=r"shard-1-of-1/shard.json: shard 2 of 1 is out of range; build the shard"):
        shards.collect(tmp_path)
    (directory / shards.MANIFEST).write_text('{"schema": 1, "shard": 1, "shards": 1, "modules_sha256": "x", '
                                             '"fingerprint": null, "modules": {"m": {"path": "../../etc/passwd", '
                                             '"sha256": "' + "0" * 64 + '", "size": 1, "seconds": null}}}')
    with pytest.raises(UsageError, match=r"names the path '\.\./\.\./etc/passwd' outside the shard"):
        shards.collect(tmp_path)
