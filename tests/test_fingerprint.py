"""The build-input fingerprint fails closed: every file a builder sources or runs is in it, and an
edit to any helper under build_scripts/lib/ changes the fingerprint of the rows that use it."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from ci.model import fingerprint, matrix
from ci.model.versions import REPO_ROOT, load

BUILD_SCRIPTS = REPO_ROOT / "build_scripts"
_SOURCE = re.compile(r"""^\s*(?:source|\.)\s+(?P<arg>.+?)\s*(?:\s#.*)?$""")
_NAMED = re.compile(r"""\$\{?LIB\}?/(?P<name>[\w.-]+)""")


def _resolve(arg: str, current: Path, lib: Path) -> Path:
    """A ``source`` argument as bash would expand it in our scripts; anything else fails the test."""
    text = arg.replace('$(dirname "${BASH_SOURCE[0]}")', str(current.parent)).replace('"', "").replace("'", "")
    text = re.sub(r"\$\{?LIB\}?", str(lib), text)
    assert "$" not in text, f"{current}: cannot resolve `source {arg}`; teach this test the new form"
    path = Path(text) if Path(text).is_absolute() else current.parent / text
    return path.resolve()


def files_a_builder_uses(builder: Path) -> set[Path]:
    """The builder, every file it sources (transitively) and every ``$LIB/<file>`` it names."""
    lib = builder.parent / "lib"
    seen: set[Path] = set()
    pending = [builder.resolve()]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        assert current.is_file(), f"{current} is sourced but does not exist"
        seen.add(current)
        for line in current.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            match = _SOURCE.match(line)
            if match:
                pending.append(_resolve(match["arg"], current, lib))
            for named in _NAMED.finditer(line):
                if (lib / named["name"]).is_file():
                    pending.append((lib / named["name"]).resolve())
    return seen


def _rows_by_builder():
    versions = load(REPO_ROOT / "versions.yaml")
    rows = {}
    for row in matrix.expand(versions):
        rows.setdefault(row.settings.builder, row)
    return rows


@pytest.mark.parametrize("builder", sorted(_rows_by_builder()))
def test_every_file_a_builder_sources_is_in_its_fingerprint(builder: str) -> None:
    row = _rows_by_builder()[builder]
    inputs = {REPO_ROOT / entry["path"] for entry in fingerprint.build_inputs(row)}
    used = files_a_builder_uses(BUILD_SCRIPTS / f"{builder}.sh")
    assert used <= inputs, f"{builder}: not in the fingerprint: {sorted(str(p) for p in used - inputs)}"
    # fail closed: every helper, used or not, is an input of every row
    helpers = {p.resolve() for d in ("lib", "provision") for p in (BUILD_SCRIPTS / d).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert helpers | {(BUILD_SCRIPTS / "nvcc-arch-filter").resolve()} <= inputs


def test_an_edit_to_a_sourced_helper_changes_the_fingerprint(tmp_path: Path) -> None:
    """flashinfer.sh sources lib/flashinfer.sh: editing it must rebuild flashinfer (it did not)."""
    root = tmp_path / "repo"
    shutil.copytree(BUILD_SCRIPTS, root / "build_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    for builder, helper in (("flashinfer", "lib/flashinfer.sh"), ("flash_attention", "lib/flash_attention.sh")):
        row = _rows_by_builder()[builder]
        before = fingerprint.fingerprint(fingerprint.build_config(row, "a" * 40, repo_root=root))
        with (root / "build_scripts" / helper).open("a") as handle:
            handle.write("# an edit\n")
        after = fingerprint.fingerprint(fingerprint.build_config(row, "a" * 40, repo_root=root))
        assert before != after, helper


def test_a_submodule_selection_is_part_of_the_fingerprint() -> None:
    """The same revision with other submodules checked out is other sources: it must rebuild."""
    row = next(iter(_rows_by_builder().values()))
    everything = fingerprint.fingerprint(fingerprint.build_config(row, "a" * 40))
    only_cutlass = fingerprint.fingerprint(fingerprint.build_config(row, "a" * 40, submodules=("csrc/cutlass",)))
    with_ck = fingerprint.fingerprint(
        fingerprint.build_config(row, "a" * 40, submodules=("csrc/cutlass", "csrc/composable_kernel")))
    assert len({everything, only_cutlass, with_ck}) == 3
    assert "source_submodules" not in fingerprint.build_config(row, "a" * 40)  # unchanged for every other row


# --- which settings are build inputs: the schema's x-build-input, declared once ------------------------------

_ROW_FIELDS = {"schema", "component", "ref", "source_revision", "arch", "cuda", "python", "pythons", "torch",
               "torch_vision", "torch_audio", "cxx11_abi", "build_inputs", "source_submodules"}


def _marked(value: bool) -> set[str]:
    schema = json.loads((REPO_ROOT / "versions.schema.json").read_text())
    return {name for name, prop in schema["$defs"]["settings"]["properties"].items()
            if prop["x-build-input"] is value}


def test_the_settings_block_is_the_schemas_build_inputs():
    row = matrix.expand(load(REPO_ROOT / "versions.yaml"))[0]
    block = set(fingerprint.settings_block(row))
    assert not row.settings.rehost  # at its default: left out (ci/model/fingerprint.py LEFT_OUT_AT_DEFAULT)
    assert block == _marked(True) - fingerprint.FILE_SETTINGS - fingerprint.LEFT_OUT_AT_DEFAULT
    assert _marked(True) >= fingerprint.FILE_SETTINGS and _marked(True) >= fingerprint.UNORDERED_SETTINGS
    assert _marked(True) >= fingerprint.LEFT_OUT_AT_DEFAULT
    assert block & _ROW_FIELDS == set()  # a setting never shadows a row field in the flat config
    assert set(fingerprint.build_config(row, "a" * 40)) == block | (_ROW_FIELDS - {"source_submodules"})


def _changed(name: str, value: object) -> object:
    """Another valid-looking value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, tuple):
        return (*value, "extra_pkg")
    if isinstance(value, dict):
        return {**value, "EXTRA_FLAG": "1"}
    return f"{value}x" if value is not None else "x"


def _with_setting(row: matrix.MatrixRow, name: str, value: object) -> matrix.MatrixRow:
    return dataclasses.replace(row, settings=dataclasses.replace(row.settings, **{name: value}))


@pytest.mark.parametrize("name", sorted(_marked(True) | _marked(False)))
def test_a_setting_changes_the_fingerprint_exactly_when_the_schema_marks_it(name):
    """Fail closed for every build input (a changed value rebuilds the row), and never a rebuild for the others."""
    row = next(r for r in matrix.expand(load(REPO_ROOT / "versions.yaml")) if not r.settings.patches)
    before = fingerprint.fingerprint(fingerprint.build_config(row, "a" * 40))
    # a patch is a file: name one that exists, so its bytes are read
    new = ("patches/enable_deep_ep_sm80.py",) if name == "patches" else _changed(name, getattr(row.settings, name))
    after = fingerprint.fingerprint(fingerprint.build_config(_with_setting(row, name, new), "a" * 40))
    assert (after != before) is (name in _marked(True)), name


def _config_as_published(row: matrix.MatrixRow, revision: str) -> dict:
    """The config as release manifests recorded it before the schema declared the build inputs: the hand-picked
    settings of that time. Their fingerprints must still match, or every published row would rebuild."""
    s = row.settings
    config = {key: value for key, value in fingerprint.build_config(row, revision).items() if key in _ROW_FIELDS}
    config.update({"builder": s.builder, "torch_cuda_arch_list": s.torch_cuda_arch_list, "arch_filter": s.arch_filter,
                   "requires_cudnn": s.requires_cudnn, "extra_env": dict(s.extra_env),
                   "wheel_packages": sorted(s.wheel_packages), "repair": s.repair, "torch_pin": s.torch_pin})
    if s.rehost:  # added since (ci/model/fingerprint.py LEFT_OUT_AT_DEFAULT): only a row that sets it has it
        config["rehost"] = sorted(s.rehost)
    return config


def test_every_real_rows_fingerprint_is_the_one_published_before_the_schema_marks():
    rows = matrix.expand(load(REPO_ROOT / "versions.yaml"))
    assert len(rows) > 20
    for row in rows:
        assert fingerprint.build_config(row, "a" * 40) == _config_as_published(row, "a" * 40), row.label
