"""Sources: git refs resolved without cloning, shallow fetches that come back clean, sdists pinned by sha256."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ci.base.errors import WheelhouseError
from ci.building import sources


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "setup.py").write_text("v1\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "v1", cwd=repo)
    _git("tag", "-a", "v1", "-m", "v1", cwd=repo)
    return repo


def test_moving_branch_and_annotated_tag_resolve_to_commits(upstream):
    url = upstream.as_uri()
    first = _git("rev-parse", "HEAD", cwd=upstream)
    assert sources.resolve_ref(url, "main") == first
    assert sources.resolve_ref(url, "v1") == first  # the peeled commit, not the tag object
    (upstream / "setup.py").write_text("v2\n")
    _git("commit", "-qam", "v2", cwd=upstream)
    assert sources.resolve_ref(url, "main") == _git("rev-parse", "HEAD", cwd=upstream) != first
    assert sources.resolve_ref(url, "no-such-branch") is None


def test_fetch_is_clean_every_time_and_follows_the_ref(upstream, tmp_path):
    cache = tmp_path / "cache"
    checkout = sources.fetch_git(upstream.as_uri(), "main", cache, submodules=False)
    assert (checkout.path / "setup.py").read_text() == "v1\n"
    (checkout.path / "setup.py").write_text("edited\n")
    (checkout.path / "build").mkdir()
    (upstream / "setup.py").write_text("v2\n")
    _git("commit", "-qam", "v2", cwd=upstream)

    again = sources.fetch_git(upstream.as_uri(), "main", cache, submodules=False)
    assert again.path == checkout.path  # cached by (url, ref)
    assert (again.path / "setup.py").read_text() == "v2\n"
    assert not (again.path / "build").exists()
    assert again.revision == _git("rev-parse", "HEAD", cwd=upstream)


def test_unknown_ref_is_one_line(upstream, tmp_path):
    with pytest.raises(WheelhouseError) as info:
        sources.fetch_git(upstream.as_uri(), "v9", tmp_path / "cache", submodules=False, component="demo")
    assert str(info.value) == f"components.demo.ref: 'v9' not found in {upstream.as_uri()}; use an existing branch, tag or commit"


@pytest.fixture
def cached_sdist(tmp_path) -> tuple[Path, Path]:
    """(cache dir, archive): demo-1.0's sdist already in the source cache, as a carried or earlier download."""
    cache = tmp_path / "cache"
    downloads = cache / "sources" / "sdist"
    downloads.mkdir(parents=True)
    project = tmp_path / "demo-1.0"
    project.mkdir()
    (project / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    with tarfile.open(downloads / "demo-1.0.tar.gz", "w:gz") as archive:
        archive.add(project, arcname="demo-1.0")
    return cache, downloads / "demo-1.0.tar.gz"


def test_sdist_digest_mismatch_is_refused(cached_sdist):
    cache, _ = cached_sdist
    with pytest.raises(WheelhouseError, match=r"sha256 [0-9a-f]{64} does not match source.sha256 0{64}"):
        sources.fetch_sdist("demo", "1.0", cache, python="python3", expected_sha256="0" * 64)


def test_sdist_is_unpacked_from_the_cache_without_downloading(cached_sdist):
    cache, archive = cached_sdist
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    checkout = sources.fetch_sdist("demo", "1.0", cache, python="/nonexistent/python", expected_sha256=digest)
    assert (checkout.path / "setup.py").is_file() and checkout.revision == digest


@pytest.mark.parametrize(("member", "mode", "reason"), [
    ("demo-1.0/../../escaped.py", 0o100644, "contains a '..' path component"),
    ("/tmp/escaped.py", 0o100644, "has an absolute path"),
    ("demo-1.0/link", 0o120777, "is a symbolic link"),
])
def test_sdist_zip_with_an_unsafe_member_is_refused_before_extracting(tmp_path, member, mode, reason):
    cache = tmp_path / "cache"
    downloads = cache / "sources" / "sdist"
    downloads.mkdir(parents=True)
    archive = downloads / "demo-1.0.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("demo-1.0/setup.py", "from setuptools import setup\nsetup()\n")
        info = zipfile.ZipInfo("placeholder")
        info.filename, info.external_attr = member, mode << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(WheelhouseError) as refused:
        sources.fetch_sdist("demo", "1.0", cache, python="/nonexistent/python")
    assert str(refused.value) == f"demo-1.0.zip: member {member!r} {reason}; refusing the archive (nothing extracted)"
    assert not (cache / "sources" / "unpacked").exists() or not any((cache / "sources" / "unpacked").rglob("*.py"))


# A URL or ref that git would read as an option must stay a URL or ref: `--upload-pack=<command>` runs the command.
def test_ls_remote_never_reads_the_url_as_an_option(tmp_path):
    marker = tmp_path / "PWNED"
    assert sources.resolve_ref(f"--upload-pack=touch {marker};true", "main") is None
    assert not marker.exists()


def test_fetch_never_reads_the_ref_as_an_option(upstream, tmp_path):
    marker = tmp_path / "PWNED"
    with pytest.raises(WheelhouseError):
        sources.fetch_git(upstream.as_uri(), f"--upload-pack=touch {marker};true", tmp_path / "cache", submodules=False)
    assert not marker.exists()


def test_pip_download_never_reads_the_name_as_an_option(tmp_path):
    # as an option, `--log=<path>==1.0` makes pip write its log to that path; as a requirement it is refused
    with pytest.raises(WheelhouseError, match="could not be downloaded"):
        sources.fetch_sdist(f"--log={tmp_path}/log", "1.0", tmp_path / "cache", python=sys.executable)
    assert not list(tmp_path.glob("log*"))


def _repo_with_two_submodules(tmp_path: Path) -> Path:
    """``app`` with submodules ``third_party/needed`` and ``third_party/unneeded`` (local bare-free repos)."""
    for name in ("needed", "unneeded"):
        sub = tmp_path / name
        sub.mkdir()
        _git("init", "-q", "-b", "main", cwd=sub)
        (sub / "header.h").write_text(f"// {name}\n")
        _git("add", ".", cwd=sub)
        _git("commit", "-qm", name, cwd=sub)
    app = tmp_path / "app"
    app.mkdir()
    _git("init", "-q", "-b", "main", cwd=app)
    (app / "setup.py").write_text("app\n")
    for name in ("needed", "unneeded"):
        _git("-c", "protocol.file.allow=always", "submodule", "add", "-q", (tmp_path / name).as_uri(),
             f"third_party/{name}", cwd=app)
    _git("commit", "-qam", "app with two submodules", cwd=app)
    return app


def _allow_file_submodules(tmp_path: Path, monkeypatch) -> None:
    """The user's git configuration reaches the fetch (a site's mirrors live there); file:// submodules need it."""
    config = tmp_path / "gitconfig"
    config.write_text("[protocol \"file\"]\n\tallow = always\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))


def test_only_the_named_submodules_are_fetched(tmp_path, monkeypatch):
    """`submodules: [path]` checks out that submodule only; a cached checkout that had all loses the others."""
    _allow_file_submodules(tmp_path, monkeypatch)
    app = _repo_with_two_submodules(tmp_path)
    cache = tmp_path / "cache"

    everything = sources.fetch_git(app.as_uri(), "main", cache, submodules=True)
    assert (everything.path / "third_party/unneeded/header.h").is_file()
    assert everything.submodules is None and "submodules" not in everything.describe()

    only = sources.fetch_git(app.as_uri(), "main", cache, submodules=("third_party/needed",), component="app")
    assert only.path == everything.path  # the same cached clone, made exact for this selection
    assert (only.path / "third_party/needed/header.h").read_text() == "// needed\n"
    assert not any((only.path / "third_party/unneeded").iterdir())
    assert only.describe()["submodules"] == ["third_party/needed"]
    assert only.revision == everything.revision


def test_a_named_submodule_that_does_not_exist_is_one_line(tmp_path, monkeypatch):
    _allow_file_submodules(tmp_path, monkeypatch)
    app = _repo_with_two_submodules(tmp_path)
    with pytest.raises(WheelhouseError) as raised:
        sources.fetch_git(app.as_uri(), "main", tmp_path / "cache", submodules=("third_party/neded",), component="app")
    assert str(raised.value) == (
        f"components.app.source.submodules: third_party/neded is not a submodule of {app.as_uri()} at main; "
        "its submodules are: third_party/needed, third_party/unneeded"
    )


def test_git_fetch_output_is_streamed_and_its_last_line_is_the_error(upstream, tmp_path, caplog):
    """A fetch says what it fetches and shows git's own lines as they come (not captured until the end)."""
    caplog.set_level(logging.INFO, logger="wheelhouse")
    sources.fetch_git(upstream.as_uri(), "main", tmp_path / "cache", submodules=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "wheelhouse.sources"]
    assert lines[0] == f"fetching {upstream.as_uri()} main"
    assert any(line.startswith("   * branch") and "main" in line and "FETCH_HEAD" in line for line in lines), lines
    caplog.clear()
    with pytest.raises(WheelhouseError, match="not found in"):
        sources.fetch_git(upstream.as_uri(), "v9", tmp_path / "cache", submodules=False)
    assert any("couldn't find remote ref v9" in r.getMessage() for r in caplog.records), caplog.messages


def test_a_failed_sdist_download_names_pips_last_line(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="wheelhouse")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(WheelhouseError) as info:
        sources.fetch_sdist("wheelhouse-no-such-project", "1.0", tmp_path / "cache", python=sys.executable)
    streamed = [r.getMessage().strip() for r in caplog.records if r.name == "wheelhouse.sources"]
    assert streamed[0] == "downloading the sdist wheelhouse-no-such-project==1.0"
    assert streamed[-1].startswith("ERROR: No matching distribution found for wheelhouse-no-such-project==1.0")
    assert str(info.value).startswith(f"sdist wheelhouse-no-such-project==1.0 could not be downloaded: {streamed[-1]}")


def test_git_hands_no_credential_to_the_host_versions_yaml_names(tmp_path, monkeypatch):
    """A credential helper that answers with $GITHUB_TOKEN (as CI setups install), a GIT_CONFIG_* extra header
    and the token itself in the caller's environment: the host named in versions.yaml gets none of them, from
    the plan's ls-remote or the build's fetch."""
    import http.server
    import threading

    seen: list[str] = []

    class Unauthorized(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(f"{self.headers.get('Authorization')} {self.headers.get('X-Extra')}")
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="x"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        '[credential]\n\thelper = "!f() { echo username=x-access-token; echo password=$GITHUB_TOKEN; }; f"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_SECRET_FOR_THE_UPSTREAM")
    for name, value in {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                        "GIT_CONFIG_VALUE_0": "X-Extra: git_SECRET"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sources, "FETCH_ATTEMPTS", 1)  # one refused fetch is enough
    url = f"http://127.0.0.1:{server.server_address[1]}/evil/repo.git"
    try:
        assert sources.resolve_ref(url, "main") is None
        with pytest.raises(WheelhouseError):
            sources.fetch_git(url, "main", tmp_path / "cache", submodules=False)
    finally:
        server.shutdown()
    assert seen, "git never reached the server"
    assert seen == ["None None"] * len(seen)  # no Authorization, no extra header, on every request


def _processes_naming(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # ended while we looked
            continue
        if any(text.encode() in arg for arg in args):
            found.append(b" ".join(args).decode(errors="replace"))
    return found


def test_ls_remote_that_never_answers_ends_in_one_line_and_leaves_no_helper(monkeypatch):
    """A host that accepts the connection and never replies: git waits minutes; the plan must not."""
    import socket
    import time

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nothing ever answers
        url = f"https://127.0.0.1:{silent.getsockname()[1]}/never/answers.git"
        started = time.monotonic()
        with pytest.raises(WheelhouseError) as info:
            sources.resolve_ref(url, "main", timeout=1)
        assert time.monotonic() - started < 10
    assert str(info.value) == (f"git ls-remote {url} main did not answer within 1 s; check the URL and the network, "
                               "then re-run")
    deadline = time.monotonic() + 5  # a killed process is gone once the kernel has torn it down
    while _processes_naming(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_naming(url) == []  # git-remote-https, which git started, was stopped with it
