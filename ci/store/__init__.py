"""Where releases live: the ReleaseStore protocol and its implementations, and opening the ones the
environment names (the commands call :func:`open_store` and :func:`open_artifacts`, nothing else here)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ci.base.errors import ConfigError, UsageError
from ci.store.artifacts import ArtifactSource, GitHubArtifacts, LocalArtifacts
from ci.store.http import ProgressFn
from ci.store.model import ReleaseStore

if TYPE_CHECKING:  # the settings module reads no store; only its type is needed here
    from ci.model.environment import Environment


def open_store(env: Environment, *, dry_run: bool = False, progress: ProgressFn | None = None,
               must_exist: bool = False) -> ReleaseStore:
    """The store ``env`` names; ``must_exist``: a local store directory must exist already (tasks that read
    a store to publish or change it; a typo must not read as an empty store). ``dry_run`` records a GitHub
    store's changes instead of making them."""
    repo = env.github_repo
    if repo is None:
        from ci.store.local import LocalStore

        return LocalStore(Path(env.store_spec), must_exist=must_exist)
    if not env.token:
        raise ConfigError(
            f"WHEELHOUSE_STORE={env.store_spec} needs a token: set GITHUB_TOKEN (or GH_TOKEN) with contents:write"
        )
    from ci.store.github import GitHubStore  # deferred: ghapi builds its endpoint table on import

    return GitHubStore(repo, api_url=env.api_url, token=env.token, dry_run=dry_run, progress=progress,
                       write_gap=env.write_gap)


def open_artifacts(store: ReleaseStore, artifacts_dir: str | Path | None) -> ArtifactSource:
    """Where restore-wheels reads workflow artifacts: ``artifacts_dir`` when named, else the workflow runs of
    the GitHub store's repository (through the store's own API client); a local store needs the directory."""
    from ci.store.github import GitHubStore

    if artifacts_dir:
        return LocalArtifacts(Path(artifacts_dir))
    if isinstance(store, GitHubStore):
        return GitHubArtifacts(store.api)
    raise UsageError("restore-wheels: a local store takes its artifacts from --artifacts-dir DIR "
                     "(DIR/<run id>/<artifact name>.zip)")


__all__ = ["open_artifacts", "open_store"]
