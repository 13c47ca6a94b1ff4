#!/usr/bin/env python3
"""The sweep: every component of versions.yaml built on the GPU machine for sm_90 through our own sessions,
checked, released, indexed, installed from the index, imported and its kernels run, in one run on the GPU machine.

``variant`` writes the sweep's versions file: each component's own entry of versions.yaml (builder,
patches, extra_env, wheel packages, pins: what CI builds) with only what the machine needs changed: the
machine's row (torch 2.11.0+cu130, Python 3.12), the source and ref the carried mirror serves and the sm_90
arch settings (both from tests/fixtures/versions-device.yaml), and a share of the 16 cores. A component that
file gives no sources for is not on the device: left out, and named in the file's header. Three components are
reduced, and the record says so:

- flashinfer: no flashinfer-cubin (upstream's own build only downloads it; the machine reaches no index),
  and its jit-cache holds one module (the decode kernel the test loads), not the 952 of the full list;
- flash-attention: every kernel unit, with dropout, ALiBi, softcap, local attention and uneven head dims
  compiled out (its ``FLASHATTENTION_DISABLE_*`` switches): the kernels the test runs, in a fraction of the
  22 minutes of its full sm_90 build, which 2026-12-01's run proved (upstream_builds_2);
- deep-gemm: one Python, so no bundle.

``--full-archs`` names components built with versions.yaml's own arch list instead (TransformerEngine's
8.0;9.0;10.0, nvcc a thread per arch), for a machine with the cores for it: on the GPU machine's 16 it did not
fit the sweep's 25 minutes beside the nine (a48b306), and ``run_on_device.sh all-archs`` proves the lists alone.
Each wheel's entry lists the cubins of every shared object (cuobjdump where the machine has it, else our fatbin
reader).

``run`` builds them side by side (``max_jobs`` each, TransformerEngine, the longest, first), each in a cache of
its own; meanwhile ``rebuild-check`` builds three of them twice in fresh directories. As each build ends, while the
others still build, the component is released into one local store, the store indexed, and the component
installed from that index into a clean target of its own, imported, and its kernel tests run: the sweep takes
about as long as its slowest build and that one's checks. A component is green when all of that passed and its
tests ran (one passed at least, none failed). ``--deadline`` stops what still builds. ``OUT`` gets
``sweep.json`` after every step.

With ``--compiler-cache-secret`` (the environment naming a remote compiler cache: run_on_device.sh's cached
sweep), each build gets its own copy of the credential, and each entry the build's compiler-cache counts.

``record`` adds a sweep to benchmarks/device_results.json (``sweeps``, newest last); one written before it ended
is kept as what it shows, marked unfinished. With ``--again`` it adds a cached sweep's two runs under
``cached_sweeps`` instead, with the second run's hit rate.

    python tests/gpu/sweep.py variant --out V.yaml [--full-archs transformer-engine]
    python tests/gpu/sweep.py run --versions V.yaml --work DIR --out OUT/sweep.json --commit SHA
    python tests/gpu/sweep.py record --result sweep.json
    python tests/gpu/sweep.py record --result sweep.json --again sweep-again.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from host_probe import line as probe_line  # noqa: E402
from host_probe import read as read_probe  # noqa: E402

from ci.base.errors import ConfigError  # noqa: E402
from ci.formats.archs import parse_arch_list  # noqa: E402
from ci.formats.cache_log import hit_share  # noqa: E402

DEVICE_VERSIONS = ROOT / "tests" / "fixtures" / "versions-device.yaml"
RESULTS = ROOT / "benchmarks" / "device_results.json"
# where each component's sources come from in the device file (flashinfer's git sources are flashinfer-aot's)
DEVICE_ENTRY = {"flashinfer": "flashinfer-aot"}
# what the device file gives each component for this machine: the sm_90 settings, and smoke tests that need
# nothing the machine lacks (megatron-core, flashinfer-cubin)
MACHINE_SETTINGS = ("torch_cuda_arch_list", "arch_filter", "verify_wheel_archs", "nvcc_threads", "build_timeout",
                    "smoke_test")
# a share of the machine's 16 cores (jobs may exceed cores: most builds have serial stretches)
JOBS = {"transformer-engine": 12, "flash-attention": 8, "apex": 6, "deep-ep": 4, "flash-mla": 6,
        "fast-hadamard-transform": 2, "deep-gemm": 2, "flashinfer": 2, "megatron-bridge": 1}
# longest first: the sweep takes as long as its slowest build
ORDER = ("transformer-engine", "deep-ep", "apex", "flash-attention", "flash-mla", "fast-hadamard-transform",
         "deep-gemm", "flashinfer", "megatron-bridge")
FLASH_ATTENTION_SWITCHES = " ".join(f"-DFLASHATTENTION_DISABLE_{name}"
                                    for name in ("DROPOUT", "ALIBI", "SOFTCAP", "LOCAL", "UNEVEN_K"))
JIT_CACHE_MODULE = ("single_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_head_dim_qk_128_head_dim_vo_128_"
                    "posenc_0_use_swa_False_use_logits_cap_False")
REDUCED = {
    "flashinfer": ("no flashinfer-cubin (downloaded by upstream's build; no index here); the jit-cache shim and its "
                   f"sm90a provider, holding {JIT_CACHE_MODULE}"),
    "flash-attention": f"every unit with {FLASH_ATTENTION_SWITCHES}; the full sm_90 build: upstream_builds_2",
    "deep-gemm": "one Python: no bundle",
}
# flashinfer: its own JIT links its jit-cache modules, with the build's linker flags only through FLASHINFER_EXTRA_LDFLAGS
# (build_scripts/lib/flashinfer.sh flashinfer_jit_environment)
REBUILD_CHECKS = ("deep-gemm", "fast-hadamard-transform", "flashinfer")


@dataclass(frozen=True)
class Tests:
    """One pytest run of a component's kernel tests: files of tests/gpu, a -k expression, the environment."""
    files: tuple[str, ...]
    select: str = ""
    jit_off: bool = False
    """flashinfer's JIT off, no nvcc anywhere: whatever runs came from the installed jit-cache."""


