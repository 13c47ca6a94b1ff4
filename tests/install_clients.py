"""Three local indexes, as a user's installer meets them, and the commands a page prints, run.

- ours: a world ``cu130/torch2.13`` published by ci/publish/pages.py over file:// from a local store, holding a
  stand-in flash-attn 2.8.3: a real wheel with a real fat binary (cubins for sm_80, sm_90, sm_100, built
  by nvcc) and a shared object linking libc10, stamped as a build stamps it (torch pin, SBOM);
- the torch index of the world: a stand-in torch ``2.13.0+cu130``;
- a stand-in of the package index (the installer's default index): ``flash_attn-2.8.3.post2.tar.gz``, a
  higher-versioned sdist of the same name whose build says so and fails, a newer torch on the world's
  minor (``2.13.9``, no CUDA build label), a newer torch (``2.99.0``), and einops (what flash-attn also
  needs, found only there).
"""

from __future__ import annotations

import ensurepip
import html
import io
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from index_helpers import REPO, UV, client_env, file_fetch, publish_release_files, release_of, run
from made_once import one_maker
from stamp_helpers import fixture_facts, linked_shared_object, simple_index, torch_stand_in
from wheel_factory import NVCC, build_wheel, cuda_shared_object

from ci.base.digest import sha256_file
from ci.building.stamp import stamp_wheel
from ci.formats.metadata import extract_metadata
from ci.publish.catalog import Context
from ci.publish.pages import DirectoryTarget, publish_index
from ci.publish.which_wheel import LOCK_PIP

WORLD = "cu130/torch2.13"
OUR_VERSION = "2.8.3"
SDIST = "flash_attn-2.8.3.post2.tar.gz"
SOURCE_BUILD = "SOURCE BUILD OF flash_attn-2.8.3.post2 STARTED"
WORLD_TORCH = "2.13.0+cu130"
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
BUILT_WITH = {"version": WORLD_TORCH, "git_version": "0" * 40, "cuda": "13.0", "cxx11_abi": True}


@dataclass(frozen=True)
class Indexes:
    site: Path
    """The published site (our index), as a directory."""
    base_url: str
    torch_index: str
    package_index: str

    @property
    def ours(self) -> str:
        return f"{self.base_url}/{WORLD}/simple/"


def flash_attn_stand_in(out: Path) -> Path:
    """flash_attn-2.8.3 for this Python on x86_64, as a build leaves it: pinned to torch 2.13 and with its SBOM."""
    assert NVCC.is_file(), f"{NVCC} is needed to build the stand-in's fat binary"
    kernels = cuda_shared_object(("80", "90", "100")).read_bytes()
    links_torch = linked_shared_object(out / "so", "libc10.so").read_bytes()
    files = {"flash_attn/__init__.py": b'__version__ = "2.8.3"\nSOURCE = "wheelhouse"\n',
             f"flash_attn_2_cuda.{CP}-x86_64-linux-gnu.so": kernels,
             "flash_attn/ops.so": links_torch}
    wheel = build_wheel(out / "wheel", files, name="flash_attn", version=OUR_VERSION,
                        tags=f"{CP}-{CP}-linux_x86_64", requires=["torch", "einops"])
    facts = fixture_facts()
    facts["torch"] = dict(BUILT_WITH)
    stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
    extract_metadata(wheel)
    return wheel


def _refusing_sdist(out: Path) -> Path:
    """The package index's higher-versioned sdist: its in-tree build backend says it started, and stops."""
    root = "flash_attn-2.8.3.post2"
    members = {
        f"{root}/pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        f"{root}/backend.py": (f"def _refuse(*args, **kwargs):\n    raise SystemExit({SOURCE_BUILD!r})\n\n"
                               "get_requires_for_build_wheel = prepare_metadata_for_build_wheel = _refuse\n"
                               "build_wheel = build_sdist = _refuse\n").encode(),
        f"{root}/PKG-INFO": b"Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.8.3.post2\n",
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / SDIST
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def package_index(root: Path) -> str:
    wheels = [torch_stand_in(root / "wheels", v) for v in ("2.13.9", "2.99.0")]
    wheels.append(build_wheel(root / "wheels", name="einops", version="0.8.1", tags="py3-none-any",
                              requires_python=None))
    wheels.append(lock_capable_pip())
    url = simple_index(root / "index", wheels)
    sdist = _refusing_sdist(root / "index" / "simple" / "flash-attn")
    (sdist.parent / "index.html").write_text(
        f'<!DOCTYPE html><html><body>\n<a href="{SDIST}#sha256={sha256_file(sdist)}">{SDIST}</a><br>\n</body></html>\n')
    listing = root / "index" / "simple" / "index.html"
    listing.write_text(listing.read_text().replace("<body>\n", '<body>\n<a href="flash-attn/">flash-attn</a><br>\n'))
    return url


