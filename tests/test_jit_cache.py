"""flashinfer-jit-cache assembled here (ci/model/jit_cache.py): shards finished, packed, and checked complete.

The module shared objects are real: nvcc compiles a kernel for sm_90a (one cubin, as flashinfer's
modules for that arch carry), gcc a host library for the module without CUDA sources. The module
list has the layout build_scripts/lib/flashinfer_aot.py writes from upstream's AOT list; the real
end to end, through flashinfer's own entry point, is tests/test_jit_cache_build.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import NVCC, build_wheel, cuda_shared_object, host_shared_object

from ci.base.errors import UsageError, WheelhouseError
from ci.checks.check import check_wheels
from ci.formats.archive import open_wheel
from ci.model import jit_cache, shards
from ci.timing import shard_model

REPO = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason="no CUDA toolkit (nvcc) on this machine")
PACKAGE = {"name": "flashinfer-jit-cache", "summary": "Pre-compiled JIT Cache for FlashInfer",
           "requires_python": ">=3.9", "license": "Apache-2.0", "description": "", "classifiers": [], "urls": {},
           "authors": ["FlashInfer team"]}
MODULES = [  # name, sources, CUDA sources, family: the same inventory for every target here
    ("decode_f16", 3, 3, "single_decode#1"),
    ("decode_bf16", 3, 3, "single_decode#1"),
    ("silu", 1, 1, "silu#2"),
    ("logging", 1, 0, "logging#3"),
]
TARGETS = ("9.0a", "12.0f")
CODES = {"8.0": "80", "9.0a": "90a", "12.0f": "120f"}


def _module_list(directory: Path, modules=MODULES, targets=TARGETS) -> jit_cache.ModuleList:
    """One list per target as build_scripts/lib/flashinfer_aot.py writes it, merged as the builder does."""
    directory.mkdir(parents=True, exist_ok=True)
    lists = []
    for target in targets:
        path = directory / f"{target}.json"
        path.write_text(json.dumps({
            "schema": 1, "generator": "test", "flashinfer_version": "0.6.13", "cuda_arch_list": target,
            "sm_capabilities": {"sm90": True}, "package": PACKAGE,
            "modules": [{"name": n, "sources": s, "cuda_sources": c, "archs": [f"sm_{CODES[target]}"] if c else [],
                         "family": f} for n, s, c, f in modules],
        }))
        lists.append(path)
    jit_cache.merge(lists, directory / "modules.json")
    return jit_cache.ModuleList.read(directory / "modules.json")


def _compile_shard(listing: jit_cache.ModuleList, spec: shards.ShardSpec, shards_dir: Path,
                   patterns: tuple[str, ...] = ()) -> dict[str, Path]:
    """What flashinfer's copy_built_kernels leaves for the shard's modules (real nvcc output for each provider's
    target), and each provider's ninja log of their steps."""
    directory = shards_dir / spec.dir_name
    lines: dict[str, list[str]] = {tag: ["# ninja log v7"] for tag in listing.providers}
    by_key = {m.key: m for m in listing.modules}
    for at, key in enumerate(jit_cache.select_shard(listing, spec, patterns)):
        module = by_key[key]
        target = directory / module.member
        target.parent.mkdir(parents=True)
        code = CODES[listing.providers[module.provider]]
        shutil.copyfile(cuda_shared_object((code,)) if module.archs else host_shared_object(), target)
        name = module.name
        lines[module.provider].append(f"{at * 1000}\t{at * 1000 + 2500}\t0\t/b/cached_ops/{name}/{name}_k.cuda.o\t1")
        lines[module.provider].append(f"{at * 1000}\t{at * 1000 + 500}\t0\t/b/cached_ops/{name}/{name}.so\t2")
    logs = {}
    for tag, text in lines.items():
        logs[tag] = directory.parent / f"{spec.dir_name}.{tag}.ninja_log"
        logs[tag].write_text("\n".join(text) + "\n")
    return logs


def _two_shards(tmp_path: Path, targets=TARGETS) -> tuple[jit_cache.ModuleList, Path]:
    listing = _module_list(tmp_path / "list", targets=targets)
    shards_dir = tmp_path / "shards"
    for index in (1, 2):
        spec = shards.ShardSpec(index, 2)
        logs = _compile_shard(listing, spec, shards_dir)
        jit_cache.finish_shard(listing, spec, (), shards_dir / spec.dir_name, logs)
    return listing, shards_dir