@dataclass(frozen=True)
class Checks:
    modules: tuple[str, ...]
    """Imported from the clean target, each in its own interpreter."""
    tests: tuple[Tests, ...] = ()
    extra_wheels: tuple[str, ...] = field(default=())
    """Globs under .device/build-deps installed into the clean target too (what --no-deps leaves out)."""


CHECKS = {
    "fast-hadamard-transform": Checks(("fast_hadamard_transform",),
                                      (Tests(("test_upstream_kernels.py",), "hadamard"),)),
    "flash-mla": Checks(("flash_mla",), (Tests(("test_upstream_kernels.py",), "flash_mla"),)),
    "deep-gemm": Checks(("deep_gemm",), (Tests(("test_upstream_kernels.py",), "deep_gemm"),)),
    "flash-attention": Checks(("flash_attn", "flash_attn_2_cuda"), (Tests(("test_upstream_kernels.py",), "flash_attn"),)),
    "flashinfer": Checks(("flashinfer", "flashinfer_jit_cache"),
                         (Tests(("test_flashinfer_jit_cache.py",), jit_off=True),
                          Tests(("test_upstream_kernels.py",), "flashinfer")),
                         ("apache_tvm_ffi-*.whl", "typing_extensions-*.whl")),
    # importing megatron.bridge needs megatron.core, which its own wheel brings: the test reads what installed
    "megatron-bridge": Checks((), (Tests(("test_pure_python.py",)),)),
    "transformer-engine": Checks(("transformer_engine", "transformer_engine.pytorch"),
                                 (Tests(("test_transformer_engine.py",)),)),
    "apex": Checks(("apex", "apex_C", "amp_C", "fused_layer_norm_cuda"), (Tests(("test_apex_deep_ep.py",), "apex"),)),
    "deep-ep": Checks(("deep_ep", "deep_ep_cpp"), (Tests(("test_apex_deep_ep.py",), "deep_ep or hybrid_ep"),)),
    # the CPU machine's check of this script (tests/test_sweep.py)
    "wheelhouse-fixture": Checks(("wheelhouse_fixture",), (Tests(("test_kernels.py",), "fixture"),)),
}


# --- the versions file ------------------------------------------------------------------------------


