"""What the index tells a user about one wheel beyond its link: its CUDA archs, the torch it was built
against, and its torch pin.

All of it is read from the wheel itself, in the one download the index already makes to compare a
``.metadata`` sidecar with the wheel's METADATA (ci/publish/index.py): the archs and the torch build from the
SBOM every build writes (ci/building/sbom.py: the cubin and PTX archs our fatbin scan found in each shared
object), the pin from METADATA. Never from versions.yaml: a user is told what the wheel holds, not
what was asked for. The facts are cached by the wheel's sha256 in ``digests.json`` (they cannot go
stale) and written into each world's record (ci/publish/catalog.py).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from ci.base import bounded_json
from ci.base.errors import WheelhouseError
from ci.building import sbom
from ci.checks import pin
from ci.formats.archs import CudaArch, parse_arch_list

MAX_SBOM_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class WheelFacts:
    """What one wheel says about itself; ``archs_known`` is False for a wheel without our SBOM."""

    archs_known: bool = False
    cubins: tuple[CudaArch, ...] = ()
    """The cubin archs of all its shared objects (sm_90a stays 9.0a)."""
    ptx: tuple[CudaArch, ...] = ()
    torch_pin: str | None = None
    """The specifier of its unconditional torch requirement (``==2.13.*``), None when it has none."""
    built_with: Mapping[str, str] | None = None
    """The torch it was built against (version, git_version, cuda, cxx11_abi), from its SBOM."""

    @property
    def has_device_code(self) -> bool:
        return bool(self.cubins or self.ptx)

    def to_json(self) -> dict[str, Any]:
        return {
            "archs_known": self.archs_known,
            "cubins": [str(a) for a in self.cubins],
            "ptx": [str(a) for a in self.ptx],
            "torch_pin": self.torch_pin,
            "built_with": dict(self.built_with) if self.built_with is not None else None,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WheelFacts:
        """The facts :meth:`to_json` wrote; a ValueError (or KeyError, TypeError) for anything else."""
        built = raw.get("built_with")
        if built is not None and not isinstance(built, Mapping):
            raise ValueError("built_with is not an object")
        torch_pin = raw.get("torch_pin")
        if torch_pin is not None and not isinstance(torch_pin, str):
            raise ValueError("torch_pin is not a string")
        return cls(
            archs_known=bool(raw["archs_known"]),
            cubins=parse_arch_list([str(a) for a in raw.get("cubins", [])]).archs,
            ptx=parse_arch_list([str(a) for a in raw.get("ptx", [])]).archs,
            torch_pin=torch_pin,
            built_with={str(k): str(v) for k, v in built.items()} if built is not None else None,
        )


def read_facts(wheel: IO[bytes], metadata: bytes) -> WheelFacts:
    """The facts of the wheel archive ``wheel`` (seekable), whose own METADATA is ``metadata``.

    A wheel without our SBOM, or with one that cannot be read, has unknown archs: the index says so
    instead of guessing."""
    try:
        torch_pin = pin.torch_pin_of(metadata)
    except UnicodeDecodeError:
        torch_pin = None
    summary = _sbom_summary(wheel)
    if summary is None:
        return WheelFacts(torch_pin=torch_pin)
    return WheelFacts(True, summary.cubin_archs, summary.ptx_archs, torch_pin, dict(summary.torch))


def _sbom_summary(wheel: IO[bytes]) -> sbom.SbomSummary | None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.count("/") == 2 and n.endswith("/" + sbom.SBOM_NAME)
                     and n.split("/", 1)[0].endswith(".dist-info")]
            if len(names) != 1 or archive.getinfo(names[0]).file_size > MAX_SBOM_BYTES:
                return None
            document = bounded_json.loads(archive.read(names[0]).decode("utf-8"))
        return sbom.summarize(document)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError,
            NotImplementedError, WheelhouseError):
        return None
