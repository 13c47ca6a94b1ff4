"""On the GPU machine: the SBOM's arch list of a real CUDA wheel equals what cuobjdump lists.

Builds the fixture extension with its CUDA kernel (``TORCH_CUDA_ARCH_LIST``, default ``8.0;9.0+PTX``)
against the machine's torch, writes the torch pin and the SBOM into it as a build does (ci/building/stamp.py,
facts gathered by ci/building/sbom.py from the real interpreter and source directory), then compares, per
shared object, the SBOM's cubin and PTX archs with ``cuobjdump --list-elf --list-ptx``. Prints one
line per shared object and copies the stamped wheel to ``OUT_DIR`` (first argument) for validation
elsewhere. Exit status 1 on any difference.

    python3 tests/gpu/sbom_archs.py "$OUT"
    python3 tests/gpu/sbom_archs.py --wheels DIST/*.whl   wheels our builds already stamped
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ci.building import sbom, sources, toolchain  # noqa: E402
from ci.building.stamp import stamp_wheel  # noqa: E402
from ci.checks import toolkit  # noqa: E402
from ci.checks.pin import read_torch_pin  # noqa: E402
from ci.formats.archive import open_wheel  # noqa: E402
from ci.formats.elf import ElfFile  # noqa: E402
from ci.formats.fatbin import find_cuobjdump, scan_elf  # noqa: E402
from ci.model import matrix  # noqa: E402
from ci.model.versions import load  # noqa: E402


def main(out_dir: Path) -> int:
    versions = load(os.environ.get("WHEELHOUSE_VERSIONS", ROOT / "tests" / "fixtures" / "versions-device.yaml"))
    row = next(r for r in matrix.expand(versions) if r.component == "wheelhouse-fixture")
    interpreter = toolchain.verify(sys.executable, row)
    tool = find_cuobjdump(toolkit.cuda_home(interpreter.nvcc) if interpreter.nvcc else None)
    assert tool is not None, "no cuobjdump"
    with tempfile.TemporaryDirectory(prefix="sbom-archs-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(ROOT / "tests" / "fixtures" / "fixture_ext", work,
                        ignore=shutil.ignore_patterns("build", "*.egg-info"))
        env = {**os.environ, "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX"),
               "MAX_JOBS": "16"}
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                        "-w", tmp, str(work)], env=env, check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        source = sources.local_directory(ROOT / versions.component(row.component).source.location)
        facts = sbom.build_facts(versions, row, source, interpreter, env)
        result = stamp_wheel(wheel, torch_version=row.torch, pin_mode=row.settings.torch_pin, facts=facts)
        print(f"{wheel.name}: links torch {result.links_torch}, Requires-Dist: torch{read_torch_pin(wheel)}")
        differences = compare_with_cuobjdump(wheel, tool)
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, out_dir / wheel.name)
    return 1 if differences else 0


def compare_with_cuobjdump(wheel: Path, tool: Path) -> int:
    """Print, per shared object, the SBOM's archs beside cuobjdump's; the number that differ."""
    summary = sbom.read_sbom(wheel)
    differences = 0
    with open_wheel(wheel) as archive:
        for member, stream in archive.shared_objects():
            listed = scan_elf(member.name, ElfFile(stream, member.name), tool)
            theirs = (listed.cubins, listed.ptx) if listed else ((), ())
            ours = summary.archs.get(member.name, ((), ()))
            same = "same" if ours == theirs else "DIFFERENT"
            differences += ours != theirs
            print(f"{wheel.name} {member.name}: SBOM cubins {_fmt(ours[0])} PTX {_fmt(ours[1])}; "
                  f"cuobjdump cubins {_fmt(theirs[0])} PTX {_fmt(theirs[1])}: {same}")
    return differences


def compare_built(wheels: list[Path]) -> int:
    tool = find_cuobjdump(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    assert tool is not None, "no cuobjdump"
    return 1 if sum(compare_with_cuobjdump(wheel, tool) for wheel in wheels) else 0


def _fmt(archs) -> str:
    return ";".join(str(a) for a in archs) or "none"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wheels"]:
        raise SystemExit(compare_built([Path(p) for p in sys.argv[2:]]))
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "sbom-archs-out")))
