"""Bundle mode: one wheel carrying an extension module per CPython, built from one build interpreter.

The fixture extension (a pybind11 torch extension) is built for Python 3.10,
3.11, 3.12 and 3.13 through the real nox session with 3.11 as the build
interpreter (the Python this machine has torch 2.13 CPU for); the other three
contribute only their headers and EXT_SUFFIX. A plain C extension shows the
same mechanism in seconds, and imports in each real interpreter without torch.
The slow test imports the torch extension in 3.10, 3.12 and 3.13 against torch
2.13.0 installed for each (cached venvs under .cache/tests/bundle-torch/).
"""

from __future__ import annotations

import csv
import email.parser
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel_factory import record_hash

from ci.checks.check import check_wheels

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "build_scripts" / "lib"
BUNDLE_VERSIONS = REPO / "tests" / "fixtures" / "versions-bundle.yaml"
TORCH_WHEELS = REPO / ".cache" / "torch-wheels"
TORCH_VENVS = REPO / ".cache" / "tests" / "bundle-torch"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
TAGS = "cp310.cp311.cp312.cp313"
WHEEL_NAME = f"wheelhouse_fixture-0.1.0-{TAGS}-{TAGS}-linux_x86_64.whl"
MODULE = "wheelhouse_fixture/_C"
RUN_OP = (
    "import sys, torch, wheelhouse_fixture as f\n"
    "out = f.scaled_add(torch.ones(3), torch.arange(3.0), 2.0)\n"
    "try:\n"
    "    f.scaled_add(torch.ones(3), torch.ones(2))\n"
    "    raise SystemExit('no ValueError for mismatched shapes')\n"
    "except ValueError:\n"
    "    pass\n"
    "print('%d.%d' % sys.version_info[:2], torch.__version__, f._C.__file__.rsplit('/', 1)[1], out.tolist())\n"
)


def _runs_as(python: str | Path, version: str) -> bool:
    try:
        proc = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == version


def interpreter(version: str) -> Path | None:
    """A runnable CPython ``version``: the newest pyenv install, else a working ``pythonX.Y`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    installs = sorted(root.glob(f"{version}.*/bin/python{version}"),
                      key=lambda p: [int(x) if x.isdigit() else -1 for x in p.parent.parent.name.split(".")])
    for candidate in [*reversed(installs), shutil.which(f"python{version}")]:
        if candidate and _runs_as(candidate, version):
            return Path(candidate)
    return None


@pytest.fixture(scope="module")
def interpreters() -> dict[str, Path]:
    found = {version: interpreter(version) for version in PYTHONS}
    missing = [version for version, path in found.items() if path is None]
    if missing:
        pytest.skip(f"no runnable CPython {', '.join(missing)} here (pyenv or PATH); bundle tests need all four")
    return found  # type: ignore[return-value]


def record_problems(wheel: Path) -> list[str]:
    """Every member listed in RECORD with its true hash and size, and nothing else."""
    problems = []
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(zf.read(record_name).decode())) if row}
        for name in names:
            if name not in rows:
                problems.append(f"{name} not in RECORD")
                continue
            if name == record_name:
                continue
            data = zf.read(name)
            digest = record_hash(data)
            if rows[name] != [digest, str(len(data))]:
                problems.append(f"{name}: RECORD says {rows[name]}, content is {digest}, {len(data)}")
        problems += [f"{name} in RECORD but not in the wheel" for name in rows if name not in names]
    return problems


# --- the mechanism on a plain C extension (seconds; no torch) -------------------------------------

C_SOURCE = r"""
#include <Python.h>
static PyObject *built_for(PyObject *self, PyObject *args) { return PyUnicode_FromString(PY_VERSION); }
static PyMethodDef methods[] = {{"built_for", built_for, METH_NOARGS, "PY_VERSION of the headers"}, {0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ext", 0, -1, methods};
PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&module); }
"""

C_SETUP = """
import sysconfig
from setuptools import Extension, setup
ext = [Extension("cdemo._ext", ["ext.c"])]
if {only_build_python} and sysconfig.get_config_var("SOABI") == {build_soabi!r}:
    ext.append(Extension("cdemo._only_here", ["ext.c"]))  # an extension set that depends on the Python
