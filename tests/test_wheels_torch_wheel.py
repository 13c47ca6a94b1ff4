"""The publish job's torch: the row's torch wheel downloaded by real pip from a (local) index, read in place."""

from __future__ import annotations

import sys
from pathlib import Path

from index_helpers import client_env, run
from stand_in_torch import torch_wheel
from wheel_factory import REPO, build_wheel, host_shared_object

VERSIONS = """\
build_matrix:
  - {{arch: {arch}, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE", torch_index: "{index}"}}
components:
  wheelhouse-fixture:
    source: {{path: tests/fixtures/fixture_ext}}
    ref: "0.1.0"
    builder: fixture
    wheel_packages: [wheelhouse-fixture]
    runs_on: ubuntu-24.04
"""


def _index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index in a directory, as pip reads one over file://."""
    (root / "torch").mkdir(parents=True)
    links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in wheels)
    (root / "torch" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.as_uri()


def _download(tmp_path: Path, arch: str, index: str) -> tuple[int, str, str]:
    versions = tmp_path / "versions.yaml"
    versions.write_text(VERSIONS.format(arch=arch, index=index))
    env = {**client_env(tmp_path), "WHEELHOUSE_VERSIONS": str(versions), "PYTHONPATH": str(REPO)}
    result = run([sys.executable, "-m", "ci", "torch-wheel", "--component", "wheelhouse-fixture", "--python", "3.11",
                  "--torch", "2.13.0", "--arch", arch, "--dest", str(tmp_path / "torch")], env)
    return result.returncode, result.stdout.strip(), result.stderr.strip()


def test_the_rows_torch_wheel_is_downloaded_for_its_python_and_arch_and_checked_in_place(tmp_path: Path) -> None:
    # both arches on offer, and another Python's: pip picks the row's, whatever this machine is
    offered = [torch_wheel(tmp_path / "offered", tags=f"{py}-{py}-manylinux_2_28_{arch}")
               for py in ("cp311", "cp312") for arch in ("x86_64", "aarch64")]
    index = _index(tmp_path / "simple", offered)
    rc, out, err = _download(tmp_path, "aarch64", index)
    assert rc == 0, err
    assert Path(out) == tmp_path / "torch" / "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    assert Path(out).read_bytes() == offered[1].read_bytes()

    from ci.checks.check import check_wheels

    wheel = build_wheel(tmp_path / "w", {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes()})
    (problem,) = check_wheels([wheel], torch_target=out).problems
    assert problem.startswith(f"{wheel.name}: demo_pkg/_C.cpython-311-x86_64-linux-gnu.so needs 1 symbol(s) that "
                              f"torch 2.13.0 (torch wheel {Path(out).name}) does not export: c10::needs_string(")


def test_a_torch_the_index_lacks_is_one_line(tmp_path: Path) -> None:
    index = _index(tmp_path / "simple", [torch_wheel(tmp_path / "offered", tags="cp312-cp312-manylinux_2_28_x86_64")])
    rc, out, err = _download(tmp_path, "x86_64", index)
    assert rc == 1 and out == "" and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("error: wheelhouse-fixture (x86_64 cu13.0.2 py3.11 torch2.13.0): could not download "
                          f"torch==2.13.0 for Python 3.11 (x86_64) from {index}: ")
    assert err.endswith("; check the row's torch_index in versions.yaml")
