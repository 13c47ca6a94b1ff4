"""The signed provenance: the publish job's statement as a Sigstore bundle, verified by verify-wheel offline.

The signatures are made by a Sigstore instance of the test's own (tests/sigstore_test_root.py: a CA, a CT log and a
transparency log, each with a key made here; bundles as actions/attest makes them) and verified by the real
sigstore-python against that instance's trusted root. verify-wheel says "published by" only from a verified
signature; the adversarial round's forgeries (B/verify_forge.py) and variants of them end in one line, exit 2, or
for a release whose statement is not signed, in a line that says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from provenance_helpers import RUN_ENV, Released, built_row, release_fixture
from sigstore_test_root import Identity, LocalSigstore

from ci.base.digest import sha256_file
from ci.base.errors import WheelhouseError
from ci.publish import provenance, release, signature
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
RUN = "https://github.com/octo/wheelhouse/actions/runs/4242/attempts/2"
WORKFLOW = "https://github.com/octo/wheelhouse/.github/workflows/_publish.yml@refs/heads/main"


@pytest.fixture(scope="module")
def released(fixture_wheel, tmp_path_factory) -> Released:
    return release_fixture(fixture_wheel, tmp_path_factory.mktemp("released"))


@pytest.fixture(scope="module")
def sigstore(tmp_path_factory) -> tuple[LocalSigstore, Path]:
    instance = LocalSigstore()
    return instance, instance.write_trusted_root(tmp_path_factory.mktemp("root") / "trusted_root.json")


def verify(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "WHEELHOUSE_STORE")}
    return subprocess.run([sys.executable, "-m", "invoke", "verify-wheel", *args], cwd=REPO, capture_output=True,
                          text=True, env=env)


def signed_assets(released: Released, sigstore: tuple[LocalSigstore, Path], where: Path, *,
                  statement: dict | None = None, identity: Identity | None = None) -> Path:
    """The release's assets as the publish workflow leaves them: the statement signed, no unsigned copy."""
    instance, _ = sigstore
    shutil.copytree(released.assets, where)
    (where / released.provenance.name).unlink()
    statement = statement or json.loads(released.provenance.read_bytes())
    bundle = instance.sign_statement(statement, identity)
    (where / provenance.bundle_asset_name("x86_64")).write_text(json.dumps(bundle))
    return where


def test_a_signed_release_says_who_published_it_from_the_verified_certificate(released, sigstore, tmp_path):
    assets = signed_assets(released, sigstore, tmp_path / "assets")
    result = verify("--wheel", str(released.wheel), "--release", str(assets), "--repo", "octo/wheelhouse",
                    "--trusted-root", str(sigstore[1]))
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"{released.wheel.name}: matches release {released.row.release_tag} (x86_64): sha256 "
                           f"{sha256_file(released.wheel)[:12]}…, world cpu/torch2.13, torch pin torch==2.13.*")
    assert line.endswith(f"; its provenance is signed by {WORKFLOW}, verified against {sigstore[1]}: published by "
                         f"{RUN}")


