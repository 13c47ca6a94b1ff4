"""Figure 12(a): how much of each component's compile a second Python can take from the first one's cache.

sccache reuses an object across Pythons exactly when the preprocessed text (with the build directory and
the venv's site-packages stripped, SCCACHE_BASEDIRS) and the flags are the same. So, per component, its
own setup.py writes its own ``build.ninja`` for Python 3.11 and for 3.12 (each with the package index's
CUDA torch; a stand-in ``ninja`` first on PATH stops the build right after, so nothing is compiled), and
every translation unit is preprocessed (``-E``) with the exact flags of each Python's file. A unit whose
two preprocessed texts are the same, the venv paths replaced by one placeholder, is one the second
Python's build can take from the cache; one that includes Python's headers differs.

Sources: the upstream repositories' local git snapshots, ``<owner>+<name>/repo`` below the folder
``WHEELHOUSE_BENCH_SNAPSHOTS`` names (each unpacked with ``git archive`` into the benchmark's scratch
directory, the submodules at the commits the tree points to). Left out when it is unset.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import cuda_torch
from benchmarks.common import Context, Figure, Table

NAME = "python-reuse"
TITLE = "12. Across Pythons: what a second Python's build can take from the first's compiler cache"
PYTHONS = ("3.11", "3.12")
TORCH = "2.13.0"
SNAPSHOTS_ENV = "WHEELHOUSE_BENCH_SNAPSHOTS"
STAND_IN_NINJA = "#!/bin/sh\n[ \"$1\" = --version ] && { echo 1.11.1; exit 0; }\nexit 1\n"


@dataclass(frozen=True)
class Upstream:
    """One component's sources as its build gets them, and the setup.py call its builder makes."""

    repo: str
    commit: str
    submodules: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """path -> (snapshot repository, the paths of it a build reads; empty: all)"""
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ("build_ext",)
    note: str = ""


CUTLASS = ("NVIDIA+cutlass", ("include", "tools/util/include"))
COMPONENTS: dict[str, Upstream] = {
    "fast-hadamard-transform": Upstream(
        "Dao-AILab+fast-hadamard-transform", "e7706faf8d1c3b9f241e36860640ad1dac644ede",
        env={"FAST_HADAMARD_TRANSFORM_FORCE_BUILD": "TRUE"}, note="the pin"),
    "flash-mla": Upstream(
        "deepseek-ai+FlashMLA", "9241ae3", {"csrc/cutlass": CUTLASS}, env={"NVCC_THREADS": "2"},
        note="9241ae3 (the pin 15f13e5 is not in the snapshot)"),
    "flash-attention": Upstream(
        "Dao-AILab+flash-attention", "v2.8.3", {"csrc/cutlass": CUTLASS},
        env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "80;90;100;120"}, note="v2.8.3"),
    "deep-ep": Upstream(
        "deepseek-ai+DeepEP", "3f601f7ac1c062c46502646ff04c535013bfca00",
        env={"TORCH_CUDA_ARCH_LIST": "9.0", "DISABLE_SM90_FEATURES": "0"}, note="the pin"),
    "apex": Upstream(
        "NVIDIA+apex", "6424da3b4faa6c8f062da4a48c424fff3f02d42d",
        # every extension at once, so each writes its build.ninja before the stand-in ninja stops it
        env={"APEX_CPP_EXT": "1", "APEX_CUDA_EXT": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "APEX_PARALLEL_BUILD": "16"},
        note="master as the snapshot has it (6424da3)"),
}
# What the other three compile at build time: nothing to measure, or nothing local to measure it on.
NOT_MEASURED = {
    "flashinfer": "nothing compiled at build time: its kernels are compiled by its JIT at run time",
    "megatron-bridge": "nothing compiled: a pure-Python wheel",
    "deep-gemm": "no local snapshot of its sources; its one translation unit, the pybind module _C, includes "
                 "Python's headers (bundle mode builds it once per Python)",
    "transformer-engine": "not measured: its setup.py builds its CMake library (cmake --build) before it writes the "
                          "PyTorch extension's build.ninja, so the stand-in ninja stops it before there is one",
}