def _pack(listing: jit_cache.ModuleList, shards_dir: Path, dist: Path, patterns: tuple[str, ...] = (),
          wheel_packages=None) -> list[Path]:
    return jit_cache.pack(listing, patterns, shards_dir, version="0.6.13", git_version="57ba7eeb", arch="x86_64",
                          dist=dist, wheel_packages=wheel_packages)


SM90A = "flashinfer_jit_cache/providers/sm90a"


@needs_nvcc
def test_the_shim_and_a_provider_per_target_hold_every_shard_and_pass_the_checks(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    manifests = [shards.ShardManifest.read(d) for d in shards.shard_dirs(shards_dir)]
    # largest first, ties by key: each provider's two 3-source decode modules, then silu and logging
    assert [sorted(m.modules) for m in manifests] == [
        ["sm120f/decode_bf16", "sm120f/logging", "sm90a/decode_bf16", "sm90a/logging"],
        ["sm120f/decode_f16", "sm120f/silu", "sm90a/decode_f16", "sm90a/silu"]]
    assert manifests[0].modules["sm90a/decode_bf16"].seconds == 3.0  # its compile and its link, from sm90a's log
    shim, *providers = _pack(listing, shards_dir, tmp_path / "dist", wheel_packages=[
        "flashinfer-python", "flashinfer-jit-cache", "flashinfer-jit-cache-sm90a", "flashinfer-jit-cache-sm120f"])
    assert shim.name == "flashinfer_jit_cache-0.6.13-cp39-abi3-linux_x86_64.whl"
    assert [p.name for p in providers] == ["flashinfer_jit_cache_sm90a-0.6.13-cp39-abi3-linux_x86_64.whl",
                                           "flashinfer_jit_cache_sm120f-0.6.13-cp39-abi3-linux_x86_64.whl"]
    report = check_wheels([shim, *providers], pythons="3.12", use_cuobjdump=False)
    assert report.problems == ()
    assert [[str(a) for a in w.archs.cubin_archs] for w in report.wheels] == [[], ["9.0a"], ["12.0f"]]
    with open_wheel(providers[0]) as archive:
        names = set(archive.names())
        checked = json.loads(archive.read_small(f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"))
        served = json.loads(archive.read_small(f"{SM90A}/manifest.json"))
        entry_points = archive.read_small(f"{archive.dist_info}/entry_points.txt").decode()
        metadata = archive.read_small(f"{archive.dist_info}/METADATA").decode()
    assert {f"{SM90A}/jit_cache/{n}/{n}.so" for n, *_ in MODULES} <= names
    assert checked["shards"] == 2 and checked["target"] == "9.0a" and sorted(checked["modules"]) == sorted(
        n for n, *_ in MODULES)
    assert served == {"schema_version": 1, "provider_id": "sm90a", "distribution": "flashinfer-jit-cache-sm90a",
                      "version": "0.6.13", "cuda_architectures": ["sm90a"],
                      "modules": sorted(n for n, *_ in MODULES)}
    assert entry_points == ("[flashinfer.jit_cache.providers]\n"
                            "sm90a = flashinfer_jit_cache.providers.sm90a:get_provider\n")
    assert "Name: flashinfer-jit-cache-sm90a\n" in metadata and "Requires-Dist" not in metadata
    with open_wheel(shim) as archive:
        shim_manifest = json.loads(archive.read_small(f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"))
        meta = archive.read_small("flashinfer_jit_cache/_build_meta.py")
        assert not [n for n in archive.names() if n.endswith(".so")]
    assert shim_manifest["providers"] == {
        "sm90a": {"project": "flashinfer-jit-cache-sm90a", "target": "9.0a", "modules": 4},
        "sm120f": {"project": "flashinfer-jit-cache-sm120f", "target": "12.0f", "modules": 4}}
    assert b'__version__ = "0.6.13"' in meta and b'__git_version__ = "57ba7eeb"' in meta


def _rewheel(wheel: Path, out: Path, *, drop: str = "", manifest_change=None) -> Path:
    """The same provider without member ``drop`` or with its checked module manifest changed (RECORD anew)."""
    files = {}
    with open_wheel(wheel) as archive:
        dist_info = archive.dist_info
        for name in archive.names():
            if name.startswith(dist_info) and not name.endswith((jit_cache.WHEEL_MANIFEST, "entry_points.txt")):
                continue
            if name != drop:
                files[name] = archive.read_small(name, limit=1 << 30)
    if manifest_change:
        key = f"{dist_info}/{jit_cache.WHEEL_MANIFEST}"
        files[key] = json.dumps(manifest_change(json.loads(files[key]))).encode()
    return build_wheel(out, files, name="flashinfer_jit_cache_sm90a", version="0.6.13", tags="cp39-abi3-linux_x86_64",
                       requires_python=">=3.9")


@needs_nvcc
def test_the_checks_refuse_a_provider_missing_a_module_its_list_names(tmp_path):
    listing, shards_dir = _two_shards(tmp_path, targets=("9.0a",))
    _shim, provider = _pack(listing, shards_dir, tmp_path / "dist")
    member = f"{SM90A}/jit_cache/decode_f16/decode_f16.so"
    lacking = _rewheel(provider, tmp_path / "lacking", drop=member)
    assert check_wheels([lacking], use_cuobjdump=False).problems == (
        f"{lacking.name}: lacks module decode_f16 ({member}), which flashinfer's AOT list names for 9.0a; its shard "
        "was incomplete: assemble the wheel again",)


@needs_nvcc
def test_the_checks_refuse_a_module_without_a_cubin_of_its_arch_and_a_module_not_listed(tmp_path):
    listing, shards_dir = _two_shards(tmp_path, targets=("9.0a",))
    _shim, provider = _pack(listing, shards_dir, tmp_path / "dist")

    def blackwell_and_unlisted(manifest):
        manifest["modules"]["silu"]["archs"] = ["sm_100a"]
        del manifest["modules"]["logging"]
        return manifest

    changed = _rewheel(provider, tmp_path / "changed", manifest_change=blackwell_and_unlisted)
    assert check_wheels([changed], use_cuobjdump=False).problems == (
        f"{changed.name}: {SM90A}/manifest.json names other modules than "
        f"flashinfer_jit_cache_sm90a-0.6.13.dist-info/{jit_cache.WHEEL_MANIFEST}; rebuild the wheel",
        f"{changed.name}: module silu has cubins for 9.0a but not for 10.0a, which its ninja file compiles for; "
        "rebuild its shard",
        f"{changed.name}: {SM90A}/jit_cache/logging/logging.so is no module of "
        f"flashinfer_jit_cache_sm90a-0.6.13.dist-info/{jit_cache.WHEEL_MANIFEST}; rebuild the wheel",
    )


def test_upstreams_wheel_without_a_module_list_is_asked_for_one_module(tmp_path):
    """A rehosted wheel names no module list: at least one compiled module, as before."""
    some = build_wheel(tmp_path / "a", {"flashinfer_jit_cache/jit_cache/m/m.so": host_shared_object().read_bytes()},
                       name="flashinfer_jit_cache", version="0.6.13+cu130", tags="cp39-abi3-manylinux_2_28_x86_64")
    assert check_wheels([some], use_cuobjdump=False).problems == ()


@needs_nvcc
def test_finish_shard_refuses_what_the_compile_did_not_leave(tmp_path):
    listing = _module_list(tmp_path / "list", targets=("9.0a",))
    spec = shards.ShardSpec(1, 2)
    logs = _compile_shard(listing, spec, tmp_path / "shards")
    directory = tmp_path / "shards" / spec.dir_name
    shutil.rmtree(directory / "jit_cache" / "sm90a" / "logging")
    with pytest.raises(WheelhouseError, match=r"^shard 1/2: module sm90a/logging was not compiled \(1 of 2 missing"):
        jit_cache.finish_shard(listing, spec, (), directory, logs)
    (directory / "jit_cache" / "sm90a" / "logging").mkdir()
    shutil.copyfile(host_shared_object(), directory / "jit_cache" / "sm90a" / "logging" / "logging.so")
    decode = directory / "jit_cache" / "sm90a" / "decode_bf16" / "decode_bf16.so"
    shutil.copyfile(host_shared_object(), decode)  # no cubin at all
    with pytest.raises(WheelhouseError, match=r"module sm90a/decode_bf16 has cubins for none but not for 9\.0a"):
        jit_cache.finish_shard(listing, spec, (), directory, logs)


@needs_nvcc
def test_pack_refuses_shards_of_another_list_or_without_a_module(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    other = _module_list(tmp_path / "other", [*MODULES, ("rope", 2, 2, "rope#4")])
    with pytest.raises(WheelhouseError, match="were cut from another module list than these sources give"):
        _pack(other, shards_dir, tmp_path / "dist")
    shutil.rmtree(shards_dir / "shard-2-of-2")
    with pytest.raises(UsageError, match=r"^shard 2/2 is missing from"):
        _pack(listing, shards_dir, tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


@needs_nvcc
def test_a_subset_is_the_modules_its_patterns_name(tmp_path):
    listing = _module_list(tmp_path / "list", targets=("9.0a",))
    patterns = ("decode_*",)
    assert [m.name for m in listing.selected(patterns)] == ["decode_f16", "decode_bf16"]
    with pytest.raises(UsageError, match="'rope_\\*' matches no module of the 4 flashinfer's AOT list names"):
        listing.selected(("rope_*",))
    spec = shards.ShardSpec(1, 1)
    logs = _compile_shard(listing, spec, tmp_path / "shards", patterns)
    jit_cache.finish_shard(listing, spec, patterns, tmp_path / "shards" / spec.dir_name, logs)
    shim, provider = _pack(listing, tmp_path / "shards", tmp_path / "dist", patterns)
    with open_wheel(provider) as archive:
        manifest = json.loads(archive.read_small(f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"))
    assert manifest["selection"] == ["decode_*"] and sorted(manifest["modules"]) == ["decode_bf16", "decode_f16"]
    assert check_wheels([shim, provider], use_cuobjdump=False).problems == ()
    # the build record's view: every listed module, the two compiled ones with their seconds
    recorded = jit_cache.record_modules(tmp_path / "shards", cache={"hits": 0, "misses": 4})
    assert [(m["name"], m["seconds"], m["shard"]) for m in recorded["modules"]] == [
        ("sm90a/decode_f16", 3.0, 1), ("sm90a/decode_bf16", 3.0, 1), ("sm90a/silu", None, None),
        ("sm90a/logging", None, None)]


@needs_nvcc
def test_the_builders_commands_end_in_one_line(tmp_path):
    listing = _module_list(tmp_path / "list", targets=("9.0a",))
    run = subprocess.run([sys.executable, "-m", "ci", "jit-cache", "select", "--modules", str(listing.path),
                          "--shard", "2/2", "--shards-dir", str(tmp_path / "shards"), "--out", str(tmp_path / "n")],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{tmp_path / 'shards' / 'shard-2-of-2'}\n"
    assert (tmp_path / "n").read_text() == "sm90a/decode_f16\nsm90a/silu\n"
    bad = subprocess.run([sys.executable, "-m", "ci", "jit-cache", "select", "--modules", str(listing.path),
                          "--shard", "3/2", "--shards-dir", str(tmp_path), "--out", str(tmp_path / "n")],
                         cwd=REPO, capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (2, "error: --shard '3/2': write I/N with 1 <= I <= N <= 256, "
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
    listing = _module_list(tmp_path / "list", targets=("9.0a",))
    spec = shards.ShardSpec(1, 1)
    logs = _compile_shard(listing, spec, tmp_path / "shards")
    jit_cache.finish_shard(listing, spec, (), tmp_path / "shards" / spec.dir_name, logs)
    fresh = jit_cache.record_modules(tmp_path / "shards", cache={"requests": 18, "hits": 2, "misses": 67})
    warm = jit_cache.record_modules(tmp_path / "shards", cache={"requests": 18, "hits": 12, "misses": 0})
    assert not any(m["cached"] for m in fresh["modules"]) and all(m["cached"] for m in warm["modules"])


def test_merge_refuses_two_lists_of_one_target_and_lists_of_two_versions(tmp_path):
    listing = _module_list(tmp_path / "one", targets=("9.0a",))
    first = tmp_path / "one" / "9.0a.json"
    with pytest.raises(UsageError, match=r"a second list for 9\.0a; give one list per arch target"):
        jit_cache.merge([first, first], tmp_path / "merged.json")
    older = json.loads(first.read_text()) | {"flashinfer_version": "0.6.12", "cuda_arch_list": "12.0f"}
    (tmp_path / "older.json").write_text(json.dumps(older))
    with pytest.raises(UsageError, match=r"a list of flashinfer 0\.6\.12, the others 0\.6\.13"):
        jit_cache.merge([first, tmp_path / "older.json"], tmp_path / "merged.json")
    assert listing.providers == {"sm90a": "9.0a"}


@needs_nvcc
def test_pack_refuses_providers_the_component_does_not_publish(tmp_path):
    listing, shards_dir = _two_shards(tmp_path)
    with pytest.raises(WheelhouseError) as refused:
        _pack(listing, shards_dir, tmp_path / "dist", wheel_packages=["flashinfer-jit-cache", "flashinfer-jit-cache-sm90a"])
    assert str(refused.value) == (
        "the arch list 9.0a 12.0f makes the provider wheels flashinfer-jit-cache-sm120f, flashinfer-jit-cache-sm90a, "
        "but wheel_packages lists flashinfer-jit-cache-sm90a: list exactly those (with flashinfer-jit-cache, the "
        "shim) in the component's wheel_packages, per CPU arch in arch_overrides")
    assert not (tmp_path / "dist").exists()


def test_versions_yaml_publishes_a_provider_per_arch_of_flashinfers_lists():
    from ci.formats.archs import parse_arch_list
    from ci.model import versions

    component = versions.load().component("flashinfer")
    for arch in ("x86_64", "aarch64"):
        settings = component.settings_for(arch)
        providers = sorted(p for p in settings.wheel_packages if p.startswith("flashinfer-jit-cache-"))
        targets = parse_arch_list(settings.torch_cuda_arch_list).archs
        assert providers == sorted(jit_cache.provider_project(jit_cache.provider_tag(t)) for t in targets), arch


SELECT = """
import json, flashinfer_jit_cache as c
p = c.select_provider()
print(json.dumps([p.provider_id if p else None, c.get_jit_cache_dir(), sorted(x.provider_id for x in
                  c.get_jit_cache_providers())]))
"""


@needs_nvcc
def test_installed_together_the_shim_serves_each_gpu_from_the_provider_that_fits(tmp_path):
    """The shim and three providers (8.0, 9.0a, 12.0f) installed with pip --no-deps, as the printed pip command does;
    the shim then picks by NVIDIA's rules: the exact target, else the family, else a plain target of a lower
    minor; nothing for a GPU none of them serves (flashinfer compiles then, or names the missing module)."""
    listing = _module_list(tmp_path / "list", targets=("8.0", "9.0a", "12.0f"))
    spec = shards.ShardSpec(1, 1)
    logs = _compile_shard(listing, spec, tmp_path / "shards")
    jit_cache.finish_shard(listing, spec, (), tmp_path / "shards" / spec.dir_name, logs)
    wheels = _pack(listing, tmp_path / "shards", tmp_path / "dist")
    assert check_wheels(wheels, use_cuobjdump=False).problems == ()
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(target), *map(str, wheels)], check=True)
    served = {}
    for gpus in ("9.0a", "12.0f", "12.1a", "8.0", "8.6", "8.9", "10.3a", "9.0a 12.0f"):
        env = {**os.environ, "PYTHONPATH": str(target), "FLASHINFER_CUDA_ARCH_LIST": gpus}
        ran = subprocess.run([sys.executable, "-c", SELECT], env=env, capture_output=True, text=True, check=True)
        chosen, directory, installed = json.loads(ran.stdout)
        assert installed == ["sm120f", "sm80", "sm90a"]
        if chosen:
            assert Path(directory) == target / jit_cache.PROVIDERS_PACKAGE / chosen / "jit_cache"
            assert (Path(directory) / "decode_f16" / "decode_f16.so").is_file()
        else:
            assert Path(directory) == target / jit_cache.JIT_CACHE_DIR and not Path(directory).exists()
        served[gpus] = chosen
    assert served == {"9.0a": "sm90a", "12.0f": "sm120f", "12.1a": "sm120f", "8.0": "sm80", "8.6": "sm80",
                      "8.9": "sm80", "10.3a": None, "9.0a 12.0f": None}