def _x86_64_entry(entry: dict) -> dict:
    """A versions.yaml component entry with its x86_64 overrides applied (mappings merge key by key)."""
    merged = {key: copy.deepcopy(value) for key, value in entry.items() if key != "arch_overrides"}
    for key, value in ((entry.get("arch_overrides") or {}).get("x86_64") or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def not_on_the_device(*, versions: Path = ROOT / "versions.yaml", device: Path = DEVICE_VERSIONS) -> list[str]:
    """The components of ``versions`` no entry of the device file gives sources for: the sweep leaves them out."""
    real = yaml.safe_load(versions.read_text(encoding="utf-8"))
    machine = yaml.safe_load(device.read_text(encoding="utf-8"))
    return sorted(name for name in real["components"] if DEVICE_ENTRY.get(name, name) not in machine["components"])


def variant(*, versions: Path = ROOT / "versions.yaml", device: Path = DEVICE_VERSIONS,
            full_archs: tuple[str, ...] = ()) -> str:
    """The sweep's versions file (see the module's docstring); a component not on the device (no entry of the
    device file gives its sources) is left out, and the file's header names it. ``full_archs``: components that
    keep versions.yaml's arch list, nvcc a thread per arch."""
    real = yaml.safe_load(versions.read_text(encoding="utf-8"))
    machine = yaml.safe_load(device.read_text(encoding="utf-8"))
    absent = not_on_the_device(versions=versions, device=device)
    _check_full_archs(full_archs, real["components"], absent, versions)
    components = {}
    for name in sorted(set(real["components"]) - set(absent)):
        components[name] = _machine_entry(name, real["components"][name],
                                          machine["components"][DEVICE_ENTRY.get(name, name)])
        if name in full_archs:
            _keep_the_arch_list(components[name], _x86_64_entry(real["components"][name]))
    if "flashinfer" in components:
        flashinfer = components["flashinfer"]
        flashinfer["wheel_packages"] = [p for p in flashinfer["wheel_packages"] if p != "flashinfer-cubin"]
        flashinfer["extra_env"]["WHEELHOUSE_JIT_CACHE_MODULES"] = JIT_CACHE_MODULE
    if "flash-attention" in components:
        components["flash-attention"]["extra_env"]["NVCC_APPEND_FLAGS"] = FLASH_ATTENTION_SWITCHES
    for entry in components.values():
        if not entry["extra_env"]:
            entry.pop("extra_env")
    document = {"build_matrix": machine["build_matrix"], "components": components}
    header = ("# generated by tests/gpu/sweep.py variant: versions.yaml's components with the GPU machine's row, "
              f"the sources {device.name} serves, sm_90 and a share of its cores\n")
    if full_archs:
        header += f"# with versions.yaml's arch lists: {', '.join(full_archs)}\n"
    if absent:
        header += f"# {_absent_line(absent, device)}\n"
    return header + yaml.safe_dump(document, sort_keys=False)


def _machine_entry(name: str, own: dict, given: dict) -> dict:
    """A component's versions.yaml entry (x86_64) with what the machine changes: its sources, sm_90 settings and
    smoke tests from the device file's entry ``given``, its runner and share of the cores."""
    entry = _x86_64_entry(own)
    entry["source"], entry["ref"] = copy.deepcopy(given["source"]), given["ref"]
    for key in MACHINE_SETTINGS:
        if key in given or key != "smoke_test":
            entry.pop(key, None)
        if key in given:
            entry[key] = copy.deepcopy(given[key])
    if set(given.get("wheel_packages", ())) < set(entry["wheel_packages"]):  # the projects its archs make
        entry["wheel_packages"] = list(given["wheel_packages"])
    entry["extra_env"] = {**(entry.get("extra_env") or {}), **(given.get("extra_env") or {})}
    for key in ("arches", "python_versions", "bundle_pythons", "job_timeout_minutes", "shards", "rehost"):
        entry.pop(key, None)
    entry["runs_on"] = "ubuntu-24.04"
    entry["max_jobs"] = JOBS.get(name, 2)
    return entry


def _check_full_archs(full_archs: tuple[str, ...], components: dict, absent: list[str], versions: Path) -> None:
    for name in full_archs:
        if name not in components or name in absent:
            raise ConfigError(f"--full-archs: {name} is not a component the sweep builds; name one of "
                              f"{', '.join(sorted(set(components) - set(absent)))}")
        if not _x86_64_entry(components[name]).get("torch_cuda_arch_list"):
            raise ConfigError(f"--full-archs: {name} sets its own gencodes (no torch_cuda_arch_list in "
                              f"{versions.name}); run_on_device.sh all-archs builds those")


def _keep_the_arch_list(entry: dict, own: dict) -> None:
    """versions.yaml's arch list and arch gate for one component, nvcc a thread per arch (as all-archs builds)."""
    entry["torch_cuda_arch_list"] = own["torch_cuda_arch_list"]
    entry["verify_wheel_archs"] = True
    entry.pop("arch_filter", None)
    entry.pop("build_timeout", None)  # versions.yaml's, not the device file's sm_90 one
    if "build_timeout" in own:
        entry["build_timeout"] = own["build_timeout"]
    threads = len(parse_arch_list(own["torch_cuda_arch_list"]).archs)
    entry["nvcc_threads"] = threads
    if "NVTE_BUILD_THREADS_PER_JOB" in entry.get("extra_env", {}):
        entry["extra_env"]["NVTE_BUILD_THREADS_PER_JOB"] = str(threads)


def _absent_line(absent: list[str], device: Path) -> str:
    return (f"not on the device: {', '.join(absent)} (no entry of {device.name} gives its sources; add one, its "
            "mirror-served source and ref and its sm_90 settings, to sweep it)")


# --- running it -------------------------------------------------------------------------------------


def _write(out: Path, record: dict) -> None:
    partial = out.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(out)


def _machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = "no GPU seen"
    return f"{gpu or 'no GPU seen'}; {os.cpu_count()} CPU cores"


def _session(component: str, python: str) -> str:
    return f"build-{component}-{python}"


def _start(command: list[str], env: dict, log: Path, *, niceness: int = 0) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=ROOT, preexec_fn=(lambda: os.nice(niceness)) if niceness else None)


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return lines[-1][-400:] if lines else ""


