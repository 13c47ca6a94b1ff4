"""Pytest fixtures for the test server. Import them into a test module (or a conftest)::

    from tests.github_server.pytest_plugin import github_server  # noqa: F401

``github_server`` yields a started :class:`GitHubTestServer` (token ``test-token``, repository
``o/r`` by convention) and stops it afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import GitHubTestServer


@pytest.fixture
def github_server() -> Iterator[GitHubTestServer]:
    with GitHubTestServer(token="test-token") as srv:
        yield srv
