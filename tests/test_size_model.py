"""Wheel sizes planned before the build (ci/timing/size_model.py): the data file is what its command writes from
benchmarks/device_results.json, every real row gets a size, and a row whose asset would pass the budget is
refused in one line before anything is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.base.errors import ConfigError
from ci.building import job
from ci.model import matrix
from ci.model.versions import load
from ci.timing import data_files, size_model

REPO = Path(__file__).resolve().parent.parent


def test_the_data_file_is_what_its_command_writes_from_the_device_results() -> None:
    written = size_model.document(json.loads(data_files.DEVICE_RESULTS.read_text()))
    assert json.loads(size_model.SIZES_FILE.read_text()) == written
    hadamard = written["projects"]["fast-hadamard-transform"]
    # two arch counts (1 and 9, built on the GPU machine): a base and a per-arch cubin share
    assert hadamard["scales_with"] == "archs" and hadamard["base"] + 9 * hadamard["per_unit"] == pytest.approx(
        47896880, rel=0.01)
    assert written["projects"]["deep-gemm"]["scales_with"] == "pythons"  # one _C per bundled Python
    assert written["projects"]["megatron-bridge"] == {**written["projects"]["megatron-bridge"], "scales_with": "nothing",
                                                      "per_unit": 0}
    jit = written["projects"]["flashinfer-jit-cache"]
    assert jit["scales_with"] == "compiles" and jit["per_unit"] == 7008618 // 52  # 11 modules, 52 sm_90a compiles


def test_each_component_counts_from_the_newest_sweep_that_built_it_in_full_and_reduced_builds_are_left_out() -> None:
    def sweep(commit: str, apex_bytes: int, te_build: str) -> dict:
        return {"commit": commit, "components": {
            "apex": {"archs": "9.0", "build": "passed",
                     "wheels": [{"name": "apex-0.1-cp312-cp312-linux_x86_64.whl", "bytes": apex_bytes}]},
            "flash-attention": {"archs": "9.0", "build": "passed", "reduced": "every unit with -DFLASHATTENTION_...",
                                "wheels": [{"name": "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", "bytes": 7}]},
            "megatron-bridge": {"archs": None, "build": "passed",
                                "wheels": [{"name": "megatron_bridge-0.5.2-py3-none-any.whl", "bytes": 5}]},
            "transformer-engine": {"archs": "9.0", "build": te_build, "wheels": [
                {"name": "transformer_engine-2.16.1-cp312-cp312-linux_x86_64.whl", "bytes": 20}] * (te_build == "passed")}}}

    found = size_model.measurements({"sweeps": [sweep("aaaaaaa1", 1000, "passed"),
                                                sweep("bbbbbbb2", 900, "stopped at the sweep's deadline")]})
    assert [(m.project, m.bytes, m.archs, m.where) for m in found] == [
        ("apex", 900, 1, "sweep bbbbbbb: apex"), ("megatron-bridge", 5, 0, "sweep bbbbbbb: megatron-bridge"),
        ("transformer-engine", 20, 1, "sweep aaaaaaa: transformer-engine")]  # the newer sweep stopped before it ended


def test_one_build_is_all_per_unit_and_a_falling_fit_is_the_mean() -> None:
    one = [size_model.Measured("p", "p-1-cp312-cp312-linux_x86_64.whl", 100, 2, 1, 0, "x")]
    assert size_model.fit(one) == {"scales_with": "archs", "base": 0, "per_unit": 50}
    falling = [size_model.Measured("p", "w", 100, 1, 1, 0, "x"), size_model.Measured("p", "w", 90, 3, 1, 0, "x")]
    assert size_model.fit(falling) == {"scales_with": "archs", "base": 95, "per_unit": 0}


def test_a_fit_below_zero_goes_through_zero_at_its_steepest_build_so_none_is_predicted_short() -> None:
    """TransformerEngine's 10.0 brings 100a and 103a kernels of its own: 1 arch 21 MB, 3 archs 113 MB. The least
    squares line crosses zero below 0 bytes; the mean ratio (52 MB per arch) would predict its 3-arch wheel 43 MB
    short."""
    te = [size_model.Measured("te", "w", 20_970_000, 1, 1, 0, "sweep"),
          size_model.Measured("te", "w", 21_600_000, 1, 1, 0, "earlier"),
          size_model.Measured("te", "w", 113_480_209, 3, 1, 0, "all_archs")]
    fitted = size_model.fit(te)
    assert fitted == {"scales_with": "archs", "base": 0, "per_unit": 37_826_737}  # rounded up
    assert all(fitted["base"] + fitted["per_unit"] * p.archs >= p.bytes for p in te)


def test_a_wheel_the_checks_refused_still_counts_its_bytes() -> None:
    row = {"component": "transformer-engine", "requested_archs": "8.0;9.0;10.0", "wheels": [],
           "refused_wheel": {"wheel": "transformer_engine-2.16.1-cp312-cp312-linux_x86_64.whl", "bytes": 113480209}}
    found = size_model.measurements({"all_archs": {"rows": [row]}})
    assert [(m.project, m.bytes, m.archs, m.where) for m in found] == [
        ("transformer-engine", 113480209, 3, "all_archs: transformer-engine")]


def test_every_real_row_with_a_measured_wheel_is_sized_and_fits() -> None:
    """A component none of whose wheels was measured yet is "not measured yet" (a state, as "not timed yet")."""
    versions = load()
    projects = json.loads(size_model.SIZES_FILE.read_text())["projects"]
    for row in matrix.expand(versions):
        sizes = size_model.predict(row)
        assert not sizes.over_budget, sizes.describe()
        measured = [a for a in sizes.assets if a.bytes is not None]
        if not any(name in projects for name in (a.name for a in sizes.assets)):
            assert not measured and sizes.short() == "not measured yet", row.label
            continue
        assert measured, f"{row.label}: no wheel sized"
    (x86,) = [r for r in matrix.expand(versions) if r.component == "flashinfer" and r.arch == "x86_64"]
    assets = {a.name: a for a in size_model.predict(x86).assets}
    providers = {name: a.bytes for name, a in assets.items() if name.startswith("flashinfer-jit-cache-")}
    assert sorted(providers) == ["flashinfer-jit-cache-sm100a", "flashinfer-jit-cache-sm120f",
                                 "flashinfer-jit-cache-sm80", "flashinfer-jit-cache-sm90a"]
    per_compile = json.loads(size_model.SIZES_FILE.read_text())["projects"]["flashinfer-jit-cache"]["per_unit"]
    assert providers["flashinfer-jit-cache-sm90a"] == 4226 * per_compile  # the row's list: 4226 sm_90a compiles
    # one wheel of all four would be 1.73 GiB, 170 MiB under the budget; the largest provider is 543 MiB
    assert sum(providers.values()) > 1.7 * 2**30 and max(providers.values()) < 0.6 * 2**30
    assert assets["flashinfer-cubin"].bytes is None and "rehosted" in assets["flashinfer-cubin"].how


def _heavy_attention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The size data with flash-attn's cubins 600 MiB per arch: four archs no longer fit one asset."""
    data = json.loads(size_model.SIZES_FILE.read_text())
    data["projects"]["flash-attn"]["per_unit"] = 600 * 2**20
    heavy = tmp_path / "wheel_sizes.json"
    heavy.write_text(json.dumps(data))
    monkeypatch.setattr(size_model, "SIZES_FILE", heavy)


