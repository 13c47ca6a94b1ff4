"""Credentials stay out of third-party build code.

A build runs other people's code: a builder script, the project's setup.py or
CMake, and (for an sdist) the setup.py pip runs while downloading. None of it
needs our tokens, and any of it could send them away, so the environment it
gets is ours minus every variable named here. A component that really needs
one (a private mirror's password, say) names it in ``pass_env``.

Withheld: the names in :data:`DENIED_NAMES`, every ``ACTIONS_*`` variable (the
runner's cache, artifact and OIDC tokens and their URLs), and every name ending
in one of :data:`DENIED_SUFFIXES` (``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``, …).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DENIED_NAMES = frozenset({
    "GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN", "GITHUB_ENTERPRISE_TOKEN", "GITHUB_JWT_TOKEN",
    "GITHUB_APP_PRIVATE_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_SECRET", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CREDENTIALS",
    "TWINE_USERNAME", "TWINE_PASSWORD", "PYPI_API_TOKEN", "UV_PUBLISH_PASSWORD", "UV_PUBLISH_TOKEN",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NPM_TOKEN", "NODE_AUTH_TOKEN", "CODECOV_TOKEN",
    "DOCKER_PASSWORD", "DOCKER_AUTH_CONFIG", "SSH_AUTH_SOCK", "GIT_ASKPASS", "SSH_ASKPASS",
})
DENIED_PREFIXES = ("ACTIONS_",)
DENIED_SUFFIXES = ("_TOKEN", "_SECRET", "_PASSWORD", "_PASSWD", "_API_KEY", "_ACCESS_KEY", "_PRIVATE_KEY",
                   "_CREDENTIALS")


def is_credential(name: str) -> bool:
    upper = name.upper()
    return upper in DENIED_NAMES or upper.startswith(DENIED_PREFIXES) or upper.endswith(DENIED_SUFFIXES)


def without_credentials(environ: Mapping[str, str], *, allow: Iterable[str] = ()) -> tuple[dict, list[str]]:
    """(``environ`` without credentials, the names withheld); names in ``allow`` are kept."""
    allowed = set(allow)
    kept, withheld = {}, []
    for name, value in environ.items():
        if is_credential(name) and name not in allowed:
            withheld.append(name)
        else:
            kept[name] = value
    return kept, sorted(withheld)
