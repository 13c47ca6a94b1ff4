"""The signed provenance of a release: a Sigstore bundle whose DSSE payload is our in-toto statement.

The publish job writes the statement's predicate (ci/publish/provenance.py) and GitHub's ``actions/attest`` signs it
with the job's OIDC identity: Fulcio certifies a short-lived key for the workflow that ran (its file, ref,
commit and run, as certificate extensions), the key signs the statement, and a transparency log (Rekor) records
the signature. The bundle holds all of it and is uploaded as ``wheelhouse-provenance-<arch>.sigstore.json``.

:func:`verify` checks a bundle offline with sigstore-python against a trusted root (a file: ``gh attestation
trusted-root`` writes the current ones, one JSON document a line; by default the public-good instance's root the
pinned sigstore release carries): the certificate chains to the root's CA at the time the log recorded, its
embedded timestamp (SCT) is signed by a CT log of the root, the log entry (its inclusion promise and its
inclusion proof with a signed checkpoint) by a log of the root, the statement by the certified key, and the
certificate names the issuer GitHub Actions, the repository, and its ``_publish.yml`` as the workflow that
signed. Only then does verify-wheel say who published the wheel, and it says what the certificate says: the run.

A private repository's attestations are signed by GitHub's own instance, with RFC 3161 timestamps and no
transparency log entry; sigstore-python verifies only bundles with a log entry, so those are refused here in
one line (``gh attestation verify`` checks them).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ci.base import bounded_json
from ci.base.errors import WheelhouseError

MEDIA_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
PUBLISH_WORKFLOW = ".github/workflows/_publish.yml"
MAX_BUNDLE_BYTES = 16 << 20
_RUN_INVOCATION_URI = "1.3.6.1.4.1.57264.1.21"
_SOURCE_REPOSITORY_DIGEST = "1.3.6.1.4.1.57264.1.13"
_PUBLIC_GOOD_ROOT = ("_store", "https%3A%2F%2Ftuf-repo-cdn.sigstore.dev", "trusted_root.json")


class SignatureError(WheelhouseError):
    """The bundle does not verify, or does not say what it must; the message says which, in one line."""

    exit_code = 2


def is_bundle(document: Any) -> bool:
    return isinstance(document, dict) and str(document.get("mediaType", "")).startswith(MEDIA_TYPE_PREFIX)


def statement_of(document: dict[str, Any], *, where: str) -> dict[str, Any]:
    """The in-toto statement a bundle's DSSE envelope carries, read WITHOUT verifying anything (what the publish job
    compares with the statement it would upload, before the bundle goes to the release)."""
    try:
        envelope = document["dsseEnvelope"]
        if envelope["payloadType"] != PAYLOAD_TYPE:
            raise SignatureError(f"{where}: the signed payload is {envelope['payloadType']!r}, not an in-toto statement")
        statement = bounded_json.loads(base64.b64decode(envelope["payload"], validate=True))
    except (KeyError, TypeError, ValueError) as exc:
        raise SignatureError(f"{where}: not a Sigstore bundle of a DSSE-signed statement ({exc})") from None
    if not isinstance(statement, dict):
        raise SignatureError(f"{where}: the signed payload is not a statement")
    return statement


def read_bundle(data: bytes, *, where: str) -> dict[str, Any]:
    if len(data) > MAX_BUNDLE_BYTES:
        raise SignatureError(f"{where}: {len(data)} bytes, more than a Sigstore bundle of a statement is")
    try:
        document = bounded_json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SignatureError(f"{where}: not JSON ({exc})") from None
    if not is_bundle(document):
        raise SignatureError(f"{where}: not a Sigstore bundle (no mediaType {MEDIA_TYPE_PREFIX}…)")
    return document


@dataclass(frozen=True)
class Signer:
    """What the verified certificate says of the workflow run that signed."""

    workflow: str
    """The signing workflow, ``https://github.com/<repo>/.github/workflows/_publish.yml@<ref>``."""
    run: str | None
    """``https://github.com/<repo>/actions/runs/<id>/attempts/<n>`` (certificates since 2023 carry it)."""
    commit: str | None
    trusted_root: str
    """Which root it verified against: the file, or the public-good root of the pinned sigstore release."""


