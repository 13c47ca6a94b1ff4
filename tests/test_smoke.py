"""Smoke tests (ci/building/smoke.py): the wheels installed as a user installs them, the component's commands run.

The fixture extension (CPU-built, the stand-in for a real component here) passes its smoke test; a module
that passes every wheel check but cannot be imported fails it, in one line; an import that links the CUDA
driver runs against a driver stub on a machine without a GPU. The slow test builds a broken fixture row
through the whole build and finds dist/ untouched.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.base.errors import WheelhouseError
from ci.building import job, smoke, toolchain
from ci.checks.check import check_wheels
from ci.model import matrix, versions

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
CACHE = REPO / ".cache"
BROKEN_EXTENSION = 'extern void wheelhouse_fixture_missing(void);\nvoid* PyInit__C(void) { wheelhouse_fixture_missing(); return 0; }\n'


def _row(path: Path = FIXTURE_VERSIONS) -> matrix.MatrixRow:
    loaded = versions.load(path)
    (row,) = matrix.expand(loaded)
    return row


def _versions(tmp_path: Path, replace: dict[str, str]) -> Path:
    text = FIXTURE_VERSIONS.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "versions.yaml"
    path.write_text(text)
    return path


def _smoke(row: matrix.MatrixRow, wheels: list[Path], environ: dict[str, str] | None = None) -> smoke.SmokeResult:
    result = smoke.run(row, wheels, cache_dir=CACHE, index=None, environ=environ or dict(os.environ))
    assert result is not None
    return result


def test_every_real_component_has_a_smoke_test() -> None:
    loaded = versions.load()
    for row in matrix.expand(loaded):
        assert row.settings.smoke_test, f"{row.component} ({row.arch}) has no smoke_test in versions.yaml"


def test_the_fixture_wheel_passes_its_smoke_test(fixture_wheel: Path) -> None:
    row = _row()
    result = _smoke(row, [fixture_wheel])
    assert result.commands == row.settings.smoke_test and "scaled_add" in result.commands[0]
    assert result.torch.startswith("torch==2.13.0 from ") and result.driver == "none (a CPU row)"
    assert smoke.describe_plan(row).startswith("smoke test: 1 command(s) in a fresh venv with torch 2.13.0")


def test_a_module_that_passes_the_checks_but_cannot_be_imported_fails_the_row(tmp_path: Path,
                                                                              fixture_wheel: Path) -> None:
    source = tmp_path / "broken.c"
    source.write_text(BROKEN_EXTENSION)
    module = tmp_path / "_C.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(module)], check=True)
    package = (REPO / "tests/fixtures/fixture_ext/wheelhouse_fixture/__init__.py").read_bytes()
    wheel = build_wheel(tmp_path / "dist", {"wheelhouse_fixture/__init__.py": package,
                                            "wheelhouse_fixture/_C.cpython-311-x86_64-linux-gnu.so": module.read_bytes()},
                        name="wheelhouse_fixture", version="0.1.0", requires=["torch==2.13.*"])
    assert check_wheels([wheel], pythons="3.11").ok  # nothing structural is wrong with it
    with pytest.raises(WheelhouseError) as failed:
        _smoke(_row(), [wheel])
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("wheelhouse-fixture (x86_64 cpu py3.11 torch2.13.0): smoke test failed: `python -c "
                              "\"import torch, wheelhouse_fixture as f; assert torch.equal(")
    assert "exited with status 1: ImportError: " in message
    assert message.endswith("undefined symbol: wheelhouse_fixture_missing; the wheels stay out of dist/ (run the command "
                            "in a venv with them to see all of its output)")


def test_declared_requirements_are_those_for_this_python(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, name="pkg", requires=["torch==2.13.*", "einops", "tomli; python_version < '3.11'",
                                                        "rich; extra == 'cli'", "pkg-helper; sys_platform == 'win32'"])
    own = build_wheel(tmp_path, name="pkg_helper", requires=["pkg"])
    assert smoke.declared_requirements([wheel, own], "3.11") == ["torch==2.13.*", "einops"]
    assert smoke.declared_requirements([wheel], "3.10") == ["torch==2.13.*", "einops", 'tomli; python_version < "3.11"']


def test_offline_each_requirement_the_machine_has_is_installed(tmp_path: Path, fixture_wheel: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """--reuse-env on a machine without an index: the requirements its PIP_FIND_LINKS holds are installed even when
    another cannot be (the 2026-12-03 sweep: TransformerEngine's smoke test found no pydantic, which the machine
    had, because importlib-metadata was missing and all of them were given up together)."""
    links = tmp_path / "links"
    build_wheel(links, {"wheelhouse_dep/__init__.py": b"VALUE = 7\n"}, name="wheelhouse_dep", version="1.0")
    wheel = build_wheel(tmp_path / "dist", {"wheelhouse_user/__init__.py": b"import wheelhouse_dep\n"},
                        name="wheelhouse_user", version="0.1.0", requires=["wheelhouse-dep", "wheelhouse-absent>=1"])
    path = tmp_path / "versions.yaml"
    path.write_text(re.sub(r"    smoke_test:\n      - >-\n(        .*\n)+", "    smoke_test:\n      - python -c \"import "
                           "wheelhouse_user, wheelhouse_dep; assert wheelhouse_dep.VALUE == 7\"\n",
                           FIXTURE_VERSIONS.read_text()))
    row = _row(path)
    assert row.settings.smoke_test == ('python -c "import wheelhouse_user, wheelhouse_dep; assert wheelhouse_dep.VALUE '
                                       '== 7"',)
    python = Path(sys.executable)
    environ = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    interpreter = toolchain.verify(python, row, env=environ)
    with caplog.at_level("WARNING"):
        result = smoke.run(row, [wheel], cache_dir=tmp_path / "cache", index=None, environ=environ, reuse=interpreter)
    assert result is not None and result.requirements == ("wheelhouse-dep", "wheelhouse-absent>=1")
    assert "could not install 1 of the 2 declared requirements here (wheelhouse-absent>=1: " in caplog.text


def test_a_requirement_on_the_jobs_pythonpath_is_still_installed_into_the_venv(tmp_path: Path,
                                                                               fixture_wheel: Path) -> None:
    """The GPU machine's tools (pydantic among them) are on PYTHONPATH when nox runs: pip, seeing pydantic there, said
    TransformerEngine's requirement was satisfied, and the import, which runs without PYTHONPATH, found none (the
    sweep at 9cfe816). What the job's PYTHONPATH holds counts for neither."""
    links = tmp_path / "links"
    build_wheel(links, {"wheelhouse_dep/__init__.py": b"VALUE = 7\n"}, name="wheelhouse_dep", version="1.0")
    outside = tmp_path / "tools"  # as pip install --target lays it out
    (outside / "wheelhouse_dep").mkdir(parents=True)
    (outside / "wheelhouse_dep" / "__init__.py").write_text("VALUE = 0\n")
    (outside / "wheelhouse_dep-1.0.dist-info").mkdir()
    (outside / "wheelhouse_dep-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: wheelhouse_dep\nVersion: 1.0\n")
    wheel = build_wheel(tmp_path / "dist", {"wheelhouse_user/__init__.py": b"import wheelhouse_dep\n"},
                        name="wheelhouse_user", version="0.1.0", requires=["wheelhouse-dep"])
    path = tmp_path / "versions.yaml"
    path.write_text(re.sub(r"    smoke_test:\n      - >-\n(        .*\n)+", "    smoke_test:\n      - python -c \"import "
                           "wheelhouse_user, wheelhouse_dep; assert wheelhouse_dep.VALUE == 7\"\n",
                           FIXTURE_VERSIONS.read_text()))
    row = _row(path)
    environ = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links), "PYTHONPATH": str(outside)}
    probe = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], env=environ, capture_output=True,
                           text=True, check=True)
    assert "wheelhouse_dep==1.0" in probe.stdout.replace("-", "_")  # pip does count it as installed
    interpreter = toolchain.verify(Path(sys.executable), row, env=environ)
    result = smoke.run(row, [wheel], cache_dir=tmp_path / "cache", index=None, environ=environ, reuse=interpreter)
    assert result is not None and result.requirements == ("wheelhouse-dep",)


