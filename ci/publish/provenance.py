"""The provenance statement of a release: in-toto Statement v1 with an SLSA Provenance v1 predicate.

One statement per arch of a release, ``wheelhouse-provenance-<arch>.intoto.json``, beside that arch's
build manifest. A release holds one (component, Python, torch) for every arch, and each arch's publish
job uploads its own wheels: a statement per arch means two arch jobs never rewrite one shared file
(the reason the manifest is per arch too), and each statement names only wheels its own job uploaded.

- ``subject``: every wheel of the arch's build, by file name and sha256;
- ``buildDefinition.externalParameters``: the row, the source (kind, location, ref, commit or
  digest, submodules), the build-input fingerprint and the versions.yaml commit;
- ``buildDefinition.resolvedDependencies``: the same source and versions.yaml commits as resource
  descriptors (``gitCommit`` or ``sha256`` digests), the build config under ``internalParameters``;
- ``runDetails``: the workflow run that published it (``GITHUB_SERVER_URL``/``GITHUB_REPOSITORY``/
  ``GITHUB_RUN_ID``/``GITHUB_RUN_ATTEMPT``, read in the publish job), or a local builder outside one.

The bytes are deterministic (sorted keys, no wall-clock time): the same build published by the same
run gives the same statement. The statement is not signed here: signing needs GitHub's OIDC token, which
only the publish job holds. There ``invoke release --predicate-out`` writes this statement's predicate,
``actions/attest`` signs it over the same wheels (a Sigstore bundle, ci/publish/signature.py), and ``invoke release
--provenance-bundle`` checks that the bundle carries exactly this statement and uploads it as
``wheelhouse-provenance-<arch>.sigstore.json`` in place of the unsigned ``.intoto.json``: one provenance,
ours, signed. A release made outside a workflow carries the unsigned statement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ci.base import bounded_json
from ci.base.errors import ConfigError, WheelhouseError
from ci.model.manifest import Manifest
from ci.model.naming import wheel_covers_arch

_Asset = TypeVar("_Asset")

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:wheelhouse:build:v1"
"""How to read ``externalParameters``: this module's docstring is its definition."""
LOCAL_BUILDER = "urn:wheelhouse:builder:local"
"""``runDetails.builder.id`` of a release published outside GitHub Actions."""
PREFIX = "wheelhouse-provenance-"
SUFFIX = ".intoto.json"
BUNDLE_SUFFIX = ".sigstore.json"
"""The signed form: a Sigstore bundle whose DSSE payload is the statement."""
RUN_VARIABLES = ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT")
_HEX_COMMIT = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def asset_name(arch: str) -> str:
    return f"{PREFIX}{arch}{SUFFIX}"


def bundle_asset_name(arch: str) -> str:
    return f"{PREFIX}{arch}{BUNDLE_SUFFIX}"


def arch_of(asset: str) -> str | None:
    for suffix in (SUFFIX, BUNDLE_SUFFIX):
        if asset.startswith(PREFIX) and asset.endswith(suffix) and len(asset) > len(PREFIX) + len(suffix):
            return asset[len(PREFIX) : -len(suffix)]
    return None


def statements_by_arch(assets: Mapping[str, _Asset]) -> dict[str, _Asset]:
    """A release's provenance (of its assets by name), by arch: the signed bundle where the arch has one."""
    found: dict[str, _Asset] = {}
    for name in sorted(assets, key=lambda n: n.endswith(BUNDLE_SUFFIX)):  # a bundle after, so it wins
        if (arch := arch_of(name)) is not None:
            found[arch] = assets[name]
    return found


def statement_for(wheel_name: str, statements: Mapping[str, _Asset]) -> _Asset | None:
    """The statement that names a wheel, judged by name: the one arch its platform tag fits. A pure-Python
    wheel fits every arch: it gets the statement only when the release has one, else none (a link to the
    wrong statement would fail verification; no link says less, and nothing false)."""
    fits = [statement for arch, statement in statements.items() if wheel_covers_arch(wheel_name, arch)]
    return fits[0] if len(fits) == 1 else None


