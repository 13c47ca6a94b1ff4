"""Each row's wheel sizes, predicted before the build from wheels that were built; an asset past the budget is refused.

GitHub refuses a release asset of 2 GiB or more, and a wheel only shows its size once hours of compiling are
done: flashinfer-jit-cache reached 2.143 GiB for one world upstream, and its upload failed. So the plan says
what each wheel of a row will weigh, beside its time, and a plan with an asset past :data:`ASSET_BUDGET`
(1.9 GiB: the limit less headroom for a wheel that grows release by release) is refused in one line with the fix.

The data is ``ci/timing/wheel_sizes.json``, written by ``python -m ci size-model --write`` from every wheel
``benchmarks/device_results.json`` records (bytes, the archs it was built for, the Pythons it bundles): per
project, ``bytes = base + per_unit * units``, least squares over its builds, where a unit is

- an arch of the row's list (``torch_cuda_arch_list``; a setup.py's own gencodes where the list is null):
  each arch adds one cubin of every kernel;
- a Python of a bundle (``bundle_pythons``: one extension module each);
- a compile of flashinfer-jit-cache (a CUDA source of a module for one arch, ci/model/jit_cache.py ``compile_units``),
  from the subset built on the GPU machine; a row's count comes from its module list (ci/timing/shard_model.py's
  ``recorded_modules``: its last build, or ci/timing/module_times/);
- nothing, for a wheel without compiled code.

One build of a project gives no base: its bytes are taken as all per unit, which over-predicts rows of more
units (the host code counted again per arch), the safe side for a budget; so does a fit whose base would fall
below zero (a wheel that grows faster than its arch count), which goes through zero at its steepest build.
flashinfer-jit-cache is one provider wheel per arch (upstream's layout: ``flashinfer-jit-cache-sm90a``...) and a
shim, each predicted from its own arch's compiles. A rehosted wheel is upstream's: its size is not ours to predict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ci.base import log
from ci.base.errors import ConfigError, WheelhouseError
from ci.model.matrix import MatrixRow
from ci.model.versions import REPO_ROOT
from ci.timing import data_files

_LOG = log.get("timing")
SIZES_FILE = data_files.DATA_DIR / "wheel_sizes.json"
COMMAND = "python -m ci size-model --write"
GITHUB_ASSET_LIMIT = 2 * 2**30
ASSET_BUDGET = int(1.9 * 2**30)
"""The most a planned release asset may weigh: GitHub's 2 GiB less headroom (flashinfer's cu129 x86_64 jit-cache had
96 MiB left and grew about 2.8 MiB a day)."""
JIT_CACHE = "flashinfer-jit-cache"
SHIM_BYTES = 8 * 2**10
"""The jit-cache shim: two small Python files and its dist-info."""


# --- the measurements -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    project: str
    wheel: str
    bytes: int
    archs: int
    pythons: int
    compiles: int
    where: str
    """The device_results.json section and the row's component."""


_ARCH_TOKEN = re.compile(r"[;,\s]+")
_SM = re.compile(r"\bsm_(\d{2,3})[af]?\b")


def _count_archs(text: str) -> int:
    return len([t for t in _ARCH_TOKEN.split(text) if t.strip()])


def _row_archs(row: Mapping[str, Any], arch_list: str) -> int:
    """The archs a row's wheel holds: the distinct ones its ``cubins`` note names (sm_90 and sm_90a are one), else
    its ``requested_archs``, else the section's arch list."""
    named = {int(n) for n in _SM.findall(str(row.get("cubins", "")))}
    if named:
        return len(named)
    return _count_archs(str(row.get("requested_archs") or arch_list))


def _pythons_of(wheel: str) -> int:
    tag = wheel[:-4].split("-")[-3]
    return max(1, len([t for t in tag.split(".") if t.startswith("cp")]))


def _bytes_of(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("system g++"), int):
        return int(value["system g++"])  # the builds' own compiler, not the machine's static-libstdc++ wrapper
    return None


def measurements(results: Mapping[str, Any]) -> list[Measured]:
    """Every wheel ``device_results.json`` records with its bytes: a section's rows (``component``, ``wheel`` and
    ``bytes``, or ``wheels`` of each, and a ``refused_wheel``), its ``cpu_bundle``, the jit-cache subset
    (``jit_cache``) and each component's newest sweep (``sweeps``)."""
    found: list[Measured] = list(_sweep_measurements(results.get("sweeps") or ()))
    for section, data in results.items():
        if not isinstance(data, Mapping):
            continue
        if section == "jit_cache":
            found += _jit_cache_measurements(data)
            continue
        for row in data.get("rows") or ():
            found += _row_measurements(section, row, str(data.get("arch_list", "9.0")))
        bundle = data.get("cpu_bundle")
        if isinstance(bundle, Mapping) and (size := _bytes_of(bundle.get("bytes"))):
            found.append(_measured(bundle["wheel"], size, 0, f"{section}.cpu_bundle"))
    return found