setup(name="cdemo", version="1.0", packages=["cdemo"], ext_modules=ext)
"""


def _c_project(root: Path, only_build_python: bool = False) -> tuple[Path, Path]:
    import sysconfig

    src = root / "src"
    (src / "cdemo").mkdir(parents=True)
    (src / "cdemo" / "__init__.py").write_text("")
    (src / "ext.c").write_text(C_SOURCE)
    (src / "setup.py").write_text(C_SETUP.format(only_build_python=only_build_python,
                                                 build_soabi=sysconfig.get_config_var("SOABI")))
    dist = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                    "--disable-pip-version-check", "-w", str(dist), str(src)], check=True, capture_output=True)
    return src, dist


def _bundle_cli(dist: Path, src: Path, pythons: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LIB / "bundle_pythons.py"), str(dist), str(src), *map(str, pythons)],
                          cwd=src, capture_output=True, text=True, timeout=600)


def test_c_extension_bundle_imports_in_every_python(tmp_path, interpreters):
    """Each module is compiled against its own Python's headers (PY_VERSION) and imports there, without torch."""
    src, dist = _c_project(tmp_path)
    # a duplicate interpreter (same SOABI) is built once
    proc = _bundle_cli(dist, src, [*interpreters.values(), interpreters["3.12"]])
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    assert wheel.name == f"cdemo-1.0-{TAGS}-{TAGS}-linux_x86_64.whl"
    assert [p.name for p in dist.iterdir()] == [wheel.name]
    assert proc.stderr.count("building the extension modules for Python") == 3
    assert record_problems(wheel) == []
    report = check_wheels([wheel], pythons=PYTHONS)
    assert report.ok, report.problems
    with zipfile.ZipFile(wheel) as zf:
        headers = email.parser.Parser().parsestr(zf.read("cdemo-1.0.dist-info/WHEEL").decode())
    assert headers.get_all("Tag") == [f"cp3{m}-cp3{m}-linux_x86_64" for m in (10, 11, 12, 13)]
    for version, python in interpreters.items():
        target = tmp_path / f"site-{version}"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(target)
        out = subprocess.run([str(python), "-c", "import cdemo._ext as e, platform; "
                              "print(e.__file__.rsplit('/', 1)[1], e.built_for() == platform.python_version())"],
                             cwd=target, capture_output=True, text=True, check=True).stdout.split()
        assert out == [f"_ext.cpython-{version.replace('.', '')}-x86_64-linux-gnu.so", "True"], version


def test_a_python_dependent_extension_set_is_refused(tmp_path, interpreters):
    src, dist = _c_project(tmp_path, only_build_python=True)
    before = sorted(p.name for p in dist.iterdir())
    proc = _bundle_cli(dist, src, [interpreters["3.10"], interpreters["3.11"]])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "[wheelhouse] error: bundle_pythons: the build for Python 3.10 produced no cdemo/_only_here "
        "(expected cdemo/_only_here.cpython-310-x86_64-linux-gnu.so); the wheel has it for Python 3.11")
    assert sorted(p.name for p in dist.iterdir()) == before  # the wheel is left as it was


def test_the_build_interpreter_must_be_one_of_the_pythons(tmp_path, interpreters):
    src, dist = _c_project(tmp_path)
    proc = _bundle_cli(dist, src, [interpreters["3.12"], interpreters["3.13"]])
    assert proc.returncode == 1
    assert "is not one of the bundle's Pythons (3.12, 3.13); build with one of them" in proc.stderr


def test_an_interpreter_that_does_not_run_is_named(tmp_path):
    src, dist = _c_project(tmp_path)
    proc = _bundle_cli(dist, src, [Path(sys.executable), tmp_path / "no-such-python3.12"])
    assert proc.returncode == 1
    assert f"cannot run interpreter {tmp_path / 'no-such-python3.12'}" in proc.stderr.strip().splitlines()[-1]


