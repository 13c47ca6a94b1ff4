"""Figure 14: nvcc's --threads on one translation unit that carries several gencodes.

fast-hadamard-transform's one CUDA unit carries nine gencodes, and nvcc compiles them one after another
unless it is given ``--threads``, which its setup.py does not give: the builder now passes NVCC_THREADS
through NVCC_APPEND_FLAGS (``append_nvcc_threads`` in build_scripts/lib/arch.sh). Compared: the same
unit (self-contained, template-heavy device code, no headers) for four gencodes, compiled by the real
nvcc with ``NVCC_APPEND_FLAGS="--threads N"`` for N = 1 and N = this machine's cores, interleaved.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from benchmarks.common import Context, Figure, Table

NAME = "nvcc-threads"
TITLE = "14. nvcc --threads for a unit with several gencodes"
NVCC = Path("/usr/local/cuda/bin/nvcc")
ARCHS = ("80", "90", "100", "120")

UNIT = """\
template <int N, int M> __device__ float step(float a) {
  #pragma unroll
  for (int i = 0; i < N; ++i) a = a * (1.0f + 1e-4f * M) + 0.5f / (i + M);
  return a;
}
template <int N, int M> __global__ void kernel(float* x) { x[threadIdx.x] = step<N, M>(x[threadIdx.x]); }
"""


def _unit(work: Path, instances: int) -> Path:
    source = work / "many_gencodes.cu"
    lines = [UNIT] + [f"template __global__ void kernel<{64 + 8 * i}, {i + 1}>(float*);" for i in range(instances)]
    source.write_text("\n".join(lines) + "\n")
    return source


def _compile(source: Path, threads: int) -> float:
    gencodes = [flag for arch in ARCHS for flag in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
    env = {**os.environ, "NVCC_APPEND_FLAGS": f"--threads {threads}"}
    started = time.perf_counter()
    subprocess.run([str(NVCC), *gencodes, "-O3", "-c", str(source), "-o", str(source.with_suffix(f".{threads}.o"))],
                   check=True, env=env, capture_output=True)
    return time.perf_counter() - started


def run(ctx: Context) -> Figure:
    cores = os.cpu_count() or 2
    rows, summary, notes = [], [], []
    if NVCC.is_file() and not ctx.toy:
        work = ctx.work / "nvcc-threads"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        source = _unit(work, 16 if ctx.quick else 48)
        _compile(source, 1)  # warm the file cache
        times: dict[int, list[float]] = {1: [], cores: []}
        for _ in range(2 if ctx.quick else 3):
            for threads in times:
                times[threads].append(_compile(source, threads))
        one, many = (statistics.median(times[t]) for t in (1, cores))
        ratio, best = one / many, min(times[1]) / min(times[cores])
        rows = [[f"{len(ARCHS)} (sm_{', sm_'.join(ARCHS)})", f"{min(times[1]):.1f} / {one:.1f} s",
                 f"{min(times[cores]):.1f} / {many:.1f} s", f"{ratio:.2f}x (min {best:.2f}x)"]]
        summary = [f"one unit, {len(ARCHS)} gencodes: nvcc --threads 1 / --threads {cores} {ratio:.2f}x "
                   f"(min {best:.2f}x)"]
        shutil.rmtree(work, ignore_errors=True)
    else:
        notes.append(f"not measured: no nvcc at {NVCC}")
    return Figure(
        NAME, TITLE,
        compared=f"one translation unit compiled for {len(ARCHS)} gencodes with nvcc --threads 1 and --threads {cores} "
                 "(through NVCC_APPEND_FLAGS, as the builders pass it)",
        where=f"this machine, {cores} cores, nvcc 13.0 (device code only, no GPU needed)",
        repetitions="3 compiles of each, interleaved (2 in quick mode); min / median",
        tables=[Table(["gencodes", "--threads 1 (min / median)", f"--threads {cores} (min / median)",
                       "1 thread / threads"], rows)],
        notes=notes,
        summary=summary,
    )