def _row_measurements(section: str, row: Any, arch_list: str) -> Iterator[Measured]:
    if not isinstance(row, Mapping) or "component" not in row:
        return
    archs = _row_archs(row, arch_list)
    wheels = [row] if "wheel" in row else [w for w in row.get("wheels") or () if isinstance(w, Mapping)]
    if isinstance(row.get("refused_wheel"), Mapping):  # built and weighed, then stopped by a check: its bytes hold
        wheels.append(row["refused_wheel"])
    for wheel in wheels:
        size = _bytes_of(wheel.get("bytes"))
        if size and str(wheel.get("wheel", "")).endswith(".whl"):
            code = str(row.get("cubins", "")).startswith("none") or wheel["wheel"].endswith("-none-any.whl")
            yield _measured(wheel["wheel"], size, 0 if code else archs, f"{section}: {row['component']}")


SWEEP_WHERE = "sweep "
"""How a sweep's measurement's ``where`` begins (``sweep <commit>: <component>``)."""


def _sweep_measurements(sweeps: Any) -> Iterator[Measured]:
    """Each component's wheels from the newest sweep that built it in full: what today's build code makes of it
    (the sections above hold builds of earlier code, whose wheels were larger), still counted when a later sweep
    stopped before that component's build ended. A build a sweep reduced (fewer kernels, one Python) is not the
    row's wheel and is left out; an entry without archs has no device code (DeepGEMM's JIT, Megatron-Bridge)."""
    newest_built: dict[str, tuple[str, Mapping]] = {}
    for sweep in sweeps if isinstance(sweeps, Sequence) else ():
        if not isinstance(sweep, Mapping):
            continue
        for component, entry in (sweep.get("components") or {}).items():
            if isinstance(entry, Mapping) and entry.get("build") == "passed" and not entry.get("reduced"):
                newest_built[component] = (str(sweep.get("commit", ""))[:7], entry)
    for component, (commit, entry) in sorted(newest_built.items()):
        archs = _count_archs(str(entry.get("archs") or ""))
        for wheel in entry.get("wheels") or ():
            size = _bytes_of(wheel.get("bytes"))
            if size and str(wheel.get("name", "")).endswith(".whl"):
                none = wheel["name"].endswith("-none-any.whl")
                yield _measured(wheel["name"], size, 0 if none else archs, f"{SWEEP_WHERE}{commit}: {component}")


def _jit_cache_measurements(data: Mapping[str, Any]) -> Iterator[Measured]:
    archs = _count_archs(str(data.get("arch_list", "")))
    compiles = sum(max(1, int(m.get("cuda_sources") or 0)) for m in data.get("modules") or ()) * max(1, archs)
    for wheel in data.get("wheels") or ():
        size = _bytes_of(wheel.get("bytes"))
        if not size:
            continue
        measured = _measured(wheel["wheel"], size, 0, "jit_cache")
        if measured.project == JIT_CACHE:
            measured = Measured(JIT_CACHE, wheel["wheel"], size, archs, 1, compiles,
                                f"jit_cache: {len(data.get('modules') or ())} modules for {data.get('arch_list')}")
        yield measured


def _measured(wheel: str, size: int, archs: int, where: str) -> Measured:
    return Measured(canonicalize_name(wheel.split("-", 1)[0]), wheel, size, archs, _pythons_of(wheel), 0, where)


# --- the fit ----------------------------------------------------------------------------------------


def _units(point: Measured, scales_with: str) -> int:
    return {"archs": point.archs, "pythons": point.pythons, "compiles": point.compiles}.get(scales_with, 0)


def _scales_with(points: list[Measured]) -> str:
    if any(p.compiles for p in points):
        return "compiles"
    if any(p.pythons > 1 for p in points):
        return "pythons"
    return "archs" if any(p.archs for p in points) else "nothing"


