"""A GitHub-compatible test server for the releases subset the wheelhouse uses.

Start it in-process::

    from tests.github_server import GitHubTestServer, FaultConfig

    with GitHubTestServer(token="t") as gh:          # or the ``github_server`` pytest fixture
        gh.seed_release("v1", repo="o/r", assets=[("a.whl", b"...")])
        gh.seed_bulk(5000, 12, repo="o/r")           # fast, no bytes kept
        ... GitHubStore("o/r", api_url=gh.api_url, token="t") ...
        gh.counters["GET /repos/{owner}/{repo}/releases"], gh.fault_counts, gh.snapshot("o/r")

or as a process: ``python -m tests.github_server --port 8000 [--uploads-port 8001] [--seed-bulk 5000x12]``.

Implemented (GitHub REST semantics, API version 2022-11-28):

- ``GET /repos/{o}/{r}/releases`` (Link pagination: ``per_page`` default 30, capped at 100; newest
  first; drafts listed; results past ``state.listing_cap`` = 10,000 answer ``422 Only the first 10000
  results are available.``), ``POST`` (201; 422 ``already_exists`` on a duplicate published tag),
  ``GET /releases/latest``, ``GET /releases/tags/{tag}`` (published only), ``GET/PATCH/DELETE
  /releases/{id}``, ``GET /releases/{id}/assets`` (paginated), ``GET/PATCH/DELETE
  /releases/assets/{id}`` (``Accept: application/octet-stream`` -> 302 to a signed object URL on
  the uploads host, which refuses a request that also carries ``Authorization``), the public
  ``browser_download_url`` (302 likewise), ``DELETE /git/refs/tags/{tag}`` (422 "Reference does not
  exist" when missing), ``GET /git/matching-refs/{ref}`` (the git tags, including those a moved or
  deleted release left behind), ``GET /git/ref/tags/{tag}``, ``GET /rate_limit`` (not charged).
- Git tags point at commits: a tag a release creates (POST, or PATCH of ``tag_name`` onto a missing
  tag) is made at ``target_commitish`` -- a sha as given, a branch name as the default branch's head
  at that moment (:meth:`ServerState.advance_head` moves it); an existing tag is left where it is.
- Workflow-run artifacts: ``GET /repos/{o}/{r}/actions/runs/{run}/artifacts`` (an object
  ``{total_count, artifacts}``; Link pagination, ``per_page`` default 30, capped at 100; ``name`` and
  ``direction`` (default ``desc``)), ``GET /actions/artifacts/{id}``, ``GET
  /actions/artifacts/{id}/zip`` (302 to a signed URL on the uploads host, or the bytes with
  ``state.artifact_redirect = False``; 410 when expired). Seed with :meth:`GitHubTestServer.seed_artifact`.
- Uploads on a separate host: ``POST /repos/{o}/{r}/releases/{id}/assets?name=&label=`` with
  ``Content-Length`` and ``Content-Type``; the asset exists in state ``starter`` from the first byte
  (a failed or aborted upload leaves it and it blocks the name until deleted); 201 sets ``state:
  uploaded``, ``size``, ``content_type`` and ``digest: sha256:<hex>`` of the received bytes; 422
  ``already_exists`` when the (normalised) name is taken; 422 ``custom`` with GitHub's message past
  the asset limits (``state.max_asset_size`` 2 GiB, ``state.max_assets`` 1,000 per release). Names are
  normalised as described in :mod:`tests.github_server.names`. ``state.incomplete_state`` is
  ``starter`` or ``open`` (the OpenAPI value).
- PATCH renaming an asset onto a name another asset holds: 422 ``already_exists`` by default
  (``state.rename_onto_existing``: ``reject-custom`` and ``reject-bare`` answer other 422s, ``allow``
  lets both exist; GitHub documents none of them).
- Auth: ``Authorization: token X`` or ``Bearer X`` must match the server token, else 401.
- Rate limits: ``x-ratelimit-*`` on every authenticated answer; :meth:`GitHubTestServer.exhaust_primary`
  (403 with ``x-ratelimit-remaining: 0`` until ``x-ratelimit-reset``),
  :meth:`GitHubTestServer.inject_secondary` (403/429 with ``retry-after``).
- Faults: :class:`FaultConfig` (seeded): 500/502/503, dropped connections (before or after the
  change is applied; mid-upload leaving a ``starter``), secondary limits, slow answers.
"""

from __future__ import annotations

from .clock import FakeClock
from .names import normalize_asset_name
from .server import FaultConfig, GitHubTestServer
from .state import ServerState

__all__ = ["FakeClock", "FaultConfig", "GitHubTestServer", "ServerState", "normalize_asset_name"]