def test_an_import_that_links_the_driver_runs_against_the_stub(tmp_path: Path, fixture_wheel: Path) -> None:
    """No GPU here: an extension that needs libcuda.so.1 imports only with the toolkit's driver stub. The stub here is
    built like NVIDIA's (a libcuda.so of SONAME libcuda.so.1 exporting the driver API) in a toolkit laid out like
    theirs (lib64/stubs/libcuda.so), its nvcc the machine's."""
    toolkit = tmp_path / "cuda"
    (toolkit / "lib64" / "stubs").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    (toolkit / "bin").mkdir()
    (toolkit / "bin" / "nvcc").symlink_to("/usr/local/cuda/bin/nvcc")
    (tmp_path / "stub.c").write_text("int cuInit(unsigned int flags) { return 34; }\n")  # CUDA_ERROR_STUB_LIBRARY
    stub = toolkit / "lib64" / "stubs" / "libcuda.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "stub.c"), "-Wl,-soname,libcuda.so.1", "-o", str(stub)],
                   check=True)
    (tmp_path / "uses_driver.c").write_text("extern int cuInit(unsigned int);\nint probe(void) { return cuInit(0); }\n")
    linked = tmp_path / "libuses_driver.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "uses_driver.c"), "-o", str(linked), str(stub)], check=True)
    wheel = build_wheel(tmp_path / "dist", {"driver_user/__init__.py": b"", "driver_user/libuses_driver.so":
                                            linked.read_bytes()}, name="driver_user", version="1.0")
    command = ("python -c \"import ctypes, driver_user, os; lib = ctypes.CDLL(os.path.join(driver_user.__path__[0], "
               "'libuses_driver.so')); assert lib.probe() == 34\"")
    path = _versions(tmp_path, {"cuda: cpu": 'cuda: "13.0.2"', "python -c \"import torch, wheelhouse_fixture as f;":
                                f"{command} && python -c \"import torch, wheelhouse_fixture as f;"})
    row = _row(path)
    assert row.cuda == "13.0.2" and row.torch_index == "default"
    environ = {**os.environ, "CUDA_HOME": str(toolkit)}
    result = _smoke(row, [fixture_wheel, wheel], environ)
    assert result.driver == f"the CUDA driver stub {stub}"
    with pytest.raises(WheelhouseError, match=r"libcuda\.so\.1: cannot open shared object file"):
        _smoke(row, [fixture_wheel, wheel], {**os.environ, "CUDA_HOME": "/usr/local/cuda"})


@pytest.mark.slow
def test_a_broken_extension_fails_its_row_and_leaves_dist_empty(tmp_path: Path) -> None:
    """The whole build: FIXTURE_BROKEN=1 compiles a module whose import fails; the checks pass, the smoke test does
    not, and nothing reaches dist/."""
    path = _versions(tmp_path, {"    max_jobs: 2\n": "    max_jobs: 2\n    extra_env: {FIXTURE_BROKEN: \"1\"}\n"})
    row = _row(path)
    dist = tmp_path / "dist"
    with pytest.raises(WheelhouseError, match=r"smoke test failed: .* undefined symbol: wheelhouse_fixture_missing"):
        job.run(versions.load(path), row, job.BuildOptions(cache_dir=CACHE, dist_root=dist))
    assert not dist.exists() or not any(dist.rglob("*.whl"))
