"""Build sessions: the plan of every session, a real fixture build through nox, and one-line failures."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from fixture_versions import without_smoke_test
from stamp_helpers import validate_cyclonedx

from ci.base import json_schema
from ci.base.errors import WheelhouseError
from ci.building import job, sbom, toolchain
from ci.checks import pin, toolkit
from ci.model import build_record, matrix
from ci.model.build_record import BuildRecord
from ci.model.versions import load

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
FAKE_TORCH = REPO / "tests" / "fixtures" / "fake_torch"
SNAPSHOTS = REPO / "tests" / "snapshots" / "plans"
NOX = [sys.executable, "-m", "nox"]


def nox(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*NOX, *args], cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=timeout)


# --- plans ----------------------------------------------------------------------------------------


def listed_sessions() -> list[str]:
    result = nox("-l")
    assert result.returncode == 0, result.stderr
    return re.findall(r"^[*-] (\S+)", result.stdout, flags=re.M)


def test_nox_lists_the_promised_sessions():
    names = set(listed_sessions())
    for expected in ("build-flash-mla-3.12", "build-fast-hadamard-transform-3.11", "build-deep-gemm-3.12",
                     "build-deep-gemm-3.11", "build-megatron-bridge-3.12", "tests", "lint", "demo"):
        assert expected in names
    assert "build-megatron-bridge-3.11" not in names
    assert "build-flashinfer-3.11" not in names


def test_a_components_pythons_build_in_the_order_of_cis_stages():
    """`nox -s build-<component>` builds every Python of this arch: the first of each (CUDA, torch) first,
    as the workflows' first stage, then the others, which start from its compiler cache."""
    result = nox("-s", "build-flash-mla", "--", "--dry-run", "--arch", "x86_64")
    assert result.returncode == 0, result.stderr[-2000:]
    order = re.findall(r"^(first|then): build plan for flash-mla \(x86_64 cu13.0.2 py(\S+) ", result.stdout, flags=re.M)
    assert order == [("first", "3.11"), ("then", "3.12")]
    refused = nox("-s", "build-flash-mla", "--", "--reuse-env", "--arch", "x86_64")
    assert refused.returncode != 0 and "--reuse-env builds in this one interpreter" in refused.stderr


def _normalise(text: str) -> str:
    text = text.replace(sys.executable, "<wheelhouse-python>")  # WHEELHOUSE_TOOLS_PYTHON, python or python3
    text = text.replace(str(Path(sys.executable).parent), "<venv-bin>")
    text = text.replace(str(REPO), "<repo>")
    text = re.sub(r"CUDA_HOME=\S+", "CUDA_HOME=<cuda-home>", text)
    text = re.sub(r"(WHEELHOUSE_REAL_NVCC=)\S+", r"\1<nvcc>", text)
    return text


def _plan_text(versions, row) -> str:
    """The plan as in a fresh checkout: an empty dist/ (a local build's record would feed the time model)."""
    environ = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda"}
    with tempfile.TemporaryDirectory() as empty:
        options = job.BuildOptions(cache_dir=REPO / ".cache", dist_root=Path(empty) / "dist", environ=environ)
        text = job.plan(versions, row, options).render().replace(str(Path(empty) / "dist"), str(REPO / "dist"))
    return _normalise(text) + "\n"


def _real_rows():
    versions = load()
    return [(versions, row) for row in matrix.expand(versions)]


@pytest.mark.parametrize("versions,row", _real_rows(), ids=lambda v: getattr(v, "release_tag", "") + "-" + getattr(v, "arch", ""))
def test_plan_snapshot_of_every_real_row(versions, row):
    """The full plan (venv, torch install, source, env, command) of every real row, pinned. A row without a
    snapshot yet (a new component, a new build_matrix row) gets one written here, to review and commit, except in
    CI (``CI`` set, as GitHub Actions sets it), where a row must come with its snapshot."""
    text = _plan_text(versions, row)
    snapshot = SNAPSHOTS / f"{row.release_tag}-{row.arch}.txt"
    new = not snapshot.is_file() and os.environ.get("CI", "") in ("", "0", "false")
    if os.environ.get("WHEELHOUSE_UPDATE_SNAPSHOTS") == "1" or new:
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.write_text(text)
    if new:
        warnings.warn(f"wrote {snapshot.relative_to(REPO)}, the plan of a new row: review and commit it", stacklevel=1)
    assert snapshot.is_file(), (f"no snapshot {snapshot.relative_to(REPO)}: write it with WHEELHOUSE_UPDATE_SNAPSHOTS=1 "
                                "python -m pytest tests/test_build.py -k test_plan_snapshot_of_every_real_row, review "
                                "and commit it")
    assert text == snapshot.read_text()


