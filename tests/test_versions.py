"""versions.yaml: the real file expands as promised; malformed files get one clear line and exit 2."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ci import matrix, versions
from ci.errors import ConfigError

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
    assert len(rows) == 28
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
    assert row["release_tag"] == "apex-master-py3.12-torch2.13.0"


def test_release_naming_matches_the_anchor(real):
    rows = matrix.select(matrix.expand(real), versions=real, component="transformer-engine", python="3.11")
    assert rows[0].release_tag == "transformer-engine-v2.16.1-py3.11-torch2.13.0"
    assert matrix.release_title(real, rows[0]) == (
        "transformer-engine v2.16.1 - cu13.0.2 py3.11 torch2.13.0; aarch64 cu13.0.2 py3.11 torch2.13.0"
    )
    assert rows[0].world == "cu130/torch2.13"


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


def test_config_error_is_the_library_error_type(tmp_path):
    with pytest.raises(ConfigError) as info:
        versions.load(write(tmp_path, mutated(_set(["components", "demo", "ref"], ""))))
    assert str(info.value) == "versions.yaml: components.demo.ref: must not be an empty string"
