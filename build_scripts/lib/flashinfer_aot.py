"""flashinfer's ahead-of-time compile, through its own entry point, for build_scripts/flashinfer.sh.

Runs under the row's interpreter (torch, and flashinfer's build dependencies on PYTHONPATH), in the
flashinfer sources. Both commands go through ``flashinfer.aot.compile_and_package_modules`` at the
ref, exactly as upstream's own jit-cache build (flashinfer-jit-cache/build_backend.py) calls it, with
the row's FLASHINFER_CUDA_ARCH_LIST in the environment:

    list    --project DIR --build-dir DIR --out modules.json
            the module list that call compiles (its ``gen_all_modules`` for these archs), and not one
            module compiled: ``build_jit_specs`` is swapped for a recorder for the call
    compile --project DIR --build-dir DIR --modules names.txt --out DIR
            the same call with ``gen_all_modules`` narrowed to the named modules; upstream's
            ``copy_built_kernels`` leaves ``<name>/<name>.so`` of each in DIR

For each module the list records its sources, its CUDA sources and the ``code=`` archs of the
``-gencode`` flags its ninja file gets (upstream's ``build_cuda_cflags``: a module's own gencodes, or
the arch list's), and the package metadata of flashinfer-jit-cache/pyproject.toml. Imported only by
the row's interpreter: nothing here imports the wheelhouse's library (a flashinfer checkout has a
``ci`` directory of its own).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

SCHEMA = 1


def _prepare(project: Path, build_dir: Path) -> None:
    """flashinfer/data as symlinks into the sources (upstream's jit-cache backend does the same), then
    flashinfer importable from the sources; its JIT workspace under ``build_dir``, not the home directory."""
    os.environ["FLASHINFER_DISABLE_VERSION_CHECK"] = "1"  # as upstream's jit-cache backend sets it
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(build_dir / "workspace"))
    if "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        sys.exit("[wheelhouse] error: FLASHINFER_CUDA_ARCH_LIST is not set (build_scripts/flashinfer.sh sets it "
                 "from TORCH_CUDA_ARCH_LIST)")
    spec = importlib.util.spec_from_file_location("flashinfer_main_build_backend", project / "build_backend.py")
    if spec is None or spec.loader is None:
        sys.exit(f"[wheelhouse] error: {project}/build_backend.py cannot be loaded; is this a flashinfer checkout?")
    backend = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(project))
    spec.loader.exec_module(backend)
    backend._create_data_dir(use_symlinks=True)


@contextmanager
def _swapped(module, name: str, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield original
    finally:
        setattr(module, name, original)


def _archs(spec) -> list[str]:
    """The ``code=`` archs of the -gencode flags upstream writes into the module's ninja file."""
    from flashinfer.jit.cpp_ext import build_cuda_cflags

    codes: list[str] = []
    for flag in build_cuda_cflags([], spec.extra_cuda_cflags):
        if flag.startswith("-gencode="):
            code = flag.rsplit(",code=", 1)[1].strip("[]")  # -gencode=arch=compute_90a,code=sm_90a
            codes += [c for c in code.split(",") if c and c not in codes]
    return codes


def _family(spec) -> str:
    """Modules made from the same source files (other dtypes, head dims, flags) form a family; the time model
    extrapolates a family's measured seconds per translation unit to the rest of it. Named by its first
    source and a digest of all of them."""
    stems = sorted({Path(source).stem for source in spec.sources})
    digest = hashlib.sha256("\n".join(stems).encode()).hexdigest()[:10]
    return f"{stems[0] if stems else spec.name}#{digest}"


def _package_metadata(project: Path) -> dict:
    import tomllib

    pyproject = tomllib.loads((project / "flashinfer-jit-cache" / "pyproject.toml").read_text())["project"]
    readme = pyproject.get("readme")
    return {
        "name": pyproject["name"],
        "summary": pyproject.get("description", ""),
        "requires_python": pyproject.get("requires-python", ""),
        "license": (pyproject.get("license") or {}).get("text", "") if isinstance(pyproject.get("license"), dict)
        else str(pyproject.get("license", "")),
        "description": readme.get("text", "") if isinstance(readme, dict) else "",
        "classifiers": list(pyproject.get("classifiers", [])),
        "urls": dict(pyproject.get("urls", {})),
        "authors": [a.get("name", "") for a in pyproject.get("authors", [])],
    }


def list_modules(project: Path, build_dir: Path, out: Path) -> None:
    _prepare(project, build_dir)
    from flashinfer import aot

    captured: list = []
    with _swapped(aot, "build_jit_specs", lambda specs, **_: captured.extend(specs)):
        aot.compile_and_package_modules(out_dir=None, build_dir=build_dir, project_root=project, config=None,
                                        verbose=False, skip_prebuilt=False)
    from flashinfer.version import __version__

    document = {
        "schema": SCHEMA,
        "generator": "flashinfer.aot.compile_and_package_modules (gen_all_modules)",
        "flashinfer_version": __version__,
        "cuda_arch_list": os.environ["FLASHINFER_CUDA_ARCH_LIST"],
        "sm_capabilities": {k: v for k, v in sorted(aot.detect_sm_capabilities().items())},
        "package": _package_metadata(project),
        "modules": [
            {"name": spec.name, "sources": len(spec.sources),
             "cuda_sources": sum(1 for s in spec.sources if Path(s).suffix == ".cu"), "archs": _archs(spec),
             "family": _family(spec)}
            for spec in captured
        ],
    }
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"[wheelhouse] flashinfer's AOT list for {document['cuda_arch_list']}: {len(captured)} modules, "
          f"{sum(m['cuda_sources'] for m in document['modules'])} CUDA sources", file=sys.stderr)


def compile_modules(project: Path, build_dir: Path, names_file: Path, out: Path) -> None:
    wanted = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
    _prepare(project, build_dir)
    from flashinfer import aot

    original = aot.gen_all_modules

    def narrowed(*args, **kwargs):
        specs = original(*args, **kwargs)
        unknown = sorted(set(wanted) - {s.name for s in specs})
        if unknown:
            sys.exit(f"[wheelhouse] error: {unknown[0]} is not a module flashinfer's AOT list names for "
                     f"{os.environ['FLASHINFER_CUDA_ARCH_LIST']}; the module list and the sources disagree")
        return [s for s in specs if s.name in set(wanted)]

    print(f"[wheelhouse] compiling {len(wanted)} modules with flashinfer.aot (MAX_JOBS={os.environ.get('MAX_JOBS')})",
          file=sys.stderr)
    with _swapped(aot, "gen_all_modules", narrowed):
        aot.compile_and_package_modules(out_dir=out, build_dir=build_dir, project_root=project, config=None,
                                        verbose=False, skip_prebuilt=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "compile"):
        command = sub.add_parser(name)
        command.add_argument("--project", type=Path, required=True)
        command.add_argument("--build-dir", type=Path, required=True)
        command.add_argument("--out", type=Path, required=True)
        if name == "compile":
            command.add_argument("--modules", type=Path, required=True, help="module names, one per line")
    args = parser.parse_args(argv)
    project, build_dir = args.project.resolve(), args.build_dir.resolve()
    if args.command == "list":
        list_modules(project, build_dir, args.out)
    else:
        compile_modules(project, build_dir, args.modules, args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