def _seeded_cache(work: Path, name: str) -> Path:
    """A fresh cache for one build, with the carried sdists in its source cache."""
    cache = work / "caches" / name
    sdists = Path(os.environ.get("WHEELHOUSE_CACHE", work / "cache")) / "sources" / "sdist"
    (cache / "sources" / "sdist").mkdir(parents=True, exist_ok=True)
    if sdists.is_dir():
        for sdist in sdists.iterdir():
            shutil.copy2(sdist, cache / "sources" / "sdist" / sdist.name)
    return cache


def _own_secret(secret: Path | None, work: Path, key: str) -> dict[str, str]:
    """The remote compiler cache's credential file for one build, a copy of ``secret`` (each build reads and
    removes its own: ci/building/remote_cache.py); nothing without one."""
    if secret is None:
        return {}
    copy_path = work / "secrets" / f"{key.replace(':', '-')}.secret"
    copy_path.parent.mkdir(mode=0o700, exist_ok=True)
    descriptor = os.open(copy_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secret.read_bytes())
    return {"WHEELHOUSE_COMPILER_CACHE_SECRET_FILE": str(copy_path)}


def build_all(components: list[str], *, versions: Path, work: Path, dist: Path, python_version: str,
              deadline: float, rebuild: tuple[str, ...], record: dict, out: Path,
              built: Callable[[str], None] = lambda name: None, cache_secret: Path | None = None) -> None:
    """Every build and rebuild check side by side; each entry of ``record`` gets its build's status and seconds,
    then ``built`` is called with the component's name (the others build on meanwhile). ``cache_secret``: the
    remote compiler cache's credential (the environment names the cache), copied for each build."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    running: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    for name in sorted(components, key=lambda c: ORDER.index(c) if c in ORDER else len(ORDER)):
        env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions), "WHEELHOUSE_CACHE": str(_seeded_cache(work, name)),
               **_own_secret(cache_secret, work, name)}
        log = logs / f"build-{name}.log"
        command = [sys.executable, "-m", "nox", "-s", _session(name, python_version), "--", "--reuse-env",
                   "--dist", str(dist)]
        running[name] = (_start(command, env, log), time.monotonic(), log)
    for name in rebuild:
        if name not in components:
            continue
        env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions),
               "WHEELHOUSE_CACHE": str(_seeded_cache(work, f"rebuild-{name}")),
               **_own_secret(cache_secret, work, f"rebuild-{name}")}  # consumed unused: both builds compile
        log = logs / f"rebuild-{name}.log"
        command = [sys.executable, "-m", "nox", "-s", f"rebuild-check-{name}-{python_version}", "--", "--reuse-env",
                   "--work", str(work / f"rebuild-{name}")]
        running[f"rebuild:{name}"] = (_start(command, env, log, niceness=10), time.monotonic(), log)
    while running:
        for key, (process, started, log) in list(running.items()):
            code = process.poll()
            late = code is None and time.monotonic() > deadline
            if late:
                os.killpg(process.pid, signal.SIGTERM)
                code = process.wait()
            if code is None:
                continue
            del running[key]
            seconds = round(time.monotonic() - started)
            status = "stopped at the sweep's deadline" if late else ("passed" if code == 0 else f"exit {code}")
            if key.startswith("rebuild:"):
                name = key.split(":", 1)[1]
                record["rebuild_checks"][name] = _rebuild_result(log, seconds, status)
            else:
                record["components"][key].update(build_s=seconds, build=status, build_log_tail=_last_line(log))
            print(f"{key}: {status} after {seconds} s", flush=True)
            _write(out, record)
            if not key.startswith("rebuild:"):
                try:
                    built(key)
                except Exception as error:  # one component's checks must not leave the others' builds unwatched
                    record["components"][key]["checks_error"] = f"{type(error).__name__}: {error}"[:400]
                    _write(out, record)
        time.sleep(2)


def _rebuild_result(log: Path, seconds: int, status: str) -> dict:
    text = log.read_text(errors="replace") if log.is_file() else ""
    digests = re.findall(r"(first|second): +sha256 ([0-9a-f]{64})", text)
    return {"seconds": seconds, "status": status, "sha256": [digest for _, digest in digests],
            "identical": "the same bytes" in text, "tail": _last_line(log)}


def _run(command: list[str], env: dict, log: Path, *, cwd: Path = ROOT) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd).returncode


def _built(name: str, dist: Path, world: str) -> dict:
    """What the build record says: wheels with sha256 and size, the checks, the build place."""
    from ci.model.build_record import BuildRecord

    records = sorted((dist / world).glob(f"{name}-*.build.json"))
    if not records:
        return {}
    built = BuildRecord.read(records[-1])
    stats = built.compiler_cache_stats or {}
    return {"wheels": [{"name": w.name, "sha256": w.sha256, "bytes": w.size, **_cubins(dist / world / w.name)}
                       for w in built.wheels],
            "checks": "passed" if built.checks_passed else f"failed: {'; '.join(built.checks.get('problems', []))[:400]}",
            "build_place": built.toolchain.get("build_place"), "fingerprint": built.fingerprint,
            "compiler_cache": {key: stats[key] for key in ("requests", "hits", "misses", "remote_step_hits",
                                                            "step_hits", "step_misses") if key in stats} or None}


def _cubins(wheel: Path) -> dict:
    """The cubin targets of each shared object of a wheel (cuobjdump where found, else our fatbin reader);
    nothing for a wheel without device code."""
    from ci.formats.fatbin import scan_wheel_archs

    if not wheel.is_file():
        return {}
    members = scan_wheel_archs(wheel).cubins_by_member()
    return {"cubins": members} if members else {}


def _pytest_counts(text: str) -> dict[str, int]:
    counts = {kind: 0 for kind in ("passed", "failed", "skipped", "error")}
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary[-1] if summary else ""):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] += int(number)
    return counts


def _without_nvcc(env: dict, work: Path) -> dict:
    path = [part for part in env.get("PATH", "").split(os.pathsep) if part and not (Path(part) / "nvcc").exists()]
    (work / "jit-workspace").mkdir(exist_ok=True)
    return {**env, "PATH": os.pathsep.join(path), "CUDA_HOME": str(work / "no-toolkit"),
            "CUDA_PATH": str(work / "no-toolkit"), "FLASHINFER_DISABLE_JIT": "1",
            "FLASHINFER_WORKSPACE_BASE": str(work / "jit-workspace")}


def import_command(python: str, module: str) -> list[str]:
    """The import check of one module: torch first, as a user imports it; a top-level extension (apex_C,
    deep_ep_cpp) finds its NEEDED libc10.so only once torch has loaded it."""
    return [python, "-c", f"import torch; import {module}"]


def imports_line(modules: tuple[str, ...], failed: list[str]) -> str:
    """The record's import verdict; a component with nothing to import alone says so (Megatron-Bridge)."""
    if failed:
        return f"failed: {', '.join(failed)}"
    return "ok: " + (", ".join(modules) or "nothing to import alone (its tests read the installed package)")