# --- the workflow run --------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowRun:
    server_url: str
    repository: str
    run_id: str
    attempt: str

    @property
    def url(self) -> str:
        return f"{self.server_url}/{self.repository}/actions/runs/{self.run_id}/attempts/{self.attempt}"


def workflow_run(env: Mapping[str, str]) -> WorkflowRun | None:
    """The publishing workflow run, from the variables GitHub Actions sets; None outside Actions.

    Inside Actions (``GITHUB_ACTIONS=true``) every variable must be there: a statement that names half a
    run could not be traced back to it.
    """
    if env.get("GITHUB_ACTIONS") != "true":
        return None
    missing = [name for name in RUN_VARIABLES if not env.get(name, "").strip()]
    if missing:
        raise ConfigError(f"GitHub Actions run without {', '.join(missing)}: the provenance statement names the "
                          "workflow run; run the release in a GitHub Actions job, or unset GITHUB_ACTIONS")
    server, repository, run_id, attempt = (env[name].strip() for name in RUN_VARIABLES)
    return WorkflowRun(server.rstrip("/"), repository, run_id, attempt)


# --- the statement -----------------------------------------------------------------------------


def _versions_commit(versions: Mapping[str, Any] | None) -> str | None:
    """The versions.yaml commit as the SBOM writes it (``<commit>-dirty`` for a changed tree)."""
    if not versions or not versions.get("commit"):
        return None
    commit = str(versions["commit"])
    return commit + ("-dirty" if versions.get("dirty") and commit != "uncommitted" else "")


def _source_digest(source: Mapping[str, Any]) -> dict[str, str]:
    revision = str(source.get("revision", ""))
    if source.get("kind") == "git" and _HEX_COMMIT.match(revision):
        return {"gitCommit": revision}
    if _SHA256.match(revision):  # an sdist's sha256, a directory's digest
        return {"sha256": revision}
    return {}


def _dependencies(source: Mapping[str, Any], versions_commit: str | None,
                  run: WorkflowRun | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    digest = _source_digest(source)
    if digest:
        entry: dict[str, Any] = {"name": "source", "digest": digest}
        if source.get("kind") == "git" and source.get("location"):
            entry["uri"] = f"git+{source['location']}@{source.get('ref', '')}"
        found.append(entry)
    for sub in source.get("submodules") or []:
        if isinstance(sub, Mapping) and _HEX_COMMIT.match(str(sub.get("commit", ""))):
            found.append({"name": f"source/{sub.get('path')}", "digest": {"gitCommit": sub["commit"]}})
    if versions_commit and _HEX_COMMIT.match(versions_commit):  # a dirty or uncommitted tree has no commit to name
        entry = {"name": "versions.yaml", "digest": {"gitCommit": versions_commit}}
        if run is not None:
            entry["uri"] = f"git+{run.server_url}/{run.repository}@{versions_commit}"
        found.append(entry)
    return found


def statement(built: Manifest, row: Mapping[str, Any], *, facts: Mapping[str, Any] | None,
              run: WorkflowRun | None) -> dict[str, Any]:
    """The provenance statement of one arch's build (``built``: the manifest the release uploads).

    ``row`` is the matrix row as JSON (:meth:`ci.model.matrix.MatrixRow.to_json`); ``facts`` what the build
    record keeps for the SBOM (ci/building/sbom.py ``build_facts``), None when the record has none. Its source
    is preferred to the manifest's: it names no path of the build machine, so a rebuild elsewhere gives
    the same statement; both name the same revision.
    """
    versions = facts.get("versions") if facts else None
    recorded = facts.get("source") if facts else None
    source: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else built.source
    if str(source.get("revision", "")) != str(built.source.get("revision", "")):
        raise WheelhouseError(f"release {built.release_tag} ({built.arch}): the build record's SBOM facts name source "
                              f"{source.get('revision')}, its source {built.source.get('revision')}; rebuild the row")
    versions_commit = _versions_commit(versions)
    builder = {"id": f"{run.server_url}/{run.repository}/.github/workflows/_publish.yml" if run else LOCAL_BUILDER}
    run_details: dict[str, Any] = {"builder": builder}
    if run is not None:
        run_details["metadata"] = {"invocationId": run.url}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": w.name, "digest": {"sha256": w.sha256}} for w in sorted(built.wheels, key=lambda w: w.name)],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "release_tag": built.release_tag,
                    "row": dict(row),
                    "source": dict(source),
                    "fingerprint": built.fingerprint,
                    "versions": {"file": (versions or {}).get("file"), "commit": versions_commit},
                },
                "internalParameters": {"build_config": built.build_config},
                "resolvedDependencies": _dependencies(source, versions_commit, run),
            },
            "runDetails": run_details,
        },
    }


