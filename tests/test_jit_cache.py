"""flashinfer-jit-cache assembled here (ci/jit_cache.py): shards finished, packed, and checked complete.

The module shared objects are real: nvcc compiles a kernel for sm_90a (one cubin, as flashinfer's
modules for that arch carry), gcc a host library for the module without CUDA sources. The module
list has the layout build_scripts/lib/flashinfer_aot.py writes from upstream's AOT list; the real
end to end, through flashinfer's own entry point, is tests/test_jit_cache_build.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import NVCC, build_wheel, cuda_shared_object, host_shared_object

from ci import jit_cache, shard_model, shards
from ci.errors import UsageError, WheelhouseError
from ci.wheels.archive import open_wheel
from ci.wheels.check import check_wheels

REPO = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason="no CUDA toolkit (nvcc) on this machine")
PACKAGE = {"name": "flashinfer-jit-cache", "summary": "Pre-compiled JIT Cache for FlashInfer",
           "requires_python": ">=3.9", "license": "Apache-2.0", "description": "", "classifiers": [], "urls": {},
           "authors": ["FlashInfer team"]}
MODULES = [  # name, sources, CUDA sources, archs, family
    ("decode_f16", 3, 3, ["sm_90a"], "single_decode#1"),
    ("decode_bf16", 3, 3, ["sm_90a"], "single_decode#1"),
    ("silu", 1, 1, ["sm_90a"], "silu#2"),
    ("logging", 1, 0, [], "logging#3"),
]


def _module_list(directory: Path, modules=MODULES) -> jit_cache.ModuleList:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "modules.json"
    path.write_text(json.dumps({
        "schema": 1, "generator": "test", "flashinfer_version": "0.6.13", "cuda_arch_list": "9.0a",
        "sm_capabilities": {"sm90": True}, "package": PACKAGE,
        "modules": [{"name": n, "sources": s, "cuda_sources": c, "archs": a, "family": f} for n, s, c, a, f in modules],
    }))
    return jit_cache.ModuleList.read(path)


def _compile_shard(listing: jit_cache.ModuleList, spec: shards.ShardSpec, shards_dir: Path,
                   patterns: tuple[str, ...] = ()) -> Path:
    """What flashinfer's copy_built_kernels leaves for the shard's modules, and a ninja log of their steps."""
    directory = shards_dir / spec.dir_name
    log = directory.parent / f"{spec.dir_name}.ninja_log"
    lines = ["# ninja log v7"]
    for at, name in enumerate(jit_cache.select_shard(listing, spec, patterns)):
        module = next(m for m in listing.modules if m.name == name)
        target = directory / module.member
        target.parent.mkdir(parents=True)
        shutil.copyfile(cuda_shared_object(("90a",)) if module.archs else host_shared_object(), target)
        lines.append(f"{at * 1000}\t{at * 1000 + 2500}\t0\t/b/cached_ops/{name}/{name}_k.cuda.o\t1")
        lines.append(f"{at * 1000}\t{at * 1000 + 500}\t0\t/b/cached_ops/{name}/{name}.so\t2")
    log.write_text("\n".join(lines) + "\n")
    return log


def _two_shards(tmp_path: Path) -> tuple[jit_cache.ModuleList, Path]:
    listing = _module_list(tmp_path / "list")
    shards_dir = tmp_path / "shards"
    for index in (1, 2):
        spec = shards.ShardSpec(index, 2)
        log = _compile_shard(listing, spec, shards_dir)
        jit_cache.finish_shard(listing, spec, (), shards_dir / spec.dir_name, log)
    return listing, shards_dir


def _pack(listing: jit_cache.ModuleList, shards_dir: Path, dist: Path, patterns: tuple[str, ...] = ()) -> Path:
    package = dist.parent / "flashinfer_jit_cache"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("def get_jit_cache_dir(): ...\n")
    return jit_cache.pack(listing, patterns, shards_dir, package_dir=package, version="0.6.13",
                          git_version="57ba7eeb", arch="x86_64", dist=dist)


@needs_nvcc
def test_the_wheel_of_every_shard_holds_each_module_and_passes_the_checks(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    manifests = [shards.ShardManifest.read(d) for d in shards.shard_dirs(shards_dir)]
    # largest first, ties by name: the two 3-source decode modules open the shards, then logging and silu
    assert [sorted(m.modules) for m in manifests] == [["decode_bf16", "logging"], ["decode_f16", "silu"]]
    assert manifests[0].modules["decode_bf16"].seconds == 3.0  # its compile step and its link, from the ninja log
    wheel = _pack(listing, shards_dir, tmp_path / "dist")
    assert wheel.name == "flashinfer_jit_cache-0.6.13-cp39-abi3-linux_x86_64.whl"
    report = check_wheels([wheel], pythons="3.12", use_cuobjdump=False)
    assert report.problems == ()
    with open_wheel(wheel) as archive:
        names = set(archive.names())
        manifest = json.loads(archive.read_small(f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"))
        meta = archive.read_small("flashinfer_jit_cache/_build_meta.py")
    assert {f"flashinfer_jit_cache/jit_cache/{n}/{n}.so" for n, *_ in MODULES} <= names
    assert manifest["shards"] == 2 and manifest["listed"] == 4 and sorted(manifest["modules"]) == sorted(
        n for n, *_ in MODULES)
    assert b'__version__ = "0.6.13"' in meta and b'__git_version__ = "57ba7eeb"' in meta
    assert [str(a) for a in report.wheels[0].archs.cubin_archs] == ["9.0a"]


def _rewheel(wheel: Path, out: Path, *, drop: str = "", manifest_change=None) -> Path:
    """The same wheel without member ``drop`` or with its module manifest changed (RECORD written anew)."""
    files = {}
    with open_wheel(wheel) as archive:
        dist_info = archive.dist_info
        for name in archive.names():
            if name.startswith(dist_info) and not name.endswith(jit_cache.WHEEL_MANIFEST):
                continue
            if name != drop:
                files[name] = archive.read_small(name, limit=1 << 30)
    if manifest_change:
        key = f"{dist_info}/{jit_cache.WHEEL_MANIFEST}"
        files[key] = json.dumps(manifest_change(json.loads(files[key]))).encode()
    return build_wheel(out, files, name="flashinfer_jit_cache", version="0.6.13", tags="cp39-abi3-linux_x86_64",
                       requires_python=">=3.9")


@needs_nvcc
def test_the_checks_refuse_a_jit_cache_missing_a_module_its_list_names(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    wheel = _pack(listing, shards_dir, tmp_path / "dist")
    member = "flashinfer_jit_cache/jit_cache/decode_f16/decode_f16.so"
    lacking = _rewheel(wheel, tmp_path / "lacking", drop=member)
    assert check_wheels([lacking], use_cuobjdump=False).problems == (
        f"{lacking.name}: lacks module decode_f16 ({member}), which flashinfer's AOT list names for 9.0a; its shard "
        "was incomplete: assemble the wheel again",)


@needs_nvcc
def test_the_checks_refuse_a_module_without_a_cubin_of_its_arch_and_a_module_not_listed(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    wheel = _pack(listing, shards_dir, tmp_path / "dist")

    def blackwell_and_unlisted(manifest):
        manifest["modules"]["silu"]["archs"] = ["sm_100a"]
        del manifest["modules"]["logging"]
        return manifest

    changed = _rewheel(wheel, tmp_path / "changed", manifest_change=blackwell_and_unlisted)
    assert check_wheels([changed], use_cuobjdump=False).problems == (
        f"{changed.name}: module silu has cubins for 9.0a but not for 10.0a, which its ninja file compiles for; "
        "rebuild its shard",
        f"{changed.name}: flashinfer_jit_cache/jit_cache/logging/logging.so is no module of "
        "flashinfer_jit_cache-0.6.13.dist-info/wheelhouse-jit-cache.json; rebuild the wheel",
    )


def test_upstreams_wheel_without_a_module_list_is_asked_for_one_module(tmp_path):
    """A rehosted wheel names no module list: at least one compiled module, as before."""
    some = build_wheel(tmp_path / "a", {"flashinfer_jit_cache/jit_cache/m/m.so": host_shared_object().read_bytes()},
                       name="flashinfer_jit_cache", version="0.6.13+cu130", tags="cp39-abi3-manylinux_2_28_x86_64")
    assert check_wheels([some], use_cuobjdump=False).problems == ()


@needs_nvcc
def test_finish_shard_refuses_what_the_compile_did_not_leave(tmp_path):
    listing = _module_list(tmp_path / "list")
    spec = shards.ShardSpec(1, 2)
    log = _compile_shard(listing, spec, tmp_path / "shards")
    directory = tmp_path / "shards" / spec.dir_name
    shutil.rmtree(directory / "jit_cache" / "logging")
    with pytest.raises(WheelhouseError, match=r"^shard 1/2: module logging was not compiled \(1 of 2 missing"):
        jit_cache.finish_shard(listing, spec, (), directory, log)
    (directory / "jit_cache" / "logging").mkdir()
    shutil.copyfile(host_shared_object(), directory / "jit_cache" / "logging" / "logging.so")
    decode = directory / "jit_cache" / "decode_bf16" / "decode_bf16.so"
    shutil.copyfile(host_shared_object(), decode)  # no cubin at all
    with pytest.raises(WheelhouseError, match=r"module decode_bf16 has cubins for none but not for 9\.0a"):
        jit_cache.finish_shard(listing, spec, (), directory, log)


@needs_nvcc
def test_pack_refuses_shards_of_another_list_or_without_a_module(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    other = _module_list(tmp_path / "other", [*MODULES, ("rope", 2, 2, ["sm_90a"], "rope#4")])
    with pytest.raises(WheelhouseError, match="were cut from another module list than these sources give"):
        _pack(other, shards_dir, tmp_path / "dist")
    shutil.rmtree(shards_dir / "shard-2-of-2")
    with pytest.raises(UsageError, match=r"^shard 2/2 is missing from"):
        _pack(listing, shards_dir, tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


@needs_nvcc
def test_a_subset_is_the_modules_its_patterns_name(tmp_path):
    listing = _module_list(tmp_path / "list")
    patterns = ("decode_*",)
    assert [m.name for m in listing.selected(patterns)] == ["decode_f16", "decode_bf16"]
    with pytest.raises(UsageError, match="'rope_\\*' matches no module of the 4 flashinfer's AOT list names"):
        listing.selected(("rope_*",))
    spec = shards.ShardSpec(1, 1)
    log = _compile_shard(listing, spec, tmp_path / "shards", patterns)
    jit_cache.finish_shard(listing, spec, patterns, tmp_path / "shards" / spec.dir_name, log)
    wheel = _pack(listing, tmp_path / "shards", tmp_path / "dist", patterns)
    with open_wheel(wheel) as archive:
        manifest = json.loads(archive.read_small(f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"))
    assert manifest["selection"] == ["decode_*"] and sorted(manifest["modules"]) == ["decode_bf16", "decode_f16"]
    assert check_wheels([wheel], use_cuobjdump=False).problems == ()
    # the build record's view: every listed module, the two compiled ones with their seconds
    recorded = jit_cache.record_modules(tmp_path / "shards", cache={"hits": 0, "misses": 4})
    assert [(m["name"], m["seconds"], m["shard"]) for m in recorded["modules"]] == [
        ("decode_f16", 3.0, 1), ("decode_bf16", 3.0, 1), ("silu", None, None), ("logging", None, None)]


@needs_nvcc
def test_the_builders_commands_end_in_one_line(tmp_path):
    listing = _module_list(tmp_path / "list")
    run = subprocess.run([sys.executable, "-m", "ci.jit_cache", "select", "--modules", str(listing.path),
                          "--shard", "2/2", "--shards-dir", str(tmp_path / "shards"), "--out", str(tmp_path / "n")],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{tmp_path / 'shards' / 'shard-2-of-2'}\n"
    assert (tmp_path / "n").read_text() == "decode_f16\nsilu\n"
    bad = subprocess.run([sys.executable, "-m", "ci.jit_cache", "select", "--modules", str(listing.path),
                          "--shard", "3/2", "--shards-dir", str(tmp_path), "--out", str(tmp_path / "n")],
                         cwd=REPO, capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (2, "[wheelhouse] error: --shard '3/2': write I/N with 1 <= I <= N <= 256, "
                                              "e.g. 3/16\n")


def test_the_time_model_extrapolates_a_measured_subset_by_family():
    modules = {"modules": [
        {"name": "d1", "cuda_sources": 3, "family": "decode", "seconds": 90.0},
        {"name": "d2", "cuda_sources": 3, "family": "decode", "seconds": None},
        {"name": "p1", "cuda_sources": 10, "family": "prefill", "seconds": 1000.0},
        {"name": "p2", "cuda_sources": 5, "family": "prefill", "seconds": None},
        {"name": "x", "cuda_sources": 2, "family": "other", "seconds": None},
        {"name": "cached", "cuda_sources": 4, "family": "decode", "seconds": 1.0, "cached": True},
    ]}
    est = shard_model.estimate(modules)
    assert est.seconds == {"d1": 90.0, "d2": 90.0, "p1": 1000.0, "p2": 500.0,
                           "x": pytest.approx(2 * 1090 / 13), "cached": 120.0}
    assert (est.measured, est.modules, est.measured_families, est.families) == (2, 6, 2, 3)
    costs = {m["name"]: m["cuda_sources"] for m in modules["modules"]}
    # two jobs, 600 s a shard (x 0.85 = 510 s): in two shards p1 shares one with d2 (545 s); in three, p1 alone
    # (500 s) is the slowest
    fit = shard_model.fit(est, costs, jobs=2, budget_s=600)
    assert (fit.shards, fit.slowest_s, fit.largest) == (3, 500.0, ("p1", 1000.0))
    assert shard_model.fit(est, costs, jobs=1, budget_s=600).shards is None  # p1 alone: 1000 s on one job
    with pytest.raises(WheelhouseError, match="every timed one was built with compiler-cache hits"):
        shard_model.estimate({"modules": [{"name": "c", "cuda_sources": 1, "seconds": 2.0, "cached": True}]})


@needs_nvcc
def test_a_shard_the_compiler_cache_mostly_served_measured_no_compile_times(tmp_path):
    """A build repeats some compiles of its own (2 hits in a fresh cache, seen here); one that took most of its
    objects from an earlier build's cache did not measure how long they take to compile."""
    listing = _module_list(tmp_path / "list")
    spec = shards.ShardSpec(1, 1)
    log = _compile_shard(listing, spec, tmp_path / "shards")
    jit_cache.finish_shard(listing, spec, (), tmp_path / "shards" / spec.dir_name, log)
    fresh = jit_cache.record_modules(tmp_path / "shards", cache={"requests": 18, "hits": 2, "misses": 67})
    warm = jit_cache.record_modules(tmp_path / "shards", cache={"requests": 18, "hits": 12, "misses": 0})
    assert not any(m["cached"] for m in fresh["modules"]) and all(m["cached"] for m in warm["modules"])
