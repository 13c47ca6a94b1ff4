"""Values from the command line or another commit that git would read as options stay arguments."""

from __future__ import annotations

import pytest

from ci.base.errors import WheelhouseError
from ci.maintenance import restore
from ci.publish.pages import GitBranchTarget


def test_versions_ref_is_never_an_option_of_git_show(tmp_path):
    marker = tmp_path / "written"
    with pytest.raises(WheelhouseError, match="--versions-ref"):
        restore.versions_text_at(f"--output={marker}")
    assert not marker.exists()


def test_push_remote_is_never_an_option_of_git(tmp_path):
    marker = tmp_path / "PWNED"
    target = GitBranchTarget(f"--upload-pack=touch {marker};true", "gh-pages")
    with target, pytest.raises(WheelhouseError):
        target.worktree()
    assert not marker.exists()


# --- inputs that used to end in a traceback: one line, a non-zero exit --------------------------------

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

from wheel_factory import build_wheel  # noqa: E402

from ci.base.digest import sha256_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
RECORD_NAME = "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0-x86_64.build.json"


def invoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS), **(env or {})}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          env=environ, timeout=120)


def one_line(result: subprocess.CompletedProcess, code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_metadata_with_a_non_ascii_name(tmp_path):
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b""})
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["demo_pkg-1.0.dist-info/METADATA"] = "Metadata-Version: 2.1\nName: démo_pkg\nVersion: 1.0\n".encode()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    result = invoke("check-wheel", "--wheel", str(wheel))
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert f"  - {wheel.name}: METADATA Name 'démo_pkg' does not match the filename; rebuild the wheel" in result.stdout


def test_metadata_with_two_names(tmp_path):
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b""})
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["demo_pkg-1.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: demo_pkg\nName: other\nVersion: 1.0\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    result = invoke("check-wheel", "--wheel", str(wheel))
    assert f"  - {wheel.name}: METADATA has 2 Name: headers; rebuild the wheel with one" in result.stdout


def test_strip_with_a_record_that_is_not_utf8(tmp_path):
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b""}, version="1.0+cu130")
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["demo_pkg-1.0+cu130.dist-info/RECORD"] = b"\xff\xfe not utf-8"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    line = one_line(invoke("fix-wheel", "--wheel", str(wheel), "--strip-local-version", "--out", str(tmp_path / "o")), 1)
    assert line == f"error: {wheel.name}: RECORD is not UTF-8; rebuild the wheel"


def _fixture_record(**changes) -> str:
    """A whole build record of the fixture row (no wheels), with ``changes`` to its top-level fields."""
    from build_records import record_of

    from ci.model import matrix
    from ci.model.versions import load

    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    return json.dumps({**json.loads(record_of(row, []).to_json()), **changes})


@pytest.mark.parametrize("content,problem", [
    ('{"row": ', "not a readable build record (Expecting value: line 1 column 9 (char 8))"),
    ("{}", "build record $.schema is missing"),
    ("[]", "holds a JSON list, not a build record"),
    # the problem nearest the top first: a row of one mistyped field lacks the others
    (_fixture_record(row={"component": 1}), "build record $.row.ref is missing"),
    (_fixture_record(schema=0), "build record schema 0, but this checkout reads schema 2"),
    # deeper than json.loads can recurse: RecursionError, a traceback, before the depth limit (adversarial R9)
    ("[" * 100_000 + "]" * 100_000, "not a readable build record (nested more than 64 levels (far deeper than "
                                    "Python's JSON reader goes))"),
    ('{"a":' * 65 + "1" + "}" * 65, "not a readable build record (nested more than 64 levels; no document of this "
                                   "tool is)"),
])
def test_release_with_a_malformed_build_record(tmp_path, content, problem):
    record = tmp_path / "dist" / "cpu" / "torch2.13" / RECORD_NAME
    record.parent.mkdir(parents=True)
    record.write_text(content)
    line = one_line(invoke("release", "--component", "wheelhouse-fixture", "--arch", "x86_64", "--dist",
                           str(tmp_path / "dist"), "--store", str(tmp_path / "store")), 2)
    assert line == f"error: {record}: {problem}; rebuild the row (nox -s build-wheelhouse-fixture-3.11)"
    assert not (tmp_path / "store").exists()


def test_release_refuses_a_record_naming_a_path(tmp_path):
    record = tmp_path / "dist" / "cpu" / "torch2.13" / RECORD_NAME
    record.parent.mkdir(parents=True)
    record.write_text(_fixture_record(wheels=[{"name": "../../x.whl", "sha256": "0" * 64, "size": 1}]))
    line = one_line(invoke("release", "--component", "wheelhouse-fixture", "--arch", "x86_64", "--dist",
                           str(tmp_path / "dist"), "--store", str(tmp_path / "store")), 2)
    assert line == (f"error: {record}: build record $.wheels[0].name is '../../x.whl', not a wheel file name; "
                    "rebuild the row (nox -s build-wheelhouse-fixture-3.11)")