def dumps(document: Mapping[str, Any]) -> bytes:
    """The uploaded bytes: sorted keys, two-space indent, one trailing newline."""
    return (json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# --- reading it back ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Provenance:
    """What a statement says, in the terms a verifier compares."""

    subjects: Mapping[str, str]
    """wheel file name -> sha256"""
    release_tag: str
    arch: str
    world: str
    fingerprint: str
    source_revision: str
    versions_commit: str | None
    run: str | None
    """The workflow run's URL, or None for a local release."""


def same_statement(signed: Mapping[str, Any], ours: Mapping[str, Any]) -> str | None:
    """Why a signed statement is not the one this release would upload (its subjects as a set: the signer lists
    the files in its own order); None when it is."""
    for key in ("_type", "predicateType", "predicate"):
        if signed.get(key) != ours.get(key):
            return f"its {key} differs from this build's"
    def subjects(document: Mapping[str, Any]) -> set[str]:
        return {json.dumps(item, sort_keys=True) for item in document.get("subject") or ()}
    if subjects(signed) != subjects(ours):
        return "it signs other wheels (names or sha256) than this build's"
    return None


def parse(data: bytes, *, where: str) -> Provenance:
    """Read a statement this module wrote; one line naming ``where`` and the fault otherwise."""
    try:
        raw = bounded_json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WheelhouseError(f"{where}: not JSON ({exc}); download the release's {PREFIX}<arch>{SUFFIX}") from None
    return read(raw, where=where)


def read(raw: Any, *, where: str) -> Provenance:
    """:func:`parse` of an already parsed document (the payload of a verified bundle)."""
    if not isinstance(raw, dict) or raw.get("_type") != STATEMENT_TYPE or raw.get("predicateType") != PREDICATE_TYPE:
        raise WheelhouseError(f"{where}: not an in-toto statement with an SLSA provenance v1 predicate; "
                              f"download the release's {PREFIX}<arch>{SUFFIX}")
    try:
        definition = raw["predicate"]["buildDefinition"]
        if definition["buildType"] != BUILD_TYPE:
            raise WheelhouseError(f"{where}: build type {definition['buildType']!r} is not {BUILD_TYPE}; "
                                  "it was not written by this wheelhouse")
        external = definition["externalParameters"]
        metadata = raw["predicate"]["runDetails"].get("metadata") or {}
        return Provenance(
            subjects={str(s["name"]): str(s["digest"]["sha256"]) for s in raw["subject"]},
            release_tag=str(external["release_tag"]),
            arch=str(external["row"]["arch"]),
            world=str(external["row"]["world"]),
            fingerprint=str(external["fingerprint"]),
            source_revision=str(external["source"].get("revision", "")),
            versions_commit=external["versions"].get("commit"),
            run=metadata.get("invocationId"),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise WheelhouseError(f"{where}: provenance statement lacks or mistypes {exc}; it was not written by "
                              "this wheelhouse") from None
