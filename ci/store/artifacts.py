"""Workflow-run artifacts: list a run's artifacts and download one as a zip, streamed to disk.

Two sources with one interface (:class:`ArtifactSource`):

- :class:`GitHubArtifacts` reads ``GET /repos/{o}/{r}/actions/runs/{run}/artifacts``. That answer is
  an object (``{total_count, artifacts}``), not a list: pages are requested with ``per_page=100``
  and followed through the Link header's ``rel="next"`` until the last page, and the number
  collected must equal ``total_count`` (the anchor's ``gh api --paginate`` printed one JSON document
  per page and broke past 30 artifacts). A download asks ``/actions/artifacts/{id}/zip``, which
  answers with a redirect to signed storage on another host; the token is sent to the API host only.
- :class:`LocalArtifacts` reads a directory laid out as ``<dir>/<run id>/<artifact name>.zip``
  (optionally with ``<artifact name>.zip.sha256`` holding the hex digest to verify), so restoring
  works against the local store too.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ci.base.errors import RemoteError, WheelhouseError

if TYPE_CHECKING:
    from ci.store.github_api import GitHubAPI

CHUNK = 1 << 20


@dataclass(frozen=True)
class Artifact:
    """One workflow-run artifact (GitHub's ``artifact`` schema, the fields restore needs)."""

    id: int | str
    name: str
    run_id: str
    size: int
    expired: bool = False
    digest: str | None = None
    """``sha256:<hex>`` of the zip (artifacts uploaded by upload-artifact v4 or newer); None otherwise."""
    created_at: str | None = None

    @property
    def sha256(self) -> str | None:
        if self.digest and self.digest.startswith("sha256:"):
            return self.digest.split(":", 1)[1].lower()
        return None


class ArtifactSource(Protocol):
    description: str

    def list_artifacts(self, run_id: str) -> list[Artifact]:
        """Every artifact of the run, expired ones included (flagged)."""

    def download(self, artifact: Artifact, dest: Path) -> str:
        """Write the artifact's zip to ``dest`` (streamed) and return the sha256 hex of the bytes written."""


class GitHubArtifacts:
    """Artifacts of a GitHub repository's workflow runs, through a :class:`GitHubAPI`.

    It lists through the API's pagination and downloads through its client (token, API URL, proxy
    settings, retry policy and progress are the API's, shared with the release store), so it behaves
    under rate limits and transient failures as every other call does.
    """

    def __init__(self, api: GitHubAPI, *, per_page: int = 100, timeout: float = 900.0) -> None:
        self._api = api
        self.per_page = per_page
        self._timeout = timeout
        self.description = f"workflow artifacts of {api.owner}/{api.name}"

    # ---- listing ------------------------------------------------------------------------------------
    def list_artifacts(self, run_id: str) -> list[Artifact]:
        api = self._api
        what = f"list artifacts of run {run_id} in {api.owner}/{api.name}"
        try:
            run = int(run_id)
        except ValueError:
            raise WheelhouseError(f"--run {run_id!r}: a workflow run id is a number (see the run's URL)") from None
        collected: dict[Any, dict[str, Any]] = {}
        total: int | None = None
        for resp in api.paged(what, "actions.list_workflow_run_artifacts", per_page=self.per_page, run_id=run):
            if resp.status == 404:
                raise RemoteError(f"{what}: run not found (HTTP 404); check the run id and the repository")
            if resp.status != 200:
                raise api.fail(what, resp)
            data = resp.json()
            if not isinstance(data, dict) or not isinstance(data.get("artifacts"), list):
                raise RemoteError(f"{what}: answer is not an object with an 'artifacts' list; check api_url")
            total = int(data.get("total_count", 0))
            for raw in data["artifacts"]:
                collected[raw["id"]] = raw
        if total is not None and len(collected) != total:
            raise RemoteError(f"{what}: collected {len(collected)} artifacts but total_count says {total} "
                              "(artifacts changed while listing?); re-run")
        return [self._artifact(raw, str(run_id)) for raw in collected.values()]

    @staticmethod
    def _artifact(raw: dict[str, Any], run_id: str) -> Artifact:
        run = raw.get("workflow_run") or {}
        return Artifact(id=raw["id"], name=raw["name"], run_id=str(run.get("id") or run_id),
                        size=int(raw.get("size_in_bytes") or 0), expired=bool(raw.get("expired")),
                        digest=raw.get("digest"), created_at=raw.get("created_at"))

    # ---- download -----------------------------------------------------------------------------------
    def download(self, artifact: Artifact, dest: Path) -> str:
        api = self._api
        what = f"download artifact {artifact.name} (id {artifact.id}, run {artifact.run_id})"
        resp, sha256 = api.download(f"{api.repo_path}/actions/artifacts/{artifact.id}/zip", dest,
                                   what=what, label=f"download {artifact.name}.zip", total=artifact.size,
                                   timeout=self._timeout)
        if resp.status == 410:
            raise RemoteError(f"{what}: the artifact has expired (HTTP 410); it cannot be restored")
        if resp.status != 200:
            raise api.fail(what, resp)
        return sha256


class LocalArtifacts:
    """Artifacts from a directory: ``<root>/<run id>/<artifact name>.zip``.

    A ``<artifact name>.zip.sha256`` file beside a zip (the hex digest, as ``sha256sum`` writes it)
    gives the digest to verify; without one the artifact has no digest, like those of
    upload-artifact before v4. Local artifacts never expire.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.description = f"artifact directory {self.root}"

    def list_artifacts(self, run_id: str) -> list[Artifact]:
        folder = self.root / str(run_id)
        if not folder.is_dir():
            raise WheelhouseError(f"--artifacts-dir: {folder} does not exist; put each run's artifact zips in "
                                  "<dir>/<run id>/<artifact name>.zip")
        out = []
        for path in sorted(folder.glob("*.zip")):
            sidecar = path.with_name(path.name + ".sha256")
            digest = None
            if sidecar.is_file():
                text = sidecar.read_text(encoding="utf-8").split()
                if text:
                    digest = f"sha256:{text[0].lower()}"
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(path.stat().st_mtime))
            out.append(Artifact(id=f"{run_id}/{path.stem}", name=path.stem, run_id=str(run_id),
                                size=path.stat().st_size, digest=digest, created_at=created))
        return out

    def download(self, artifact: Artifact, dest: Path) -> str:
        source = self.root / artifact.run_id / f"{artifact.name}.zip"
        digest = hashlib.sha256()
        part = dest.with_name(dest.name + ".part")
        try:
            with source.open("rb") as src, part.open("wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
            os.replace(part, dest)
        except FileNotFoundError:
            raise WheelhouseError(f"artifact {source} vanished; re-run") from None
        finally:
            part.unlink(missing_ok=True)
        return digest.hexdigest()


__all__ = ["Artifact", "ArtifactSource", "GitHubArtifacts", "LocalArtifacts"]
