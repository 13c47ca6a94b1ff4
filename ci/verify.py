"""Check a downloaded wheel offline against its release's manifest and provenance, and its own SBOM.

What is compared, each difference one line:

- sha256: the wheel's bytes against the manifest's entry and the provenance statement's subject;
- source commit: the SBOM's source commit (or sdist/directory digest) against the manifest's build
  record and the statement;
- world: the torch the SBOM says the wheel was built against (CUDA, major.minor) against the row's
  world the statement names;
- torch pin: the ``Requires-Dist: torch`` of the wheel's METADATA against the pin its SBOM records,
  and that pin against the release's torch;
- the build fingerprint: the SBOM's (wheels built since it carries one) against the manifest's, and the
  statement's against the manifest's.

An input that is not what it should be (no such file, not a wheel, a manifest or statement of another
release) is a :class:`~ci.errors.UsageError`: one line, nothing compared. Nothing is written anywhere.
The statement's signature is not checked here (it is made by GitHub's attestation action in the
publish job; ``gh attestation verify`` checks it against GitHub's attestation store).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ci import manifest, naming, provenance, sbom
from ci.digest import sha256_file
from ci.errors import CheckFailed, UsageError, WheelhouseError
from ci.manifest import Manifest
from ci.wheels import pin
from ci.wheels.archive import open_wheel


@dataclass(frozen=True)
class Verification:
    wheel: str
    summary: str
    """The one line of a wheel that matches."""
    mismatches: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _short(text: str | None) -> str:
    return "none" if not text else (text[:12] + "…" if len(text) > 16 else text)


# --- inputs --------------------------------------------------------------------------------------


def _checked_wheel(wheel: Path) -> None:
    if not wheel.is_file():
        raise UsageError(f"{wheel}: no such file; name the downloaded wheel with --wheel")
    try:
        parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        raise UsageError(f"{wheel}: not a wheel file name (<name>-<version>-<tags>.whl); name the downloaded wheel") from None
    try:
        with open_wheel(wheel):
            pass
    except CheckFailed as exc:
        raise UsageError(f"{wheel}: not a readable wheel ({exc}); download it again") from None


def _read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise UsageError(f"{path}: no such file; download the release's {manifest.PREFIX}<arch>.json")
    try:
        return manifest.parse(path.read_bytes(), where=str(path))
    except WheelhouseError as exc:
        raise UsageError(f"{exc}; download the release's {manifest.PREFIX}<arch>.json again") from None


def _find_manifest(wheel_name: str, release_dir: Path) -> tuple[Path, Manifest]:
    """The manifest in a folder of release assets that lists ``wheel_name`` (a pure-Python wheel may be
    listed by every arch: the first by arch name)."""
    if not release_dir.is_dir():
        raise UsageError(f"--release {release_dir}: not a directory; name the folder the release's assets were "
                         "downloaded to (gh release download TAG -D DIR)")
    found = sorted(release_dir.glob(f"{manifest.PREFIX}*.json"))
    if not found:
        raise UsageError(f"{release_dir}: holds no {manifest.PREFIX}<arch>.json; download the release's assets there")
    for path in found:
        parsed = _read_manifest(path)
        if any(entry.name == wheel_name for entry in parsed.wheels):
            return path, parsed
    tags = sorted({_read_manifest(path).release_tag for path in found})
    raise UsageError(f"{release_dir}: the manifests of release {', '.join(tags)} do not list {wheel_name}; "
                     "download the assets of the release the wheel came from")


def _read_provenance(path: Path, built: Manifest) -> provenance.Provenance:
    if not path.is_file():
        raise UsageError(f"{path}: no such file; download {provenance.asset_name(built.arch)} from release "
                         f"{built.release_tag} beside the manifest, or name it with --provenance")
    try:
        statement = provenance.parse(path.read_bytes(), where=str(path))
    except WheelhouseError as exc:
        raise UsageError(str(exc)) from None
    if (statement.release_tag, statement.arch) != (built.release_tag, built.arch):
        raise UsageError(f"{path}: the provenance of release {statement.release_tag} ({statement.arch}), not of "
                         f"{built.release_tag} ({built.arch}) as the manifest; download the statement of the same release")
    return statement


# --- the comparisons -----------------------------------------------------------------------------


def _sbom_world(summary: sbom.SbomSummary) -> str | None:
    cuda = summary.torch.get("cuda") or "none"
    try:
        return naming.world_path("cpu" if cuda == "none" else cuda, summary.torch["version"])
    except (KeyError, IndexError):
        return None


def _pin_problems(name: str, wheel: Path, summary: sbom.SbomSummary, release_torch: str) -> list[str]:
    recorded = summary.torch_pin
    if recorded is None:  # the build pinned nothing (links no torch, or torch_pin: none): upstream's requirements stand
        return []
    declared = pin.read_torch_pin(wheel)
    if declared is None or f"torch{declared}" != recorded:
        return [f"{name}: torch pin: METADATA requires {'torch' + declared if declared else 'no pinned torch'}, its "
                f"SBOM records {recorded}: METADATA was changed after the build"]
    try:
        admits = Version(release_torch) in SpecifierSet(declared)
    except (InvalidSpecifier, InvalidVersion):
        admits = False
    if not admits:
        return [f"{name}: torch pin: torch{declared} does not admit the release's torch {release_torch}"]
    return []


def _sbom_problems(name: str, wheel: Path, built: Manifest, statement: provenance.Provenance,
                   summary: sbom.SbomSummary) -> list[str]:
    problems = []
    expected = str(built.source.get("revision", ""))
    if summary.source_revision != expected:
        problems.append(f"{name}: source commit: its SBOM says {summary.source_revision or 'none'}, release "
                        f"{built.release_tag}'s manifest says {expected or 'none'}")
    world = _sbom_world(summary)
    if world != statement.world:
        problems.append(f"{name}: world: its SBOM's torch ({summary.torch.get('version')}, CUDA "
                        f"{summary.torch.get('cuda')}) is world {world}, the release's row is {statement.world}")
    problems += _pin_problems(name, wheel, summary, built.torch)
    if summary.fingerprint and summary.fingerprint != built.fingerprint:  # a wheel built before the SBOM had it: none
        problems.append(f"{name}: build fingerprint: its SBOM says {_short(summary.fingerprint)}, release "
                        f"{built.release_tag}'s manifest says {_short(built.fingerprint)}")
    return problems


def _digest_problems(name: str, actual: str, expected: str, statement: provenance.Provenance, tag: str) -> list[str]:
    problems = []
    if actual != expected:
        problems.append(f"{name}: sha256 {_short(actual)} differs from release {tag}'s manifest "
                        f"({_short(expected)}): the bytes changed after the release")
    subject = statement.subjects.get(name)
    if subject is None:
        problems.append(f"{name}: not a subject of release {tag}'s provenance statement")
    elif subject != expected:
        problems.append(f"{name}: the provenance's sha256 {_short(subject)} differs from the manifest's "
                        f"{_short(expected)}: manifest and provenance disagree")
    return problems


def _agreement_problems(built: Manifest, statement: provenance.Provenance) -> list[str]:
    problems = []
    if statement.fingerprint != built.fingerprint:
        problems.append(f"build fingerprint: the provenance says {_short(statement.fingerprint)}, the manifest "
                        f"{_short(built.fingerprint)}")
    revision = str(built.source.get("revision", ""))
    if statement.source_revision != revision:
        problems.append(f"source commit: the provenance says {statement.source_revision or 'none'}, the manifest "
                        f"{revision or 'none'}")
    return problems


def verify_wheel(wheel: Path, *, manifest_path: Path | None = None, release_dir: Path | None = None,
                 provenance_path: Path | None = None) -> Verification:
    """Compare ``wheel`` with its release (a manifest, or a folder of its downloaded assets) and its SBOM."""
    if (manifest_path is None) == (release_dir is None):
        raise UsageError("name the wheel's release with exactly one of --manifest PATH or --release DIR")
    _checked_wheel(wheel)
    name = wheel.name
    if release_dir is not None:
        found_at, built = _find_manifest(name, release_dir)
    else:
        assert manifest_path is not None
        found_at, built = manifest_path, _read_manifest(manifest_path)
        if not any(entry.name == name for entry in built.wheels):
            raise UsageError(f"{manifest_path}: the manifest of release {built.release_tag} ({built.arch}) does not "
                             f"list {name}; pass the manifest of the release the wheel came from")
    statement = _read_provenance(provenance_path or found_at.parent / provenance.asset_name(built.arch), built)
    expected = next(entry.sha256 for entry in built.wheels if entry.name == name)
    actual = sha256_file(wheel)
    mismatches = [
        *_digest_problems(name, actual, expected, statement, built.release_tag),
        *_agreement_problems(built, statement),
    ]
    try:
        summary = sbom.read_sbom(wheel)
    except CheckFailed as exc:
        return Verification(name, "", (*mismatches, str(exc)))
    mismatches += _sbom_problems(name, wheel, built, statement, summary)
    run = statement.run or "a release outside GitHub Actions"
    line = (f"{name}: matches release {built.release_tag} ({built.arch}): sha256 {_short(actual)}, world "
            f"{statement.world}, torch pin {summary.torch_pin or 'none'}, source commit "
            f"{_short(statement.source_revision)}, published by {run}")
    return Verification(name, line, tuple(mismatches))
