"""The environment variables every command honours, read in one place.

Entry points pass ``os.environ`` here; library code receives the typed
result and never reads the environment itself.

=========================  ====================================================
WHEELHOUSE_VERSIONS        another versions file (default: versions.yaml)
WHEELHOUSE_STORE           a directory (default: wheelhouse/ in the repository)
                           or ``github:owner/repo``
WHEELHOUSE_TORCH_INDEX     torch index for every row (``default``: pip's own)
WHEELHOUSE_API_URL/GH_HOST GitHub API base (GitHub Enterprise, the test server)
GITHUB_TOKEN / GH_TOKEN    token for the GitHub store
WHEELHOUSE_CACHE           checkout / compiler / sdist cache (default: .cache/)
WHEELHOUSE_WRITE_GAP       seconds between GitHub writes (default 1, as GitHub
                           asks; the test suite's command runs set 0)
WHEELHOUSE_MAX_JOBS        build jobs for this machine, in place of versions.yaml's
                           max_jobs (not a build input: the wheels are the same)
GITHUB_ACTIONS             ``true`` on GitHub Actions: steps fold into groups,
                           errors become annotations (ci/base/log.py)
=========================  ====================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ci.base.errors import ConfigError
from ci.model.versions import DEFAULT_VERSIONS, REPO_ROOT

DEFAULT_STORE = REPO_ROOT / "wheelhouse"
DEFAULT_CACHE = REPO_ROOT / ".cache"
DEFAULT_API_URL = "https://api.github.com"


@dataclass(frozen=True)
class Environment:
    versions_path: Path = DEFAULT_VERSIONS
    store_spec: str = str(DEFAULT_STORE)
    torch_index: str | None = None
    api_url: str = DEFAULT_API_URL
    token: str | None = field(default=None, repr=False)
    cache_dir: Path = DEFAULT_CACHE
    write_gap: float = 1.0
    max_jobs: int | None = None
    github_actions: bool = False

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> Environment:
        api = env.get("WHEELHOUSE_API_URL") or env.get("GH_HOST") or DEFAULT_API_URL
        if "://" not in api:  # GH_HOST may be a bare host name (GitHub Enterprise)
            api = f"https://{api}/api/v3"
        return cls(
            versions_path=Path(env.get("WHEELHOUSE_VERSIONS") or DEFAULT_VERSIONS),
            store_spec=env.get("WHEELHOUSE_STORE") or str(DEFAULT_STORE),
            torch_index=env.get("WHEELHOUSE_TORCH_INDEX") or None,
            api_url=api.rstrip("/"),
            token=env.get("GITHUB_TOKEN") or env.get("GH_TOKEN") or None,
            cache_dir=Path(env.get("WHEELHOUSE_CACHE") or DEFAULT_CACHE),
            write_gap=_seconds("WHEELHOUSE_WRITE_GAP", env.get("WHEELHOUSE_WRITE_GAP"), 1.0),
            max_jobs=_jobs("WHEELHOUSE_MAX_JOBS", env.get("WHEELHOUSE_MAX_JOBS")),
            github_actions=on_github_actions(env),
        )

    @property
    def github_repo(self) -> str | None:
        """``owner/repo`` when the store is GitHub, else None."""
        if self.store_spec.startswith("github:"):
            repo = self.store_spec.removeprefix("github:")
            if repo.count("/") != 1 or not all(repo.split("/")):
                raise ConfigError(
                    f"WHEELHOUSE_STORE={self.store_spec}: expected github:owner/repo or a directory path"
                )
            return repo
        return None


def _seconds(name: str, value: str | None, default: float) -> float:
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 60:
        raise ConfigError(f"{name}={value}: expected a number of seconds from 0 to 60")
    return seconds


def _jobs(name: str, value: str | None) -> int | None:
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise ConfigError(f"{name}={value}: expected a whole number of build jobs from 1 to 1024")
    return int(value)


def on_github_actions(env: Mapping[str, str]) -> bool:
    """Whether this runs as a GitHub Actions step (the runner sets GITHUB_ACTIONS=true)."""
    return env.get("GITHUB_ACTIONS") == "true"