def test_plan_markdown_into_a_missing_folder_fails_before_planning(tmp_path):
    line = one_line(invoke("plan", "--markdown", str(tmp_path / "nope" / "plan.md"), "--store", str(tmp_path / "s")), 2)
    assert line == (f"error: --markdown {tmp_path / 'nope' / 'plan.md'} is in {tmp_path / 'nope'}, which is not a "
                    "directory; name a file in an existing directory")


@pytest.mark.parametrize("where", ["missing-folder", "directory"])
def test_github_output_that_cannot_be_written(tmp_path, where):
    target = tmp_path / "nope" / "out" if where == "missing-folder" else tmp_path
    line = one_line(invoke("matrix", "--github-output", env={"GITHUB_OUTPUT": str(target)}), 2)
    assert line.startswith(f"error: $GITHUB_OUTPUT {target} ")


@pytest.mark.parametrize("args,expected", [
    (("prune", "--older-than", "3months"), "error: --older-than '3months': give a number and a unit, e.g. 90d, 12h or 2w"),
    (("prune", "--keep-worlds", "banana"), "error: --keep-worlds: 'banana' is not a world;"),
    (("publish-index", "--default-world", "banana"), "error: default world 'banana' is not a world path"),
    (("publish-index", "--base-url", "javascript:x"), "error: base URL 'javascript:x' is not an http(s)://"),
])
def test_usage_errors_exit_2(tmp_path, args, expected):
    store = tmp_path / "store"
    (store / "releases").mkdir(parents=True)
    line = one_line(invoke(*args, "--store", str(store), *(["--out", str(tmp_path / "site")]
                                                           if args[0] == "publish-index" else [])), 2)
    assert line.startswith(expected), line


# --- smaller messages ----------------------------------------------------------------------------


def _fake_build(dist: Path, seed: str) -> Path:
    """What a build of the fixture row leaves in dist/ (wheel, .metadata, build record), without compiling."""
    from build_records import write_record

    from ci.formats.metadata import extract_metadata
    from ci.model import matrix
    from ci.model.versions import load

    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    out = dist / row.world
    wheel = build_wheel(out, {"wheelhouse_fixture/__init__.py": f"SEED = {seed!r}\n".encode()},
                        name="wheelhouse_fixture", version=row.ref, tags="py3-none-linux_x86_64")
    extract_metadata(wheel, out)
    write_record(dist, row, [wheel])
    return wheel


def _release_lines(result: subprocess.CompletedProcess) -> list[str]:
    """The release's step lines: one per asset, saying what its upload does (new, identical, replaced)."""
    found = (re.match(r"^--- release: upload (\S+) to \S+ \(\d+ bytes\): (.+\))$", line)
             for line in result.stderr.splitlines())
    return [f"{match[1]}: {match[2]}" for match in found if match]


def test_a_release_that_would_change_published_bytes_is_refused_unless_replace_names_both_digests(tmp_path):
    """A re-release replaced a published wheel with other bytes and logged the same line as for a new one
    (issue 42, item 4). Now the log says new / identical / replaced per asset, and other bytes behind a published
    wheel's URL need --replace: the refusal names both sha256 and uploads nothing."""
    store = tmp_path / "store"
    one = _fake_build(tmp_path / "one", "one")
    two = _fake_build(tmp_path / "two", "two")  # same file name, other bytes
    a, b = sha256_file(one), sha256_file(two)
    args = ("release", "--component", "wheelhouse-fixture", "--arch", "x86_64", "--store", str(store))
    tag = "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0"
    first = invoke(*args, "--dist", str(tmp_path / "one"))
    assert first.returncode == 0, first.stderr
    assert [line.split(": ")[1].split(" ")[0] for line in _release_lines(first)] == ["new"] * 4, first.stderr
    assert f"{one.name}: new (sha256 {a})" in _release_lines(first)
    again = invoke(*args, "--dist", str(tmp_path / "one"))
    assert again.returncode == 0 and f"{one.name}: identical (sha256 {a})" in _release_lines(again), again.stderr

    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    line = one_line(invoke(*args, "--dist", str(tmp_path / "two")), 1)
    assert line == (f"error: release {tag}: {one.name} is published with sha256 {a}, this build's is {b}: its URL "
                    "would serve other bytes; pass --replace to replace it, or bump the version")
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before  # nothing uploaded

    replaced = invoke(*args, "--dist", str(tmp_path / "two"), "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert f"{one.name}: replaced (sha256 {a} -> {b})" in _release_lines(replaced)
    assert (store / "releases" / tag / "assets" / one.name).read_bytes() == two.read_bytes()


def test_check_wheel_on_a_directory_or_an_empty_glob_is_a_usage_error(tmp_path):
    line = one_line(invoke("check-wheel", "--wheel", str(tmp_path)), 2)
    assert line == f"error: --wheel {tmp_path} is a directory; name wheel files, or a glob such as '{tmp_path}/*.whl'"
    line = one_line(invoke("check-wheel", "--wheel", f"{tmp_path}/*.whl"), 2)
    assert line == f"error: --wheel '{tmp_path}/*.whl' matches no file; check the glob (e.g. 'dist/cu130/torch2.13/*.whl')"


@pytest.mark.parametrize("args", [("check-wheel",), ("fix-wheel", "--strip-local-version")], ids=lambda a: a[0])
def test_a_wheel_task_without_a_wheel_is_a_usage_error(args):
    line = one_line(invoke(*args), 2)
    assert line == ("error: name at least one --wheel FILE (repeat it; quote a glob: "
                    "--wheel 'dist/cu130/torch2.13/*.whl')")


def test_release_without_a_component_is_a_usage_error():
    line = one_line(invoke("release"), 2)
    assert line == "error: release: name --component C (invoke matrix lists the components)"


def test_check_wheel_takes_paths_with_spaces_and_several_wheels(tmp_path):
    wheel = build_wheel(tmp_path / "with space", {"demo_pkg/__init__.py": b""})
    other = build_wheel(tmp_path / "other dir", {"other_pkg/__init__.py": b""}, name="other_pkg")
    result = invoke("check-wheel", "--wheel", str(wheel), "--wheel", str(other))
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = [line for line in result.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    assert [v.split()[:2] for v in verdicts] == [["PASS", wheel.name], ["PASS", other.name]], result.stdout


def test_check_wheel_never_prints_escape_sequences(tmp_path):
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b""})
    hostile = wheel.with_name(wheel.name.replace(".whl", "\x1b[2J.whl"))
    wheel.rename(hostile)
    result = invoke("check-wheel", "--wheel", str(hostile))
    assert "\x1b" not in result.stdout and "\\x1b[2J" in result.stdout