RETIRED_WORLD = "cu129/torch2.13"


def build_indexes(root: Path, *, retired_world: bool = False, public: tuple[str, str] | None = None) -> Indexes:
    """Our published world, the torch index and the package index. With ``retired_world``, an earlier publish
    also served the stand-in in cu129/torch2.13, whose release is gone since: that world is archived.
    ``public``: the (site URL, torch index URL) the pages name instead of the local ones (for a screenshot
    that shows what a published site shows; its commands then point elsewhere)."""
    wheel = flash_attn_stand_in(root / "built")
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    store = root / "store"
    releases = []
    for cuda in ("13.0.2", "12.9.1") if retired_world else ("13.0.2",):
        tag = f"flash-attention-v2.8.3-py{py}-torch2.13.0" + ("" if cuda == "13.0.2" else "-cu129")
        copied = publish_release_files(store / "releases", tag, [wheel])
        releases.append(release_of(tag, f"flash-attention v2.8.3 - cu{cuda} py{py} torch2.13.0", copied,
                                   f"{store.as_uri()}/releases"))
    site = store / "site"
    base_url = site.as_uri()
    torch_index = simple_index(root / "torch-index", [torch_stand_in(root / "torch-wheels", WORLD_TORCH)])
    if public is not None:
        base_url = public[0]
    # the world's torch index as versions.yaml's build_matrix[].torch_index names it
    context = Context(torch_indexes={WORLD: public[1] if public else torch_index.rstrip("/")})
    fetch = file_fetch(store.as_uri(), store)
    publish_index(releases, DirectoryTarget(site), base_url=base_url, default_world=WORLD, fetch=fetch,
                  context=context)
    if retired_world:  # the cu129 release was deleted (a prune): the next publish keeps its world, archived
        publish_index(releases[:1], DirectoryTarget(site), base_url=base_url, default_world=WORLD, fetch=fetch,
                      context=context, allow_shrink=True)
    return Indexes(site, base_url, torch_index.rstrip("/"), package_index(root / "package-index"))


def user_env(tmp: Path, indexes: Indexes) -> dict[str, str]:
    """A user's environment: no configuration but the default index, which is the stand-in package index."""
    env = client_env(tmp)
    env["PIP_INDEX_URL"] = indexes.package_index
    env["UV_DEFAULT_INDEX"] = indexes.package_index
    return env


CACHE = REPO / ".cache" / "test-clients"
"""Files the client tests reuse between runs (kept by content: a file is downloaded or built once)."""


def bundled_pip() -> Path:
    """The pip wheel this Python's ensurepip installs into every new venv: the pip a fresh venv has."""
    (wheel,) = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    return wheel


def lock_capable_pip() -> Path:
    """A pip wheel of at least the version that installs lock files, for the stand-in package index (the printed
    lock-file form's first line installs it): fetched once with this machine's own pip configuration."""
    folder = CACHE / f"pip-{LOCK_PIP}"
    with one_maker(folder):
        return _lock_capable_pip(folder)


def _lock_capable_pip(folder: Path) -> Path:
    found = sorted(folder.glob("pip-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", str(folder), f"pip>={LOCK_PIP}"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        found = sorted(folder.glob("pip-*.whl"))
    return found[-1]


def fresh_venv(tmp: Path, name: str = "venv") -> Path:
    """A new venv as ``python -m venv`` makes it (the pip ensurepip bundles, nothing else); its python."""
    assert UV, "uv is not installed in the development venv"
    venv = tmp / name
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], client_env(tmp))
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    seeded = run([UV, "pip", "install", "--quiet", "--offline", "--no-index", "--python", str(python), str(bundled_pip())],
                 client_env(tmp))
    assert seeded.returncode == 0, seeded.stderr
    return python


