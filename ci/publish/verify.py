"""Check a downloaded wheel offline against its release's manifest and provenance, and its own SBOM.

Who published a wheel is said only from a verified signature. A release published by the workflow carries
``wheelhouse-provenance-<arch>.sigstore.json``: our provenance statement signed in the publish job
(ci/publish/signature.py). Its signature is verified against a trusted root (``--trusted-root FILE``, else the
public-good root) and the repository named by ``--repo`` (else ``WHEELHOUSE_STORE=github:<owner>/<repo>``);
then the line says ``signed by <workflow>, published by <run>`` as the certificate names them. A release with
only the unsigned ``.intoto.json`` (one made outside a workflow, or anyone's edit of the release) is checked
for consistency and the line says plainly that nothing shows who published it.

What is compared, each difference one line:

- the archive: the validation check-wheel runs (RECORD lists every member with its hash; no member it does not
  list, such as an added ``.pth``);
- sha256: the wheel's bytes against the manifest's entry and the statement's subject;
- arch: the manifest's against the wheel's platform tag; and exactly one manifest of the release lists the wheel;
- source commit: the SBOM's source commit (or sdist/directory digest) against the manifest and the statement;
- world: the torch the SBOM says the wheel was built against (CUDA, major.minor) against the row's world;
- torch pin: the ``Requires-Dist: torch`` of the wheel's METADATA against the pin its SBOM records, and that
  pin against the release's torch;
- the build fingerprint: the SBOM's (wheels built since it carries one) and the statement's against the
  manifest's; for a signed statement, the run it names against the run its certificate names.

An input that is not what it should be (no such file, not a wheel, a manifest or statement of another
release) is a :class:`~ci.base.errors.UsageError`: one line, nothing compared. Nothing is written anywhere; every
string read from the files is printed escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed, UsageError, WheelhouseError
from ci.building import sbom
from ci.checks import pin
from ci.formats.archive import open_wheel
from ci.formats.record import check_record
from ci.model import manifest, naming
from ci.model.manifest import Manifest
from ci.model.naming import wheel_covers_arch
from ci.publish import provenance, signature


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


MAX_DOCUMENT_BYTES = 16 << 20
"""A manifest or statement of a release is a few kilobytes; a file beyond this is not one."""


def _checked_wheel(wheel: Path) -> list[str]:
    """The archive problems check-wheel reports (RECORD), once the file is a readable wheel at all."""
    if not wheel.is_file():
        raise UsageError(f"{wheel}: no such file; name the downloaded wheel with --wheel")
    try:
        parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        raise UsageError(f"{wheel}: not a wheel file name (<name>-<version>-<tags>.whl); name the downloaded wheel") from None
    try:
        with open_wheel(wheel) as archive:
            return [f"{wheel.name}: archive: {log.printable(problem)}" for problem in check_record(archive)]
    except CheckFailed as exc:
        raise UsageError(f"{wheel}: not a readable wheel ({log.printable(str(exc))}); download it again") from None


def _read_small(path: Path, what: str) -> bytes:
    size = path.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise UsageError(f"{path}: {size} bytes, far more than a release's {what} is; download it again")
    return path.read_bytes()


def _read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise UsageError(f"{path}: no such file; download the release's {manifest.PREFIX}<arch>.json")
    try:
        return manifest.parse(_read_small(path, "manifest"), where=str(path))
    except WheelhouseError as exc:
        raise UsageError(f"{log.printable(str(exc))}; download the release's {manifest.PREFIX}<arch>.json again") \
            from None


def _find_manifest(wheel_name: str, release_dir: Path) -> tuple[Path, Manifest]:
    """The one manifest in a folder of release assets that lists ``wheel_name``; two that list it are an error
    (a manifest added beside the genuine one could otherwise stand for it)."""
    if not release_dir.is_dir():
        raise UsageError(f"--release {release_dir}: not a directory; name the folder the release's assets were "
                         "downloaded to (gh release download TAG -D DIR)")
    found = sorted(release_dir.glob(f"{manifest.PREFIX}*.json"))
    if not found:
        raise UsageError(f"{release_dir}: holds no {manifest.PREFIX}<arch>.json; download the release's assets there")
    manifests = [(path, _read_manifest(path)) for path in found]
    listing = [(path, parsed) for path, parsed in manifests if any(entry.name == wheel_name for entry in parsed.wheels)]
    if len(listing) > 1:
        raise UsageError(f"{release_dir}: {len(listing)} manifests list {wheel_name} "
                         f"({', '.join(path.name for path, _ in listing)}); a release lists a wheel in one: name the "
                         "one to check with --manifest, and find out where the other came from")
    if listing:
        return listing[0]
    tags = sorted({log.printable(parsed.release_tag) for _, parsed in manifests})
    raise UsageError(f"{release_dir}: the manifests of release {', '.join(tags)} do not list {wheel_name}; "
                     "download the assets of the release the wheel came from")


@dataclass(frozen=True)
class Origin:
    """The statement a wheel is checked against, and what is known of who made it."""

    statement: provenance.Provenance
    signer: signature.Signer | None
    """The verified signer; None for an unsigned statement."""


def _provenance_file(given: Path | None, found_at: Path, built: Manifest) -> Path:
    """``--provenance``, else beside the manifest: the signed bundle where there is one, else the statement."""
    if given is not None:
        return given
    bundle = found_at.parent / provenance.bundle_asset_name(built.arch)
    return bundle if bundle.is_file() else found_at.parent / provenance.asset_name(built.arch)


def _read_origin(path: Path, built: Manifest, *, repository: str | None, trusted_root: Path | None) -> Origin:
    if not path.is_file():
        raise UsageError(f"{path}: no such file; download {provenance.bundle_asset_name(built.arch)} (or, for a "
                         f"release made outside a workflow, {provenance.asset_name(built.arch)}) from release "
                         f"{log.printable(built.release_tag)} beside the manifest, or name it with --provenance")
    data = _read_small(path, "provenance")
    signer = None
    try:
        if signature.is_bundle(_json_or_none(data)):
            if not repository:
                raise UsageError(f"{path}: a signed provenance; name the repository whose publish workflow signed it "
                                 "with --repo OWNER/REPO (or WHEELHOUSE_STORE=github:OWNER/REPO)")
            document, signer = signature.verify(data, repository=repository, trusted_root=trusted_root,
                                                where=str(path))
            statement = provenance.read(document, where=str(path))
        else:
            statement = provenance.parse(data, where=str(path))
    except signature.SignatureError as exc:
        raise signature.SignatureError(log.printable(str(exc))) from None
    except WheelhouseError as exc:
        raise UsageError(log.printable(str(exc))) from None
    if (statement.release_tag, statement.arch) != (built.release_tag, built.arch):
        raise UsageError(f"{path}: the provenance of release {log.printable(statement.release_tag)} "
                         f"({log.printable(statement.arch)}), not of {log.printable(built.release_tag)} "
                         f"({log.printable(built.arch)}) as the manifest; download the statement of the same release")
    return Origin(statement, signer)


def _json_or_none(data: bytes) -> object:
    from ci.base import bounded_json

    try:
        return bounded_json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None


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


def _arch_problems(name: str, built: Manifest) -> list[str]:
    if wheel_covers_arch(name, built.arch):
        return []
    return [f"{name}: arch: its platform tag is not {log.printable(built.arch)}, the arch of release "
            f"{log.printable(built.release_tag)}'s manifest that lists it"]


def _signer_problems(origin: Origin) -> list[str]:
    """A signed statement names the run that published it; the certificate says which run signed it."""
    if origin.signer is None or origin.signer.run is None or origin.statement.run in (None, origin.signer.run):
        return []
    return [f"run: the signed statement names {log.printable(origin.statement.run or '')}, its certificate the run "
            f"{log.printable(origin.signer.run)}"]


def _chosen_manifest(name: str, manifest_path: Path | None, release_dir: Path | None) -> tuple[Path, Manifest]:
    if release_dir is not None:
        return _find_manifest(name, release_dir)
    assert manifest_path is not None
    built = _read_manifest(manifest_path)
    if not any(entry.name == name for entry in built.wheels):
        raise UsageError(f"{manifest_path}: the manifest of release {log.printable(built.release_tag)} "
                         f"({log.printable(built.arch)}) does not list {name}; pass the manifest of the release the "
                         "wheel came from")
    return manifest_path, built


def verify_wheel(wheel: Path, *, manifest_path: Path | None = None, release_dir: Path | None = None,
                 provenance_path: Path | None = None, repository: str | None = None,
                 trusted_root: Path | None = None) -> Verification:
    """Compare ``wheel`` with its release (a manifest, or a folder of its downloaded assets) and its SBOM; say who
    published it only when a signed statement verifies (``repository``, ``trusted_root``: ci/publish/signature.py)."""
    if (manifest_path is None) == (release_dir is None):
        raise UsageError("name the wheel's release with exactly one of --manifest PATH or --release DIR")
    archive_problems = _checked_wheel(wheel)
    name = wheel.name
    found_at, built = _chosen_manifest(name, manifest_path, release_dir)
    origin = _read_origin(_provenance_file(provenance_path, found_at, built), built, repository=repository,
                          trusted_root=trusted_root)
    statement = origin.statement
    expected = next(entry.sha256 for entry in built.wheels if entry.name == name)
    actual = sha256_file(wheel)
    mismatches = [
        *archive_problems,
        *_arch_problems(name, built),
        *_digest_problems(name, actual, expected, statement, built.release_tag),
        *_agreement_problems(built, statement),
        *_signer_problems(origin),
    ]
    try:
        summary = sbom.read_sbom(wheel)
    except CheckFailed as exc:
        return Verification(name, "", (*mismatches, log.printable(str(exc))))
    mismatches += _sbom_problems(name, wheel, built, statement, summary)
    facts = log.printable(f"sha256 {_short(actual)}, world {statement.world}, torch pin {summary.torch_pin or 'none'}, "
                          f"source commit {_short(statement.source_revision)}")
    tag, arch = log.printable(built.release_tag), log.printable(built.arch)
    if origin.signer is not None:
        signer = origin.signer
        line = (f"{name}: matches release {tag} ({arch}): {facts}; its provenance is signed by "
                f"{log.printable(signer.workflow)}, verified against {log.printable(signer.trusted_root)}: published "
                f"by {log.printable(signer.run or 'a run its certificate does not name')}")
    else:
        line = (f"{name}: consistent with release {tag} ({arch})'s manifest and its unsigned provenance statement: "
                f"{facts}; nothing here shows who published it (a release the publish workflow made carries "
                f"{provenance.bundle_asset_name(built.arch)}, signed)")
    return Verification(name, line, tuple(log.printable(m) for m in mismatches))
