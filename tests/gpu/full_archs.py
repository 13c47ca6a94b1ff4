#!/usr/bin/env python3
"""The GPU machine's builds with versions.yaml's own arch lists, and one flash-attention unit timed.

``variant`` writes the device versions file (tests/fixtures/versions-device.yaml: the refs the carried
mirror serves, the machine's torch) with the arch settings of versions.yaml's x86_64 rows in place of its
sm_90 ones, for the components named: DeepEP 8.0;9.0;10.0, TransformerEngine 8.0;9.0;10.0, apex its
seven, and for the two whose setup.py emits its own gencodes (fast-hadamard-transform's nine,
FlashMLA's sm_90a + sm_100f) exactly those, so the wheel checks require them; nvcc gets a thread per
gencode, up to the machine's cores. ``requested`` prints a component's list (what cuobjdump must show).

``one-unit`` times one kernel translation unit of flash-attention for all four archs of versions.yaml
through the real build's nvcc command: setup.py writes its build.ninja (a stand-in ninja stops it
there), and the unit's command runs as written, with nvcc --threads 1 and with --threads 4.

    python tests/gpu/full_archs.py variant --components "deep-ep apex" --out versions-all-archs.yaml
    python tests/gpu/full_archs.py requested --versions versions-all-archs.yaml --component apex
    python tests/gpu/full_archs.py one-unit --source FLASH_ATTENTION_CHECKOUT --out one-unit.json
    python tests/gpu/full_archs.py result --component apex --versions V --dist DIST --build-s 300 --status 0 --out R

``result`` adds one component's row to the results file run_on_device.sh all-archs writes under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from host_probe import read as read_probe  # noqa: E402

from ci.base.errors import ConfigError  # noqa: E402
from ci.model import versions as versions_mod  # noqa: E402

DEVICE_VERSIONS = ROOT / "tests" / "fixtures" / "versions-device.yaml"
# What the setup.py of a component without torch_cuda_arch_list emits for CUDA 13 (cuobjdump's list).
OWN_GENCODES = {
    "fast-hadamard-transform": "7.5;8.0;8.7;9.0;10.0;10.3;11.0;12.0;12.1",
    "flash-mla": "9.0a;10.0f",
}
# The builders that hand nvcc_threads to nvcc (DeepEP's setup.py takes none, and its builder is not ours to change).
GIVES_NVCC_THREADS = {"fast-hadamard-transform", "flash-mla", "apex", "transformer-engine", "flash-attention"}
# Builders that take MAX_JOBS as a budget of cores and share it out between extensions themselves
# (build_scripts/apex.sh: APEX_PARALLEL_BUILD = MAX_JOBS / (2 x nvcc threads)). A thread per gencode leaves them
# one extension at a time (apex with seven archs: 2 jobs x 7 threads, still compiling its ninth of twelve
# extensions after 680 s on 16 cores), so they keep versions.yaml's nvcc threads and get every core.
SHARES_ITS_CORES = {"apex"}
ONE_UNIT = "flash_fwd_hdim128_fp16_sm80.cu"
STAND_IN_NINJA = "#!/bin/sh\n[ \"$1\" = --version ] && { echo 1.11.1; exit 0; }\nexit 1\n"


def variant(components: list[str], *, device: Path = DEVICE_VERSIONS, cores: int | None = None) -> str:
    """The device versions file with versions.yaml's arch settings for ``components``."""
    real = versions_mod.load()
    raw = yaml.safe_load(device.read_text(encoding="utf-8"))
    cores = cores or os.cpu_count() or 1
    unknown = [name for name in components if name not in raw["components"] or name not in real.components]
    if unknown:
        raise ConfigError(f"{device.name}: {unknown[0]} is not a component of both {device.name} and versions.yaml; "
                          f"name one of {', '.join(sorted(set(raw['components']) & set(real.components)))}")
    for name in components:
        settings = real.component(name).settings_for("x86_64")
        entry = raw["components"][name]
        archs = settings.torch_cuda_arch_list or OWN_GENCODES.get(name)
        entry["torch_cuda_arch_list"] = archs
        if settings.extra_cubins:  # what the gate accepts beyond the list (TransformerEngine's 10.3a)
            entry["extra_cubins"] = dict(settings.extra_cubins)
        entry["arch_filter"] = False  # every arch its own build compiles
        entry["verify_wheel_archs"] = archs is not None
        gencodes = len(versions_mod.parse_arch_list(archs).archs) if archs else 1
        if name in SHARES_ITS_CORES:
            entry["nvcc_threads"] = min(settings.nvcc_threads, gencodes)
        elif name in GIVES_NVCC_THREADS:
            entry["nvcc_threads"] = max(1, min(gencodes, cores, 64))
        else:
            entry["nvcc_threads"] = 1
        env = dict(entry.get("extra_env") or {})
        if "NVCC_THREADS" in env:
            env["NVCC_THREADS"] = str(entry["nvcc_threads"])
        if "NVTE_BUILD_THREADS_PER_JOB" in env:
            env["NVTE_BUILD_THREADS_PER_JOB"] = str(entry["nvcc_threads"])
        if env:
            entry["extra_env"] = env
        # the cores shared out between the jobs and their nvcc threads (two jobs at least: a CUDA unit and
        # its binding's C++ unit side by side), or all of them to a builder that shares them out itself
        entry["max_jobs"] = cores if name in SHARES_ITS_CORES else max(2, cores // entry["nvcc_threads"])
    header = (f"# generated by tests/gpu/full_archs.py from {device.name}: versions.yaml's arch lists for "
              f"{', '.join(components)}\n")
    return header + yaml.safe_dump(raw, sort_keys=False)


def requested(versions: Path, component: str) -> str:
    return versions_mod.load(versions, check_tree=False).component(component).settings_for("x86_64").torch_cuda_arch_list or ""


def one_unit(source: Path, python: str, *, archs: str = "80;90;100;120", unit: str = ONE_UNIT,
             threads: tuple[int, ...] = (4, 1), out: Path | None = None) -> dict:
    """Time one flash-attention unit's real nvcc command for ``archs``, once per nvcc thread count, the most
    threads first; ``out`` is rewritten after each step, so a run stopped by a time limit keeps what it got."""
    from benchmarks.python_reuse import compile_commands

    stand_in = source.parent / "stand-in-ninja"
    stand_in.mkdir(exist_ok=True)
    (stand_in / "ninja").write_text(STAND_IN_NINJA)
    (stand_in / "ninja").chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in}:{os.environ['PATH']}", "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
           "FLASH_ATTN_CUDA_ARCHS": archs, "MAX_JOBS": "1"}
    started = time.perf_counter()
    subprocess.run([python, "setup.py", "build_ext"], cwd=source, env=env, capture_output=True)
    print(f"setup.py wrote its build.ninja in {time.perf_counter() - started:.0f} s", flush=True)
    commands = {src: cmd for ninja in source.rglob("build.ninja") for src, cmd in compile_commands(ninja).items()}
    chosen = next((src for src in commands if src.endswith("/" + unit)), None)
    if chosen is None:
        raise ConfigError(f"{source}: setup.py wrote no build.ninja command for {unit}; see its output")
    command, skip = [], False
    for arg in commands[chosen]:  # without its dependency file and its own --threads
        if skip or arg == "-MD":
            skip = False
        elif arg in ("-MF", "--threads", "-t"):
            skip = True
        elif not arg.startswith("--threads="):
            command.append(arg)
    result = {"unit": unit, "archs": archs, "command": shlex.join(commands[chosen]), "seconds": {}}
    for count in threads:
        flags = list(command)
        started = time.perf_counter()
        proc = subprocess.run([*flags, "--threads", str(count)], cwd=source, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ConfigError(f"{unit}: nvcc exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        result["seconds"][str(count)] = round(time.perf_counter() - started, 1)
        print(f"{unit} for {archs}, nvcc --threads {count}: {result['seconds'][str(count)]} s", flush=True)
        if out is not None:
            out.write_text(json.dumps(result, indent=1) + "\n")
    return result


GITHUB_ASSET_LIMIT = 2 * 2**30


def _base(arch: str) -> str:
    return arch.rstrip("af")


def result(component: str, *, versions: Path, dist: Path, build_s: int, status: int, python: str,
           kernels: str, host_probe: Path | None = None) -> dict:
    """One machine-readable row for benchmarks/device_results.json: the build, its wheel, its archs, its
    gates, its kernels and the time model's prediction beside the measured time (and, with ``host_probe``, how
    fast the host compiles: tests/gpu/host_probe.py)."""
    from ci.formats.archs import parse_arch_list
    from ci.formats.fatbin import scan_wheel_archs
    from ci.model import matrix
    from ci.timing import time_model

    loaded = versions_mod.load(versions, check_tree=False)
    row = next(r for r in matrix.expand(loaded) if r.component == component and r.arch == "x86_64")
    settings = row.settings
    extra = parse_arch_list(list(settings.extra_cubins)).archs
    listed = sorted({f"sm_{a.major}{a.minor}" for a in parse_arch_list(settings.torch_cuda_arch_list or "").archs})
    allowed = {*listed, *(f"sm_{a.major}{a.minor}" for a in extra)}  # cuobjdump: every listed arch, and only these
    memory = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal:"))) // 2**20
    conditions = time_model.Conditions(os.cpu_count() or 1, memory, settings.max_jobs,
                                       time_model.nvcc_threads(row), max(1, len(listed)))
    found = {"component": component, "ref": row.ref, "requested_archs": settings.torch_cuda_arch_list,
             "settings": f"max_jobs {settings.max_jobs}, nvcc threads {time_model.nvcc_threads(row)}",
             "build_s": build_s, "build_exit": status,
             "predicted_s": round(time_model.predict_seconds(component, conditions)),
             "wheels": [], "kernels": kernels}
    if host_probe is not None:
        found["host_probe"] = read_probe(host_probe)
    if extra:
        found["extra_cubins"] = ";".join(str(a) for a in extra)
    stems = [w.replace("-", "_") for w in settings.wheel_packages]
    for wheel in sorted(p for p in dist.glob("*.whl") if p.name.split("-")[0] in stems):
        entry: dict = {"wheel": wheel.name, "bytes": wheel.stat().st_size,
                       "under_github_limit": wheel.stat().st_size < GITHUB_ASSET_LIMIT, "shared_objects": {}}
        for member, cubins in scan_wheel_archs(wheel).cubins_by_member().items():
            entry["shared_objects"][member] = {
                "cubins": cubins, "equal": set(listed) <= {_base(a) for a in cubins} <= allowed}
        gate = subprocess.run([sys.executable, "-m", "invoke", "check-wheel", "--wheel", str(wheel), "--torch", python,
                               "--pythons", "3.12", *(["--require-archs", settings.torch_cuda_arch_list]
                                                      if settings.torch_cuda_arch_list else []),
                               *(["--extra-cubins", ";".join(settings.extra_cubins)] if extra else [])],
                              capture_output=True, text=True, cwd=ROOT)
        entry["arch_gate"] = "PASS" if gate.returncode == 0 else f"FAIL: {(gate.stdout + gate.stderr).strip()[-300:]}"
        found["wheels"].append(entry)
    found["all_equal"] = bool(found["wheels"]) and all(
        so["equal"] for w in found["wheels"] for so in w["shared_objects"].values())
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    make = sub.add_parser("variant")
    make.add_argument("--components", required=True)
    make.add_argument("--out", type=Path, required=True)
    ask = sub.add_parser("requested")
    ask.add_argument("--versions", type=Path, required=True)
    ask.add_argument("--component", required=True)
    time_one = sub.add_parser("one-unit")
    time_one.add_argument("--source", type=Path, required=True)
    time_one.add_argument("--python", default=sys.executable)
    time_one.add_argument("--out", type=Path, required=True)
    record = sub.add_parser("result")
    record.add_argument("--component", required=True)
    record.add_argument("--versions", type=Path, required=True)
    record.add_argument("--dist", type=Path, required=True)
    record.add_argument("--build-s", type=int, required=True)
    record.add_argument("--status", type=int, required=True)
    record.add_argument("--kernels", default="")
    record.add_argument("--python", default=sys.executable)
    record.add_argument("--out", type=Path, required=True, help="the results file; the row is added to its rows")
    record.add_argument("--host-probe", type=Path, help="tests/gpu/host_probe.py's record of this machine")
    args = parser.parse_args(argv)
    try:
        if args.what == "result":
            row = result(args.component, versions=args.versions, dist=args.dist, build_s=args.build_s,
                         status=args.status, python=args.python, kernels=args.kernels, host_probe=args.host_probe)
            data = json.loads(args.out.read_text()) if args.out.is_file() else {"rows": []}
            data["rows"] = [r for r in data["rows"] if r["component"] != args.component] + [row]
            args.out.write_text(json.dumps(data, indent=1) + "\n")
            print(json.dumps(row, indent=1))
            return 0
        if args.what == "variant":
            args.out.write_text(variant(args.components.split()), encoding="utf-8")
        elif args.what == "requested":
            print(requested(args.versions, args.component))
        else:
            one_unit(args.source.resolve(), args.python, out=args.out)
            print(args.out.read_text())
    except ConfigError as error:
        print(f"full_archs: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
