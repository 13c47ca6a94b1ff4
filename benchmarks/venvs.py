"""Figure 7: row venvs, pip vs uv, cold and warm installer cache.

``ci.building.job.toolchain.prepare_venv`` creates the pinned venv of the fixture row (tests/fixtures/versions.yaml:
Python 3.11, torch 2.13.0 from pip's configuration) with each installer. Cold: the installer's cache
directory is empty (``PIP_CACHE_DIR`` / ``UV_CACHE_DIR`` point at a new one). Warm: a second venv,
at another path, with the cache the cold one filled: what every later row with the same torch costs.
Each venv is verified (torch version, CUDA, ABI) outside the timing, then deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from benchmarks.common import REPO, Context, Figure, Samples, Table, human_bytes, ratio

NAME = "venvs"
TITLE = "9. Row venvs: pip vs uv, cold and warm"
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
INSTALLERS = ("pip", "uv")


@contextlib.contextmanager
def _environ(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def run(ctx: Context) -> Figure:
    from ci.building import toolchain
    from ci.model import matrix
    from ci.model.versions import load

    if toolchain.find_uv() is None:
        raise RuntimeError("uv not found (requirements-tools.txt installs it)")
    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    index = toolchain.torch_index(row)
    reps = 1 if (ctx.quick or ctx.toy) else 2
    work = ctx.work / "venvs"
    shutil.rmtree(work, ignore_errors=True)
    times = {(inst, kind): Samples() for inst in INSTALLERS for kind in ("cold", "warm")}
    venv_size: dict[str, int] = {}
    torch_seen = ""
    try:
        for rep in range(reps):
            caches = {inst: work / f"{inst}-cache-{rep}" for inst in INSTALLERS}
            # cold for both installers, then warm for both: a noisy neighbour slows both alike
            for kind in ("cold", "warm"):
                for inst in INSTALLERS if rep % 2 == 0 else INSTALLERS[::-1]:
                    venvs_root = work / f"{inst}-{kind}-{rep}"
                    env = {"PIP_CACHE_DIR": str(caches[inst] / "pip"), "UV_CACHE_DIR": str(caches[inst] / "uv")}
                    with _environ(**env):
                        started = time.perf_counter()
                        python = toolchain.prepare_venv(row, venvs_root, index=index, installer=inst)
                        elapsed = time.perf_counter() - started
                    interpreter = toolchain.verify(python, row)
                    torch_seen = interpreter.torch_version
                    times[(inst, kind)].add(elapsed)
                    venv_size.setdefault(inst, _tree_bytes(venvs_root))
                    ctx.log(f"  {inst} {kind} {rep + 1}/{reps}: {elapsed:.1f} s (torch {torch_seen})")
                    shutil.rmtree(venvs_root, ignore_errors=True)
            for cache in caches.values():
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    for kind in ("cold", "warm"):
        pip, uv = times[("pip", kind)], times[("uv", kind)]
        rows.append([f"{kind} installer cache", pip.fmt(), uv.fmt(), ratio(pip, uv)])
    uv_cold, uv_warm = times[("uv", "cold")], times[("uv", "warm")]
    rows.append(["uv cold / uv warm", "", "", ratio(uv_cold, uv_warm)])
    summary = [f"row venv with torch {torch_seen} (Python {row.python}): pip / uv {ratio(times[('pip', 'cold')], uv_cold)} "
               f"cold, {ratio(times[('pip', 'warm')], uv_warm)} warm (a second venv with the same torch)"]
    source = "pip's configuration" if index is None else index
    return Figure(
        NAME, TITLE,
        compared=("`ci.building.job.toolchain.prepare_venv` of the fixture row (create the venv, install torch, install the build "
                  "tools) with `installer='pip'` (`python -m venv`, `pip install`) vs `installer='uv'` (`uv venv`, "
                  "`uv pip install` with pip's index options passed on)"),
        where=(f"this machine, {os.cpu_count()} cores; torch {torch_seen} from {source}; venvs and installer caches "
               f"on one file system"),
        repetitions=(f"{reps} of each, per repetition cold pip and uv, then warm pip and uv (order alternating); "
                     "min / median"),
        tables=[Table(["venv creation", "pip", "uv", "pip / uv"], rows)],
        notes=[
            "Cold: the installer's cache directory is new and empty. Warm: a second venv at another path, with the "
            "cache the cold run filled (every later row with the same torch on that machine or CI cache).",
            "pip unpacks every wheel into every venv; uv unpacks it once into its cache and hardlinks the files "
            "into each venv (its cache lives next to the venvs, `<WHEELHOUSE_CACHE>/uv`, so links work).",
            f"Venv size on disk: pip {human_bytes(venv_size.get('pip', 0))}, uv "
            f"{human_bytes(venv_size.get('uv', 0))} (hardlinked files counted in full). A CUDA torch with its "
            "nvidia-* wheels is several GB: pip's cost grows with it, uv's warm cost barely does.",
            "Every venv is verified by `ci.building.job.toolchain.verify` (torch version, CUDA, C++ ABI) after the timing.",
        ],
        summary=summary,
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
