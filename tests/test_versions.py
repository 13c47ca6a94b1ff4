"""versions.yaml: the real file expands as promised; malformed files get one clear line and exit 2."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ci.base.errors import ConfigError
from ci.model import matrix, versions

REPO = Path(__file__).resolve().parent.parent

BASE = {
    "build_matrix": [
        {"arch": "x86_64", "cuda": "13.0.2", "python": "3.11", "torch": "2.13.0", "cxx11_abi": "TRUE"},
        {"arch": "x86_64", "cuda": "13.0.2", "python": "3.12", "torch": "2.13.0", "cxx11_abi": "TRUE"},
        {"arch": "aarch64", "cuda": "13.0.2", "python": "3.12", "torch": "2.13.0", "cxx11_abi": "TRUE"},
    ],
    "components": {
        "demo": {
            "source": {"git": "https://example.invalid/demo.git"},
            "ref": "v1",
            "builder": "fixture",
            "runs_on": "ubuntu-24.04",
            "extra_env": {"A": "1", "B": "2"},
            "arch_overrides": {"aarch64": {"runs_on": "ubuntu-24.04-arm", "extra_env": {"B": "3"}}},
        }
    },
}


def run_matrix(path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(path)}
    return subprocess.run(
        [sys.executable, "-m", "invoke", "matrix", *args], cwd=REPO, env=env, capture_output=True, text=True
    )


def write(tmp_path: Path, doc, name="versions.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def mutated(fn):
    doc = copy.deepcopy(BASE)
    fn(doc)
    return doc


def _set(path, value):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


def _delete(path):
    def apply(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return apply


def _append_row(doc):
    doc["build_matrix"].append(dict(doc["build_matrix"][1]))


# (case id, document or raw text, exact expected message)
MALFORMED = [
    ("yaml-syntax", "build_matrix: [\n  - {arch: x86_64\n", None),
    ("top-level-list", "- 1\n- 2\n", "versions.yaml: the top level must be a mapping with build_matrix and components"),
    ("unknown-top-key", mutated(_set(["build_matrx"], [])),
     "versions.yaml: build_matrx: unknown key (did you mean 'build_matrix'?); known keys: build_matrix, components, verl_reference_versions"),
    ("unknown-component-key", mutated(_set(["components", "demo", "max_job"], 4)), None),
    ("missing-builder", mutated(_delete(["components", "demo", "builder"])),
     "versions.yaml: components.demo: missing required key 'builder'; add it (see versions.schema.json)"),
    ("missing-matrix", mutated(_delete(["build_matrix"])),
     "versions.yaml: (top level): missing required key 'build_matrix'; add it (see versions.schema.json)"),
    ("python-as-number", mutated(_set(["build_matrix", 0, "python"], 3.1)),
     'versions.yaml: build_matrix[0].python: expected a string, got number 3.1; quote it: "3.1" (YAML reads 3.10 as the number 3.1)'),
    ("max-jobs-string", mutated(_set(["components", "demo", "max_jobs"], "four")),
     "versions.yaml: components.demo.max_jobs: expected an integer, got string 'four'"),
    ("bad-arch", mutated(_set(["build_matrix", 2, "arch"], "arm64")),
     "versions.yaml: build_matrix[2].arch: string 'arm64' is not allowed (did you mean 'aarch64'?); use one of: x86_64, aarch64"),
    ("bad-cxx11-abi", mutated(_set(["build_matrix", 0, "cxx11_abi"], True)), None),
    ("override-runs-on-type", mutated(_set(["components", "demo", "arch_overrides", "aarch64", "runs_on"], 5)), None),
    ("override-unknown-arch", mutated(_set(["components", "demo", "arch_overrides", "x86"], {"max_jobs": 2})), None),
    ("override-arch-not-in-matrix", mutated(lambda d: (d["build_matrix"].pop(2), None)), None),
    ("arches-not-in-matrix", mutated(lambda d: (d["build_matrix"].pop(2), d["components"]["demo"].pop("arch_overrides"),
                                                d["components"]["demo"].__setitem__("arches", ["aarch64"]))), None),
    ("rehost-not-published", mutated(_set(["components", "demo", "rehost"], ["flashinfer-cubin"])),
     "versions.yaml: components.demo.rehost[0]: flashinfer-cubin is not one of the wheels the component publishes "
     "(demo); rehost only one of them, or add it to wheel_packages"),
    ("shards-zero", mutated(_set(["components", "demo", "shards"], 0)),
     "versions.yaml: components.demo.shards: 0 is too small; the minimum is 1"),
    # a builder that does not declare it builds by shards (ci/model/shards.py BUILDER_DECLARATION): each of the N jobs
    # would run the whole build and leave no shard
    ("shards-builder-cannot", mutated(_set(["components", "demo", "shards"], 256)),
     "versions.yaml: components.demo.shards: 256 shards, but build_scripts/fixture.sh does not build by shards (it "
     "has no '# wheelhouse-builder: builds-by-shards' line): each shard job would run the whole build and leave no "
     "shard; set shards: 1, or make the builder build one shard (WHEELHOUSE_SHARD) and assemble them "
     "(WHEELHOUSE_ASSEMBLE)"),
    ("shards-override-builder-cannot", mutated(_set(["components", "demo", "arch_overrides", "aarch64", "shards"], 2)),
     "versions.yaml: components.demo.arch_overrides.aarch64.shards: 2 shards, but build_scripts/fixture.sh does not "
     "build by shards (it has no '# wheelhouse-builder: builds-by-shards' line): each shard job would run the whole "
     "build and leave no shard; set shards: 1, or make the builder build one shard (WHEELHOUSE_SHARD) and assemble "
     "them (WHEELHOUSE_ASSEMBLE)"),
    ("python-not-in-matrix", mutated(_set(["components", "demo", "python_versions"], ["3.13"])),
     "versions.yaml: components.demo.python_versions[0]: Python '3.13' is not in build_matrix (3.11, 3.12); "
     "remove it or add a build_matrix row for it"),
    ("self-hosted-aarch64", mutated(_set(["components", "demo", "arch_overrides", "aarch64", "runs_on"],
                                         ["self-hosted", "Linux", "ARM64"])),
     "versions.yaml: components.demo.arch_overrides.aarch64.runs_on: the aarch64 build points at a self-hosted runner "
     "(the self-hosted machine is x86_64); set arch_overrides.aarch64.runs_on to a GitHub-hosted runner such as ubuntu-24.04-arm"),
    ("duplicate-row", mutated(_append_row),
     "versions.yaml: build_matrix[3]: duplicates build_matrix[1] (x86_64 cu13.0.2 py3.12 torch2.13.0); remove one of them"),
    ("missing-builder-script", mutated(_set(["components", "demo", "builder"], "nonexistent")),
     "versions.yaml: components.demo.builder: build_scripts/nonexistent.sh does not exist; name an existing builder or add that script"),
    ("missing-patch", mutated(_set(["components", "demo", "patches"], ["patches/nope.py"])),
     "versions.yaml: components.demo.patches[0]: patches/nope.py does not exist; give a path relative to the repository root"),
    ("source-both", mutated(_set(["components", "demo", "source"], {"git": "x", "sdist": "y"})),
     "versions.yaml: components.demo.source: name exactly one of 'git' (a clone URL), 'sdist' (a distribution name) or 'path' (a directory)"),
    ("extra-env-number", mutated(_set(["components", "demo", "extra_env"], {"A": 1})),
     'versions.yaml: components.demo.extra_env.A: expected a string, got number 1; quote it: "1"'),
    ("empty-matrix", mutated(_set(["build_matrix"], [])),
     "versions.yaml: build_matrix: must not be empty; list at least one entry or remove the key"),
    ("bad-component-name", mutated(lambda d: d["components"].__setitem__("Bad_Name", d["components"]["demo"])), None),
    ("duplicate-key", "build_matrix: []\nbuild_matrix: []\ncomponents: {}\n", None),
    ("arch-filter-without-list", mutated(_set(["components", "demo", "arch_filter"], True)),
     "versions.yaml: components.demo.arch_filter: needs torch_cuda_arch_list to say which archs to keep; set it or drop arch_filter"),
    ("extra-cubins-without-list", mutated(_set(["components", "demo", "extra_cubins"], {"10.3a": "the build adds it"})),
     "versions.yaml: components.demo.extra_cubins: the arch gate reads it only beside torch_cuda_arch_list; set that "
     "list or drop extra_cubins"),
    ("extra-cubins-flavour-of-the-list",
     mutated(lambda d: d["components"]["demo"].update(torch_cuda_arch_list="9.0;10.0",
                                                      extra_cubins={"sm_100a": "the build adds it"})),
     "versions.yaml: components.demo.extra_cubins: sm_100a is accepted already, as a flavour of 10.0 in "
     "torch_cuda_arch_list (9.0;10.0); remove it from extra_cubins"),
    ("build-path-exceptions-bad-name",
     mutated(_set(["components", "demo", "build_path_exceptions"], {"lib x.so": "reads its plugins from there"})), None),
    ("extra-cubins-not-an-arch",
     mutated(lambda d: d["components"]["demo"].update(torch_cuda_arch_list="10.0", extra_cubins={"b300": "B300 needs it"})),
     None),
    # values that reach git, pip, compiler flags, paths, tags, URLs and index worlds
    ("git-option", mutated(_set(["components", "demo", "source"], {"git": "--upload-pack=touch PWNED;true"})),
     "versions.yaml: components.demo.source.git: string '--upload-pack=touch PWNED;true' is malformed; write a clone "
     "URL: https://host/owner/repo.git, ssh://host/path, git@host:owner/repo.git, or a local repository (/path, "
     "./path, ../path or file:///path); no spaces, no <transport>:: form"),
    ("git-transport", mutated(_set(["components", "demo", "source"], {"git": "fd::0"})), None),
    ("ref-option", mutated(_set(["components", "demo", "ref"], "--upload-pack=touch PWNED;true")), None),
    ("sdist-option", mutated(_set(["components", "demo", "source"], {"sdist": "--index-url=http://127.0.0.1:1/"})),
     "versions.yaml: components.demo.source.sdist: string '--index-url=http://127.0.0.1:1/' is malformed; write a "
     "distribution name as on the package index: letters, digits, '.', '_' and '-', starting and ending with a letter or digit"),
    ("ref-whitespace", mutated(_set(["components", "demo", "ref"], "0.1.0 rc1")),
     "versions.yaml: components.demo.ref: string '0.1.0 rc1' is malformed; write a git branch, tag or commit (for an "
     "sdist, its version) as git accepts it: letters, digits and ._/+- only, starting with a letter or digit (no "
     "spaces, no leading '-'), no '..' or '//', no part that starts with '.' or ends in '.lock'"),
    ("ref-pipe", mutated(_set(["components", "demo", "ref"], "v1|x")), None),
    ("ref-dot", mutated(_set(["components", "demo", "ref"], ".")), None),
    # refs git's check-ref-format refuses: no upstream has them, and the tag made from `a..b` is refused too
    ("ref-dot-dot", mutated(_set(["components", "demo", "ref"], "a..b")), None),
    ("ref-dot-dot-path", mutated(_set(["components", "demo", "ref"], "a/../../../../x")), None),
    ("ref-lock", mutated(_set(["components", "demo", "ref"], "v1.lock")), None),
    ("ref-part-lock", mutated(_set(["components", "demo", "ref"], "v1.lock/x")), None),
    ("ref-part-dot", mutated(_set(["components", "demo", "ref"], "release/.v1")), None),
    ("ref-double-slash", mutated(_set(["components", "demo", "ref"], "release//v1")), None),
    ("ref-250", mutated(_set(["components", "demo", "ref"], "a" * 250)),
     "versions.yaml: components.demo.ref: string '" + "a" * 60 + "…(250 characters)' is longer than 128 "
     "characters; shorten it"),
    ("component-name-long", mutated(lambda d: d["components"].__setitem__("c" * 65, d["components"].pop("demo"))),
     "versions.yaml: components." + "c" * 65 + ": invalid name; component names are lower-case "
     "letters, digits and '-', at most 64 characters"),
    ("reference-version-long", mutated(_set(["verl_reference_versions"], {"vllm": "1" * 201})), None),
    ("arch-list-token", mutated(_set(["components", "demo", "torch_cuda_arch_list"], "banana;9.0")),
     "versions.yaml: components.demo.torch_cuda_arch_list: string 'banana;9.0' is malformed; list CUDA archs separated "
     "by ';', ',' or spaces, e.g. \"8.0;9.0a;10.0;12.0f\" (90, sm_90a and +PTX are accepted too), or null when the "
     "component sets its own gencodes"),
    ("arch-list-empty", mutated(_set(["components", "demo", "torch_cuda_arch_list"], "")), None),
    ("override-arch-list", mutated(_set(["components", "demo", "arch_overrides", "aarch64", "torch_cuda_arch_list"],
                                        "9.0;9.x")), None),
    ("patch-absolute", mutated(_set(["components", "demo", "patches"], ["/etc/passwd"])),
     "versions.yaml: components.demo.patches[0]: string '/etc/passwd' is malformed; write a path relative to the "
     "repository root, without '..' components, a leading '/' or spaces (letters, digits and ._+@/- only)"),
    ("patch-dotdot", mutated(_set(["components", "demo", "patches"], ["../../x"])), None),
    ("source-path-outside", mutated(_set(["components", "demo", "source"], {"path": "../../../../tmp"})), None),
    ("wheel-packages-name", mutated(_set(["components", "demo", "wheel_packages"], ["../x"])), None),
    ("torch-index-not-url", mutated(_set(["build_matrix", 0, "torch_index"], "not a url")),
     "versions.yaml: build_matrix[0].torch_index: string 'not a url' is malformed; write \"default\" (pip's own "
     "configuration, for the build; the pages name PyTorch's index of the row's CUDA) or an http(s):// or file:// "
     "index URL of letters, digits and ._~:/?#@%+=,- (percent-encode the rest), e.g. "
     "https://download.pytorch.org/whl/cu130"),
    ("max-jobs-huge", mutated(_set(["components", "demo", "max_jobs"], 10**30)),
     "versions.yaml: components.demo.max_jobs: 1000000000000000000000000000000 is too large; the maximum is 256"),
    ("build-timeout-zero", mutated(_set(["components", "demo", "build_timeout"], "0")), None),
    ("runs-on-space", mutated(_set(["components", "demo", "runs_on"], "ubuntu latest")), None),
    ("extra-env-name", mutated(_set(["components", "demo", "extra_env"], {"1BAD": "x"})),
     "versions.yaml: components.demo.extra_env.1BAD: invalid name; environment variable names are letters, digits "
     "and '_', not starting with a digit, at most 128 characters"),
]

# Key paths that the messages without an exact expectation must name.
EXPECTED_PATHS = {
    "yaml-syntax": "invalid YAML at line 2 column 3",
    "unknown-component-key": "components.demo.max_job: unknown key (did you mean 'max_jobs'?)",
    "bad-cxx11-abi": "build_matrix[0].cxx11_abi:",
    "override-runs-on-type": "components.demo.arch_overrides.aarch64.runs_on:",
    "override-unknown-arch": "components.demo.arch_overrides.x86: invalid name (did you mean 'x86_64'?)",
    "override-arch-not-in-matrix": "components.demo.arch_overrides.aarch64: arch not in build_matrix (x86_64)",
    "arches-not-in-matrix": "components.demo.arches[0]: 'aarch64' is not an arch of build_matrix (x86_64)",
    "bad-component-name": "components.Bad_Name: invalid name",
    "duplicate-key": "duplicate key 'build_matrix'",
    "ref-option": "components.demo.ref: string '--upload-pack=touch PWNED;true' is malformed;",
    "ref-pipe": "components.demo.ref: string 'v1|x' is malformed;",
    "ref-dot": "components.demo.ref: string '.' is malformed;",
    "git-transport": "components.demo.source.git: string 'fd::0' is malformed; write a clone URL",
    "ref-dot-dot": "components.demo.ref: string 'a..b' is malformed; write a git branch, tag or commit",
    "ref-dot-dot-path": "components.demo.ref: string 'a/../../../../x' is malformed; write a git branch, tag or commit",
    "ref-lock": "components.demo.ref: string 'v1.lock' is malformed; write a git branch, tag or commit",
    "ref-part-lock": "components.demo.ref: string 'v1.lock/x' is malformed; write a git branch, tag or commit",
    "ref-part-dot": "components.demo.ref: string 'release/.v1' is malformed; write a git branch, tag or commit",
    "ref-double-slash": "components.demo.ref: string 'release//v1' is malformed; write a git branch, tag or commit",
    "reference-version-long": "verl_reference_versions.vllm: string '" + "1" * 60 + "…(201 characters)' is longer "
                              "than 200 characters; shorten it",
    "arch-list-empty": "components.demo.torch_cuda_arch_list: string '' is malformed;",
    "override-arch-list": "components.demo.arch_overrides.aarch64.torch_cuda_arch_list: string '9.0;9.x' is malformed;",
    "patch-dotdot": "components.demo.patches[0]: string '../../x' is malformed; write a path relative to the repository root",
    "source-path-outside": "components.demo.source.path: string '../../../../tmp' is malformed; write a path relative",
    "wheel-packages-name": "components.demo.wheel_packages[0]: string '../x' is malformed; write a distribution name",
    "build-timeout-zero": "components.demo.build_timeout: string '0' is malformed; write a timeout(1) duration greater than zero",
    "runs-on-space": "components.demo.runs_on: string 'ubuntu latest' is malformed; write a GitHub runner label",
    "build-path-exceptions-bad-name": ("components.demo.build_path_exceptions.lib x.so: invalid name; "
                                       "build_path_exceptions keys are member paths or globs"),
    "extra-cubins-not-an-arch": ("components.demo.extra_cubins.b300: invalid name; extra_cubins keys are exact CUDA "
                                 "targets, e.g. 10.3a or sm_103a"),
}


@pytest.mark.parametrize("case,doc,expected", MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_malformed_file_gives_one_line_and_exit_2(tmp_path, case, doc, expected):
    result = run_matrix(write(tmp_path, doc))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    message = lines[0].removeprefix("error: ")
    if expected is not None:
        assert message == expected
    else:
        assert message.startswith("versions.yaml: ")
        assert EXPECTED_PATHS[case] in message


def test_at_least_fifteen_distinct_cases():
    assert len({case for case, _, _ in MALFORMED}) >= 15


def test_missing_file(tmp_path):
    result = run_matrix(tmp_path / "absent.yaml")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'absent.yaml'}: file not found; pass an existing versions file (WHEELHOUSE_VERSIONS)"


def test_arch_overrides_merge_mappings_key_by_key(tmp_path):
    loaded = versions.load(write(tmp_path, BASE))
    component = loaded.component("demo")
    assert dict(component.settings_for("x86_64").extra_env) == {"A": "1", "B": "2"}
    # the anchor's shallow update would have dropped A here
    assert dict(component.settings_for("aarch64").extra_env) == {"A": "1", "B": "3"}
    assert component.settings_for("aarch64").runs_on == "ubuntu-24.04-arm"


def test_unknown_component_lists_known_ones(tmp_path):
    result = run_matrix(write(tmp_path, BASE), "--component", "dem")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: versions.yaml: unknown component 'dem' (did you mean 'demo'?); known components: demo"


def test_unknown_filter_value(tmp_path):
    result = run_matrix(write(tmp_path, BASE), "--arch", "arm64")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: versions.yaml: no build_matrix row has arch 'arm64'; known: aarch64, x86_64"


# --- the real versions.yaml ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    return versions.load()


ANCHOR_COMPONENTS = ["flash-attention", "apex", "transformer-engine", "flashinfer", "megatron-bridge", "deep-ep",
                     "flash-mla", "fast-hadamard-transform"]


def test_real_matrix_has_the_anchors_27_rows_plus_deep_gemm(real):
    rows = matrix.expand(real)
    anchor_rows = [r for r in rows if r.component in ANCHOR_COMPONENTS]
    assert len(anchor_rows) == 27
    assert len({r.release_tag for r in anchor_rows}) == 14
    deep_gemm = [r for r in rows if r.component == "deep-gemm"]
    assert [(r.arch, r.python, r.bundle_pythons) for r in deep_gemm] == [("x86_64", "3.12", ("3.11", "3.12"))]


def test_invoke_matrix_json_real_file():
    result = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--json"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["component"], r["arch"], r["python"]) for r in rows] == [
        (r.component, r.arch, r.python) for r in matrix.expand(versions.load())]  # every row of versions.yaml, in order
    assert sum(r["component"] in ANCHOR_COMPONENTS for r in rows) == 27


def test_invoke_matrix_apex_aarch64_312():
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "matrix", "--component", "apex", "--arch", "aarch64", "--python", "3.12", "--json"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["runs_on"] == '"ubuntu-24.04-arm"'
    assert row["max_jobs"] == 2
    assert row["torch_cuda_arch_list"] == "9.0;10.0"
    assert row["release_tag"] == "apex-master-cu130-py3.12-torch2.13.0"


def test_release_naming_matches_the_anchor(real):
    rows = matrix.select(matrix.expand(real), versions=real, component="transformer-engine", python="3.11")
    assert rows[0].release_tag == "transformer-engine-v2.16.1-cu130-py3.11-torch2.13.0"
    assert matrix.release_title(real, rows[0]) == (
        "transformer-engine v2.16.1 - cu13.0.2 py3.11 torch2.13.0; aarch64 cu13.0.2 py3.11 torch2.13.0"
    )
    assert rows[0].world == "cu130/torch2.13"


def test_a_cpu_row_reads_cpu_in_titles_logs_and_its_tag():
    """A CPU row's label was `cucpu` (`x86_64 cucpu py3.11`); its release tag names its world, cpu."""
    from ci.model import naming

    fixture = REPO / "tests" / "fixtures" / "versions.yaml"
    loaded = versions.load(fixture)
    (row,) = matrix.expand(loaded)
    assert row.release_tag == "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0"
    assert row.world == "cpu/torch2.13"
    assert matrix.release_title(loaded, row) == "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0"
    assert row.label == "wheelhouse-fixture (x86_64 cpu py3.11 torch2.13.0)"
    assert loaded.build_matrix[0].label == "x86_64 cpu py3.11 torch2.13.0"
    listing = run_matrix(fixture)
    assert listing.returncode == 0, listing.stderr
    assert " x86_64   cpu        py3.11 " in listing.stdout and "cucpu" not in listing.stdout
    for title in ("c v1 - cpu py3.11 torch2.13.0", "c v1 - cucpu py3.11 torch2.13.0"):  # and titles written before
        assert naming.parse_title(title).segments == (naming.TitleSegment("x86_64", "cpu", "3.11", "2.13.0"),)


