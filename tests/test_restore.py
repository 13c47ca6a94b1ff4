"""restore-wheels: workflow artifacts back into releases, against the GitHub test server (45 artifacts
in two runs: pagination, expiry, digest mismatch, unsafe zip members, newest-run-wins, clobber) and
against the local store; plus the artifact endpoints' fidelity to GitHub's OpenAPI description."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.base.errors import ConfigError, WheelhouseError
from ci.checks.contents import FLASHINFER_HEADERS
from ci.flows import plan as skip_plan
from ci.maintenance import restore
from ci.model import manifest, matrix, naming
from ci.store.artifacts import GitHubArtifacts, LocalArtifacts
from ci.store.github import GitHubStore
from ci.store.local import LocalStore
from tests.github_server import GitHubTestServer
from tests.github_server.pytest_plugin import github_server as server  # noqa: F401 (fixture)
from tests.github_server.schemas import DATA, errors

VERSIONS = """
build_matrix:
  - {arch: x86_64, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: x86_64, cuda: "13.0.2", python: "3.12", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: "13.0.2", python: "3.12", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: x86_64, cuda: "12.8.1", python: "3.11", torch: "2.12.0", cxx11_abi: "TRUE"}
  - {arch: x86_64, cuda: "12.8.1", python: "3.12", torch: "2.12.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: "12.8.1", python: "3.11", torch: "2.12.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: "12.8.1", python: "3.12", torch: "2.12.0", cxx11_abi: "TRUE"}
components:
  flash-attention:
    source: {git: "https://github.com/Dao-AILab/flash-attention.git"}
    ref: v2.8.3
    builder: flash_attention
    wheel_packages: [flash-attn]
    runs_on: ubuntu-24.04
  apex:
    source: {git: "https://github.com/NVIDIA/apex.git"}
    ref: master
    builder: apex
    wheel_packages: [apex]
    runs_on: ubuntu-24.04
  flashinfer:
    source: {git: "https://github.com/flashinfer-ai/flashinfer.git"}
    ref: v0.6.13
    builder: flashinfer
    wheel_packages: [flashinfer-python]
    runs_on: ubuntu-24.04
    python_versions: ["3.12"]
  deep-gemm:
    source: {git: "https://github.com/deepseek-ai/DeepGEMM.git"}
    ref: 8b1392b978f5a03c828dd1711090d7fb50958b8a
    builder: deep_gemm
    wheel_packages: [deep-gemm]
    runs_on: ubuntu-24.04
    arches: [x86_64]
    bundle_pythons: true
