"""The generated index as pip and uv see it: served over loopback HTTP and over file://."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from index_helpers import (
    REPO,
    UV,
    CountingServer,
    client_env,
    file_fetch,
    pip_install,
    publish_release_files,
    release_of,
    run,
    tamper,
)
from made_once import one_maker
from wheel_factory import build_wheel

from ci.base.digest import sha256_file
from ci.publish.pages import DirectoryTarget, publish_index
from ci.store.model import Release

WORLD = "cu130/torch2.13"
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
YANKED = "tinypure-1.1-py3-none-any.whl"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, list[Path]]:
    """Release tag -> wheels: a pure package in three versions and a platform wheel depending on it."""
    out = tmp_path_factory.mktemp("wheels")
    return {
        "tinypure-v1-py3-torch2.13.0": [
            build_wheel(out / "a", name="tinypure", version="1.0", tags="py3-none-any", requires_python=">=3.8", sidecar=True),
            build_wheel(out / "a", name="tinypure", version="1.1", tags="py3-none-any", requires_python=None, sidecar=True),
            build_wheel(out / "a", name="tinypure", version="2.0", tags="py3-none-any", requires_python=">=3.99", sidecar=True),
        ],
        f"tinyext-v1-py{PY}-torch2.13.0": [
            build_wheel(out / "b", name="tinyext", version="1.0", tags=f"{CP}-{CP}-linux_x86_64", requires_python=None, requires=["tinypure>=1.0"], sidecar=True),
        ],
    }


def _serve_tree(root: Path, wheels: dict[str, list[Path]], base: str, *, index_base: str) -> list[Release]:
    """Copy the wheels into ``root/releases/<tag>/`` and return releases pointing at ``base``."""
    releases = []
    for i, (tag, files) in enumerate(sorted(wheels.items())):
        copied = publish_release_files(root / "releases", tag, files)
        releases.append(
            release_of(
                tag,
                f"{tag.split('-')[0]} v1 - cu13.0.2 py{PY} torch2.13.0",
                copied,
                f"{base}/releases",
                id_base=100 * i,
            )
        )
    return releases


@pytest.fixture
def served(tmp_path, wheels):
    """A loopback server over a tree holding release files and the generated index."""
    root = tmp_path / "www"
    root.mkdir()
    with CountingServer(root) as server:
        releases = _serve_tree(root, wheels, server.url, index_base=server.url)
        summary = publish_index(
            releases,
            DirectoryTarget(root / "index"),
            base_url=f"{server.url}/index",
            default_world=WORLD,
            fetch=file_fetch(server.url, root),
            yanked={YANKED: "broken build"},
        ).summary
        assert summary.warnings == ()
        server.log.reset()
        yield server, root, f"{server.url}/index/{WORLD}/simple/"


def _sent(server: CountingServer, suffix: str) -> int:
    return sum(n for path, n in server.log.bytes_by_path.items() if path.endswith(suffix))


def test_pip_installs_with_hashes_metadata_requires_python_and_yank(served, tmp_path):
    server, _, index = served
    target = tmp_path / "target"
    proc = pip_install(index, target, "tinyext", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "tinyext" / "__init__.py").exists()
    assert (target / "tinypure" / "__init__.py").read_text() == 'VERSION = "1.0"\n'
    # 2.0 needs Python >= 3.99 and 1.1 is yanked: neither is downloaded, not even its metadata
    assert _sent(server, "tinypure-2.0-py3-none-any.whl") == 0
    assert _sent(server, "tinypure-2.0-py3-none-any.whl.metadata") == 0
    assert _sent(server, YANKED) == 0
    # the resolver read metadata through PEP 658 before downloading
    assert _sent(server, "tinyext-1.0-" + f"{CP}-{CP}-linux_x86_64.whl.metadata") > 0


def test_pip_refuses_a_wheel_changed_after_indexing(served, tmp_path):
    _, root, index = served
    wheel = next((root / "releases").rglob("tinyext-*.whl"))
    tamper(wheel)
    proc = pip_install(index, tmp_path / "target", "tinyext", tmp_path)
    assert proc.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in proc.stderr, proc.stderr
    assert not (tmp_path / "target" / "tinyext").exists()


@pytest.fixture
def uv_venv(tmp_path) -> Path:
    assert UV, "uv is not installed in the development venv"
    venv = tmp_path / "venv"
    proc = run([UV, "venv", "--quiet", "--python", sys.executable, str(venv)], client_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return venv


def test_uv_installs(served, tmp_path, uv_venv):
    server, _, index = served
    env = client_env(tmp_path)
    py = str(uv_venv / "bin" / "python")
    proc = run(
        [UV, "pip", "install", "--python", py, "--index-url", index, "--cache-dir", str(tmp_path / "c"), "tinyext"], env
    )
    assert proc.returncode == 0, proc.stderr
    listed = run([UV, "pip", "list", "--python", py, "--format", "freeze"], env).stdout.split()
    assert "tinyext==1.0" in listed and "tinypure==1.0" in listed
    assert _sent(server, "tinypure-2.0-py3-none-any.whl") == 0 and _sent(server, YANKED) == 0


def test_uv_locks_index_hashes_and_refuses_a_wheel_changed_after_indexing(served, tmp_path, uv_venv):
    """`uv pip compile --generate-hashes` takes the hashes from the index (no wheel download); the locked install checks them."""
    server, root, index = served
    env = client_env(tmp_path)
    py = str(uv_venv / "bin" / "python")
    (tmp_path / "req.in").write_text("tinyext\n")
    proc = run(
        [
            UV,
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--python",
            py,
            "--index-url",
            index,
            "--cache-dir",
            str(tmp_path / "c1"),
            str(tmp_path / "req.in"),
            "-o",
            str(tmp_path / "req.txt"),
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    locked = (tmp_path / "req.txt").read_text()
    wheel = next((root / "releases").rglob("tinypure-1.0-*.whl"))
    assert f"--hash=sha256:{sha256_file(wheel)}" in locked
    assert _sent(server, ".whl") == 0, server.log.bytes_by_path  # resolved from .metadata alone
    tamper(wheel)
    proc = run(
        [
            UV,
            "pip",
            "sync",
            "--python",
            py,
            "--require-hashes",
            "--index-url",
            index,
            "--cache-dir",
            str(tmp_path / "c2"),
            str(tmp_path / "req.txt"),
        ],
        env,
    )
    assert proc.returncode != 0
    assert "hash mismatch" in proc.stderr.lower(), proc.stderr
    # a plain install checks the index's hash as well
    proc = run(
        [UV, "pip", "install", "--python", py, "--index-url", index, "--cache-dir", str(tmp_path / "c3"), "tinypure"],
        env,
    )
    assert proc.returncode != 0
    assert "hash mismatch" in proc.stderr.lower(), proc.stderr
    assert "tinypure" not in run([UV, "pip", "list", "--python", py, "--format", "freeze"], env).stdout


def test_pip_installs_from_a_file_url_index(tmp_path, wheels):
    root = tmp_path / "store"
    base = root.as_uri()
    releases = _serve_tree(root, wheels, base, index_base=base)
    summary = publish_index(
        releases,
        DirectoryTarget(root / "index"),
        base_url=f"{base}/index",
        default_world=WORLD,
        fetch=file_fetch(base, root),
    ).summary
    assert summary.warnings == ()
    for index in (f"{base}/index/{WORLD}/simple/", f"{base}/index/simple/"):
        target = tmp_path / ("t" + str(len(index)))
        proc = pip_install(index, target, "tinyext", tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (target / "tinypure" / "__init__.py").read_text() == 'VERSION = "1.1"\n'


# --------------------------------------------------------------------------- a large wheel


BIG_BYTES = 210 * 1024 * 1024


@pytest.fixture(scope="module")
def big_wheel() -> Path:
    """A >= 200 MB wheel (one stored random member) with its sidecar, made once under .cache/tests/."""
    out = REPO / ".cache" / "tests" / "big-wheel-v2"
    wheel = out / "bigpkg-1.0-py3-none-any.whl"
    with one_maker(out):
        _make_big_wheel(out, wheel)
    return wheel


def _make_big_wheel(out: Path, wheel: Path) -> None:
    if not (wheel.exists() and Path(str(wheel) + ".metadata").exists() and wheel.stat().st_size >= BIG_BYTES):
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        build_wheel(staging, name="bigpkg", version="1.0", tags="py3-none-any", requires_python=">=3.8", random_member_bytes=BIG_BYTES, sidecar=True)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)


@pytest.mark.slow
def test_large_wheel_resolves_through_metadata_only(tmp_path, big_wheel, uv_venv):
    sidecar = Path(str(big_wheel) + ".metadata")
    root = tmp_path / "www"
    root.mkdir()
    (tmp_path / "req.in").write_text("bigpkg\n")
    env = client_env(tmp_path)
    figures: dict[str, int] = {}
    with CountingServer(root, mounts={"big": big_wheel.parent}) as server:
        with_meta = release_of("big-v1", "bigpkg v1 - cu13.0.2 py3.11 torch2.13.0", [big_wheel, sidecar], server.url)
        with_meta = Release(
            with_meta.tag,
            with_meta.title,
            assets=tuple(
                a.__class__(a.name, a.size, f"{server.url}/big/{a.name}", a.digest, id=a.id) for a in with_meta.assets
            ),
        )
        without = Release(with_meta.tag, with_meta.title, assets=(with_meta.asset(big_wheel.name),))
        for label, rel in (("with", with_meta), ("without", without)):
            summary = publish_index([rel], DirectoryTarget(root / label), base_url=f"{server.url}/{label}",
                                    default_world=WORLD).summary
            assert summary.warnings == ()

        def compile_with(label: str, ranges: bool) -> None:
            server.set_ranges(ranges)
            server.log.reset()
            proc = run(
                [
                    UV,
                    "pip",
                    "compile",
                    "--quiet",
                    "--python",
                    str(uv_venv / "bin" / "python"),
                    "--index-url",
                    f"{server.url}/{label}/{WORLD}/simple/",
                    "--cache-dir",
                    str(tmp_path / f"c-{label}-{ranges}"),
                    str(tmp_path / "req.in"),
                ],
                env,
            )
            assert proc.returncode == 0, proc.stderr
            assert "bigpkg==1.0" in proc.stdout
            figures[f"uv compile, {label} .metadata, ranges={'on' if ranges else 'off'}: wheel"] = (
                server.log.bytes_by_path[f"/big/{big_wheel.name}"]
            )
            figures[f"uv compile, {label} .metadata, ranges={'on' if ranges else 'off'}: .metadata"] = (
                server.log.bytes_by_path[f"/big/{sidecar.name}"]
            )

        def pip_report(label: str) -> None:
            server.set_ranges(True)
            server.log.reset()
            proc = run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--isolated",
                    "--no-cache-dir",
                    "--dry-run",
                    "--ignore-installed",
                    "--quiet",
                    "--report",
                    str(tmp_path / f"report-{label}.json"),
                    "--index-url",
                    f"{server.url}/{label}/{WORLD}/simple/",
                    "bigpkg",
                ],
                env,
            )
            assert proc.returncode == 0, proc.stderr
            figures[f"pip install --dry-run, {label} .metadata: wheel"] = server.log.bytes_by_path[
                f"/big/{big_wheel.name}"
            ]
            figures[f"pip install --dry-run, {label} .metadata: .metadata"] = server.log.bytes_by_path[
                f"/big/{sidecar.name}"
            ]

        compile_with("with", True)
        compile_with("without", True)
        compile_with("without", False)
        pip_report("with")
        pip_report("without")
    print(f"\nwheel {big_wheel.stat().st_size} bytes, sidecar {sidecar.stat().st_size} bytes")
    for key, value in figures.items():
        print(f"{key}: {value} bytes served")
    assert figures["uv compile, with .metadata, ranges=on: wheel"] == 0
    assert figures["uv compile, with .metadata, ranges=on: .metadata"] == sidecar.stat().st_size
    # this pip (23.2) reads .metadata to resolve but still downloads the chosen wheel in --dry-run
    assert figures["pip install --dry-run, with .metadata: .metadata"] == sidecar.stat().st_size
    assert figures["uv compile, without .metadata, ranges=off: wheel"] >= BIG_BYTES