def test_a_plan_with_an_asset_past_the_budget_is_refused_in_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _heavy_attention(tmp_path, monkeypatch)
    versions = load()
    row = next(r for r in matrix.expand(versions) if r.component == "flash-attention" and r.arch == "x86_64")
    with pytest.raises(ConfigError) as refused:
        job.plan(versions, row, job.BuildOptions(cache_dir=REPO / ".cache"))
    assert str(refused.value) == (
        "versions.yaml: components.flash-attention: flash-attention (x86_64 cu13.0.2 py3.11 torch2.13.0): flash-attn "
        "would be 2.34 GiB (1 build(s), 4 archs), past the 1.90 GiB a release asset may take (GitHub refuses 2 GiB); "
        "build fewer archs into one wheel: drop some from torch_cuda_arch_list (arch_overrides per CPU arch), or split "
        "the component into one component per arch family")
    # the same row with the aarch64 list (two archs) fits, and job.run refuses before it fetches anything
    aarch64 = next(r for r in matrix.expand(versions) if r.component == "flash-attention" and r.arch == "aarch64")
    assert not size_model.predict(aarch64).over_budget
    with pytest.raises(ConfigError, match=r"past the 1\.90 GiB"):
        job.run(versions, row, job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist"))
    assert not (tmp_path / "cache").exists()


def test_invoke_matrix_and_the_dry_run_show_the_sizes_beside_the_time() -> None:
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(REPO / "versions.yaml")}
    shown = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--component", "flashinfer"], cwd=REPO, env=env,
                           capture_output=True, text=True, check=True).stdout
    first = shown.splitlines()[0]
    assert "h (fits)" in first and "GiB in 7, largest 543 MiB (fits)" in first
    versions = load()
    row = next(r for r in matrix.expand(versions) if r.component == "flashinfer" and r.arch == "x86_64")
    text = job.plan(versions, row, job.BuildOptions(cache_dir=REPO / ".cache")).render()
    assert "  wheel sizes:    flashinfer-python " in text and "flashinfer-jit-cache-sm90a 543 MiB (4226 compiles" in text