def shell_env(python: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` as a user's shell has it with the venv of ``python`` active, and uv (alone) on PATH."""
    venv = python.parent.parent
    uv_bin = venv.parent / f"{venv.name}-uv-bin"
    uv_bin.mkdir(exist_ok=True)
    if not (uv_bin / "uv").exists():
        assert UV
        (uv_bin / "uv").symlink_to(UV)
    return {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{uv_bin}:/usr/bin:/bin"}


@dataclass(frozen=True)
class Ran:
    output: str
    failed: str | None
    """The first command that exited non-zero, None when every one passed."""


def run_commands(commands: list[str], python: Path, env: dict[str, str]) -> Ran:
    """Each printed command as it is printed, pasted into bash in a shell whose venv is ``python``'s."""
    output = []
    shell = shell_env(python, env)
    for command in commands:
        proc = run(["bash", "-c", command], shell)
        output.append(f"$ {command}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            return Ran("\n".join(output), command)
    return Ran("\n".join(output), None)


def installed(python: Path, tmp: Path) -> dict[str, str]:
    assert UV
    listed = run([UV, "pip", "list", "--python", str(python), "--format", "freeze"], client_env(tmp)).stdout
    return {name: version for name, version in (line.split("==", 1) for line in listed.split()) if name != "pip"}


def ours_is_installed(python: Path) -> bool:
    """The installed flash_attn is our wheel's (its SBOM is in place), not anything built from a source tree."""
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    return (site / f"flash_attn-{OUR_VERSION}.dist-info" / "sboms" / "wheelhouse.cdx.json").is_file()


_PRE = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)


def printed_blocks(page: str) -> list[list[str]]:
    """Every ``<pre>`` block of a page, as its lines (unescaped)."""
    return [html.unescape(block).splitlines() for block in _PRE.findall(page)]


def install_forms(page: str) -> dict[str, list[str]]:
    """The install commands a page prints, by form: ``pip`` and ``uv`` (each its first block whose every line
    is such a command), ``pip-locked`` and ``uv-locked`` (the first such block installing a lock file)."""
    forms: dict[str, list[str]] = {}
    for lines in printed_blocks(page):
        if not lines:
            continue
        for form, prefix in (("uv", "uv pip install "), ("pip", "pip install ")):
            if all(line.startswith(prefix) for line in lines):
                key = f"{form}-locked" if any(" -r " in line for line in lines) else form
                forms.setdefault(key, lines)
                break
    return forms


def user_torch(out: Path, version: str, *, cuda: str | None, capabilities: tuple[tuple[int, int], ...] = (),
               git_version: str = BUILT_WITH["git_version"], cxx11_abi: bool = True) -> Path:
    """A stand-in of the torch a user has, as which-wheel reads it (version, CUDA, ABI, git, GPUs): a package
    directory to put first on PYTHONPATH. There is no GPU here; the GPU machine runs the real one."""
    package = out / "torch"
    package.mkdir(parents=True, exist_ok=True)
    names = [f"stand-in GPU {i}" for i in range(len(capabilities))]
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\n"
        "class version:\n"
        f"    cuda = {cuda!r}\n    hip = None\n    git_version = {git_version!r}\n"
        f"def compiled_with_cxx11_abi():\n    return {cxx11_abi!r}\n"
        "class cuda:\n"
        f"    _names, _caps = {names!r}, {list(capabilities)!r}\n"
        "    @staticmethod\n    def is_available():\n        return bool(cuda._caps)\n"
        "    @staticmethod\n    def device_count():\n        return len(cuda._caps)\n"
        "    @staticmethod\n    def get_device_name(i):\n        return cuda._names[i]\n"
        "    @staticmethod\n    def get_device_capability(i):\n        return tuple(cuda._caps[i])\n")
    return out
