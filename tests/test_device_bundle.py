"""`invoke device-bundle`: the GPU machine's carried bundle, made from local snapshots, checked against a size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import device_bundle
import full_archs

from ci.versions import REPO_ROOT, load

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
            "apex": ("7.5;8.0;8.6;9.0;10.0;11.0;12.0", 7)}
    for name, (archs, threads) in want.items():
        settings = loaded.component(name).settings_for("x86_64")
        assert (settings.torch_cuda_arch_list, settings.nvcc_threads) == (archs, threads), name
        assert not settings.arch_filter and settings.verify_wheel_archs
        assert loaded.component(name).ref == device.component(name).ref
    assert loaded.component("flash-mla").settings_for("x86_64").extra_env["NVCC_THREADS"] == "2"
    assert full_archs.requested(out, "deep-ep") == "8.0;9.0;10.0"