def test_deep_gemm_builder_bundles_through_the_same_step(tmp_path, interpreters):
    """deep_gemm.sh end to end on a stand-in checkout (DeepGEMM's layout, a plain C `deep_gemm._C`)."""
    src = tmp_path / "DeepGEMM"
    for sub in ("third-party/cutlass/include", "third-party/fmt/include", "csrc", "deep_gemm"):
        (src / sub).mkdir(parents=True)
    (src / "deep_gemm" / "__init__.py").write_text("")
    (src / "csrc" / "python_api.c").write_text(C_SOURCE.replace("_ext", "_C"))
    (src / "setup.py").write_text('from setuptools import Extension, setup\n'
                                  'setup(name="deep_gemm", version="2.1.0", packages=["deep_gemm"],\n'
                                  '      ext_modules=[Extension("deep_gemm._C", ["csrc/python_api.c"])])\n')
    # a stand-in toolkit with what the builder checks for (the stand-in _C uses none of it)
    cuda = tmp_path / "cuda"
    for header in ("cuda_runtime.h", "cuda_runtime_api.h", "nvrtc.h", "cublasLt.h", "cublas_v2.h", "cusparse.h",
                   "cusolverDn.h"):
        (cuda / "include").mkdir(parents=True, exist_ok=True)
        (cuda / "include" / header).write_text("")
    for library in ("libcudart.so", "libnvrtc.so"):
        (cuda / "lib64").mkdir(exist_ok=True)
        (cuda / "lib64" / library).write_bytes(b"")
    dist = tmp_path / "dist"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MAX_JOBS": "2",
           "CUDA_HOME": str(cuda), "CUDA_VERSION": "13.0",
           "DIST_DIR": str(dist), "WHEELHOUSE_ROOT": str(REPO), "WHEELHOUSE_PYTHON": sys.executable,
           "WHEELHOUSE_TOOLS_PYTHON": sys.executable,
           "WHEELHOUSE_BUNDLE_PYTHONS": "3.11 3.12",
           "WHEELHOUSE_BUNDLE_INTERPRETERS": f"{interpreters['3.11']} {interpreters['3.12']}"}
    proc = subprocess.run(["bash", str(REPO / "build_scripts" / "deep_gemm.sh")], cwd=src, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.iterdir()
    assert wheel.name == "deep_gemm-2.1.0-cp311.cp312-cp311.cp312-linux_x86_64.whl"
    assert "[wheelhouse] bundling the extension for Pythons 3.11 3.12" in proc.stderr
    assert record_problems(wheel) == []
    report = check_wheels([wheel], pythons="3.11,3.12")
    assert report.ok, report.problems
    assert report.wheels[0].coverage.stems == ("deep_gemm/_C",)


# --- the fixture torch extension through the nox session ---------------------------------------------


@pytest.fixture(scope="module")
def bundle_build(tmp_path_factory, interpreters) -> tuple[Path, dict]:
    """`nox -s build-wheelhouse-fixture-3.11` with versions-bundle.yaml: the bundle wheel and its build record.

    The bundle's interpreters go first on PATH as python3.X (what setup-python or uv provide on a
    CI machine; a pyenv shim for a version pyenv does not select would not run).
    """
    root = tmp_path_factory.mktemp("bundle")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for version, path in interpreters.items():
        (bin_dir / f"python{version}").symlink_to(path)
    dist = root / "dist"
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(BUNDLE_VERSIONS), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "nox", "-s", "build-wheelhouse-fixture-3.11", "--", "--dist", str(dist)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    wheels = sorted(dist.rglob("*.whl"))
    assert [w.name for w in wheels] == [WHEEL_NAME], proc.stderr[-2000:]
    (record_path,) = dist.rglob("*.build.json")
    return wheels[0], json.loads(record_path.read_text())


def test_bundle_is_one_wheel_for_every_python(bundle_build):
    wheel, record = bundle_build
    assert wheel.parent.name == "torch2.13" and wheel.parent.parent.name == "cpu"
    assert record["row"]["python"] == "3.11" and record["row"]["bundle_pythons"] == list(PYTHONS)
    assert record["row"]["release_tag"] == "wheelhouse-fixture-0.1.0-cpu-py3.10-3.11-3.12-3.13-torch2.13.0"
    assert record["toolchain"]["python_version"] == "3.11" and record["toolchain"]["torch"].startswith("2.13.0")
    assert record["checks"]["ok"] is True and record["checks"]["pythons"] == list(PYTHONS)
    with zipfile.ZipFile(wheel) as zf:
        modules = sorted(n for n in zf.namelist() if n.endswith(".so"))
    assert modules == [f"{MODULE}.cpython-{v.replace('.', '')}-x86_64-linux-gnu.so" for v in PYTHONS]
    assert record_problems(wheel) == []
    report = check_wheels([wheel], torch_target=record["toolchain"]["python"], pythons=PYTHONS)
    assert report.ok, report.problems
    (result,) = report.wheels
    assert result.coverage.claimed_pythons == PYTHONS
    assert sorted(e.member for e in result.abi.elves) == modules and all(e.needed > 0 for e in result.abi.elves)


def _without(wheel: Path, member: str, out_dir: Path) -> Path:
    """A copy of ``wheel`` (same name) without ``member``, its RECORD rewritten to match."""
    out_dir.mkdir()
    copy = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == member:
                continue
            if info.filename.endswith(".dist-info/RECORD"):
                rows = [row for row in csv.reader(io.StringIO(data.decode())) if row and row[0] != member]
                buffer = io.StringIO()
                csv.writer(buffer, lineterminator="\n").writerows(rows)
                data = buffer.getvalue().encode()
            dst.writestr(info, data)
    return copy


def test_a_missing_module_fails_naming_the_python_and_the_module(bundle_build, tmp_path):
    wheel, record = bundle_build
    member = f"{MODULE}.cpython-312-x86_64-linux-gnu.so"
    broken = _without(wheel, member, tmp_path / "broken")
    assert record_problems(broken) == []  # a well-formed wheel; only its coverage is wrong
    report = check_wheels([broken], torch_target=record["toolchain"]["python"], pythons=PYTHONS)
    assert not report.ok
    assert report.problems == (
        f"{WHEEL_NAME}: module {MODULE} has no build for Python 3.12 (expected {member})",)


def test_the_bundle_installs_and_runs_in_311(bundle_build, tmp_path):
    wheel, _ = bundle_build
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), str(wheel)], check=True)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", RUN_OP], env={**os.environ, "PYTHONPATH": str(target)},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, torch_version, module, result = proc.stdout.strip().split(" ", 3)
    assert (version, module, result) == ("3.11", "_C.cpython-311-x86_64-linux-gnu.so", "[1.0, 3.0, 5.0]")
    assert torch_version.startswith("2.13.0")