def fit(points: list[Measured], scales_with: str | None = None) -> dict[str, Any]:
    """``base`` and ``per_unit`` bytes of one project (see the module doc), and what its units are (by default what
    its builds differ in)."""
    scales_with = scales_with or _scales_with(points)
    xs = [_units(p, scales_with) for p in points]
    ys = [p.bytes for p in points]
    mean_y = sum(ys) / len(ys)
    if scales_with == "nothing":
        return {"scales_with": scales_with, "base": round(mean_y), "per_unit": 0}
    if len(set(xs)) < 2:
        return {"scales_with": scales_with, "base": 0, "per_unit": round(mean_y / max(1, xs[0]))}
    mean_x = sum(xs) / len(xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    if slope <= 0:  # builds of one project differ more between trees than between arch counts
        return {"scales_with": scales_with, "base": round(mean_y), "per_unit": 0}
    base = mean_y - slope * mean_x
    if base < 0:  # more units weigh more than in proportion (an arch that brings arch-specific kernels of its own):
        # through zero at the steepest of the builds, so that none of them is predicted under its bytes
        steepest = max(-(-y // x) for x, y in zip(xs, ys, strict=True) if x)  # rounded up
        return {"scales_with": scales_with, "base": 0, "per_unit": steepest}
    return {"scales_with": scales_with, "base": round(base), "per_unit": round(slope)}


def document(results: Mapping[str, Any]) -> dict[str, Any]:
    """The data file's contents, from ``device_results.json``."""
    by_project: dict[str, list[Measured]] = {}
    for point in measurements(results):
        by_project.setdefault(point.project, []).append(point)
    projects = {}
    for name, points in sorted(by_project.items()):
        projects[name] = {**fit(points), "measured": [
            {"wheel": p.wheel, "bytes": p.bytes, "archs": p.archs, "pythons": p.pythons, "compiles": p.compiles,
             "where": p.where} for p in points]}
    return {"generator": COMMAND, "source": data_files.shown(data_files.DEVICE_RESULTS),
            "model": "bytes = base + per_unit * units (ci/timing/size_model.py)", "projects": projects}


# --- a row's assets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AssetSize:
    name: str
    """The project, or the jit-cache provider's project."""
    bytes: int | None
    how: str


@dataclass(frozen=True)
class RowSizes:
    row: MatrixRow
    assets: tuple[AssetSize, ...]

    @property
    def largest(self) -> AssetSize | None:
        known = [a for a in self.assets if a.bytes is not None]
        return max(known, key=lambda a: a.bytes or 0) if known else None

    @property
    def over_budget(self) -> list[AssetSize]:
        return [a for a in self.assets if a.bytes is not None and a.bytes > ASSET_BUDGET]

    def short(self) -> str:
        largest = self.largest
        if largest is None:
            return "not measured yet"
        total = sum(a.bytes or 0 for a in self.assets)
        verdict = "OVER BUDGET" if self.over_budget else "fits"
        if len(self.assets) == 1:
            return f"{_size(total)} ({verdict})"
        return f"{_size(total)} in {len(self.assets)}, largest {_size(largest.bytes or 0)} ({verdict})"

    def describe(self) -> str:
        parts = [f"{a.name} {_size(a.bytes) if a.bytes is not None else '?'} ({a.how})" for a in self.assets]
        return "; ".join(parts) + f"; each asset at most {_size(ASSET_BUDGET)} (ci/timing/size_model.py)"


def _size(count: int) -> str:
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    if count >= 2**20:
        return f"{count / 2**20:.0f} MiB"
    return f"{count / 2**10:.0f} KiB"


def load_data(path: Path | None = None) -> dict[str, Any]:
    path = path or SIZES_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise WheelhouseError(f"{path}: cannot be read ({error}); write it again: {COMMAND}") from None


def predict(row: MatrixRow, data: Mapping[str, Any] | None = None, *, dist_root: Path | None = None) -> RowSizes:
    """The row's release assets and their predicted bytes."""
    data = data if data is not None else load_data()
    projects = data.get("projects", {})
    assets: list[AssetSize] = []
    rehosted = {canonicalize_name(p) for p in row.settings.rehost}
    for package in row.settings.wheel_packages or (row.component,):
        name = canonicalize_name(package)
        if name in rehosted:
            assets.append(AssetSize(name, None, "rehosted: upstream's wheel"))
        elif name == JIT_CACHE:
            assets += _jit_cache_assets(row, projects.get(name), dist_root)
        elif name.startswith(JIT_CACHE + "-"):
            continue  # a provider: predicted with the jit-cache
        else:
            assets.append(_asset(row, name, projects.get(name)))
    return RowSizes(row, tuple(assets))


def _asset(row: MatrixRow, name: str, model: Mapping[str, Any] | None) -> AssetSize:
    if model is None:
        return AssetSize(name, None, "no wheel of it measured yet")
    scales_with = model["scales_with"]
    units = {"archs": _arch_count(row), "pythons": len(row.pythons), "nothing": 0}.get(scales_with, 0)
    size = int(model["base"] + model["per_unit"] * units)
    builds = len(model.get("measured", ()))
    how = f"{builds} build(s)" + (f", {units} {scales_with}" if scales_with != "nothing" else "")
    return AssetSize(name, size, how)


def _arch_count(row: MatrixRow) -> int:
    from ci.timing import time_model

    return time_model.arch_count(row)


def _jit_cache_assets(row: MatrixRow, model: Mapping[str, Any] | None, dist_root: Path | None) -> list[AssetSize]:
    """The shim and one provider per arch of the row's module list, each from its compiles."""
    from ci.model import jit_cache
    from ci.timing import shard_model

    found = shard_model.recorded_modules(row, dist_root or REPO_ROOT / "dist")
    if model is None or found is None:
        why = "no module list recorded for the row" if found is None else "no jit-cache wheel measured yet"
        return [AssetSize(JIT_CACHE, None, why)]
    per_compile = model["per_unit"]
    compiles = jit_cache.provider_compiles(found[1]["modules"], str(found[1].get("cuda_arch_list", "")))
    assets = [AssetSize(JIT_CACHE, SHIM_BYTES, "the shim that picks a provider")]
    for provider, count in sorted(compiles.items()):
        assets.append(AssetSize(jit_cache.provider_project(provider), int(count * per_compile),
                                f"{count} compiles x {_size(per_compile)}"))
    return assets


def refuse_over_budget(row: MatrixRow, *, versions_name: str = "versions.yaml", dist_root: Path | None = None) -> None:
    """Raise, in one line with the fix, when an asset of ``row`` is predicted past :data:`ASSET_BUDGET`."""
    sizes = predict(row, dist_root=dist_root)
    for asset in sizes.over_budget:
        raise ConfigError(
            f"{versions_name}: components.{row.component}: {row.label}: {asset.name} would be "
            f"{_size(asset.bytes or 0)} ({asset.how}), past the {_size(ASSET_BUDGET)} a release asset may take "
            f"(GitHub refuses 2 GiB); {_fix(asset.name)}")


def _fix(name: str) -> str:
    if name.startswith(JIT_CACHE):
        return ("one provider wheel is one arch already: narrow its modules (WHEELHOUSE_JIT_CACHE_MODULES in "
                "extra_env) or leave that arch to flashinfer's JIT")
    return ("build fewer archs into one wheel: drop some from torch_cuda_arch_list (arch_overrides per CPU arch), or "
            "split the component into one component per arch family")


# --- predicted against measured --------------------------------------------------------------------------


def points_of(name: str, model: Mapping[str, Any]) -> list[Measured]:
    """A project's measurements as the data file holds them (``document``'s ``measured``)."""
    return [Measured(name, m["wheel"], m["bytes"], m["archs"], m["pythons"], m["compiles"], m["where"])
            for m in model["measured"]]


def predicted_against_measured(data: Mapping[str, Any]) -> list[tuple[Measured, int | None, str]]:
    """Every measured wheel with its prediction from the project's *other* builds (None with no other build)."""
    rows: list[tuple[Measured, int | None, str]] = []
    for name, model in sorted(data.get("projects", {}).items()):
        points = points_of(name, model)
        for index, point in enumerate(points):
            others = points[:index] + points[index + 1:]
            if not others:
                rows.append((point, None, "its only build"))
                continue
            fitted = fit(others, model["scales_with"])
            units = _units(point, fitted["scales_with"])
            rows.append((point, int(fitted["base"] + fitted["per_unit"] * units), f"from {len(others)} other build(s)"))
    return rows


def add_command(commands: Any) -> None:
    """``python -m ci size-model [--write | --check]``: the fitted sizes, written again from the device results (or
    checked against them), as ``python -m ci timing-data`` writes the time model's (ci/timing/data_files.py)."""
    parser = commands.add_parser("size-model", help="the wheel-size model, written from the device results",
                                 description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {data_files.shown(SIZES_FILE)} from "
                                                              f"{data_files.shown(data_files.DEVICE_RESULTS)}")
    data_files.add_generator_options(parser, SIZES_FILE, check_into=action)
    parser.set_defaults(run=_size_command)


def _size_command(args: Any) -> None:
    if args.write or args.check:
        written = document(data_files.read_results(args.results))
        data_files.write_or_check(written, args.out, check=args.check, command=COMMAND)
        if args.write:
            _LOG.info(f"{data_files.shown(args.out)}: {len(written['projects'])} projects from "
                      f"{data_files.shown(args.results)}")
    data = load_data(args.out)
    for name, model in sorted(data.get("projects", {}).items()):
        log.out(f"{name}: {model['base']} + {model['per_unit']} bytes per {model['scales_with']} unit, "
                f"from {len(model['measured'])} build(s)")