def check_installed(name: str, entry: dict, *, index: str, packages: list[str], work: Path, python: str) -> None:
    """Install ``packages`` from ``index`` into a clean target, import, run the kernel tests; into ``entry``."""
    checks = CHECKS.get(name, Checks(()))
    target, log = work / f"clean-{name}", work / "logs" / f"check-{name}.log"
    shutil.rmtree(target, ignore_errors=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PIP_NO_INDEX", "PIP_FIND_LINKS")}
    code = _run([python, "-m", "pip", "install", "--no-deps", "--target", str(target), "--index-url", index,
                 *packages], env, log)
    extras = [str(wheel) for pattern in checks.extra_wheels for wheel in (ROOT / ".device" / "build-deps").glob(pattern)]
    if code == 0 and extras:
        code = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *extras], env, log)
    entry["installed"] = "from our index" if code == 0 else f"pip exit {code}: {_last_line(log)}"
    if code != 0:
        return
    env["PYTHONPATH"] = os.pathsep.join([str(target), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    failed = [module for module in checks.modules if _run(import_command(python, module), env, log, cwd=work) != 0]
    entry["imports"] = imports_line(checks.modules, failed)
    totals = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for tests in checks.tests:
        report = work / "logs" / f"kernels-{name}-{len(entry.setdefault('kernel_runs', []))}.log"
        command = [python, "-m", "pytest", *(str(ROOT / "tests" / "gpu" / f) for f in tests.files),
                   *(["-k", tests.select] if tests.select else []), "-o", "addopts=", "-p", "no:cacheprovider",
                   "-q", "-rs", "--rootdir", str(ROOT)]
        _run(command, _without_nvcc(env, work) if tests.jit_off else env, report, cwd=work)
        counts = _pytest_counts(report.read_text(errors="replace"))
        skips = [line.strip()[:200] for line in report.read_text(errors="replace").splitlines()
                 if line.startswith("SKIPPED")]
        entry["kernel_runs"].append({"tests": " ".join(tests.files) + (f" -k '{tests.select}'" if tests.select else ""),
                                     **counts, "skips": skips[:10]})
        totals = {kind: totals[kind] + counts[kind] for kind in totals}
    entry["kernels"] = totals


def green(entry: dict) -> bool:
    kernels = entry.get("kernels") or {}
    return (entry.get("build") == "passed" and entry.get("checks") == "passed"
            and entry.get("installed") == "from our index" and str(entry.get("imports", "")).startswith("ok")
            and kernels.get("passed", 0) > 0 and kernels.get("failed", 0) == 0 and kernels.get("error", 0) == 0)


def run(*, versions: Path, work: Path, out: Path, commit: str, deadline_s: int, python: str = sys.executable,
        components: list[str] | None = None, rebuild: tuple[str, ...] = REBUILD_CHECKS,
        cache_secret: Path | None = None, host_probe: Path | None = None) -> dict:
    from ci.model import matrix
    from ci.model.versions import load

    if cache_secret is not None and not cache_secret.is_file():
        raise ConfigError(f"--compiler-cache-secret {cache_secret}: no such file; give the remote compiler cache's "
                          "credential file (key=value lines, README: The remote compiler cache)")
    loaded = load(versions, check_tree=False)
    names = components or sorted(loaded.components)
    rows = {row.component: row for row in matrix.expand(loaded) if row.component in names}
    python_version = next(iter(rows.values())).python
    started = time.monotonic()
    record: dict = {"kind": "sweep", "commit": commit, "date": time.strftime("%Y-%m-%d"), "machine": _machine(),
                    "versions": "tests/gpu/sweep.py variant (versions.yaml's components; the machine's row, sources "
                                "and sm_90 settings from tests/fixtures/versions-device.yaml)",
                    "components": {name: {"ref": rows[name].ref, "archs": rows[name].settings.torch_cuda_arch_list,
                                          "max_jobs": rows[name].settings.max_jobs,
                                          **({"reduced": REDUCED[name]} if name in REDUCED else {})}
                                   for name in names},
                    "rebuild_checks": {}}
    if host_probe is not None:  # how fast this host compiles: sweeps on two hosts of one kind compare by it
        record["host_probe"] = read_probe(host_probe)
    work.mkdir(parents=True, exist_ok=True)
    dist = work / "dist"
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions), "WHEELHOUSE_STORE": str(work / "store")}

    def release_and_check(name: str) -> None:
        row, entry = rows[name], record["components"][name]
        entry.update(_built(name, dist, row.world))
        if entry.get("build") != "passed":
            return
        code = _run([python, "-m", "invoke", "release", "--component", name, "--python", row.python, "--torch",
                     row.torch, "--arch", row.arch, "--dist", str(dist)], env, work / "logs" / f"release-{name}.log")
        entry["released"] = "yes" if code == 0 else f"exit {code}"
        if code != 0:
            return
        index_log = work / "logs" / f"publish-index-{name}.log"
        code = _run([python, "-m", "invoke", "publish-index"], env, index_log)
        entry["indexed"] = "yes" if code == 0 else f"exit {code}: {_last_line(index_log)}"
        if code == 0:
            _write(out, record)
            check_installed(name, entry, index=f"file://{work / 'store' / 'site' / row.world / 'simple'}/",
                            packages=list(row.settings.wheel_packages), work=work, python=python)
        _write(out, record)

    build_all(names, versions=versions, work=work, dist=dist, python_version=python_version,
              deadline=started + deadline_s, rebuild=rebuild, record=record, out=out, built=release_and_check,
              cache_secret=cache_secret)
    # all started together: the longest build's seconds are the builds' wall time
    record["builds_wall_s"] = max([entry.get("build_s", 0) for entry in record["components"].values()]
                                  + [check["seconds"] for check in record["rebuild_checks"].values()])
    indexed = [entry["indexed"] for entry in record["components"].values() if "indexed" in entry]
    record["indexed"] = next((i for i in indexed if i != "yes"), "yes" if indexed else "nothing released")
    for entry in record["components"].values():
        entry["green"] = green(entry)
    record["green"] = sum(entry["green"] for entry in record["components"].values())
    record["wall_s"] = round(time.monotonic() - started)
    _write(out, record)
    return record


