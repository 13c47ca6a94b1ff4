"""The benchmark runner's machinery on toy sizes (a few seconds; measures nothing meaningful).

Figure 6 (a real extension build, about a minute) is left out; everything else runs end to end:
the GitHub test server as a process and in process, the anchor's baselines, the peak-RSS wrapper,
uv against the counting server, and the RESULTS.md writer with ``--only`` merging. Figure 11 in toy
mode rebuilds only its pure-Python project (a real build twice, a few seconds), not the fixture extension.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.anchor import cuda_archs, generate_matrix
from benchmarks.common import Samples, cuda_wheel, ratio
from benchmarks.runner import main
from ci.model import matrix
from ci.model.versions import load

TOY_FIGURES = "listing,skip-plan,strip,fatbin-scan,resolution,crafted-wheels,pacing,rebuilds"


def test_runner_toy_run_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    assert main(["--toy", "--only", TOY_FIGURES, "--out", str(out), "--cache", str(tmp_path / "cache")]) == 0
    text = out.read_text()
    for title in ("1. Index listing", "2. Skip plan", "3. Local-version strip", "4. Fatbin arch scan",
                  "5. Resolution bytes", "7. Wheel checks on crafted wheels", "8. Write pacing",
                  "11. Rebuilds, byte for byte"):
        assert f"## {title}" in text
    assert "| CPU |" in text and "| cores |" in text and "| Python |" in text and "| date |" in text
    assert "**Repetitions:**" in text and "min / median" in text
    rows = len(matrix.expand(load()))
    assert f"| rows skipped (of {rows}) | {rows} | {rows} |" in text  # both sides skip the complete matrix
    # the pure-Python project, really built twice here, is the same bytes
    (pure,) = [line for line in text.splitlines() if line.startswith("| tinypkg | this machine")]
    cells = pure.split(" | ")
    assert cells[2] == cells[3] and len(cells[2].strip("`")) == 12 and cells[4:6] == ["yes", "none"]
    assert "This figure failed" not in text
    assert not (tmp_path / "cache" / "work").exists()

    # --only keeps the other sections as they were
    before = text.split("<!-- figure:skip-plan -->")[1].split("<!-- /figure:skip-plan -->")[0]
    assert main(["--toy", "--only", "fatbin-scan", "--out", str(out), "--cache", str(tmp_path / "cache")]) == 0
    after = out.read_text()
    assert before in after and "## 4. Fatbin arch scan" in after


def test_unknown_figure_is_refused(capsys) -> None:
    assert main(["--only", "nope"]) == 2
    assert "unknown figure(s) nope" in capsys.readouterr().err


def test_the_results_file_gets_its_folder_and_an_impossible_one_is_refused_before_any_figure(
        tmp_path: Path, capsys) -> None:
    out = tmp_path / "new" / "folder" / "RESULTS.md"
    assert main(["--toy", "--only", "skip-plan", "--out", str(out), "--cache", str(tmp_path / "cache")]) == 0
    assert "## 2. Skip plan" in out.read_text()
    (tmp_path / "a-file").write_text("")
    capsys.readouterr()
    refused = tmp_path / "a-file" / "RESULTS.md"
    assert main(["--toy", "--only", "skip-plan", "--out", str(refused), "--cache", str(tmp_path / "cache")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: --out {refused}: its folder cannot be made") and "[skip-plan]" not in (
        captured.out + captured.err)


def test_synthetic_wheel_is_read_alike_by_both_scanners(tmp_path: Path) -> None:
    from ci.formats.fatbin import scan_wheel_archs

    wheel = cuda_wheel(tmp_path, name="demo", version="1.0+cu130", tags="cp311-cp311-linux_x86_64",
                       size=300_000, archs=["8.0", "9.0a", "12.0f"])
    assert cuda_archs.wheel_cuda_archs(str(wheel)) == ["12.0f", "8.0", "9.0a"]
    assert [str(a) for a in scan_wheel_archs(wheel, use_cuobjdump=False).cubin_archs] == ["8.0", "9.0a", "12.0f"]
    assert generate_matrix.parse_arch_list("8.0;9.0a 10.0+PTX,12.0f") == ["10.0", "12.0f", "8.0", "9.0a"]
    assert generate_matrix.wheel_arches("x-1-py3-none-any.whl", ["aarch64"]) == ["aarch64"]
    assert generate_matrix.wheel_arches("x-1-cp312-cp312-manylinux_2_28_aarch64.whl", ["x86_64"]) == []


def test_ratio_reports_median_and_min() -> None:
    assert ratio(Samples([4.0, 6.0, 8.0]), Samples([1.0, 2.0, 2.0])) == "3.0x (min 4.0x)"
    assert Samples([1.0, 3.0, 2.0]).fmt() == "1 / 2 s"


def test_cross_python_versions_file_loads(tmp_path: Path) -> None:
    """The cross-Python figure builds from a versions file of its own; versions.yaml's checks apply to it."""
    from benchmarks import cross_python
    from ci.model import matrix
    from ci.model.versions import load

    rows = matrix.expand(load(cross_python._versions_file(tmp_path)))
    assert {(r.component, r.python) for r in rows} >= {("wheelhouse-fixture", p) for p in cross_python.PYTHONS}


