"""which-wheel against sites whose records were edited by whoever serves them: every value is checked when it is
loaded (one line naming the file and key, exit 2), nothing it prints can make a pasted command run anything
else, and no record is read past its size limit or outside the site.

The hostile sites are copies of a real one (tests/install_clients.py) with one value changed, as the third
adversarial round's ``which_hostile.py`` made them, plus variants of each root cause. Each run is the file
itself (``python ci/publish/which_wheel.py``), as a user runs the copy the site serves; the printed command lines are
then pasted into bash with stand-in ``pip`` and ``uv`` that only echo, and must not have made any file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from index_helpers import REPO
from install_clients import WORLD, WORLD_TORCH, build_indexes, user_torch

from ci.publish.which_wheel import INDEX_RECORD, MAX_RECORD_BYTES, WORLD_RECORD

RECORD = f"{WORLD}/{WORLD_RECORD}"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return build_indexes(tmp_path_factory.mktemp("hostile-records"))


@pytest.fixture(scope="module")
def torch(tmp_path_factory) -> Path:
    return user_torch(tmp_path_factory.mktemp("user"), WORLD_TORCH, cuda="13.0")


def which_wheel(index: str, torch: Path, *args: str, via: str = "file") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(torch), PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    command = ([sys.executable, str(REPO / "ci" / "publish" / "which_wheel.py")] if via == "file"
               else [sys.executable, "-m", "invoke", "which-wheel"])
    return subprocess.run([*command, "--index", index, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env)


def hostile_site(good_site: Path, out: Path, *, world: Callable[[dict[str, Any]], None] | None = None,
                 index: Callable[[dict[str, Any]], None] | None = None, raw_world: bytes | None = None,
                 raw_index: bytes | None = None) -> Path:
    shutil.copytree(good_site, out)
    if world is not None or raw_world is not None:
        doc = json.loads((out / RECORD).read_text())
        if world is not None:
            world(doc)
        (out / RECORD).write_bytes(raw_world if raw_world is not None else json.dumps(doc).encode())
    if index is not None or raw_index is not None:
        doc = json.loads((out / INDEX_RECORD).read_text())
        if index is not None:
            index(doc)
        (out / INDEX_RECORD).write_bytes(raw_index if raw_index is not None else json.dumps(doc).encode())
    return out


def pasted(output: str, scratch: Path) -> list[str]:
    """Paste every printed ``pip``/``uv`` line into bash with stand-ins that only echo; the files it made."""
    stub = scratch / "stub"
    stub.mkdir(exist_ok=True)
    for name in ("pip", "uv"):
        (stub / name).write_text('#!/bin/sh\necho "stub $0 $*"\n')
        (stub / name).chmod(0o755)
    before = set(os.listdir(scratch))
    for line in output.splitlines():
        if line.startswith(("  pip ", "  uv ")):
            subprocess.run(["bash", "-c", line], cwd=scratch, env={"PATH": f"{stub}:/usr/bin:/bin", "W": str(scratch)},
                           capture_output=True, timeout=30, check=False)
    return sorted(set(os.listdir(scratch)) - before)


def _set(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


W0 = ("projects", 0, "wheels", 0)
# case: (edit of the world record, the key the one-line error must name)
INJECTIONS = {
    # the adversarial round's five (R3)
    "index-url-injection": (_set("index", value="file:///x/simple/ ; touch $W/PWNED-index ;"), "index"),
    "torch-index-injection": (_set("torch_index", value="https://127.0.0.1:9/whl/cpu $(touch $W/PWNED-torch)"),
                              "torch_index"),
    "project-name-injection": (_set("projects", 0, "name", value="flash-attn$(touch${IFS}$W/PWNED-name)"),
                               "projects[0].name"),
    "status-reason-ansi": (_set("status_reason", value="\x1b[2J\x1b[Hall good\x1b]0;owned\x07 \x1b[8m"),
                           "status_reason"),
    "index-url-newline": (_set("index", value="file:///x/simple/\n  pip install --index-url http://127.0.0.1:9/e evil"),
                          "index"),
    # variants: each other value that reaches a printed line or the terminal
    "wheel-url-backquote": (_set(*W0, "url", value="file:///x/`touch $W/PWNED-url`/flash_attn.whl"),
                            "projects[0].wheels[0].url"),
    "torch-index-semicolon-no-space": (_set("torch_index", value="https://127.0.0.1:9/whl;touch${IFS}$W/PWNED-ti;"),
                                       "torch_index"),
    "release-newline": (_set(*W0, "release", value="tag\n  pip install evil"), "projects[0].wheels[0].release"),
    "yanked-escape": (_set(*W0, "yanked", value="\x1b]0;owned\x07"), "projects[0].wheels[0].yanked"),
    "built-with-escape": (_set(*W0, "facts", "built_with", "version", value="2.13.0\x1b[8m"),
                          "projects[0].wheels[0].facts.built_with.version"),
    "status-right-to-left-override": (_set("status_reason", value="fine\u202e txet"), "status_reason"),
    "requires-python-quote": (_set(*W0, "requires_python", value=">=3.9' ; touch $W/PWNED-rp '"),
                              "projects[0].wheels[0].requires_python"),
    "torch-pin-dollar": (_set(*W0, "facts", "torch_pin", value="==2.13.*$(id)"),
                         "projects[0].wheels[0].facts.torch_pin"),
    "index-of-another-world": (_set("index", value="https://127.0.0.1:9/cu129/torch2.13/simple/"), "index"),
    "world-of-another-name": (_set("world", value="cu129/torch2.13"), "world"),
}


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_a_value_that_could_change_a_printed_command_is_refused_in_one_line(case, good, torch, tmp_path):
    edit, key = INJECTIONS[case]
    site = hostile_site(good.site, tmp_path / "site", world=edit)
    result = which_wheel(str(site), torch)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {site}/{RECORD}: {key} ")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr and "\u202e" not in result.stderr
    assert "publish the index again" in result.stderr
    assert pasted(result.stdout, tmp_path) == []


STRUCTURE = {
    # R9: depth
    "deep-nesting-world": ({"raw_world": b"[" * 200_000 + b"]" * 200_000}, f"{RECORD} is nested too deeply"),
    "deep-nesting-index": ({"raw_index": b'{"worlds":' + b"[" * 200_000 + b"]" * 200_000 + b"}"},
                           f"{INDEX_RECORD} is nested too deeply"),
    "deep-nesting-facts": ({"world": _set(*W0, "facts", value=json.loads("[" * 500 + "]" * 500))},
                           f"{RECORD}: projects[0].wheels[0].facts is not an object"),
    # R10: paths and names
    "record-traversal": ({"index": _set("worlds", 0, "record", value="../../../../../../etc/passwd")},
                         f"{INDEX_RECORD}: worlds[0].record is not {WORLD}/{WORLD_RECORD}"),
    "record-absolute": ({"index": _set("worlds", 0, "record", value="/proc/self/environ")},
                        f"{INDEX_RECORD}: worlds[0].record is not {WORLD}/{WORLD_RECORD}"),
    "world-traversal": ({"index": _set("worlds", 0, "world", value="../../etc")}, f"{INDEX_RECORD}: worlds[0].world"),
    "filename-traversal": ({"world": _set(*W0, "filename", value="../../evil.whl")},
                           f"{RECORD}: projects[0].wheels[0].filename is not a wheel file name of flash-attn"),
    "filename-of-another-project": ({"world": _set(*W0, "filename", value="torch-2.99.0-py3-none-any.whl")},
                                    f"{RECORD}: projects[0].wheels[0].filename is not a wheel file name of flash-attn"),
    "url-of-another-file": ({"world": _set(*W0, "url", value="https://127.0.0.1:9/torch-2.99.0-py3-none-any.whl")},
                            f"{RECORD}: projects[0].wheels[0].url does not end in the wheel's file name"),
    "size-nan": ({"world": _set(*W0, "size", value="NaN")}, f"{RECORD}: projects[0].wheels[0].size is not of type int"),
    "size-bool": ({"world": _set(*W0, "size", value=True)}, f"{RECORD}: projects[0].wheels[0].size is not of type int"),
    "facts-bad": ({"world": _set(*W0, "facts", value={"archs_known": True, "cubins": "x"})},
                  f"{RECORD}: projects[0].wheels[0].facts.cubins is not of type list"),
    "arch-not-an-arch": ({"world": _set(*W0, "facts", "cubins", value=["9.0; rm -rf ~"])},
                         f"{RECORD}: projects[0].wheels[0].facts.cubins[0] is not a CUDA arch"),
    "sha256-not-hex": ({"world": _set(*W0, "sha256", value="z" * 64)}, f"{RECORD}: projects[0].wheels[0].sha256"),
    "non-utf8": ({"raw_world": b'{"format": "\xff\xfe"}'}, f"{RECORD} is not JSON"),
    "not-an-object": ({"raw_world": b"[]"}, f"{RECORD} is not an index record"),
    "another-format": ({"world": _set("format", value="something-else")}, f'{RECORD}: format is not "wheelhouse-world"'),
    "many-wheels": ({"world": lambda w: w["projects"][0].update(wheels=w["projects"][0]["wheels"] * 20_000)},
                    f"{RECORD} is larger than {MAX_RECORD_BYTES // 2**20} MiB"),
    "missing-key": ({"world": lambda w: w.pop("index")}, f"{RECORD}: index is missing"),
}


@pytest.mark.parametrize("case", sorted(STRUCTURE))
def test_a_malformed_record_or_path_is_one_line(case, good, torch, tmp_path):
    edits, expected = STRUCTURE[case]
    site = hostile_site(good.site, tmp_path / "site", **edits)
    result = which_wheel(str(site), torch)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {site}/{expected}"), result.stderr


def test_invoke_which_wheel_is_the_same_code_with_the_same_line_and_status(good, torch, tmp_path):
    site = hostile_site(good.site, tmp_path / "site", world=INJECTIONS["index-url-injection"][0])
    direct, wrapped = which_wheel(str(site), torch), which_wheel(str(site), torch, via="invoke")
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    fine_direct, fine_wrapped = which_wheel(str(good.site), torch), which_wheel(str(good.site), torch, via="invoke")
    assert (fine_wrapped.returncode, fine_wrapped.stdout) == (fine_direct.returncode, fine_direct.stdout) == (
        0, fine_direct.stdout)


def test_values_a_shell_would_act_on_reach_the_commands_quoted(good, torch, tmp_path):
    """Legal URLs with ``~``, ``#``, ``?`` and ``=``: each printed command splits into exactly the words meant."""
    base = "https://host.example/~team/site?x=1#top"
    index = f"https://host.example/~team/{WORLD}/simple/"

    def edit(doc: dict[str, Any]) -> None:
        doc["index"], doc["torch_index"] = index, "https://host.example/whl/cu130?a=b"
    site = hostile_site(good.site, tmp_path / "site", world=edit)
    result = which_wheel(str(site), torch)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines() if line.startswith(("  pip ", "  uv "))]
    assert shlex.split(lines[0]) == ["pip", "install", "--no-deps", "--index-url", index, "flash-attn==2.8.3"]
    assert f"'{index}'" in lines[0] and base not in result.stdout
    lock = [shlex.split(line) for line in lines if " -r " in line]
    assert lock and all(words[words.index("-r") + 1] == f"https://host.example/~team/{WORLD}/pylock.flash-attn.toml"
                        for words in lock)
    assert pasted(result.stdout, tmp_path) == []


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_an_oversized_answer_over_http_is_refused_after_the_limit(torch, tmp_path):
    """A 64 MiB wheelhouse-index.json from a loopback server: refused having read just past 8 MiB."""
    root = tmp_path / "big"
    root.mkdir()
    with (root / INDEX_RECORD).open("wb") as out:
        out.write(b'{"pad": "' + b"A" * (64 << 20) + b'", "worlds": []}')
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Quiet(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = which_wheel(url, torch)
    finally:
        server.shutdown()
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: {url}/{INDEX_RECORD} is larger than {MAX_RECORD_BYTES // 2**20} MiB, more than "
                             "any record of ours; check the URL, or use a site you trust\n")