"""
TORCH = "2.13.0"
OLD, NEW = 101, 202
DIST = {"flash-attention": "flash_attn", "apex": "apex", "flashinfer": "flashinfer_python", "deep-gemm": "deep_gemm"}


def versions():
    return restore.versions_from_text(VERSIONS, ref="abc1234")


def wheel_file(row: matrix.MatrixRow) -> str:
    if row.bundle_pythons:
        return f"{DIST[row.component]}-1.0-py3-none-linux_{row.arch}.whl"
    py = row.python.replace(".", "")
    return f"{DIST[row.component]}-1.0-cp{py}-cp{py}-linux_{row.arch}.whl"


def art_name(row: matrix.MatrixRow) -> str:
    return naming.artifact_name(row.component, row.arch, row.cuda, row.python, row.torch)


def make_zip(members: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, "/etc/passwd")
    return buf.getvalue()


def wheel_bytes(row: matrix.MatrixRow, run: int) -> bytes:
    """A valid wheel (restore checks every wheel) that says which run built it; the same bytes every call."""
    return _wheel_bytes(DIST[row.component], wheel_file(row), run)


@functools.cache
def _wheel_bytes(dist: str, filename: str, run: int) -> bytes:
    tags = filename.removeprefix(f"{dist}-1.0-").removesuffix(".whl")
    with tempfile.TemporaryDirectory() as tmp:
        files = {f"{dist}/__init__.py": f"RUN = {run}\n".encode()}
        if dist == "flashinfer_python":  # the wheel checks refuse one without the headers its JIT compiles with
            files.update(dict.fromkeys(FLASHINFER_HEADERS, b""))
        wheel = build_wheel(Path(tmp), files, name=dist, version="1.0", tags=tags)
        return wheel.read_bytes()


def wheel_metadata(row: matrix.MatrixRow, run: int) -> bytes:
    with zipfile.ZipFile(io.BytesIO(wheel_bytes(row, run))) as zf:
        return zf.read(f"{DIST[row.component]}-1.0.dist-info/METADATA")


def artifact_zip(row: matrix.MatrixRow, run: int) -> bytes:
    whl = wheel_file(row)
    return make_zip({whl: wheel_bytes(row, run), f"{whl}.metadata": wheel_metadata(row, run),
                     f"{row.release_tag}-{row.arch}.build.json": b"{}"})


class Scenario:
    """45 artifacts in two runs; see the module docstring."""

    def __init__(self) -> None:
        self.versions = versions()
        rows = matrix.expand(self.versions)
        self.rows = [r for r in rows if r.torch == TORCH]
        self.old_torch = [r for r in rows if r.torch != TORCH]
        assert len(self.rows) == 11 and len(self.old_torch) == 11
        by = {(r.component, r.arch, r.python): r for r in self.rows}
        self.expired = by[("flashinfer", "aarch64", "3.12")]      # only in the newer run, expired
        self.mismatch = by[("apex", "aarch64", "3.11")]           # digest does not match the bytes
        self.escape = by[("flash-attention", "aarch64", "3.12")]  # a ../ member
        self.conflict = by[("flash-attention", "x86_64", "3.11")]  # release holds other bytes already
        self.same = by[("apex", "x86_64", "3.12")]                # release holds these bytes already
        self.dups = [by[("flash-attention", "x86_64", "3.12")], by[("apex", "x86_64", "3.11")],
                     by[("flashinfer", "x86_64", "3.12")], by[("deep-gemm", "x86_64", "3.12")],
                     by[("apex", "aarch64", "3.12")]]
        # (run, name, zip bytes, kwargs)
        self.artifacts: list[tuple[int, str, bytes, dict]] = []
        for r in self.rows:
            if r is self.expired:
                continue
            data = artifact_zip(r, OLD)
            kw: dict = {"created_at": "2025-01-01T00:00:00Z"}
            if r is self.mismatch:
                kw["digest"] = "sha256:" + "0" * 64
            if r is self.escape:
                data = make_zip({wheel_file(r): wheel_bytes(r, OLD), f"../{wheel_file(r)}": b"evil"})
            self.artifacts.append((OLD, art_name(r), data, kw))
        for r in self.old_torch:
            self.artifacts.append((OLD, art_name(r), artifact_zip(r, OLD), {"created_at": "2025-01-01T00:00:00Z"}))
        for i in range(12):
            self.artifacts.append((OLD, f"build-log-{i:02d}", b"log", {}))
        for r in self.dups:
            self.artifacts.append((NEW, art_name(r), artifact_zip(r, NEW), {"created_at": "2025-01-02T00:00:00Z"}))
        self.artifacts.append((NEW, art_name(self.expired), artifact_zip(self.expired, NEW),
                               {"expired": True, "created_at": "2025-01-02T00:00:00Z"}))
        for i in range(6):
            self.artifacts.append((NEW, f"build-log-new-{i:02d}", b"log", {}))
        assert len(self.artifacts) == 45
        assert sum(1 for a in self.artifacts if a[0] == OLD) == 33  # more than GitHub's default page of 30

    def expected_wheels(self) -> dict[str, dict[str, bytes]]:
        """Release tag -> wheel name -> bytes after a restore without --clobber."""
        out: dict[str, dict[str, bytes]] = {}
        for r in self.rows:
            if r in (self.expired, self.mismatch, self.escape):
                continue
            run = NEW if r in self.dups else OLD
            data = b"other bytes" if r is self.conflict else wheel_bytes(r, run)
            out.setdefault(r.release_tag, {})[wheel_file(r)] = data
        return out


def seed_existing(sc: Scenario, put) -> None:
    """The conflicting release (other bytes + a real build manifest) and one holding identical bytes."""
    real = manifest.Manifest(sc.conflict.component, sc.conflict.release_tag, "x86_64", ("3.11",), TORCH, "f" * 64,
                             {}, (manifest.WheelEntry(wheel_file(sc.conflict), hashlib.sha256(b"other bytes")
                                                      .hexdigest(), 11),), True, {})
    put(sc.conflict.release_tag, matrix.release_title(sc.versions, sc.conflict),
        [(wheel_file(sc.conflict), b"other bytes"), (manifest.asset_name("x86_64"), real.to_json().encode())])
    put(sc.same.release_tag, matrix.release_title(sc.versions, sc.same),
        [(wheel_file(sc.same), wheel_bytes(sc.same, OLD))])


def make(gh: GitHubTestServer) -> GitHubStore:
    return GitHubStore("o/r", token=gh.token, api_url=gh.api_url, sleep=lambda s: None, seed=0)


def mutations(gh: GitHubTestServer) -> int:
    return sum(n for k, n in gh.counters.items() if k.split()[0] in ("POST", "PATCH", "DELETE", "PUT"))


def manifests_of(store, tag: str) -> dict[str, manifest.Manifest]:
    rel = store.get_release(tag)
    return {a.name: manifest.parse(store.read_asset(tag, a.name), where=a.name) for a in rel.assets
            if manifest.arch_of(a.name)}


def check_final(sc: Scenario, store, *, clobbered: bool) -> None:
    expected = sc.expected_wheels()
    if clobbered:
        expected[sc.conflict.release_tag][wheel_file(sc.conflict)] = wheel_bytes(sc.conflict, OLD)
    for tag, wheels in expected.items():
        rel = store.get_release(tag)
        assert rel is not None, tag
        for name, data in wheels.items():
            assert rel.asset(name).sha256 == hashlib.sha256(data).hexdigest(), (tag, name)
            assert store.read_asset(tag, name) == data
        found = manifests_of(store, tag)
        for arch in {a for r in sc.rows if r.release_tag == tag for a in [r.arch]}:
            name = manifest.asset_name(arch)
            arch_wheels = {n for n in wheels if n.endswith(f"_{arch}.whl")}
            if not arch_wheels:
                assert name not in found, (tag, arch)
            elif tag == sc.conflict.release_tag and arch == "x86_64" and not clobbered:
                assert not found[name].restored  # the real build manifest was kept
            else:
                m = found[name]
                assert m.restored and not m.checks_passed, (tag, arch)
                assert {w.name for w in m.wheels} == arch_wheels
    assert store.get_release(sc.expired.release_tag).asset(wheel_file(sc.expired)) is None
    assert store.get_release(sc.mismatch.release_tag).asset(wheel_file(sc.mismatch)) is None


# --------------------------------------------------------------------------- GitHub


def test_artifact_endpoints_follow_the_openapi_description(server: GitHubTestServer) -> None:  # noqa: F811
    gh = server
    for i in range(35):
        gh.seed_artifact(7, f"a{i:02d}", make_zip({"x.whl": b"x" * i}), digest=None if i == 3 else True)
    gh.seed_release("v1")

    def get(url: str, auth: bool = True):
        req = urllib.request.Request(url, headers={"Authorization": f"token {gh.token}"} if auth else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()

    status, headers, body = get(f"{gh.api_url}/repos/o/r/actions/runs/7/artifacts")
    page = json.loads(body)
    assert status == 200 and page["total_count"] == 35 and len(page["artifacts"]) == 30  # default per_page
    assert 'rel="next"' in headers["link"] and "per_page=30" in headers["link"]
    assert errors(page["artifacts"], "artifact", array=True) == []
    spec = json.loads((DATA / "openapi-releases-subset.json").read_text())
    op = spec["paths"]["/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts"]["get"]
    from jsonschema import Draft202012Validator

    from tests.github_server.schemas import _nullable
    schema = _nullable(op["responses"]["200"]["content"]["application/json"]["schema"])
    assert list(Draft202012Validator(schema).iter_errors(page)) == []
    assert page["artifacts"][0]["digest"].startswith("sha256:")
    _, _, body = get(f"{gh.api_url}/repos/o/r/actions/runs/7/artifacts?per_page=100")
    assert len(json.loads(body)["artifacts"]) == 35
    _, _, body = get(f"{gh.api_url}/repos/o/r/actions/runs/7/artifacts?per_page=500&name=a03")
    [one] = json.loads(body)["artifacts"]
    assert one["digest"] is None and errors(one, "artifact") == []
    _, _, body = get(one["url"])
    assert json.loads(body) == one
    # download: 302 to a signed URL on the uploads host, which refuses a request that carries the token
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    req = urllib.request.Request(one["archive_download_url"], headers={"Authorization": f"token {gh.token}"})
    with pytest.raises(urllib.error.HTTPError) as redirect:
        urllib.request.build_opener(NoRedirect).open(req, timeout=10)
    assert redirect.value.code == 302
    location = redirect.value.headers["location"]
    assert location.startswith(gh.uploads_url)
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(location)
    assert refused.value.code == 400
    status, _, data = get(location, auth=False)
    assert status == 200 and zipfile.ZipFile(io.BytesIO(data)).namelist() == ["x.whl"]
    _, _, refs = get(f"{gh.api_url}/repos/o/r/git/matching-refs/tags")
    assert errors(json.loads(refs), "git-ref", array=True) == [] and json.loads(refs)[0]["ref"] == "refs/tags/v1"


def test_artifact_download_redirect_and_direct(server: GitHubTestServer, tmp_path: Path) -> None:  # noqa: F811
    gh = server
    data = make_zip({"w.whl": b"w" * 5000})
    gh.seed_artifact(9, "art", data)
    gh.seed_artifact(9, "old", data, expired=True)
    with make(gh) as store:
        source = GitHubArtifacts(store.api, per_page=1)
        arts = {a.name: a for a in source.list_artifacts("9")}
        assert gh.counters["GET /repos/{owner}/{repo}/actions/runs/{run_id}/artifacts"] == 2  # Link followed
        digest = source.download(arts["art"], tmp_path / "a.zip")
        assert digest == hashlib.sha256(data).hexdigest() == arts["art"].sha256
        assert gh.counters["GET /_artifacts/{artifact_id}"] == 1  # fetched from the other host, without the token
        gh.state.artifact_redirect = False
        assert source.download(arts["art"], tmp_path / "b.zip") == digest
        with pytest.raises(WheelhouseError, match="expired"):
            source.download(arts["old"], tmp_path / "c.zip")
        with pytest.raises(WheelhouseError, match="a workflow run id is a number"):
            source.list_artifacts("main")


def test_restore_45_artifacts_two_runs(server: GitHubTestServer) -> None:  # noqa: F811
    gh = server
    sc = Scenario()
    for run, name, data, kw in sc.artifacts:
        gh.seed_artifact(run, name, data, **kw)

    def put(tag, title, assets):
        gh.seed_release(tag, name=title, assets=assets)

    seed_existing(sc, put)
    with make(gh) as store:
        source = GitHubArtifacts(store.api)
        gh.reset_counters()
        listings = restore.collect(source, [str(OLD), str(NEW)])
        assert gh.counters["GET /repos/{owner}/{repo}/actions/runs/{run_id}/artifacts"] == 2  # per_page=100
        assert {r: len(a) for r, a in listings.items()} == {"101": 33, "202": 12}
        p = restore.plan(sc.versions, listings, torch=TORCH, versions_ref="abc1234", releases=store.list_releases(),
                         source=source.description, store=store.description)
        text = p.render()
        assert f"skip: {art_name(sc.expired)} (run 202): expired" in text
        assert sum("not a wheel artifact" in s for s in p.skipped) == 18
        assert sum("torch 2.12.0, not 2.13.0" in s for s in p.skipped) == 11
        assert len(p.warnings) == 5 and all("using run 202 (newest), ignoring run 101" in w for w in p.warnings)
        assert {r.tag for r in p.releases} == {r.release_tag for r in sc.rows if r is not sc.expired}
        assert sum(len(r.items) for r in p.releases) == 10
        dg = next(r for r in p.releases if r.component == "deep-gemm")
        assert dg.tag == "deep-gemm-8b1392b978f5a03c828dd1711090d7fb50958b8a-cu130-py3.11-3.12-torch2.13.0"
        assert dg.items[0].artifact.run_id == "202"
        assert mutations(gh) == 0

        result = restore.apply(p, store, source)
        refused = " | ".join(result.refused)
        assert len(result.refused) == 3, result.refused
        assert f"artifact {art_name(sc.mismatch)}" in refused and "does not match its digest" in refused
        assert f"artifact {art_name(sc.escape)}" in refused and "'../" in refused
        assert f"asset {wheel_file(sc.conflict)} exists with other bytes" in refused and "--clobber" in refused
        assert f"{sc.same.release_tag}/{wheel_file(sc.same)}" in result.unchanged
        assert store.get_release(sc.conflict.release_tag).asset(f"{wheel_file(sc.conflict)}.metadata") is None
        check_final(sc, store, clobbered=False)

        gh.reset_counters()
        again = restore.apply(p, store, source)
        assert mutations(gh) == 0 and again.uploaded == () and again.manifests == ()

        clobber = restore.plan(sc.versions, listings, torch=TORCH, versions_ref="abc1234", clobber=True)
        done = restore.apply(clobber, store, source)
        replaced = f"{sc.conflict.release_tag}/{wheel_file(sc.conflict)}"
        assert done.uploaded == (replaced, f"{replaced}.metadata")
        assert done.manifests == (f"{sc.conflict.release_tag}/{manifest.asset_name('x86_64')}",)
        check_final(sc, store, clobbered=True)
        assert not any(a.name.count(".clobber-") for r in store.list_releases() for a in r.assets)
        gh.reset_counters()
        restore.apply(clobber, store, source)
        assert mutations(gh) == 0

        # the skip plan never takes a restored release for a finished build
        rows = [r for r in sc.rows if r.release_tag == sc.conflict.release_tag]
        decided = skip_plan.decide(sc.versions, rows, store, resolve=lambda row: "0" * 40)
        assert all(d.build and "restored" in d.reason for d in decided.decisions)


def test_nothing_to_restore_and_bad_versions_ref(tmp_path: Path) -> None:
    empty = restore.plan(versions(), {"1": []}, torch="9.9", versions_ref="x")
    assert empty.releases == () and "0 artifact(s) into 0 release(s)" in empty.render()
    with pytest.raises(WheelhouseError, match=r"no unexpired wheel artifacts for torch 9.9 in run\(s\) 1"):
        restore.apply(empty, LocalStore(tmp_path / "s"), LocalArtifacts(tmp_path))
    with pytest.raises(WheelhouseError) as bad:
        restore.versions_text_at("no-such-ref-anywhere")
    assert "\n" not in str(bad.value) and "git fetch origin no-such-ref-anywhere" in str(bad.value)
    assert "build_matrix" in restore.versions_text_at("HEAD")
    with pytest.raises(ConfigError, match=r"versions\.yaml at abc: "):
        restore.versions_from_text("components: {}\n", ref="abc")


# --------------------------------------------------------------------------- local store


def test_restore_into_the_local_store(tmp_path: Path) -> None:
    sc = Scenario()
    root = tmp_path / "artifacts"
    for run, name, data, kw in sc.artifacts:
        if kw.get("expired"):
            continue  # local artifacts never expire
        folder = root / str(run)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.zip"
        path.write_bytes(data)
        digest = kw.get("digest") or f"sha256:{hashlib.sha256(data).hexdigest()}"
        (folder / f"{name}.zip.sha256").write_text(f"{digest.split(':')[1]}  {path.name}\n")
    (root / str(NEW) / f"{art_name(sc.dups[0])}.zip.sha256").unlink()  # no digest: restored only when accepted
    apex12 = next(r for r in sc.old_torch if (r.component, r.arch, r.python) == ("apex", "x86_64", "3.12"))
    sym = root / str(OLD) / f"{art_name(apex12)}.zip"
    sym.write_bytes(make_zip({"ok.whl": b"1"}, symlink="link.whl"))
    sym.with_name(sym.name + ".sha256").unlink()

    store = LocalStore(tmp_path / "store")

    def put(tag, title, assets):
        store.ensure_release(tag, title, "")
        for name, data in assets:
            f = tmp_path / name
            f.write_bytes(data)
            store.upload_asset(tag, f, name=name)

    seed_existing(sc, put)
    source = LocalArtifacts(root)
    listings = restore.collect(source, [str(OLD), str(NEW)])
    strict = restore.plan(sc.versions, listings, torch=TORCH, versions_ref="abc1234", releases=store.list_releases())
    refused = [r for r in restore.apply(strict, LocalStore(tmp_path / "strict"), source).refused
               if art_name(sc.dups[0]) in r]
    assert len(refused) == 1 and "has no digest" in refused[0] and "pass --accept-undigested" in refused[0], refused
    p = restore.plan(sc.versions, listings, torch=TORCH, versions_ref="abc1234", releases=store.list_releases(),
                     accept_undigested=True)
    result = restore.apply(p, store, source)
    assert len(result.refused) == 3
    assert any(f"{art_name(sc.dups[0])}" in w and "no digest" in w for w in result.warnings)
    check_final(sc, store, clobbered=False)
    snapshot = {f: f.stat().st_mtime_ns for f in (tmp_path / "store").rglob("*") if f.is_file()}
    restore.apply(p, store, source)
    assert snapshot == {f: f.stat().st_mtime_ns for f in (tmp_path / "store").rglob("*") if f.is_file()}

    # torch 2.12.0: the symlink member refuses its artifact
    p12 = restore.plan(sc.versions, listings, torch="2.12.0", versions_ref="abc1234", accept_undigested=True)
    r12 = restore.apply(p12, store, source)
    assert any("is a symbolic link" in r for r in r12.refused)


def test_extract_refuses_escaping_members(tmp_path: Path) -> None:
    for members, symlink, reason in [
        ({"../x.whl": b"1"}, None, "'..' path component"),
        ({"/abs/x.whl": b"1"}, None, "absolute path"),
        ({"a\\..\\..\\x.whl": b"1"}, None, "'..' path component"),
        ({"x.whl": b"1"}, "y.whl", "symbolic link"),
    ]:
        z = tmp_path / "a.zip"
        z.write_bytes(make_zip(members, symlink=symlink))
        with pytest.raises(restore.ArtifactRefused, match=reason):
            restore.extract_wheels(z, tmp_path / "out", what="artifact a")
        assert not (tmp_path / "x.whl").exists() and not (tmp_path / "out").exists()


def restore_local(sc: Scenario, tmp_path: Path, artifacts: list[tuple[matrix.MatrixRow, bytes]]):
    """(the local store, the result) of restoring these artifacts of run OLD (each with its digest)."""
    root = tmp_path / "artifacts" / str(OLD)
    root.mkdir(parents=True)
    for row, data in artifacts:
        (root / f"{art_name(row)}.zip").write_bytes(data)
        (root / f"{art_name(row)}.zip.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  x\n")
    store = LocalStore(tmp_path / "store")
    source = LocalArtifacts(tmp_path / "artifacts")
    p = restore.plan(sc.versions, restore.collect(source, [str(OLD)]), torch=TORCH, versions_ref="abc1234")
    return store, restore.apply(p, store, source)


def test_restored_wheels_pass_the_wheel_checks_first(tmp_path: Path) -> None:
    """A wheel check-wheel refuses (a '../' member, no RECORD) or a .metadata unlike its wheel is never uploaded."""
    sc = Scenario()
    rows = [r for r in sc.rows if r.component == "apex" and r.arch == "x86_64"]
    good = wheel_bytes(rows[0], OLD)
    with zipfile.ZipFile(io.BytesIO(good)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    traversal = make_zip({**members, "../../../../escaped.txt": b"x"})
    no_record = make_zip({n: d for n, d in members.items() if not n.endswith("RECORD")})
    cases = [
        (rows[0], make_zip({wheel_file(rows[0]): traversal}), "contains a '..' path component"),
        (rows[1], make_zip({wheel_file(rows[1]): no_record}), "has no apex-1.0.dist-info/RECORD"),
    ]
    other = next(r for r in sc.rows if r.component == "flash-attention" and r.arch == "x86_64")
    forged = make_zip({wheel_file(other): wheel_bytes(other, OLD), f"{wheel_file(other)}.metadata": b"Name: forged\n"})
    store, result = restore_local(sc, tmp_path, [(row, data) for row, data, _ in cases] + [(other, forged)])
    assert result.uploaded == () and len(result.refused) == 6, result.refused  # 3 artifacts, 3 empty releases
    refused = " | ".join(result.refused)
    for row, _, reason in cases:
        assert f"artifact {art_name(row)}" in refused and f"fails the wheel checks: {wheel_file(row)}: " in refused
        assert reason in refused
    assert f"{wheel_file(other)}.metadata differs from the METADATA inside {wheel_file(other)}; refused" in refused
    assert store.list_releases() == []


def test_restore_refuses_a_wheel_of_a_project_the_component_does_not_publish(tmp_path: Path) -> None:
    """wheel_packages decides what an artifact may put on a release: torch inside apex's artifact refuses it."""
    sc = Scenario()
    apex, flash = (next(r for r in sc.rows if (r.component, r.arch, r.python) == (c, "x86_64", "3.11"))
                   for c in ("apex", "flash-attention"))
    with tempfile.TemporaryDirectory() as tmp:
        torch = build_wheel(Path(tmp), {"torch/__init__.py": b"print('hijacked')\n"}, name="torch", version="99.0",
                            tags="cp311-cp311-linux_x86_64")
        hijack = make_zip({wheel_file(apex): wheel_bytes(apex, OLD), torch.name: torch.read_bytes()})
    plain = make_zip({wheel_file(flash): wheel_bytes(flash, OLD)})  # a wheel without its .metadata
    store, result = restore_local(sc, tmp_path, [(apex, hijack), (flash, plain)])
    assert result.refused[0] == (
        f"artifact {art_name(apex)} (run {OLD}, id {OLD}/{art_name(apex)}): torch-99.0-cp311-cp311-linux_x86_64.whl: "
        "project 'torch' is not one component apex publishes (apex: components.apex.wheel_packages in versions.yaml, "
        "or the component's own name when it lists none); a component publishes only its own wheels: fix its "
        "build, or list the project in its wheel_packages; refused")
    assert store.get_release(apex.release_tag) is None
    # the other artifact is restored, and its wheel gets the .metadata made from its own METADATA
    assert result.uploaded == (f"{flash.release_tag}/{wheel_file(flash)}",
                               f"{flash.release_tag}/{wheel_file(flash)}.metadata")
    assert store.read_asset(flash.release_tag, f"{wheel_file(flash)}.metadata") == wheel_metadata(flash, OLD)
