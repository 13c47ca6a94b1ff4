"""patches/deep_ep_relative_nvshmem_rpath.py: DeepEP's extension finds NVSHMEM beside it, not on the build machine.

The real link is checked on a small extension of our own whose setup.py spells the link argument as DeepEP's
does: setuptools builds it before and after the patch, and the RUNPATH is read back from the ELF file. An
install laid out as pip lays out DeepEP's wheel and nvidia-nvshmem's (both in one site-packages) then imports
it with no library path set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import upstream_snapshots

from ci.checks import paths
from ci.formats.elf import ElfFile

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "deep_ep_relative_nvshmem_rpath.py"
RELATIVE = "$ORIGIN/nvidia/nvshmem/lib"

# Our stand-in of the part of DeepEP's setup.py the patch edits: the NVSHMEM directory found in the build's
# site-packages, and the link arguments on one line as upstream writes them.
SETUP = """\
import os
import setuptools

nvshmem_dir = os.environ["STAND_IN_NVSHMEM_DIR"]
nvshmem_host_lib = "libnvshmem_host.so.3"
extra_link_args = []
extra_link_args.extend([f'-l:{nvshmem_host_lib}', f'-L{nvshmem_dir}/lib', f'-Wl,-rpath,{nvshmem_dir}/lib'])
setuptools.setup(name="stand_in_deep_ep", version="0.0.0",
                 ext_modules=[setuptools.Extension("stand_in_deep_ep_cpp", ["ext.c"], extra_link_args=extra_link_args)])
"""
EXTENSION = """\
#include <Python.h>
int nvshmem_stand_in(void);
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(nvshmem_stand_in()); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "stand_in_deep_ep_cpp", 0, -1, methods};
PyMODINIT_FUNC PyInit_stand_in_deep_ep_cpp(void) { return PyModule_Create(&module); }
"""


def run_patch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PATCH), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _nvshmem_lib(site: Path) -> Path:
    """A host library named as NVSHMEM's, where the nvidia-nvshmem wheel puts it in ``site``."""
    lib = site / "nvidia" / "nvshmem" / "lib"
    lib.mkdir(parents=True)
    (lib / "host.c").write_text("int nvshmem_stand_in(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvshmem_host.so.3", str(lib / "host.c"),
                    "-o", str(lib / "libnvshmem_host.so.3")], check=True, timeout=120)
    (lib / "host.c").unlink()
    return lib


def _build(project: Path, nvshmem_dir: Path) -> Path:
    out = project / "out"
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out), "--build-temp",
                    str(project / "tmp")], cwd=project, check=True, capture_output=True, timeout=300,
                   env={**os.environ, "STAND_IN_NVSHMEM_DIR": str(nvshmem_dir)})
    [built] = out.glob("stand_in_deep_ep_cpp*.so")
    return built


def _nvshmem_runpath(shared_object: Path) -> list[tuple[str, str]]:
    """The search-path entries for NVSHMEM (an interpreter built with --enable-shared adds its own lib dir)."""
    with shared_object.open("rb") as handle:
        return [(tag, entry) for tag, entry in paths.run_paths(ElfFile(handle, shared_object.name))
                if "nvshmem" in entry]


def _findings(shared_object: Path, build_paths: list[str]) -> list[paths.BuildPathFinding]:
    with shared_object.open("rb") as handle:
        return paths.find_build_paths(shared_object.name, ElfFile(handle, shared_object.name), build_paths)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    root = tmp_path / "DeepEP"
    root.mkdir()
    (root / "setup.py").write_text(SETUP)
    (root / "ext.c").write_text(EXTENSION)
    return root


def test_unpatched_the_wheel_would_send_the_import_to_the_builders_site_packages(project, tmp_path):
    build_site = tmp_path / "builder" / "lib" / "python3.12" / "site-packages"
    _nvshmem_lib(build_site)
    built = _build(project, build_site / "nvidia" / "nvshmem")
    assert _nvshmem_runpath(built) == [("RUNPATH", f"{build_site}/nvidia/nvshmem/lib")]
    [finding] = _findings(built, [str(project)])
    assert finding.where == "RUNPATH" and "site-packages" in finding.path


def test_patched_the_extension_finds_nvshmem_beside_it_on_another_machine(project, tmp_path):
    build_site = tmp_path / "builder" / "lib" / "python3.12" / "site-packages"
    _nvshmem_lib(build_site)
    proc = run_patch(cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert f"links NVSHMEM through {RELATIVE}" in proc.stdout
    built = _build(project, build_site / "nvidia" / "nvshmem")
    assert _nvshmem_runpath(built) == [("RUNPATH", RELATIVE)]
    assert _findings(built, [str(project), str(build_site)]) == []
    # a user's site-packages elsewhere, as pip installs both wheels; the builder's copy is gone
    user_site = tmp_path / "user" / "site-packages"
    _nvshmem_lib(user_site)
    (user_site / built.name).write_bytes(built.read_bytes())
    build_site.joinpath("nvidia").rename(tmp_path / "moved-away")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    imported = subprocess.run([sys.executable, "-c", "import stand_in_deep_ep_cpp as m; print(m.answer())"],
                              cwd=user_site, env=env, capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "42"


def test_a_second_run_changes_nothing(project):
    assert run_patch(str(project), cwd=project.parent).returncode == 0
    once = (project / "setup.py").read_bytes()
    again = run_patch(str(project), cwd=project.parent)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert (project / "setup.py").read_bytes() == once
    assert once.decode().count(RELATIVE) == 1 and "f'-Wl,-rpath,{nvshmem_dir}/lib'" not in once.decode()


def test_an_upstream_that_moved_on_fails_in_one_line_and_changes_nothing(project, tmp_path):
    moved = SETUP.replace("f'-Wl,-rpath,{nvshmem_dir}/lib'", "'-Wl,-rpath,' + nvshmem_dir + '/lib'")
    (project / "setup.py").write_text(moved)
    proc = run_patch(cwd=project)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert f"{project / 'setup.py'}: expected the link argument f'-Wl,-rpath,{{nvshmem_dir}}/lib' once, found it 0 " \
           "time(s); update patches/deep_ep_relative_nvshmem_rpath.py to the new setup.py; nothing was changed" \
           in proc.stderr
    assert (project / "setup.py").read_text() == moved
    missing = run_patch(str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 1 and "no such file; run it in a DeepEP checkout" in missing.stderr


def test_real_deep_ep_setup_at_the_pin_changes_in_one_line(tmp_path):
    snapshot = upstream_snapshots.find("deepseek-ai/DeepEP")
    if snapshot is None:
        pytest.skip(upstream_snapshots.skip_reason("deepseek-ai/DeepEP") + " (the stand-in above covers the patch)")
    from ci.model.versions import load

    pin = load(REPO / "versions.yaml").component("deep-ep").ref
    setup = subprocess.run(["git", f"--git-dir={snapshot}", "show", f"{pin}:setup.py"], check=True,
                           capture_output=True, text=True, timeout=60).stdout
    (tmp_path / "setup.py").write_text(setup)
    assert run_patch(cwd=tmp_path).returncode == 0
    before, after = setup.splitlines(), (tmp_path / "setup.py").read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and RELATIVE in changed[0][1] and "-l:libnvshmem_device.a" in changed[0][1]