def _backdoored(wheel: Path, out: Path) -> Path:
    """The round's tampered wheel: a module and a .pth added, RECORD left as it was."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as sink:
        for info in source.infolist():
            sink.writestr(info, source.read(info))
        sink.writestr("zzz_backdoor.pth", "import os; os.system('touch PWNED-verify')\n")
    return target


def _rewrite(assets: Path, wheel: Path, *, run: str | None = None, arch_file: str = "x86_64") -> None:
    """What anyone who can replace release assets does: the manifest and the unsigned statement made to match."""
    digest = sha256_file(wheel)
    manifest_path = assets / f"wheelhouse-build-manifest-{arch_file}.json"
    statement_path = assets / provenance.asset_name(arch_file)
    manifest = json.loads(manifest_path.read_text())
    statement = json.loads(statement_path.read_text())
    for entry in manifest["wheels"]:
        entry.update(sha256=digest, size=wheel.stat().st_size)
    for subject in statement["subject"]:
        subject["digest"]["sha256"] = digest
    if run is not None:
        statement["predicate"]["runDetails"]["metadata"]["invocationId"] = run
    manifest_path.write_text(json.dumps(manifest))
    statement_path.write_text(json.dumps(statement))


def test_the_rounds_forgeries_and_variants_are_refused_or_said_to_be_unsigned(released, sigstore, tmp_path):
    """B/verify_forge.py's cases, and variants of them: a tampered wheel with the assets beside it edited to match
    never reads "published by"; with the signed bundle beside it, it fails."""
    cases: dict[str, tuple[int, str]] = {}

    def run(case: str, wheel: Path, assets: Path, *extra: str) -> str:
        result = verify("--wheel", str(wheel), "--release", str(assets), "--repo", "octo/wheelhouse",
                        "--trusted-root", str(sigstore[1]), *extra)
        text = (result.stdout + result.stderr).strip()
        cases[case] = (result.returncode, text)
        assert "Traceback" not in text, text
        return text

    # the round's case 2: wheel + manifest + statement changed together; the added .pth is not in RECORD
    assets = tmp_path / "wmp"
    shutil.copytree(released.assets, assets)
    wheel = _backdoored(released.wheel, tmp_path / "wmp-wheel")
    _rewrite(assets, wheel, run="https://github.com/NVIDIA/wheelhouse/actions/runs/123456789/attempts/1")
    text = run("wheel-manifest-provenance", wheel, assets)
    assert "published by" not in text and f"error: {wheel.name}: archive: " in text and "zzz_backdoor.pth" in text

    # variant: RECORD made to list the .pth too: consistent, but unsigned, and it says so
    listed = tmp_path / "listed-wheel"
    listed.mkdir()
    from ci.formats.rewrite import add_members
    relisted = listed / released.wheel.name
    shutil.copyfile(released.wheel, relisted)
    add_members(relisted, relisted, {"zzz_backdoor.pth": b"import os\n"}, {})
    assets = tmp_path / "listed"
    shutil.copytree(released.assets, assets)
    _rewrite(assets, relisted, run="https://github.com/NVIDIA/wheelhouse/actions/runs/123456789/attempts/1")
    text = run("record-rewritten", relisted, assets)
    assert cases["record-rewritten"][0] == 0 and "published by" not in text
    assert "its unsigned provenance statement" in text and "nothing here shows who published it" in text

    # the round's case 3: the run carries escapes and a newline: printed escaped, never as a second line
    assets = tmp_path / "escapes"
    shutil.copytree(released.assets, assets)
    _rewrite(assets, relisted, run="https://github.com/o/r/actions/runs/1\n\x1b[32mSIGNATURE VERIFIED\x1b[0m")
    text = run("run-escapes", relisted, assets)
    assert "\x1b" not in text and len(text.splitlines()) == 1 and "published by" not in text

    # the signed bundle beside the tampered wheel: its subject is the genuine digest
    assets = signed_assets(released, sigstore, tmp_path / "signed")
    text = run("signed-wheel-replaced", relisted, assets)
    assert cases["signed-wheel-replaced"][0] == 2 and "differs from release" in text

    # a bundle signed by another Sigstore instance (the forger's own CA and logs)
    forger = (LocalSigstore(), sigstore[1])
    statement = json.loads(released.provenance.read_bytes())
    for subject in statement["subject"]:
        subject["digest"]["sha256"] = sha256_file(relisted)
    assets = signed_assets(released, forger, tmp_path / "forged-root", statement=statement)
    _rewrite_manifest_only(assets, relisted)
    text = run("own-root", relisted, assets)
    assert cases["own-root"][0] == 2 and "the signature does not verify against" in text

    # signed by the trusted instance, but for another workflow of the repository, or another repository
    for case, identity in (("other-workflow", Identity(workflow=".github/workflows/pr.yml")),
                           ("other-repository", Identity(repository="mallory/wheelhouse"))):
        assets = signed_assets(released, sigstore, tmp_path / case, statement=statement, identity=identity)
        _rewrite_manifest_only(assets, relisted)
        text = run(case, relisted, assets)
        assert cases[case][0] == 2 and "the signature does not verify against" in text, text

    # the payload of a genuine bundle edited (the forger's statement in the trusted signer's envelope)
    assets = signed_assets(released, sigstore, tmp_path / "payload-edited")
    bundle_path = assets / provenance.bundle_asset_name("x86_64")
    bundle = json.loads(bundle_path.read_text())
    import base64
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    bundle_path.write_text(json.dumps(bundle))
    _rewrite_manifest_only(assets, relisted)
    text = run("payload-edited", relisted, assets)
    assert cases["payload-edited"][0] == 2 and "the signature does not verify against" in text

    # the round's case 6: a second manifest (another arch, sorted first) listing the replaced wheel
    assets = tmp_path / "extra-arch"
    shutil.copytree(released.assets, assets)
    manifest = json.loads((assets / "wheelhouse-build-manifest-x86_64.json").read_text())
    manifest["arch"] = "aarch64"
    (assets / "wheelhouse-build-manifest-aarch64.json").write_text(json.dumps(manifest))
    text = run("extra-arch-manifest", relisted, assets)
    assert cases["extra-arch-manifest"][0] == 2 and "2 manifests list" in text
    # variant: the genuine manifest removed, the other arch's alone: its arch is not the wheel's
    (assets / "wheelhouse-build-manifest-x86_64.json").unlink()
    statement_file = json.loads((assets / provenance.asset_name("x86_64")).read_text())
    statement_file["predicate"]["buildDefinition"]["externalParameters"]["row"]["arch"] = "aarch64"
    (assets / provenance.asset_name("aarch64")).write_text(json.dumps(statement_file))
    text = run("other-arch-manifest", relisted, assets)
    assert cases["other-arch-manifest"][0] == 2 and "arch: its platform tag is not aarch64" in text

    # no repository named for a signed statement: it cannot say whose signature to accept
    assets = signed_assets(released, sigstore, tmp_path / "no-repo")
    result = subprocess.run([sys.executable, "-m", "invoke", "verify-wheel", "--wheel", str(released.wheel),
                             "--release", str(assets)], cwd=REPO, capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "WHEELHOUSE_STORE"})
    assert result.returncode == 2 and "--repo OWNER/REPO" in result.stderr and len(result.stderr.splitlines()) == 1

    for case, (code, text) in cases.items():
        print(f"=== {case:<28} rc={code}  {text.splitlines()[0][:220]}")
        lines = text.splitlines()  # one line for a good wheel; else one error line per difference
        assert len(lines) == 1 if code == 0 else all(line.startswith("error: ") for line in lines), (case, text)


def _rewrite_manifest_only(assets: Path, wheel: Path) -> None:
    manifest_path = assets / "wheelhouse-build-manifest-x86_64.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["wheels"]:
        entry.update(sha256=sha256_file(wheel), size=wheel.stat().st_size)
    manifest_path.write_text(json.dumps(manifest))


def test_the_publish_job_uploads_the_bundle_only_when_it_signs_this_release_statement(fixture_wheel, sigstore,
                                                                                      tmp_path):
    """`invoke release --predicate-out` writes the predicate the signing step signs; `--provenance-bundle` uploads
    the bundle in place of the unsigned statement, and refuses one that signs anything else (before uploading)."""
    dist = tmp_path / "dist"
    versions, row = built_row(fixture_wheel, dist)
    plan = release.plan(versions, row, dist, env=RUN_ENV)
    instance, _ = sigstore
    good = tmp_path / "good.json"
    good.write_text(json.dumps(instance.sign_statement(dict(plan.statement))))
    other = dict(plan.statement, predicate={**plan.statement["predicate"], "runDetails": {"builder": {"id": "x"}}})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(instance.sign_statement(other)))
    with pytest.raises(WheelhouseError) as refused:
        release.plan(versions, row, dist, env=RUN_ENV, bundle=bad)
    assert str(refused.value) == (f"{bad}: the bundle does not sign this release's provenance statement: its predicate "
                                  "differs from this build's; sign what `invoke release --predicate-out` wrote, over "
                                  f"dist/{row.world}/*.whl")
    store = LocalStore(tmp_path / "store")
    release.apply(release.plan(versions, row, dist, env=RUN_ENV, bundle=good), store)
    names = {a.name for a in store.get_release(row.release_tag).assets}
    assert provenance.bundle_asset_name(row.arch) in names and provenance.asset_name(row.arch) not in names
    published = store.read_asset(row.release_tag, provenance.bundle_asset_name(row.arch))
    statement, signer = signature.verify(published, repository="octo/wheelhouse", trusted_root=sigstore[1],
                                         where="bundle")
    assert statement == plan.statement and signer.run == RUN

    out = tmp_path / "predicate.json"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")}, **RUN_ENV,
           "WHEELHOUSE_VERSIONS": str(versions.path)}
    done = subprocess.run([sys.executable, "-m", "invoke", "release", "--component", row.component, "--arch",
                           row.arch, "--dist", str(dist), "--predicate-out", str(out)], cwd=REPO, capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == plan.statement["predicate"]
    assert not (tmp_path / "store2").exists()