# --- recording it -----------------------------------------------------------------------------------


def _read_sweep(result: Path) -> dict:
    """A sweep.json as run() wrote it; one written before the sweep ended (the machine taken back, the call's time
    up) is kept as what it shows, marked unfinished: a component whose installs and kernel runs had not ended is
    not green."""
    sweep = json.loads(result.read_text())
    if sweep.get("kind") != "sweep" or not re.fullmatch(r"[0-9a-f]{7,40}", str(sweep.get("commit", ""))):
        raise ConfigError(f"{result}: not a sweep record with the commit it ran; give the sweep.json that "
                          "tests/gpu/sweep.py run wrote")
    if "wall_s" not in sweep:  # run() writes it last
        sweep["unfinished"] = True
        for entry in sweep["components"].values():
            entry["green"] = green(entry)
        sweep["green"] = sum(entry["green"] for entry in sweep["components"].values())
    return sweep


def add_record(result: Path, into: Path = RESULTS, notes: tuple[str, ...] = ()) -> dict:
    """Add a sweep's record to the device results (under ``sweeps``, newest last), with ``notes``."""
    sweep = _read_sweep(result)
    if notes:
        sweep["notes"] = [*sweep.get("notes", []), *notes]
    data = json.loads(into.read_text())
    data.setdefault("sweeps", []).append(sweep)
    into.write_text(json.dumps(data, indent=2) + "\n")
    return sweep