def test_the_recorded_gpu_machine_results_render_a_row_each() -> None:
    """benchmarks/device_results.json is written by hand from device output: every recorded run must still render."""
    import json

    from benchmarks import builds, cross_python
    from benchmarks.common import DEVICE_RESULTS

    data = json.loads(DEVICE_RESULTS.read_text())
    runs = data["causal_conv1d_two_venv_paths"]
    rows = cross_python.device_rows()
    assert len(rows) == len(runs) == len(cross_python.device_notes())
    for run, row in zip(runs, rows, strict=True):
        assert run["build"] in row[0] and row[3] == f"{run['second_s'] / run['first_s']:.2f}"
    for key in ("upstream_builds_2", "upstream_builds_3"):
        rendered = builds.upstream_rows_table(key, key)
        assert rendered is not None
        table, _ = rendered
        assert [row[0] for row in table.rows] == [row["component"] for row in data[key]["rows"]]


def test_every_repository_file_the_recorded_results_name_exists() -> None:
    """The notes of device_results.json are rendered into RESULTS.md: a file moved since must be renamed there too."""
    import re

    from benchmarks.common import DEVICE_RESULTS

    repo = DEVICE_RESULTS.parent.parent
    named = r"\b(?:ci|tests|benchmarks|build_scripts|patches|docs)/[\w/.-]+\.(?:py|sh|json|yaml|md)\b"
    for text in (DEVICE_RESULTS.read_text(), (repo / "benchmarks" / "RESULTS.md").read_text()):
        paths = set(re.findall(named, text))
        assert "ci/timing/time_model.py" in paths  # the pattern finds what both name
        assert [path for path in sorted(paths) if not (repo / path).exists()] == []


def test_the_recorded_rebuild_checks_render_and_a_missing_key_is_named(tmp_path: Path) -> None:
    """Figure 11's GPU-machine rows come from device_results.json's "rebuilds" runs, one row per component."""
    import json

    from benchmarks import rebuilds
    from benchmarks.common import DEVICE_RESULTS

    runs = rebuilds.device_runs()
    rows = rebuilds.device_rows(runs)
    recorded = [row for run in runs for row in run["rows"]]
    assert len(rows) == len(recorded) >= 2
    for row, data in zip(rows, recorded, strict=True):
        cells = row.cells()
        assert cells[0].startswith(data["component"]) and cells[2] == f"`{data['first_sha256'][:12]}`"
        assert row.identical == (data["first_sha256"] == data["second_sha256"] and not data["differences"])
        assert all(difference in cells[5] for difference in data["differences"])
    assert not any(row.identical for row in rows[:2])  # the 2026-12-02 run: nvcc's module ids differ

    broken = json.loads(DEVICE_RESULTS.read_text())
    del broken["rebuilds"][0]["rows"][1]["second_sha256"]
    path = tmp_path / "device_results.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(RuntimeError, match=r"rebuilds\[0\]\.rows\[1\] has no 'second_sha256'; add it"):
        rebuilds.device_runs(path)
    broken["rebuilds"][0]["rows"][1]["second_sha256"] = "109d5c738eec"
    path.write_text(json.dumps(broken))
    with pytest.raises(RuntimeError, match=r"rows\[1\]\.second_sha256 is '109d5c738eec'; write the wheel's full sha256"):
        rebuilds.device_runs(path)


def test_the_reuse_figure_reads_the_compile_commands_torch_writes(tmp_path: Path) -> None:
    """Figure 12 preprocesses each unit with the exact command torch's extension builder wrote into
    build.ninja: its rules' variables expanded, the dependency file, object and gencodes taken out, -E put in."""
    from benchmarks.python_reuse import compile_commands, preprocess_command

    ninja = tmp_path / "build.ninja"
    ninja.write_text(
        "ninja_required_version = 1.3\ncxx = c++\nnvcc = /usr/local/cuda/bin/nvcc\n"
        "cflags = -I/site/torch/include -I/py/include/python3.12\npost_cflags = -O3\n"
        "cuda_cflags = -I/site/torch/include\ncuda_post_cflags = -gencode=arch=compute_90,code=sm_90 --threads 2\n"
        "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n  depfile = $out.d\n"
        "rule cuda_compile\n  command = $nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out $cuda_post_cflags\n"
        "rule cuda_dlink\n  command = $nvcc $in -o $out\n"
        "build /b/a.o: compile /s/a.cpp\nbuild /b/k.o: cuda_compile /s/k.cu\nbuild /b/dlink.o: cuda_dlink /b/k.o\n")
    commands = compile_commands(ninja)
    assert sorted(commands) == ["/s/a.cpp", "/s/k.cu"]  # a link step is no unit
    assert preprocess_command(commands["/s/a.cpp"], "/s/a.cpp", Path("/o/a.i")) == [
        "c++", "-I/site/torch/include", "-I/py/include/python3.12", "-O3", "-E", "-P", "/s/a.cpp", "-o", "/o/a.i"]
    assert preprocess_command(commands["/s/k.cu"], "/s/k.cu", Path("/o/k.i")) == [
        "/usr/local/cuda/bin/nvcc", "-I/site/torch/include", "--threads", "2", "-arch=sm_90", "-E", "-Xcompiler", "-P",
        "/s/k.cu", "-o", "/o/k.i"]


def test_the_reuse_figure_quotes_a_failed_unit_without_the_machines_paths() -> None:
    """A unit that does not preprocess is named with the compiler's first error line, the paths in it cut to the
    file they name: the figure is published, the build machine's folders are no part of it."""
    from benchmarks.python_reuse import _first_error

    stderr = ("In file included from i.cpp:3:\n/home/u/repo/.cache/bench/work/flash-mla-py3.11/csrc/cutlass/include/"
              "cutlass/cutlass.h:43:35: fatal error: cuda/std/utility: No such file or directory\n   43 | #define X\n")
    assert _first_error(stderr) == "cutlass.h:43:35: fatal error: cuda/std/utility: No such file or directory"