def _git(snapshot: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={snapshot}", *args], check=True, capture_output=True, **kw)


def _unpack(snapshot: Path, commit: str, dest: Path, paths: tuple[str, ...] = ()) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    archive = _git(snapshot, "archive", "--format=tar", commit, *paths).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def sources(snapshots: Path, spec: Upstream, dest: Path) -> Path:
    """The component's tree at its commit with its submodules, under ``dest``."""
    if (dest / ".unpacked").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    top = snapshots / spec.repo / "repo"
    _unpack(top, spec.commit, dest)
    for path, (repo, keep) in spec.submodules.items():
        gitlink = _git(top, "rev-parse", f"{spec.commit}:{path}", text=True).stdout.strip()
        shutil.rmtree(dest / path, ignore_errors=True)
        _unpack(snapshots / repo / "repo", gitlink, dest / path, keep)
    (dest / ".unpacked").write_text(spec.commit + "\n")
    return dest


def _ninja_files(tree: Path, spec: Upstream, python: Path, stand_in: Path, log: Path) -> list[Path]:
    """Run the component's setup.py with the stand-in ninja: it writes its build.ninja and stops."""
    env = {**os.environ, **spec.env, "PATH": f"{stand_in}:{python.parent}:{os.environ['PATH']}",
           "CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda"), "MAX_JOBS": "1",
           "CPATH": cuda_torch.toolkit_extra_include(), "PYTHONDONTWRITEBYTECODE": "1"}
    with log.open("w") as out:
        subprocess.run([str(python), "setup.py", *spec.args], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    return sorted(tree.rglob("build.ninja"))


_VAR = re.compile(r"^(\w+)\s*=\s*(.*)$")
_BUILD = re.compile(r"^build\s+(\S+):\s*(\w+)\s+(\S+)")


def compile_commands(ninja_file: Path) -> dict[str, list[str]]:
    """source -> the compile command torch's extension builder wrote for it (variables expanded)."""
    variables: dict[str, str] = {}
    rules: dict[str, str] = {}
    rule = None
    commands = {}
    for line in ninja_file.read_text().splitlines():
        if line.startswith("rule "):
            rule = line.split()[1]
            continue
        if rule and line.startswith("  command = "):
            rules[rule] = line.split("=", 1)[1].strip()
            continue
        if not line.startswith(" "):
            rule = None
        if (match := _VAR.match(line)) and not line.startswith("build"):
            variables[match[1]] = match[2]
        elif (match := _BUILD.match(line)) and match[2] in ("compile", "cuda_compile") and match[2] in rules:
            text = re.sub(r"\$(\w+)", lambda m: {"in": match[3], "out": match[1]}.get(m[1], variables.get(m[1], "")),
                          rules[match[2]])
            commands[match[3]] = shlex.split(text)
    return commands


def preprocess_command(command: list[str], source: str, out: Path) -> list[str]:
    """The compile command turned into ``-E``: no dependency file, no object, one device arch for nvcc."""
    result, skip = [], 0
    nvcc = Path(command[0]).name == "nvcc" or command[0].endswith("/nvcc")
    for index, arg in enumerate(command):
        if skip:
            skip -= 1
            continue
        if arg in ("-MMD", "-MD", "--generate-dependencies-with-compile"):
            continue
        if arg in ("-MF", "--dependency-output", "-o", "-gencode"):
            skip = 1
            continue
        if arg == "-c" or arg.startswith(("-gencode=", "--generate-code", "-arch")) or arg == source:
            continue
        if index and command[index - 1] == "-c":
            continue
        result.append(arg)
    device = ["-arch=sm_90"] if nvcc else []
    return [*result, *device, "-E", *(["-Xcompiler", "-P"] if nvcc else ["-P"]), source, "-o", str(out)]


def _preprocess(job: tuple[list[str], str, Path, Path]) -> tuple[bool, str]:
    command, source, out, cwd = job
    env = {**os.environ, "CPATH": cuda_torch.toolkit_extra_include()}  # as the build had it
    proc = subprocess.run(preprocess_command(command, source, out), cwd=cwd, capture_output=True, text=True, env=env)
    return proc.returncode == 0 and out.is_file(), _first_error(proc.stderr)


def _first_error(stderr: str) -> str:
    """The compiler's first error line, its paths reduced to the file they name (no build machine's path)."""
    line = next((line for line in stderr.splitlines() if "error" in line), stderr.strip()[-200:])
    return re.sub(r"(?<!\S)(?:/[^\s:/]+)+/([^/\s:]+)", r"\1", line).strip()


@dataclass
class Reuse:
    units: int = 0
    same: int = 0
    bytes_total: int = 0
    bytes_same: int = 0
    failed: list[str] = field(default_factory=list)
    differing: list[str] = field(default_factory=list)
    seconds: float = 0.0


def measure(component: str, spec: Upstream, snapshots: Path, work: Path, log) -> Reuse:
    started = time.perf_counter()
    from ci.model import matrix
    from ci.model.versions import load

    rows = {r.python: r for r in matrix.expand(load()) if r.component == component and r.arch == "x86_64"}
    if component in ("flashinfer", "megatron-bridge"):
        rows = {}
    stand_in = work / "stand-in-ninja"
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "ninja").write_text(STAND_IN_NINJA)
    (stand_in / "ninja").chmod(0o755)
    base = sources(snapshots, spec, work / "sources" / component)
    commands, sites, trees = {}, {}, {}
    for python in PYTHONS:
        row = rows.get(python) or next(iter(rows.values()))
        import dataclasses

        venv = cuda_torch.prepared_venv(dataclasses.replace(row, python=python, torch=TORCH), log)
        tree = work / f"{component}-py{python}"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(base, tree, symlinks=True)
        files = _ninja_files(tree, spec, venv / "bin" / "python", stand_in, work / f"{component}-py{python}.log")
        commands[python] = {src: (cmd, f.parent) for f in files for src, cmd in compile_commands(f).items()}
        sites[python] = str(next(venv.glob("lib/python*/site-packages")))
        trees[python] = str(tree)
    result = Reuse()
    out = work / "preprocessed" / component
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shared = sorted(set(commands[PYTHONS[0]]) & set(commands[PYTHONS[1]]),
                    key=lambda s: s.replace(trees[PYTHONS[0]], "").replace(trees[PYTHONS[1]], ""))
    by_unit: dict[str, dict[str, Path]] = {}
    jobs = []
    for python in PYTHONS:
        for index, source in enumerate(sorted(commands[python], key=lambda s: s.replace(trees[python], ""))):
            command, cwd = commands[python][source]
            unit = source.replace(trees[python], "<src>")
            target = out / f"{python}-{index}.i"
            by_unit.setdefault(unit, {})[python] = target
            jobs.append((command, source, target, cwd))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        answers = list(pool.map(_preprocess, jobs))
    problems = {str(job[2]): message for job, (ok, message) in zip(jobs, answers, strict=True) if not ok}
    for unit, targets in sorted(by_unit.items()):
        if len(targets) < 2:
            result.failed.append(f"{unit}: compiled for one Python only")
            continue
        if any(str(t) in problems for t in targets.values()):
            result.failed.append(f"{unit}: {next(problems[str(t)] for t in targets.values() if str(t) in problems)}")
            continue
        texts = {}
        for python, target in targets.items():
            text = target.read_text(errors="replace")
            texts[python] = text.replace(sites[python], "<site-packages>").replace(trees[python], "<src>")
        result.units += 1
        size = len(texts[PYTHONS[1]].encode())
        result.bytes_total += size
        if texts[PYTHONS[0]] == texts[PYTHONS[1]]:
            result.same += 1
            result.bytes_same += size
        else:
            result.differing.append(unit.removeprefix("<src>/"))
    del shared
    result.seconds = time.perf_counter() - started
    return result