def add_cached_record(first: Path, again: Path, into: Path = RESULTS, notes: tuple[str, ...] = ()) -> dict:
    """Add a cached sweep (run_on_device.sh's WHEELHOUSE_SWEEP_REMOTE_CACHE=1: the sweep through a served compiler
    cache, then again as a second machine) to the device results under ``cached_sweeps``, apart from ``sweeps``:
    it may hold only some components, and ``sweeps`` is the all-nine record the size model reads."""
    runs = {"first": _read_sweep(first), "again": _read_sweep(again)}
    for name, path in (("first", first), ("again", again)):
        if not all("compiler_cache" in entry for entry in runs[name]["components"].values() if "build_s" in entry):
            raise ConfigError(f"{path}: a sweep without compiler-cache counts; give the sweep.json and "
                              "sweep-again.json of run_on_device.sh sweep with WHEELHOUSE_SWEEP_REMOTE_CACHE=1")
    if runs["first"]["commit"] != runs["again"]["commit"]:
        raise ConfigError(f"{again}: ran {runs['again']['commit'][:12]}, {first} ran {runs['first']['commit'][:12]}; "
                          "give the two files of one cached sweep")
    record = {**runs, "hit_rate": cache_hit_rate(runs["again"]), "notes": list(notes)}
    data = json.loads(into.read_text())
    data.setdefault("cached_sweeps", []).append(record)
    into.write_text(json.dumps(data, indent=2) + "\n")
    return record


def cache_hit_rate(sweep: dict) -> dict[str, int]:
    """The compiler cache's counts summed over a sweep's builds: units asked for, hits, and the sccache steps of the
    hits that came from the remote."""
    counts = [entry.get("compiler_cache") or {} for entry in sweep["components"].values()]
    return {key: sum(c.get(key, 0) for c in counts)
            for key in ("requests", "hits", "misses", "step_hits", "remote_step_hits")}


def _cache_counts(stats: dict) -> str:
    remote = f", {stats['remote_step_hits']} of its steps' hits from the remote" if "remote_step_hits" in stats else ""
    return f"{stats.get('hits', 0)} hits of {stats.get('requests', 0)} requests, {stats.get('misses', 0)} misses{remote}"