def test_check_wheel_into_a_closed_pipe_ends_quietly(tmp_path):
    wheel = build_wheel(tmp_path / "w", {"demo_pkg/__init__.py": b""})
    for i in range(400):  # more report than a pipe buffer holds
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / wheel.name).write_bytes(wheel.read_bytes())
    environ = {**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS), "SPEC": f"{tmp_path}/d*/*.whl"}
    # read by a reader that leaves after one line
    done = subprocess.run(f'"{sys.executable}" -m invoke check-wheel --wheel "$SPEC" | head -1', shell=True, cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("PASS ") and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_dry_run_with_a_missing_source_fails(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nox", "-s", "build-wheelhouse-fixture-3.11", "--", "--dry-run",
                           "--source", str(tmp_path / "nonexistent")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)}, timeout=120)
    assert done.returncode != 0
    assert f"--source {tmp_path / 'nonexistent'}: not a directory; pass the path of a source checkout" in done.stderr


@pytest.mark.parametrize("record,problem", [
    ([], "a JSON list, not an object"),
    ({"tag": "x"}, "no title"),
    ({"title": "t", "assets": {"a.whl": {"size": "1"}}}, "assets entry 'a.whl' lacks size or sha256"),
])
def test_a_local_store_record_of_the_wrong_shape_is_one_line(tmp_path, record, problem):
    release = tmp_path / "store" / "releases" / "x"
    release.mkdir(parents=True)
    (release / "release.json").write_text(json.dumps(record))
    line = one_line(invoke("publish-index", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "site")), 1)
    assert line == (f"error: local store: {release / 'release.json'} is not a release record ({problem}); restore "
                    "it from a copy or remove that release folder")


def test_a_local_store_record_nested_past_the_json_readers_depth_is_one_line(tmp_path):
    release = tmp_path / "store" / "releases" / "x"
    release.mkdir(parents=True)
    (release / "release.json").write_text("[" * 100_000 + "]" * 100_000)
    line = one_line(invoke("publish-index", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "site")), 1)
    assert line == (f"error: local store: {release / 'release.json'} is unreadable (nested more than 64 levels (far "
                    "deeper than Python's JSON reader goes)); remove that release")


@pytest.mark.parametrize("name", ["wheelhouse-site.json", "digests.json"])
def test_a_published_site_file_nested_past_the_json_readers_depth_is_not_ours(tmp_path, name):
    """The site a publish would replace: its marker and digest cache are read before anything is written."""
    (tmp_path / "store" / "releases").mkdir(parents=True)
    site = tmp_path / "site"
    site.mkdir()
    (site / name).write_text("{\"a\":" * 100_000 + "1" + "}" * 100_000)
    result = invoke("publish-index", "--store", str(tmp_path / "store"), "--out", str(site))
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr, result.stderr[-3000:]
    assert result.returncode in (0, 1), result.stderr
    if result.returncode:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                                  "[" * 65 + "]" * 65])
def test_the_bounded_json_reader_refuses_depth_as_a_value_error(text):
    from ci.base import bounded_json

    with pytest.raises(ValueError, match="nested more than 64 levels"):
        bounded_json.loads(text)
    assert bounded_json.depth(bounded_json.loads("[" * 64 + "]" * 64)) == 64  # the limit itself is read


@pytest.mark.parametrize("option", ["--out", "--pages-artifact"])
def test_a_site_target_the_file_system_refuses_is_one_line(tmp_path, option):
    (tmp_path / "store" / "releases").mkdir(parents=True)
    line = one_line(invoke("publish-index", "--store", str(tmp_path / "store"), option, "/proc/wheelhouse-site"), 1)
    assert line == "error: cannot write the site to /proc/wheelhouse-site (No such file or directory); name a " \
                   "writable directory"