def test_github_output(tmp_path):
    out = tmp_path / "gh_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(out)}
    result = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--component", "megatron-bridge", "--github-output"],
                            cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = out.read_text().splitlines()
    assert lines[1] == "has_builds=true"
    assert [r["component"] for r in json.loads(lines[0].removeprefix("matrix="))] == ["megatron-bridge"]


def test_schema_file_is_valid_draft_2020_12():
    import jsonschema

    schema = json.loads((REPO / "versions.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)


def _schema_defs() -> dict:
    return json.loads((REPO / "versions.schema.json").read_text())["$defs"]


def test_every_list_of_setting_names_agrees():
    """The schema's settings are the one list; the component's and the override's $refs, the Settings fields,
    SETTING_KEYS and the README's versions.yaml table name the same settings (a key missing from one was
    accepted by the schema and then dropped silently). Each says whether it is a build input (x-build-input,
    read by ci/model/fingerprint.py), so none is left out of the fingerprint by omission."""
    defs = _schema_defs()
    names = set(defs["settings"]["properties"])
    unmarked = {name for name, prop in defs["settings"]["properties"].items()
                if not isinstance(prop.get("x-build-input"), bool)}
    assert unmarked == set(), f"mark each setting \"x-build-input\": true (changes the wheel) or false: {unmarked}"
    assert set(versions.BUILD_INPUT_SETTINGS) == {name for name in names
                                                  if defs["settings"]["properties"][name]["x-build-input"]}
    for where in ("component", "override"):
        refs = {name: prop["$ref"] for name, prop in defs[where]["properties"].items()
                if prop.get("$ref", "").startswith("#/$defs/settings/")}
        assert refs == {name: f"#/$defs/settings/properties/{name}" for name in names}, where
    assert set(defs["override"]["properties"]) == names
    assert {f.name for f in dataclasses.fields(versions.Settings)} == names
    assert set(versions.SETTING_KEYS) == names
    readme = (REPO / "README.md").read_text()
    table = readme.split("\n## versions.yaml\n", 1)[1].split("\n## ", 1)[0]
    first_column = " ".join(line.split("|")[1] for line in table.splitlines() if line.startswith("| `"))
    assert names - set(re.findall(r"`([a-z_]+)`", first_column)) == set()


def test_a_setting_left_out_gets_the_schemas_default(tmp_path):
    """The schema's `default`s are the defaults (editors show them); only the required settings have none."""
    defs = _schema_defs()
    settings = defs["settings"]["properties"]
    required = set(defs["component"]["required"]) & set(settings)
    assert required == {"builder", "runs_on"}
    assert {name for name, prop in settings.items() if "default" not in prop} == required
    doc = {"build_matrix": BASE["build_matrix"][:1],
           "components": {"demo": {key: BASE["components"]["demo"][key] for key in ("source", "ref", *required)}}}
    got = versions.load(write(tmp_path, doc)).component("demo").settings_for("x86_64")
    for name, prop in settings.items():
        if name not in required:
            default = prop["default"]
            expected = tuple(default) if isinstance(default, list) else default
            assert getattr(got, name) == expected, name


def test_config_error_is_the_library_error_type(tmp_path):
    with pytest.raises(ConfigError) as info:
        versions.load(write(tmp_path, mutated(_set(["components", "demo", "ref"], ""))))
    assert str(info.value) == "versions.yaml: components.demo.ref: must not be an empty string"


# The semantic pass refuses what the schema refuses where a value reaches git, pip, nvcc or the file system, so a
# schema edit cannot reopen it (and versions files of other commits, read without the tree, get the same rules).
SEMANTIC = [
    ("git-option", _set(["components", "demo", "source"], {"git": "--upload-pack=touch PWNED;true"}),
     "versions.yaml: components.demo.source.git: '--upload-pack=touch PWNED;true' starts with '-', which git and pip "
     "would read as an option; remove the '-'"),
    ("sdist-option", _set(["components", "demo", "source"], {"sdist": "--index-url=x"}),
     "versions.yaml: components.demo.source.sdist: '--index-url=x' starts with '-', which git and pip would read as an "
     "option; remove the '-'"),
    ("git-transport", _set(["components", "demo", "source"], {"git": "fd::0"}),
     "versions.yaml: components.demo.source.git: 'fd::0' is not a clone URL git may be given here; write "
     "https://host/owner/repo.git, ssh://host/path, git@host:owner/repo.git or a local repository (/path, "
     "./path, ../path or file:///path)"),
    ("ref-option", _set(["components", "demo", "ref"], "-c"),
     "versions.yaml: components.demo.ref: '-c' starts with '-', which git and pip would read as an option; remove the '-'"),
    ("ref-dot", _set(["components", "demo", "ref"], "."),
     "versions.yaml: components.demo.ref: '.' names no branch, tag or commit; write e.g. v1.2.0 or main"),
    ("ref-dot-dot", _set(["components", "demo", "ref"], "a..b"),
     "versions.yaml: components.demo.ref: 'a..b' contains '..', which git refuses in a branch or tag name; write the "
     "ref as git shows it"),
    ("ref-lock", _set(["components", "demo", "ref"], "v1.lock"),
     "versions.yaml: components.demo.ref: 'v1.lock' has a part that ends in '.lock' ('v1.lock'), which git refuses in "
     "a branch or tag name; write the ref as git shows it"),
    ("ref-tilde", _set(["components", "demo", "ref"], "HEAD~1"),
     "versions.yaml: components.demo.ref: 'HEAD~1' contains '~', which git refuses in a branch or tag name; write the "
     "ref as git shows it"),
    ("tag-too-long", _set(["components", "demo", "ref"], "v" * 190),
     "versions.yaml: components.demo.ref: makes the release tag 'demo-" + "v" * 55 + "…(220 characters)', which is "
     "220 characters long, more than 200; shorten the ref (or the component name)"),
    ("arch-list", _set(["components", "demo", "torch_cuda_arch_list"], "banana;9.0"),
     "versions.yaml: components.demo.torch_cuda_arch_list: CUDA arch list: 'banana' is not an architecture; "
     "write e.g. 8.0, 90, 9.0a or 12.0f"),
    ("arch-list-empty", _set(["components", "demo", "torch_cuda_arch_list"], ";"),
     'versions.yaml: components.demo.torch_cuda_arch_list: names no CUDA arch; write e.g. "8.0;9.0", or null when '
     "the component sets its own"),
    ("patch-outside", _set(["components", "demo", "patches"], ["/etc/passwd"]),
     "versions.yaml: components.demo.patches[0]: /etc/passwd is outside the repository; give a path relative to the "
     "repository root"),
    ("path-outside", _set(["components", "demo", "source"], {"path": "tests/../../x"}),
     "versions.yaml: components.demo.source.path: tests/../../x is outside the repository; give a path relative to "
     "the repository root"),
]


@pytest.mark.parametrize("check_tree", [True, False])
@pytest.mark.parametrize("case,change,expected", SEMANTIC, ids=[case for case, _, _ in SEMANTIC])
def test_semantic_pass_refuses_values_the_schema_refuses(tmp_path, case, change, expected, check_tree):
    path = write(tmp_path, mutated(change))
    loaded = versions._build(path, yaml.safe_load(path.read_text()))
    with pytest.raises(ConfigError) as info:
        versions._check_semantics(loaded, REPO if check_tree else None)
    assert str(info.value) == expected


def test_symlinked_patch_leading_out_of_the_repository_is_refused(tmp_path):
    root = tmp_path / "repo"
    (root / "build_scripts").mkdir(parents=True)
    (root / "build_scripts" / "fixture.sh").write_text("")
    (root / "patches").mkdir()
    (root / "patches" / "p.py").symlink_to("/etc/passwd")
    doc = mutated(_set(["components", "demo", "patches"], ["patches/p.py"]))
    with pytest.raises(ConfigError, match=r"patches\[0\]: patches/p.py is outside the repository"):
        versions.load(write(tmp_path, doc), repo_root=root)


# --- bounded reading: any file is read in bounded time and memory, or refused in one line -----------


FIXTURE_TEXT = (REPO / "tests" / "fixtures" / "versions.yaml").read_text()
AFTER_FIXTURE = FIXTURE_TEXT.count("\n") + 1  # the first line a case appends to the fixture's text


def alias_bomb(levels: int) -> str:
    """A few hundred bytes whose aliases expand to 9**levels values, under a key that takes free-form entries."""
    lines = ['    l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"    l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "verl_reference_versions:\n  bomb:\n" + "\n".join(lines) + f"\n  use: *l{levels - 1}\n" + FIXTURE_TEXT


BOUNDS = [
    ("alias-bomb", alias_bomb(6),
     "more than 20000 values with aliases expanded at line 7; a versions file needs far fewer: "
     "write values out instead of repeating aliases"),
    ("alias-inside-itself", FIXTURE_TEXT + "x-loop: &loop [1, *loop]\n",
     f"alias *loop is inside the value it names at line {AFTER_FIXTURE}; remove the alias"),
    ("deep-flow", FIXTURE_TEXT + "x-deep: " + "[" * 5000 + "]" * 5000 + "\n",
     f"nested more than 20 levels at line {AFTER_FIXTURE}; a versions file needs far fewer: flatten it"),
    ("deep-block", FIXTURE_TEXT + "x-deep:\n" + "".join(" " * (i + 1) + "- \n" for i in range(400)),
     f"nested more than 20 levels at line {AFTER_FIXTURE + 20}; a versions file needs far fewer: flatten it"),
    ("deep-mapping", FIXTURE_TEXT + "x-deep: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
     f"nested more than 20 levels at line {AFTER_FIXTURE}; a versions file needs far fewer: flatten it"),
    ("too-many-values", FIXTURE_TEXT + "x-many: [" + "1," * 20000 + "]\n",
     f"more than 20000 values with aliases expanded at line {AFTER_FIXTURE}; a versions file needs far fewer: "
     "write values out instead of repeating aliases"),
    ("too-large", FIXTURE_TEXT + "# " + "x" * (1 << 20) + "\n",
     "larger than 1 MiB; a versions file needs far less: remove what is not build configuration"),
    ("list-as-key", FIXTURE_TEXT + "? [a, b]\n: 1\n", f"invalid YAML at line {AFTER_FIXTURE} column 3: a list cannot be a mapping key; "
     "fix the syntax there"),
]


@pytest.mark.parametrize("case,text,expected", BOUNDS, ids=[case for case, _, _ in BOUNDS])
def test_a_document_past_the_bounds_is_refused_while_reading(tmp_path, case, text, expected):
    with pytest.raises(ConfigError) as info:
        versions.load(write(tmp_path, text))
    assert str(info.value) == f"versions.yaml: {expected}"


def test_the_bounds_leave_room_for_aliases_and_many_times_the_real_file(tmp_path):
    real = (REPO / "versions.yaml").read_text()
    assert len(real.encode()) * 20 < versions.MAX_FILE_BYTES
    shared = FIXTURE_TEXT + "    extra_env: &env {A: '1', B: '2'}\n    arch_overrides: {x86_64: {extra_env: *env}}\n"
    component = versions.load(write(tmp_path, shared)).component("wheelhouse-fixture")
    assert dict(component.settings_for("x86_64").extra_env) == {"A": "1", "B": "2"}


@pytest.mark.parametrize("case", ["alias-bomb", "deep-flow"])
def test_invoke_matrix_ends_a_document_past_the_bounds_in_one_line_and_exit_2(tmp_path, case):
    _, text, expected = next(bound for bound in BOUNDS if bound[0] == case)
    result = run_matrix(write(tmp_path, text))
    assert (result.returncode, result.stderr) == (2, f"error: versions.yaml: {expected}\n")


def test_the_release_tag_is_bounded_where_each_of_its_parts_is_within_its_own_limit(tmp_path):
    """A 64-character component name and a 128-character ref pass the schema; the tag made of both would not
    fit the file names made from it (the store's folder, the build record)."""
    doc = mutated(lambda d: d["components"].__setitem__("c" * 64, d["components"].pop("demo")))
    doc["components"]["c" * 64]["ref"] = "r" * 128
    result = run_matrix(write(tmp_path, doc))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "error: versions.yaml: components." + "c" * 64 + ".ref: makes the release tag '" + "c" * 60 + "…(218 "
        "characters)', which is 218 characters long, more than 200; shorten the ref (or the component name)\n")


CLONE_URLS = {
    "https://github.com/NVIDIA/apex.git": True,
    "https://git.example.com:8443/group/sub/repo": True,
    "ssh://git@github.com/NVIDIA/apex.git": True,
    "ssh://host:2222/srv/repo.git": True,
    "git@github.com:NVIDIA/apex.git": True,
    "/srv/git/repo.git": True,
    "./upstream": True,
    "../upstream.git": True,
    "file:///srv/git/repo.git": True,
    # remote helpers (<transport>::<address>) and other schemes
    "fd::0": False,
    "fd::3,4": False,
    "ext::sh%S%x20-c%x20id": False,
    "https::github.com/x": False,
    "git://github.com/NVIDIA/apex.git": False,
    "http://github.com/NVIDIA/apex.git": False,
    "ftp://host/repo": False,
    # options and hosts git would hand to ssh as options
    "ssh://-oProxyCommand=touch%20x/y": False,
    "git@host:-oProxyCommand=x": False,
    "-uhost:repo": False,
    # credentials in the URL, no path, relative paths without ./ (git reads host:path as ssh)
    "https://user:secret@github.com/x.git": False,
    "https://github.com": False,
    "host:owner/repo": False,
    "upstream": False,
    "~/upstream": False,
    "/": False,
    "https://github.com/a b": False,
}


@pytest.mark.parametrize("url,accepted", CLONE_URLS.items(), ids=list(CLONE_URLS))
def test_schema_and_loader_accept_the_same_clone_urls(url, accepted):
    """The schema (editors) and the semantic pass (which a schema edit cannot reopen) allow the same forms."""
    pattern = _schema_defs()["source"]["properties"]["git"]["pattern"]
    assert bool(re.match(pattern, url)) == accepted
    assert (versions._CLONE_URL.fullmatch(url) is not None) == accepted