def _torch_211_param():
    cached = sorted(TORCH_WHEELS.glob("torch-2.11.0-cp311-cp311-manylinux*_x86_64.whl"))
    if cached:
        return pytest.param(cached[0], id="cached-torch-2.11.0")
    return pytest.param(None, id="download-torch-2.11.0", marks=[pytest.mark.network, pytest.mark.slow])


@pytest.mark.parametrize("torch_wheel", [_torch_211_param()])
def test_modules_built_against_another_torch_are_named_with_their_symbols(bundle_build, torch_wheel):
    """Against torch 2.11 every per-Python module is reported, with the c10 symbol 2.11 does not export."""
    if torch_wheel is None:
        TORCH_WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "torch==2.11.0",
                        "-d", str(TORCH_WHEELS)], check=True)
        torch_wheel = sorted(TORCH_WHEELS.glob("torch-2.11.0-cp311-cp311-manylinux*_x86_64.whl"))[0]
    wheel, _ = bundle_build
    report = check_wheels([wheel], torch_target=torch_wheel, pythons=PYTHONS)
    assert not report.ok
    assert len(report.problems) == len(PYTHONS)
    for version in PYTHONS:
        member = f"{MODULE}.cpython-{version.replace('.', '')}-x86_64-linux-gnu.so"
        (problem,) = [p for p in report.problems if p.startswith(f"{WHEEL_NAME}: {member} ")]
        assert problem.startswith(f"{WHEEL_NAME}: {member} needs 1 symbol(s) that torch 2.11.0"), problem
        assert "c10::ValueError::ValueError(c10::SourceLocation, std::__cxx11::basic_string<" in problem
        assert problem.endswith("rebuild against that torch")
    symbol = "_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    missing = {e.member: [m.mangled for m in e.missing] for e in report.wheels[0].abi.elves}
    assert missing == {f"{MODULE}.cpython-{v.replace('.', '')}-x86_64-linux-gnu.so": [symbol] for v in PYTHONS}


# --- slow: the torch extension in every Python, against torch 2.13.0 installed there ----------------------


def _torch_venv(version: str, python: Path) -> Path:
    """A venv of ``version`` with torch 2.13.0 from pip's configured index, made once under .cache/."""
    venv = TORCH_VENVS / f"py{version}"
    venv_python = venv / "bin" / "python"
    probe = [str(venv_python), "-W", "ignore", "-c", "import torch; print(torch.__version__)"]
    if venv_python.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip().startswith("2.13.0"):
            return venv_python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    # The index's torch 2.13.0 is the CUDA build; it imports without a GPU only with its nvidia-* libraries,
    # so the whole set is installed once (several GB) and the venv reused afterwards.
    proc = subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "torch==2.13.0"], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.fail(f"torch 2.13.0 does not install for Python {version}: {proc.stderr.strip()[-600:]}")
    return venv_python


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_the_bundle_runs_in_every_python_against_torch_213(bundle_build, interpreters, version, tmp_path):
    wheel, _ = bundle_build
    venv_python = _torch_venv(version, interpreters[version])
    target = tmp_path / "site"
    subprocess.run([str(venv_python), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), str(wheel)], check=True)
    proc = subprocess.run([str(venv_python), "-W", "ignore", "-c", RUN_OP],
                          env={**os.environ, "PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(proc.stdout.strip())
    got_version, torch_version, module, result = proc.stdout.strip().split(" ", 3)
    assert got_version == version and torch_version.startswith("2.13.0")
    assert module == f"_C.cpython-{version.replace('.', '')}-x86_64-linux-gnu.so"
    assert result == "[1.0, 3.0, 5.0]"