def cached_line(cached: dict) -> str:
    rate = cached["hit_rate"]
    share = hit_share(rate["hits"], rate["requests"]) if rate["requests"] else "no compile request"
    return (f"the second machine: {rate['hits']} of {rate['requests']} compiles from the cache ({share}), "
            f"{rate['remote_step_hits']} of {rate['step_hits']} hit steps from the remote; builds "
            f"{cached['first'].get('builds_wall_s')} s, then {cached['again'].get('builds_wall_s')} s")


def summary(sweep: dict) -> str:
    lines = [f"sweep of {sweep['commit'][:12]} on {sweep['machine']}: {sweep['green']} of "
             f"{len(sweep['components'])} green, builds {sweep.get('builds_wall_s')} s, "
             + ("UNFINISHED (recorded before it ended)" if sweep.get("unfinished") else f"all {sweep.get('wall_s')} s")]
    if "host_probe" in sweep:
        lines.append(f"  {probe_line(sweep['host_probe'])}")
    for name, entry in sweep["components"].items():
        kernels = entry.get("kernels") or {}
        wheels = ", ".join(f"{w['name']} {w['sha256'][:12]}" for w in entry.get("wheels", []))
        lines.append(f"  {name}: {'green' if entry.get('green') else 'NOT green'}; build {entry.get('build')} "
                     f"{entry.get('build_s')} s; checks {entry.get('checks')}; {entry.get('installed', 'not installed')}; "
                     f"imports {entry.get('imports', '-')}; kernels {kernels.get('passed', 0)} passed, "
                     f"{kernels.get('failed', 0)} failed, {kernels.get('skipped', 0)} skipped; {wheels}"
                     + (f"; compiler cache {_cache_counts(entry['compiler_cache'])}" if entry.get("compiler_cache") else ""))
    for name, check in sweep.get("rebuild_checks", {}).items():
        lines.append(f"  rebuild-check {name}: {check['status']}, {check['seconds']} s, "
                     f"{'identical' if check['identical'] else 'DIFFERENT'} {' / '.join(d[:12] for d in check['sha256'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    make = sub.add_parser("variant")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--full-archs", default="", help="components built with versions.yaml's arch list")
    go = sub.add_parser("run")
    go.add_argument("--versions", type=Path, required=True)
    go.add_argument("--work", type=Path, required=True)
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--commit", required=True)
    go.add_argument("--deadline", type=int, default=21 * 60, help="seconds after which builds still running stop")
    go.add_argument("--components", help="only these (default: every component of the versions file)")
    go.add_argument("--rebuild", default=" ".join(REBUILD_CHECKS), help="components built twice by rebuild-check")
    go.add_argument("--compiler-cache-secret", type=Path,
                    help="the remote compiler cache's credential file (WHEELHOUSE_COMPILER_CACHE names the cache); "
                         "each build gets a copy")
    go.add_argument("--host-probe", type=Path,
                    help="tests/gpu/host_probe.py's record of this machine, kept in the sweep's")
    keep = sub.add_parser("record")
    keep.add_argument("--result", type=Path, required=True)
    keep.add_argument("--into", type=Path, default=RESULTS)
    keep.add_argument("--note", action="append", default=[], help="a line for the record's notes (repeatable)")
    keep.add_argument("--again", type=Path, help="a cached sweep's second run (sweep-again.json): both go under "
                                                 "cached_sweeps")
    args = parser.parse_args(argv)
    try:
        if args.what == "variant":
            args.out.write_text(variant(full_archs=tuple(args.full_archs.split())), encoding="utf-8")
            if absent := not_on_the_device():
                print(f"sweep: {_absent_line(absent, DEVICE_VERSIONS)}", file=sys.stderr)
        elif args.what == "run":
            sweep = run(versions=args.versions.resolve(), work=args.work.resolve(), out=args.out.resolve(),
                        commit=args.commit, deadline_s=args.deadline,
                        components=args.components.split() if args.components else None,
                        rebuild=tuple(args.rebuild.split()), cache_secret=args.compiler_cache_secret,
                        host_probe=args.host_probe)
            print(summary(sweep))
            return 0 if sweep["green"] == len(sweep["components"]) else 1
        elif args.again:
            cached = add_cached_record(args.result, args.again, args.into, tuple(args.note))
            print(f"{summary(cached['first'])}\nagain:\n{summary(cached['again'])}\n{cached_line(cached)}")
        else:
            print(summary(add_record(args.result, args.into, tuple(args.note))))
    except ConfigError as error:
        print(f"sweep: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