def test_every_listed_build_session_dry_runs():
    # one session per (component, Python); build-<component> (every Python of it) is tested on its own below
    listed = [name for name in listed_sessions() if name.startswith("build-") and re.search(r"-\d+\.\d+$", name)]
    assert sorted(listed) == sorted({f"build-{row.component}-{row.python}" for row in matrix.session_rows(load())})
    for session in listed:
        result = nox("-s", session, "--", "--dry-run", "--arch", "x86_64")
        assert result.returncode == 0, f"{session}: {result.stderr[-500:]}"
        assert "build plan for" in result.stdout and "command:" in result.stdout, session


def test_deep_gemm_plan_bundles_both_pythons():
    result = nox("-s", "build-deep-gemm-3.12", "--", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "--index-url https://download.pytorch.org/whl/cu130 --index-strategy unsafe-best-match -- torch==2.13.0 torchvision==0.28.0 torchaudio==2.11.0" in result.stdout
    assert "bundle:         one wheel for Pythons 3.11, 3.12" in result.stdout
    assert "WHEELHOUSE_BUNDLE_PYTHONS=3.11 3.12" in result.stdout


def test_torch_index_precedence():
    versions = load()
    row = matrix.expand(versions)[0]
    assert toolchain.torch_index(row) == "https://download.pytorch.org/whl/cu130"
    assert toolchain.torch_index(row, "https://mirror.example/whl") == "https://mirror.example/whl"
    assert toolchain.torch_index(row, "default") is None


def test_fake_torch_answers_like_the_real_one():
    """The stand-in answers the probe with the same keys and types as the installed torch."""
    real = toolchain.probe(sys.executable)
    fake_env = {**os.environ, "PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_VERSION": real["torch"]}
    fake = json.loads(subprocess.run([sys.executable, "-c", toolchain._PROBE], capture_output=True, text=True,
                                     env=fake_env).stdout)
    assert set(fake) == set(real)
    assert {k: type(v) for k, v in fake.items() if v is not None} == {k: type(v) for k, v in real.items() if v is not None}
    assert fake["torch"] == real["torch"] and fake["cxx11_abi"] == real["cxx11_abi"]


# --- a real build through the session -------------------------------------------------------------


def test_fixture_builds_through_the_nox_session(tmp_path):
    dist = tmp_path / "dist"
    result = nox("-s", "build-wheelhouse-fixture-3.11", "--", "--dist", str(dist),
                 env={"WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)})
    assert result.returncode == 0, result.stderr[-2000:]
    world = dist / "cpu" / "torch2.13"
    (wheel,) = world.glob("*.whl")
    assert wheel.name == "wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl"
    assert (world / f"{wheel.name}.metadata").read_text().startswith("Metadata-Version:")
    record_path = world / "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0-x86_64.build.json"
    record = json.loads(record_path.read_text())
    # the record the build wrote satisfies its schema, reads back whole and is written again byte for byte
    assert json_schema.problem(record, build_record.SCHEMA_FILE) is None
    assert BuildRecord.read(record_path).to_json() == record_path.read_text()
    # its _C links torch: the published wheel and its sidecar pin the row's torch line
    assert pin.read_torch_pin(wheel) == "==2.13.*"
    assert pin.torch_pin_of((world / f"{wheel.name}.metadata").read_bytes()) == "==2.13.*"
    # and it carries a valid CycloneDX SBOM, listed in RECORD, written from what the record keeps
    validate_cyclonedx(sbom.read_document(wheel))
    summary = sbom.read_sbom(wheel)
    assert summary.source_revision == record["source"]["revision"] == record["sbom"]["source"]["revision"]
    assert summary.torch["version"] == record["toolchain"]["torch"] and summary.torch_pin == "torch==2.13.*"
    assert record["checks"]["ok"] is True
    assert record["toolchain"]["torch"].startswith("2.13.0")
    assert record["wheels"][0]["name"] == wheel.name
    assert set(record["durations"]) >= {"toolchain_s", "source_s", "build_s", "checks_s", "smoke_s", "total_s"}
    # the wheel installed into a fresh venv with the row's torch, its operation run (ci/building/smoke.py)
    smoked = record["checks"]["smoke_test"]
    assert smoked["ok"] and "scaled_add" in smoked["commands"][0] and smoked["driver"] == "none (a CPU row)"
    # the build's own sccache server, read before it stopped: the binding's compile at least
    stats = record["compiler_cache_stats"]
    assert stats["requests"] >= 1 and stats["hits"] + stats["misses"] >= 1, stats
    assert f"compiler cache: {stats['requests']} compile requests, {stats['hits']} hits" in result.stderr
    # and names each translation unit it compiled afresh (fixture.cpp includes Python's headers: never reused
    # by another Python; here it may come from the cache of an earlier build of this Python)
    assert record["compiler_cache_misses"] in ([], ["fixture"]), record
    # torch's extension builder compiles through ninja where there is one: its log outlives the build directory
    steps = record["ninja_steps"]
    if shutil.which("ninja"):
        assert steps["steps"] >= 1 and all(s["output"].endswith(".o") for s in steps["slowest"]), steps
        assert "slowest of" in result.stderr
    else:
        assert steps == {"steps": 0, "slowest": []}


# --- failures: one line, non-zero, nothing in dist/ ------------------------------------------------


def _git_versions(tmp_path: Path, ref: str) -> Path:
    upstream = tmp_path / "upstream"
    subprocess.run(["git", "init", "-q", str(upstream)], check=True)
    (upstream / "README").write_text("x\n")
    subprocess.run(["git", "-C", str(upstream), "add", "."], check=True)
    subprocess.run(["git", "-C", str(upstream), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True)
    text = FIXTURE_VERSIONS.read_text().replace(
        "source: {path: tests/fixtures/fixture_ext}", f"source: {{git: \"file://{upstream}\"}}"
    ).replace('ref: "0.1.0"', f"ref: {ref}")
    path = tmp_path / "versions.yaml"
    path.write_text(text)
    return path


def _cuda_versions(tmp_path: Path, cuda: str) -> Path:
    text = FIXTURE_VERSIONS.read_text().replace("cuda: cpu", f'cuda: "{cuda}"')
    path = tmp_path / "versions.yaml"
    path.write_text(text)
    return path


FAILURES = {
    "wrong-torch": (
        lambda tmp: FIXTURE_VERSIONS, ["--reuse-env"],
        {"PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_VERSION": "2.11.0"},
        r"has torch 2\.11\.0 but the row wants 2\.13\.0; install torch==2\.13\.0 there or drop --reuse-env",
    ),
    "missing-nvcc": (
        lambda tmp: _cuda_versions(tmp, "13.0.2"), ["--reuse-env"],
        {"PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_CUDA": "13.0", "CUDA_HOME": "/nonexistent-cuda"},
        r"CUDA_HOME=/nonexistent-cuda has no bin/nvcc; install the CUDA 13\.0 toolkit and point CUDA_HOME at it",
    ),
    "torch-cuda-mismatch": (
        lambda tmp: _cuda_versions(tmp, "13.0.2"), ["--reuse-env"],
        {"PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_CUDA": "12.8"},
        r"has torch built for CUDA 12\.8 but the row wants CUDA 13\.0",
    ),
    "nvcc-mismatch": (
        lambda tmp: _cuda_versions(tmp, "12.9.1"), ["--reuse-env"],
        {"PYTHONPATH": str(FAKE_TORCH), "FAKE_TORCH_CUDA": "12.9", "CUDA_HOME": "/usr/local/cuda"},
        r"/usr/local/cuda/bin/nvcc is CUDA 13\.0 but the row wants CUDA 12\.9; point CUDA_HOME at a CUDA 12\.9 toolkit",
    ),
    "unknown-ref": (
        lambda tmp: _git_versions(tmp, "v9.9.9"), ["--reuse-env"], {},
        r"components\.wheelhouse-fixture\.ref: 'v9\.9\.9' not found in file://\S+; use an existing branch, tag or commit",
    ),
    "missing-source-dir": (
        lambda tmp: FIXTURE_VERSIONS, ["--reuse-env", "--source", "/nonexistent/checkout"], {},
        r"--source /nonexistent/checkout: not a directory; pass the path of a source checkout",
    ),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_build_failure_is_one_line_and_leaves_dist_empty(tmp_path, case):
    if case == "nvcc-mismatch" and not Path("/usr/local/cuda/bin/nvcc").is_file():
        pytest.skip("needs the CUDA 13.0 toolkit in /usr/local/cuda")
    make_versions, args, env, pattern = FAILURES[case]
    env = dict(env)
    settings = {key: env.pop(key) for key in list(env) if key.startswith("FAKE_TORCH_")}
    if settings:  # the probe gets an allow-listed environment: the fake torch reads its answers from a file
        env["PYTHONPATH"] = str(shutil.copytree(FAKE_TORCH, tmp_path / "fake_torch"))
        (tmp_path / "fake_torch" / "settings.json").write_text(json.dumps(settings))
    dist = tmp_path / "dist"
    result = nox("-s", "build-wheelhouse-fixture-3.11", "--", *args, "--dist", str(dist),
                 env={"WHEELHOUSE_VERSIONS": str(make_versions(tmp_path)), **env})
    assert result.returncode != 0
    aborted = [line for line in result.stderr.splitlines() if "aborted:" in line]
    assert len(aborted) == 1, result.stderr[-1500:]
    assert re.search(pattern, aborted[0]), aborted[0]
    assert "Traceback" not in result.stderr
    assert not dist.exists() or not any(dist.rglob("*"))


def test_repair_setting_gives_a_manylinux_wheel(tmp_path):
    """`repair: manylinux_2_34` runs auditwheel repair before the checks (torch libraries excluded)."""
    versions_file = tmp_path / "versions.yaml"
    versions_file.write_text(FIXTURE_VERSIONS.read_text().replace("max_jobs: 2", "max_jobs: 2\n    repair: manylinux_2_34"))
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    result = job.run(versions, row, job.BuildOptions(cache_dir=REPO / ".cache", dist_root=tmp_path / "dist"))
    (wheel,) = result.wheels
    assert wheel.name == "wheelhouse_fixture-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    record = json.loads(result.record.read_text())
    assert record["checks"]["ok"] is True and record["wheels"][0]["name"] == wheel.name
    assert not (tmp_path / "dist" / "cpu" / "torch2.13" / "wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl").exists()


def test_builder_path_without_a_compiler_cache_or_arch_filter(tmp_path):
    """A machine with neither sccache nor ccache (the GPU machine) still gets a PATH, venv first."""
    venv_python = tmp_path / "venv" / "bin" / "python"
    assert job.builder_path(None, venv_python, None, "/usr/bin:/bin") == f"{venv_python.parent}:/usr/bin:/bin"
    assert job.builder_path(tmp_path / "filter", venv_python, "/opt/cache/bin/sccache", "") == \
        f"{tmp_path / 'filter'}:{venv_python.parent}:/opt/cache/bin"


def test_cuda_home_of_an_nvcc_wrapper_is_the_toolkit_it_runs(tmp_path):
    """An nvcc on PATH that is a wrapper script (/usr/local/bin/nvcc exec'ing the toolkit's) has no headers
    beside it; the toolkit is the one nvcc names itself."""
    kit = tmp_path / "cuda-13.0"
    (kit / "bin").mkdir(parents=True)
    (kit / "include").mkdir()
    (kit / "include" / "cuda_runtime.h").write_text("")
    real = kit / "bin" / "nvcc"
    real.write_text(f'#!/bin/sh\necho "#$ TOP={kit}/bin/.." >&2\n')
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    for script in (real, wrapper):
        script.chmod(0o755)
    assert toolkit.cuda_home(wrapper) == kit
    assert toolkit.cuda_home(real) == kit


def test_a_cxx_that_links_libstdcxx_statically_is_refused_before_the_build(tmp_path):
    """The GPU machine's CXX wrapper linked libstdc++ statically; the extensions it made crashed in std::regex."""
    wrapper = tmp_path / "g++-static"
    wrapper.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "CXX": str(wrapper)}
    with pytest.raises(WheelhouseError) as info:
        toolchain.check_cxx(env)
    assert str(info.value) == (
        f"CXX={wrapper} links libstdc++ statically (its shared libraries do not need libstdc++.so.6); extensions "
        "built with it crash beside torch's shared libstdc++: point it at a compiler that links it dynamically, "
        "e.g. the system g++ (CC, CXX and CUDAHOSTCXX alike)")
    assert toolchain.check_cxx({**os.environ, "CXX": "g++"}) == "g++"
    assert toolchain.check_cxx({**os.environ, "CXX": "/nonexistent/g++"}) is None  # pure-Python builds need none
    # The GPU machine also exports CUDAHOSTCXX=<the wrapper>, which CMake hands nvcc for the kernels' host code
    with pytest.raises(WheelhouseError) as info:
        toolchain.check_cxx({**os.environ, "CXX": "g++", "CUDAHOSTCXX": str(wrapper)})
    assert str(info.value).startswith(f"CUDAHOSTCXX={wrapper} links libstdc++ statically")


def _stamped_row_venv(cache: Path, row) -> Path:
    """A row venv as prepare_venv leaves it, made in a second: a bare venv that finds this venv's torch."""
    venv = cache / "venvs" / toolchain.venv_key(row, None)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{row.python}" / "site-packages"
    (site / "tool_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / ".wheelhouse-ready").write_text("{}\n")
    return venv


def test_build_code_gets_no_credential_and_cannot_change_its_interpreter(tmp_path, caplog):
    """Third-party build code gets an allow-listed environment: no token under any name, no URL credentials;
    pass_env lets a named variable through as it is. A .pth it drops into the row venv would run in every later
    use of that interpreter (the checks, the next builds): the build fails naming it, and the venv goes."""
    caplog.set_level(logging.INFO, logger="wheelhouse")

    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", src)
    leak, ran = tmp_path / "seen.json", tmp_path / "pth-ran.txt"
    (src / "setup.py").write_text(
        "import json, os, site\n"
        "open(os.environ['LEAK'], 'w').write(json.dumps(dict(os.environ)))\n"
        "open(os.path.join(site.getsitepackages()[0], 'zzz_hostile.pth'), 'w').write(\n"
        f"    \"import os; open({str(ran)!r}, 'a').write(str(os.environ.get('GITHUB_TOKEN')) + chr(10))\\n\")\n"
        "raise SystemExit(1)\n")
    secrets = {"GITHUB_TOKEN": "ghp_SECRET1", "GH_TOKEN": "ghp_SECRET2", "ACTIONS_RUNTIME_TOKEN": "SECRET3",
               "ACTIONS_ID_TOKEN_REQUEST_URL": "https://SECRET4", "TWINE_PASSWORD": "SECRET5",
               "AWS_SECRET_ACCESS_KEY": "SECRET6", "ANY_SERVICE_TOKEN": "SECRET7",
               # names a deny-list missed (adversarial re-run N6)
               "TOKEN": "tok_SECRET8", "GITHUB_PAT": "pat_SECRET9", "GH_PAT": "pat_SECRET10",
               "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.https://127.0.0.1/.extraheader",
               "GIT_CONFIG_VALUE_0": "AUTHORIZATION: basic git_SECRET11", "UV_INDEX_MIRROR_PASSWORD": "SECRET12"}
    urls = {"PIP_INDEX_URL": "https://u:pip_SECRET13@127.0.0.1:9/simple",
            "UV_EXTRA_INDEX_URL": "https://uv_SECRET14@127.0.0.1:9/simple"}
    environ = {**os.environ, **secrets, **urls, "MIRROR_PASSWORD": "allowed", "LEAK": str(leak),
               "SOME_UNLISTED_SETTING": "x"}
    versions_file = tmp_path / "versions.yaml"
    versions_file.write_text(FIXTURE_VERSIONS.read_text().replace(
        "max_jobs: 2", "max_jobs: 2\n    pass_env: [MIRROR_PASSWORD, LEAK]"))
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    cache = tmp_path / "cache"
    venv = _stamped_row_venv(cache, row)
    options = job.BuildOptions(cache_dir=cache, dist_root=tmp_path / "dist", source=src, environ=environ)
    with pytest.raises(WheelhouseError) as info:
        job.run(versions, row, options)

    seen = json.loads(leak.read_text())
    assert seen["COMPONENT"] == "wheelhouse-fixture"  # the builder's own contract arrived
    assert not set(secrets) & set(seen)
    assert "SECRET" not in json.dumps(seen)
    assert seen["PIP_INDEX_URL"] == "https://127.0.0.1:9/simple"  # pip still finds the index, without the password
    assert seen["UV_EXTRA_INDEX_URL"] == "https://127.0.0.1:9/simple"
    assert seen["MIRROR_PASSWORD"] == "allowed"
    assert "SOME_UNLISTED_SETTING" not in seen and seen["PATH"] and seen["HOME"] == os.environ["HOME"]
    (line,) = [line for line in caplog.messages if line.startswith("withholding from the build:")]
    assert line.startswith(
        "withholding from the build: credentials ACTIONS_ID_TOKEN_REQUEST_URL, ACTIONS_RUNTIME_TOKEN, "
        "ANY_SERVICE_TOKEN, AWS_SECRET_ACCESS_KEY, GH_PAT, GH_TOKEN, GITHUB_PAT, GITHUB_TOKEN, GIT_CONFIG_COUNT, "
        "GIT_CONFIG_KEY_0, GIT_CONFIG_VALUE_0, TOKEN, TWINE_PASSWORD, UV_INDEX_MIRROR_PASSWORD; the URL credentials "
        "in PIP_INDEX_URL, UV_EXTRA_INDEX_URL; "), line
    assert line.endswith("variable(s) not on the allow-list (ci/model/credentials.py) (pass_env in versions.yaml passes one)")

    assert str(info.value) == (
        f"{row.label}: the build changed what its venv runs at start "
        f"({venv}/lib/python3.11/site-packages/zzz_hostile.pth); the venv {venv} is made again by the next build; "
        "a build must install nothing into its interpreter")
    assert not (venv / toolchain.READY).exists()  # stale: the next build makes it again
    assert "SECRET" not in (ran.read_text() if ran.exists() else "")
    assert not (tmp_path / "dist").exists()


def _reuse_env_build(python: Path, src: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The fixture row built with --reuse-env by ``python`` (the interpreter that runs this tool, in the test a
    throwaway venv): its one-line error, if any, is the last line of stdout."""
    script = ("import sys\nfrom pathlib import Path\nfrom ci.building import job\nfrom ci.model import matrix\nfrom ci.base.errors import WheelhouseError\n"
              "from ci.model.versions import load\nversions = load(sys.argv[1]); (row,) = matrix.expand(versions)\n"
              "options = job.BuildOptions(cache_dir=Path(sys.argv[2]), dist_root=Path(sys.argv[3]), reuse_env=True, "
              "source=Path(sys.argv[4]))\n"
              "try:\n    job.run(versions, row, options)\nexcept WheelhouseError as error:\n    print(error)\n")
    return subprocess.run([str(python), "-c", script, str(FIXTURE_VERSIONS), str(tmp_path / "cache"),
                           str(tmp_path / "dist"), str(src)], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_with_reuse_env_the_files_a_build_adds_to_the_interpreter_are_removed(tmp_path):
    """--reuse-env builds in the caller's interpreter (the tool's own, which later runs `invoke release` with a
    token): a .pth the build drops there is taken out again and the build fails naming it. Run from a throwaway
    venv, never this one."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", src)
    (src / "setup.py").write_text("import os, site\n"
                                  "open(os.path.join(site.getsitepackages()[0], 'zzz_hostile.pth'), 'w').write('\\n')\n"
                                  "raise SystemExit(1)\n")
    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    python = _stamped_row_venv(tmp_path / "elsewhere", row) / "bin" / "python"
    result = _reuse_env_build(python, src, tmp_path)
    planted = python.parent.parent / "lib" / "python3.11" / "site-packages" / "zzz_hostile.pth"
    assert result.stdout.strip().splitlines()[-1] == (  # the builder's own output comes first
        f"{row.label}: the build changed what {python} runs at every start: removed what it added ({planted}); "
        "build without --reuse-env, in a shell that holds no token"), result.stderr[-2000:]
    assert not planted.exists() and python.is_file()


# What a build's setup.py does to the interpreter it runs in (adversarial R2 and variants): each payload appends a
# line to MARK when it runs. (a) a module rewritten to the same size, its mtime put back and its bytecode deleted;
# (b) a line added to an entry script in bin/; (c) pyvenv.cfg edited; (d) bytecode planted for an unchanged
# module, its header matching the source's size and mtime, so Python runs it instead; (e) a detached process that
# writes a .pth after the build has ended. Then the build fails (the check runs whether it fails or not).
HOSTILE_SETUP = """\
import importlib.util, os, subprocess, sys
MARK = {mark!r}
def same_size(path, payload):
    st = os.stat(path); old = open(path).read(); head = old.split("\\n", 1)[0]
    line = payload + "#"
    open(path, "w").write(line + "x" * (len(head) - len(line)) + old[len(head):])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
probe = importlib.util.find_spec("wheelhouse_probe").origin
same_size(probe, "open(%r,'a').write('module\\n')" % MARK)
cache = os.path.join(os.path.dirname(probe), "__pycache__")
for cached in os.listdir(cache) if os.path.isdir(cache) else ():
    os.unlink(os.path.join(cache, cached))
entry = os.path.join(os.path.dirname(sys.executable), "tool-entry")
lines = open(entry).read().split("\\n", 1)
open(entry, "w").write(lines[0] + "\\nopen(%r,'a').write('bin\\\\n')\\n" % MARK + lines[1])
cfg = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg")
open(cfg, "a").write("include-system-site-packages = true\\n")
quiet = importlib.util.find_spec("wheelhouse_quiet").origin
st = os.stat(quiet)
import importlib._bootstrap_external as be
code = compile("open(%r,'a').write('bytecode\\\\n')" % MARK, quiet, "exec")
data = be._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)
os.makedirs(os.path.join(os.path.dirname(quiet), "__pycache__"), exist_ok=True)
open(importlib.util.cache_from_source(quiet), "wb").write(data)
late = os.path.join(os.path.dirname(quiet), "zzz_late.pth")
subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(6); open(%r, 'w').write(%r)"
                  % (late, "import os; open(%r,'a').write('late pth\\\\n')\\n" % MARK)],
                 start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
raise SystemExit(1)
"""


@pytest.mark.slow  # a real (failing) build and a 7 s wait: tests/test_interpreter_state.py is the fast variant
def test_nothing_a_build_writes_into_the_interpreter_that_runs_this_tool_runs_again(tmp_path):
    """--reuse-env builds in the interpreter that runs this tool, the one `GITHUB_TOKEN=… invoke release` later
    starts. The before/after comparison was by size and mtime, of site-packages only (adversarial R2): now by
    contents, bin/ and pyvenv.cfg too, after every process the build left running is ended; what the build added
    is removed and what it altered renamed out of the way, so nothing it wrote runs at the next start."""
    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    venv = _stamped_row_venv(tmp_path / "elsewhere", row)
    python = venv / "bin" / "python"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "wheelhouse_probe").mkdir()
    (site / "wheelhouse_probe" / "__init__.py").write_text("# a module of the interpreter" + "." * 400 + "\n"
                                                          "VALUE = 1\n")
    (site / "wheelhouse_quiet.py").write_text("QUIET = 1\n")
    (venv / "bin" / "tool-entry").write_text(f"#!{python}\nprint('tool')\n")
    (venv / "bin" / "tool-entry").chmod(0o755)
    subprocess.run([str(python), "-m", "compileall", "-q", str(site / "wheelhouse_probe")], check=True)
    mark = tmp_path / "ran.txt"
    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", src)
    (src / "setup.py").write_text(HOSTILE_SETUP.format(mark=str(mark)))
    result = _reuse_env_build(python, src, tmp_path)
    line = result.stdout.strip().splitlines()[-1]
    altered = [str(site / "wheelhouse_probe" / "__init__.py"), str(venv / "bin" / "tool-entry"),
               str(venv / "pyvenv.cfg")]
    assert line.startswith(f"{row.label}: the build changed what {python} runs at every start: renamed what it "
                           f"altered to <name>.changed-by-build ("), (line, result.stderr[-3000:])
    assert all(path in line for path in altered), (line, result.stderr[-3000:])
    assert "; ended 1 process(es) it left running; build without --reuse-env, in a shell that holds no token" in line, \
        result.stderr[-2500:]
    assert all(Path(path + ".changed-by-build").is_file() and not Path(path).exists() for path in altered)
    time.sleep(7)  # the late writer would have written its .pth by now
    assert not (site / "zzz_late.pth").exists()
    for command in (["-c", "import wheelhouse_quiet"], ["-c", "import wheelhouse_probe"]):
        subprocess.run([str(python), *command], capture_output=True)  # the next starts of the interpreter
    assert not mark.exists(), mark.read_text()  # none of the build's code ran again


def test_the_dry_run_plan_masks_index_credentials():
    """The plan names the torch index; a password in its URL is masked like every logged line."""
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=REPO / ".cache", torch_index="https://u:IDX_SECRET@127.0.0.1:9/simple")
    text = job.plan(versions, row, options).render()
    assert "--index-url https://***@127.0.0.1:9/simple" in text
    assert "IDX_SECRET" not in text


def test_this_machines_max_jobs_replaces_the_versions_file_value():
    """WHEELHOUSE_MAX_JOBS: a 16-core machine builds with its cores without a versions file of its own."""
    from ci.base.errors import ConfigError
    from ci.model.environment import Environment

    versions = load()
    row = next(r for r in matrix.expand(versions) if r.component == "flash-attention")
    environ = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    jobs = Environment.from_mapping({"WHEELHOUSE_MAX_JOBS": "16"}).max_jobs
    options = job.BuildOptions(cache_dir=REPO / ".cache", dist_root=REPO / "dist", environ=environ, max_jobs=jobs)
    assert job.plan(versions, row, options).env["MAX_JOBS"] == "16"
    default = job.BuildOptions(cache_dir=REPO / ".cache", dist_root=REPO / "dist", environ=environ)
    assert job.plan(versions, row, default).env["MAX_JOBS"] == str(row.settings.max_jobs)
    with pytest.raises(ConfigError, match=r"^WHEELHOUSE_MAX_JOBS=0: expected a whole number of build jobs from 1 to 1024$"):
        Environment.from_mapping({"WHEELHOUSE_MAX_JOBS": "0"})


def test_the_builder_gets_the_environment_the_plan_shows(tmp_path):
    """plan and run resolve the builder's environment in one place: every variable the dry run prints reaches
    the builder as printed, apart from what only the build knows (the build directory of the resolved
    revision, the compiler cache's port, the caller's PATH at the end of PATH)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", src)
    seen_file = tmp_path / "seen.json"
    (src / "setup.py").write_text("import json, os, sys\n"
                                  "open(os.environ['SEEN'], 'w').write(json.dumps(dict(os.environ)))\nsys.exit(1)\n")
    environ = {**os.environ, "SEEN": str(seen_file)}
    versions_file = tmp_path / "versions.yaml"
    versions_file.write_text(FIXTURE_VERSIONS.read_text().replace("max_jobs: 2", "max_jobs: 2\n    pass_env: [SEEN]"))
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", reuse_env=True,
                                 source=src, environ=environ)
    planned = job.plan(versions, row, options)
    assert planned.env["PATH"].endswith(":$PATH")
    with pytest.raises(WheelhouseError, match="exited with status"):
        job.run(versions, row, options)
    seen = json.loads(seen_file.read_text())
    build_dir = str(Path(seen["DIST_DIR"]).parent)
    expected = {key: value.replace(str(planned.build_dir), build_dir) for key, value in planned.env.items()}
    expected["PATH"] = expected["PATH"].replace("$PATH", environ["PATH"])
    if "SCCACHE_SERVER_PORT" in expected:
        assert expected["SCCACHE_SERVER_PORT"] == "<a free port>" and seen["SCCACHE_SERVER_PORT"].isdigit()
        expected["SCCACHE_SERVER_PORT"] = seen["SCCACHE_SERVER_PORT"]
    assert expected["SOURCE_REVISION"].startswith("<") and len(seen["SOURCE_REVISION"]) == 64  # the directory digest
    expected["SOURCE_REVISION"] = seen["SOURCE_REVISION"]
    if "SCCACHE_BASEDIRS" in expected:  # an empty cache: earlier builds left no site-packages to strip
        earlier = ":<site-packages of earlier builds into this cache>"
        assert expected["SCCACHE_BASEDIRS"].endswith(earlier)
        expected["SCCACHE_BASEDIRS"] = expected["SCCACHE_BASEDIRS"].removesuffix(earlier)
    assert {key: seen.get(key) for key in expected} == expected


# --- the resumable path, end to end -----------------------------------------------------------------

RESUMABLE_SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="wheelhouse-fixture", version="0.1.0", packages=["wheelhouse_fixture"],
      ext_modules=[CppExtension("wheelhouse_fixture._C", ["csrc/quick.cpp", "csrc/held.cpp"], extra_compile_args=["-g0"])],
      cmdclass={"build_ext": BuildExtension})
"""
# A compiler that stops on held.cpp while the file $WHEELHOUSE_TEST_HOLD exists (the build's timeout then
# stops it) and logs each compile it makes; otherwise it is g++.
HOLDING_CXX = """\
#!/bin/sh
case "$*" in *held.cpp*) while [ -e "$WHEELHOUSE_TEST_HOLD" ]; do sleep 1; done ;; esac
case "$*" in *" -c "*) echo "$*" | grep -o '[a-z]*\\.cpp' >> "$WHEELHOUSE_TEST_COMPILES" ;; esac
exec g++ "$@"
"""


def _resumable_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "csrc").mkdir(parents=True)
    (src / "wheelhouse_fixture").mkdir()
    (src / "wheelhouse_fixture" / "__init__.py").write_text("from . import _C  # noqa: F401\n")
    (src / "setup.py").write_text(RESUMABLE_SETUP)
    (src / "csrc" / "quick.cpp").write_text("int quick(int x) { return x + 1; }\n")
    (src / "csrc" / "held.cpp").write_text(
        "#include <Python.h>\nstatic PyModuleDef m = {PyModuleDef_HEAD_INIT, \"_C\", nullptr, -1, nullptr};\n"
        "PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&m); }\n")
    return src


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("ninja", path=str(Path(sys.executable).parent)) is None,
                    reason="needs g++ and ninja")