def _trusted_roots(path: Path | None) -> tuple[list[Any], str]:
    """The roots to verify against, and how to name them: a file of one trusted root, or of one a line (``gh
    attestation trusted-root``: GitHub's and the public-good one); by default the public-good root."""
    from sigstore.models import TrustedRoot
    from sigstore_models.trustroot import v1 as trustroot_v1

    if path is None:
        text = resources.files("sigstore").joinpath("/".join(_PUBLIC_GOOD_ROOT)).read_text(encoding="utf-8")
        where = "the public-good Sigstore root of the pinned sigstore-python"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SignatureError(f"--trusted-root {path}: cannot read it ({exc}); name the file `gh attestation "
                                 "trusted-root` wrote") from None
        where = str(path)
    documents = [text] if _one_document(text) else [line for line in text.splitlines() if line.strip()]
    roots = []
    for document in documents:
        try:
            roots.append(TrustedRoot(trustroot_v1.TrustedRoot.from_json(document)))
        except Exception as exc:  # sigstore's and pydantic's parse errors alike: the file is not a trusted root
            raise SignatureError(f"--trusted-root {where}: not a Sigstore trusted root ({_reason(exc)[:120]}); "
                                 "write it with `gh attestation trusted-root`") from None
    if not roots:
        raise SignatureError(f"--trusted-root {where}: holds no trusted root")
    return roots, where


def _one_document(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _policy(repository: str) -> Any:
    from cryptography import x509
    from sigstore.verify import policy

    class PublishWorkflow:
        """The certificate's identity is this repository's publish workflow, at any ref."""

        def verify(self, cert: Any) -> None:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = names.get_values_for_type(x509.UniformResourceIdentifier)
            wanted = f"https://github.com/{repository}/{PUBLISH_WORKFLOW}@"
            if not any(uri.startswith(wanted) for uri in uris):
                from sigstore.errors import VerificationError

                raise VerificationError(f"signed by {', '.join(uris) or 'no workflow'}, not by {wanted}<ref>")

    return policy.AllOf([policy.OIDCIssuerV2(GITHUB_ISSUER),
                         policy.OIDCSourceRepositoryURI(f"https://github.com/{repository}"),
                         PublishWorkflow()])


def _extension(cert: Any, oid: str) -> str | None:
    from cryptography import x509

    try:
        raw = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
    except x509.ExtensionNotFound:
        return None
    if raw[:1] == b"\x0c" and len(raw) > 2:  # a DER UTF8String (Fulcio's newer extensions)
        length = raw[1]
        return raw[2:2 + length].decode("utf-8", "replace") if length < 0x80 else raw[3:].decode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def verify(data: bytes, *, repository: str, trusted_root: Path | None, where: str) -> tuple[dict[str, Any], Signer]:
    """The statement a bundle signs and who signed it, once it verifies against ``trusted_root`` (see the module
    docstring); SignatureError in one line otherwise."""
    from cryptography import x509
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle
    from sigstore.verify import Verifier

    read_bundle(data, where=where)
    roots, root_name = _trusted_roots(trusted_root)
    try:
        bundle = Bundle.from_json(data)
    except Exception as exc:  # InvalidBundle, pydantic's ValidationError, a bad certificate: not a bundle we verify
        raise SignatureError(f"{where}: not a Sigstore bundle sigstore-python verifies ({_reason(exc)}); a private "
                             "repository's attestations carry no transparency log entry: check them with "
                             "`gh attestation verify`") from None
    failures = []
    for root in roots:
        try:
            payload_type, payload = Verifier(trusted_root=root).verify_dsse(bundle, _policy(repository))
            break
        except SigstoreError as exc:
            failures.append(_reason(exc))
    else:
        raise SignatureError(f"{where}: the signature does not verify against {root_name}: {'; '.join(failures)}")
    if payload_type != PAYLOAD_TYPE:
        raise SignatureError(f"{where}: the signed payload is {payload_type!r}, not an in-toto statement")
    try:
        statement = bounded_json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SignatureError(f"{where}: the signed statement is not JSON ({exc})") from None
    cert = bundle.signing_certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    workflow = next(iter(san.get_values_for_type(x509.UniformResourceIdentifier)), "")
    signer = Signer(workflow, _extension(cert, _RUN_INVOCATION_URI), _extension(cert, _SOURCE_REPOSITORY_DIGEST),
                    root_name)
    return statement, signer


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