def run(ctx: Context) -> Figure:
    snapshots = os.environ.get(SNAPSHOTS_ENV)
    rows, notes = [], []
    if snapshots and not ctx.toy:
        work = ctx.work / "python-reuse"
        for component, spec in COMPONENTS.items():
            ctx.log(f"  {component}: build.ninja for Pythons {' and '.join(PYTHONS)}, then -E of every unit")
            found = measure(component, spec, Path(snapshots), work, ctx.log)
            units = found.units + len(found.failed)
            share_units = f"{found.same / found.units:.2f}" if found.units else "-"
            share_bytes = f"{found.bytes_same / found.bytes_total:.2f}" if found.bytes_total else "-"
            rows.append([component, spec.note, str(units), f"{found.same} / {found.units}", share_units,
                         f"{found.bytes_total / 2**20:.0f} MiB", share_bytes,
                         ", ".join(found.differing[:6]) + (f" and {len(found.differing) - 6} more"
                                                           if len(found.differing) > 6 else "")])
            if found.failed:
                notes.append(f"{component}: {len(found.failed)} unit(s) not compared: " + "; ".join(found.failed[:3]))
            ctx.log(f"  {component}: {found.same}/{found.units} units the same, {found.seconds:.0f} s")
    for component, reason in NOT_MEASURED.items():
        rows.append([component, "", "-", "-", "-", "-", "-", reason])
    return Figure(
        NAME, TITLE,
        compared=(f"per translation unit, its preprocessed text (`-E`) with Python {PYTHONS[0]}'s and with "
                  f"{PYTHONS[1]}'s compile flags as the component's own setup.py writes them into build.ninja "
                  "(venv paths replaced by one placeholder, as sccache strips them)"),
        where=(f"this machine, {os.cpu_count()} cores; torch {TORCH} (CUDA 13 wheel) from the package index, "
               "nvcc 13.0; sources from the upstream repositories' local snapshots"),
        repetitions="1 (preprocessing is deterministic)",
        tables=[Table(["component", "sources", "translation units", "the same for both Pythons", "share (units)",
                       "preprocessed (py3.12)", "share (bytes)", "units that differ (include Python's headers)"],
                      rows)],
        notes=[
            "share (units): the translation units a second Python's build takes from the compiler cache, of all; "
            "share (bytes): the same weighted by each unit's preprocessed size, a proxy for its compile time.",
            "nvcc units are preprocessed for one device arch (sm_90): which headers a unit includes does not depend on it.",
            *notes,
        ],
        summary=[f"{row[0]}: {row[4]} of its translation units ({row[6]} of preprocessed bytes) the same for "
                 f"Pythons {' and '.join(PYTHONS)}" for row in rows if row[4] not in ("-",)],
    )


if __name__ == "__main__":
    print(run(Context(quick=True)).markdown())
    sys.exit(0)