def test_a_build_stopped_at_its_timeout_resumes_on_a_fresh_machine_to_the_same_bytes(tmp_path, caplog):
    """The resumable path as CI takes it: a build reaches its build_timeout; what _build.yml saves then
    (ci.flows.workflows.RESUME_PATHS: the build directories and the compiler cache) is all a fresh machine gets
    back; the next run resumes there, compiles only what the first did not finish, and its wheel passes the
    same checks as an uninterrupted build's and has the same bytes."""
    import tarfile

    from ci.flows import workflows

    caplog.set_level(logging.INFO, logger="wheelhouse")
    src = _resumable_source(tmp_path)
    cxx = tmp_path / "holding-cxx"
    cxx.write_text(HOLDING_CXX)
    cxx.chmod(0o755)
    hold, compiles = tmp_path / "hold", tmp_path / "compiles"
    environ = {**os.environ, "CXX": str(cxx), "WHEELHOUSE_TEST_HOLD": str(hold), "WHEELHOUSE_TEST_COMPILES": str(compiles)}

    def versions_with(timeout: str):
        path = tmp_path / f"versions-{timeout}.yaml"
        # its sources are not the fixture's package: the fixture's smoke test does not apply
        text = without_smoke_test()
        path.write_text(text.replace("max_jobs: 2", f"max_jobs: 2\n    build_timeout: {timeout}"))
        versions = load(path)
        return versions, matrix.expand(versions)[0]

    def build_into(cache: Path, versions, row, dist: Path):
        options = job.BuildOptions(cache_dir=cache, dist_root=dist, reuse_env=True, source=src, environ=environ)
        return job.run(versions, row, options)

    def compiled() -> list[str]:
        done = compiles.read_text().split() if compiles.exists() else []
        compiles.unlink(missing_ok=True)
        return sorted(done)

    # an uninterrupted build, on a machine of its own
    reference = build_into(tmp_path / "reference-cache", *versions_with("20m"), tmp_path / "reference-dist")
    assert compiled() == ["held.cpp", "quick.cpp"]

    # the interrupted one: held.cpp waits, build_timeout stops the build; quick.cpp was compiled
    cache = tmp_path / "workspace" / ".cache"
    hold.touch()
    with pytest.raises(job.BuildTimedOut, match=r"did not finish within build_timeout 25s; run the same command"):
        build_into(cache, *versions_with("25s"), tmp_path / "dist")
    assert compiled() == ["quick.cpp"]
    assert not (tmp_path / "dist").exists()
    # what the job saves, and nothing else, is what the next machine starts from
    saved = tmp_path / "saved.tar"
    with tarfile.open(saved, "w") as archive:
        for path in workflows.RESUME_PATHS:
            archive.add(cache / path.removeprefix(".cache/").rstrip("/"), arcname=path.rstrip("/"))
    shutil.rmtree(cache)
    cache.mkdir()
    with tarfile.open(saved) as archive:
        archive.extractall(cache.parent, filter="fully_trusted")
    (kept,) = (cache / "builds").iterdir()

    hold.unlink()
    caplog.clear()
    resumed = build_into(cache, *versions_with("20m"), tmp_path / "dist")
    assert f"resuming the interrupted build in {kept}" in caplog.messages
    assert compiled() == ["held.cpp"]  # fewer steps: only what the first run did not finish
    assert not kept.exists()  # a finished build leaves no directory behind
    first, second = (BuildRecord.read(result.record) for result in (reference, resumed))
    assert first.checks_passed and second.checks_passed
    assert second.checks == first.checks
    (wheel,), (same,) = reference.wheels, resumed.wheels
    assert wheel.name == same.name and wheel.read_bytes() == same.read_bytes()
