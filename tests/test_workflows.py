"""The generated GitHub Actions workflows: current, derived from versions.yaml, lint-clean and least-privilege.

The security properties are asserted on the parsed YAML, so a hand edit to
ci/flows/workflows.py that weakens one fails here even when actionlint is happy.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci.base.errors import ConfigError
from ci.flows import workflows
from ci.model import matrix, naming
from ci.model.versions import DEFAULT_VERSIONS, REPO_ROOT, load

WF = workflows.WORKFLOWS_DIR
BUILD = f"{WF}/_build.yml"
PUBLISH = f"{WF}/_publish.yml"
SHARD = f"{WF}/_build_shard.yml"
REUSABLE = (BUILD, PUBLISH, SHARD)
PUBLISH_INDEX = f"{WF}/publish-index.yml"


@pytest.fixture(scope="module")
def versions():
    return load()


@pytest.fixture(scope="module")
def generated(versions) -> dict[str, str]:
    return workflows.generate(versions)


@pytest.fixture(scope="module")
def docs(generated) -> dict[str, dict]:
    return {path: yaml.safe_load(text) for path, text in generated.items()}


def _raw_versions() -> dict:
    return yaml.safe_load(DEFAULT_VERSIONS.read_text(encoding="utf-8"))


def _write_versions(tmp_path: Path, data: dict):
    path = tmp_path / "versions.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load(path)


def _on(doc: dict) -> dict:
    # safe_load is YAML 1.1: the plain key `on` reads as True.
    return doc.get("on", doc.get(True))


def _steps(doc: dict):
    for job_id, job in doc["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def _text(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=True, width=10000)


def _script(name: str) -> str:
    return (REPO_ROOT / workflows.SCRIPTS_DIR / name).read_text(encoding="utf-8")


def _run_script(name: str, env: dict[str, str], *args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"] if path is None else f"{path}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(REPO_ROOT / workflows.SCRIPTS_DIR / name), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60, cwd=env.get("PWD"))


def _build_workflows(docs: dict[str, dict]) -> list[str]:
    """Every workflow that builds or publishes (all but the PR plan)."""
    return [path for path in docs if not path.endswith("/plan.yml")]


# --- generated == committed ----------------------------------------------------------------------


def test_committed_workflows_are_current(versions):
    assert workflows.check(versions, REPO_ROOT) == [], "run `invoke workflows` and commit the result"


def test_generating_into_a_fresh_tree_equals_the_committed_files(versions, tmp_path):
    written = workflows.write(versions, tmp_path)
    assert written == sorted(workflows.generate(versions))
    fresh = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / WF).iterdir())
    committed = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / WF).iterdir() if workflows.is_generated(p))
    assert fresh == committed
    for rel in fresh:
        assert (tmp_path / rel).read_bytes() == (REPO_ROOT / rel).read_bytes(), rel
    assert workflows.check(versions, tmp_path) == []
    assert workflows.write(versions, tmp_path) == []  # idempotent


def test_output_is_stable_and_marked(versions, generated):
    assert workflows.generate(versions) == generated
    assert list(generated) == sorted(generated)
    for path, text in generated.items():
        assert text.startswith(workflows.HEADER + "\n"), path
        assert text.endswith("\n") and not text.endswith("\n\n"), path
        assert "\t" not in text, path
        assert "\non:\n" in text, f"{path}: the trigger key should read `on:`"


def test_one_workflow_per_component(versions, generated):
    expected = {f"{WF}/build-{name}.yml" for name in versions.components}
    fixed = {BUILD, PUBLISH, PUBLISH_INDEX, f"{WF}/build-all.yml", f"{WF}/release.yml", f"{WF}/plan.yml"}
    fixed.add(SHARD)  # versions.yaml splits flashinfer's rows into shards
    assert set(generated) == expected | fixed


# --- derived from versions.yaml ------------------------------------------------------------------


def test_adding_a_component_needs_its_workflow(tmp_path):
    data = _raw_versions()
    data["components"]["flash-mla-next"] = copy.deepcopy(data["components"]["flash-mla"])
    changed = _write_versions(tmp_path, data)
    assert workflows.check(changed, REPO_ROOT) == [f"{WF}/build-flash-mla-next.yml"]
    doc = yaml.safe_load(workflows.generate(changed)[f"{WF}/build-flash-mla-next.yml"])
    plan = {step.get("id"): step for step in doc["jobs"]["plan"]["steps"]}["plan"]
    assert plan["run"] == "invoke plan --component flash-mla-next --github-output\n"


def test_adding_a_python_changes_the_dispatch_choices(tmp_path):
    data = _raw_versions()
    for row in [r for r in data["build_matrix"] if r["python"] == "3.12"]:
        data["build_matrix"].append({**row, "python": "3.13"})
    changed = _write_versions(tmp_path, data)
    stale = workflows.check(changed, REPO_ROOT)
    assert f"{WF}/build-all.yml" in stale
    assert f"{WF}/build-flash-mla.yml" in stale
    # components pinned to Python 3.12 do not change
    assert f"{WF}/build-megatron-bridge.yml" not in stale
    assert f"{WF}/build-flashinfer.yml" not in stale
    assert BUILD not in stale

    doc = yaml.safe_load(workflows.generate(changed)[f"{WF}/build-flash-mla.yml"])
    assert _on(doc)["workflow_dispatch"]["inputs"]["python"]["options"] == ["all", "3.11", "3.12", "3.13"]
    every = yaml.safe_load(workflows.generate(changed)[f"{WF}/build-all.yml"])
    assert _on(every)["workflow_dispatch"]["inputs"]["python"]["options"] == ["all", "3.11", "3.12", "3.13"]


def test_dispatch_choices_follow_each_component(docs, versions):
    def options(name: str, field: str) -> list[str]:
        return _on(docs[f"{WF}/build-{name}.yml"])["workflow_dispatch"]["inputs"][field]["options"]

    assert options("megatron-bridge", "arch") == ["all", "x86_64"]
    assert options("megatron-bridge", "python") == ["all", "3.12"]
    assert options("flashinfer", "arch") == ["all", "aarch64", "x86_64"]
    assert options("deep-gemm", "python") == ["all", "3.11", "3.12"]  # one bundle row covers both
    arches = sorted({row.arch for row in versions.build_matrix})
    assert _on(docs[f"{WF}/build-all.yml"])["workflow_dispatch"]["inputs"]["arch"]["options"] == ["all", *arches]


def test_removed_component_leaves_a_stale_file_that_write_removes(tmp_path, versions):
    target = tmp_path / "tree"
    workflows.write(versions, target)
    (target / WF / "hand-written.yml").write_text("name: mine\non: push\n", encoding="utf-8")
    data = _raw_versions()
    del data["components"]["flash-mla"]
    smaller = _write_versions(tmp_path, data)
    assert workflows.check(smaller, target) == [f"{WF}/build-flash-mla.yml"]
    assert workflows.write(smaller, target) == [f"{WF}/build-flash-mla.yml"]
    assert not (target / WF / "build-flash-mla.yml").exists()
    assert (target / WF / "hand-written.yml").exists()


def test_hand_edit_is_reported(tmp_path, versions):
    workflows.write(versions, tmp_path)
    path = tmp_path / WF / "build-apex.yml"
    path.write_text(path.read_text(encoding="utf-8").replace("cancel-in-progress: false", "cancel-in-progress: true"))
    (tmp_path / BUILD).unlink()
    assert workflows.check(versions, tmp_path) == [BUILD, f"{WF}/build-apex.yml"]


# --- actionlint ----------------------------------------------------------------------------------


def _tool(name: str) -> str | None:
    path = os.pathsep.join([sysconfig.get_path("scripts"), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


def test_actionlint_reports_nothing(tmp_path, versions):
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (it comes with requirements.txt)")
    workflows.write(versions, tmp_path)
    (tmp_path / ".git").mkdir()  # actionlint resolves ./.github/workflows/... from the project root
    env = dict(os.environ)
    shellcheck = _tool("shellcheck")
    if shellcheck:  # actionlint runs shellcheck over every run: script when it finds it on PATH
        env["PATH"] = os.pathsep.join([str(Path(shellcheck).parent), env.get("PATH", "")])
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / WF).glob("*.yml"))
    result = subprocess.run(
        [actionlint, "-no-color", *files], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


# --- security and robustness properties ----------------------------------------------------------


def test_builds_are_never_cancelled_in_progress(docs):
    for path in _build_workflows(docs):
        text = _text(docs[path])
        assert "cancel-in-progress: true" not in text, path
    for path in docs:
        if path.split("/")[-1].startswith("build-") or path.endswith("/release.yml"):
            assert docs[path]["concurrency"]["cancel-in-progress"] is False, path


def _assert_write_is_expected(docs, path, job_id, scope):
    """The one kind of job each write grant is for."""
    name = path.split("/")[-1]
    if scope == "contents":
        # only the jobs that call _publish.yml
        assert job_id == "publish" and docs[path]["jobs"][job_id]["uses"] == f"./{PUBLISH}", (path, job_id)
        assert (name.startswith("build-") and name != "build-all.yml") or name == "release.yml"
    elif scope == "pages":
        assert job_id in ("deploy", "publish-index")
    elif scope == "id-token":  # Pages deploys, and the artifact attestation of the publish job
        assert job_id in ("deploy", "publish-index", "publish")
    elif scope == "attestations":
        assert job_id == "publish" and docs[path]["jobs"][job_id]["uses"] == f"./{PUBLISH}", (path, job_id)
    elif scope == "pull-requests":
        assert name == "plan.yml" and job_id == "plan"
    else:
        pytest.fail(f"{path}: {job_id} writes {scope}")


def test_permissions_are_explicit_and_least(docs):
    # the reusable workflows state each job's grant (a called job can only lower its caller's)
    assert docs[BUILD]["jobs"]["build"]["permissions"] == {"contents": "read"}
    assert docs[PUBLISH]["jobs"]["publish"]["permissions"] == {"contents": "write", "id-token": "write",
                                                              "attestations": "write"}
    for path, doc in docs.items():
        if path in REUSABLE:
            assert "permissions" not in doc and len(doc["jobs"]) == 1
            continue
        assert doc["permissions"] == {}, f"{path}: the workflow default must grant nothing"
        for job_id, job in doc["jobs"].items():
            assert "permissions" in job, f"{path}: job {job_id} has no permissions"
            for scope, level in job["permissions"].items():
                assert level in ("read", "write"), (path, job_id, scope)
    writes = {
        (path, job_id, scope)
        for path, doc in docs.items() if path not in REUSABLE
        for job_id, job in doc["jobs"].items()
        for scope, level in job["permissions"].items() if level == "write"
    }
    for path, job_id, scope in writes:
        _assert_write_is_expected(docs, path, job_id, scope)
    for path, doc in docs.items():
        if "build" in doc["jobs"] and path not in REUSABLE:
            assert doc["jobs"]["build"]["permissions"] == {"contents": "read"}, path


def test_secrets_reach_only_the_steps_that_use_them(docs):
    token_steps: set[tuple[str, str]] = set()
    proxy_steps: set[tuple[str, str]] = set()
    for path, doc in docs.items():
        assert "env" not in doc, f"{path}: no workflow-wide env"
        for job_id, job in doc["jobs"].items():
            outside_steps = {key: value for key, value in job.items() if key not in ("steps", "secrets")}
            assert not re.search(r"secrets\.|GITHUB_TOKEN|github\.token", _text(outside_steps)), (path, job_id)
            if "secrets" in job:
                assert job["uses"] in (f"./{BUILD}", f"./{SHARD}"), f"{path}: {job_id} passes secrets to {job['uses']}"
                assert job["secrets"] == {"EGRESS_PROXY": "${{ secrets.EGRESS_PROXY }}"}
        for _job_id, step in _steps(doc):
            text = _text(step)
            where = f"{path}: {step['name']}"
            if re.search(r"GITHUB_TOKEN|github\.token|secrets\.GITHUB_TOKEN", text):
                token_steps.add((path.split("/")[-1], step["name"]))
                # given through env only, and only to steps that talk to the GitHub API
                assert not re.search(r"secrets\.|github\.token", _text({k: v for k, v in step.items() if k != "env"})), where
                assert re.match(r"(invoke (release|plan|publish-index)|bash build_scripts/ci/(publish_row|plan_comment)\.sh)",
                                step["run"]), where
            if "EGRESS_PROXY" in text:
                proxy_steps.add((path.split("/")[-1], step["name"]))
                assert path in (BUILD, SHARD), where
                for key, value in step["env"].items():
                    if "EGRESS_PROXY" in value:
                        assert key in ("HTTP_PROXY", "HTTPS_PROXY"), where
                        assert value == "${{ runner.environment == 'self-hosted' && secrets.EGRESS_PROXY || '' }}", where
            other = re.sub(r"secrets\.(GITHUB_TOKEN|EGRESS_PROXY)", "", text)
            assert "secrets." not in other, f"{where}: an unexpected secret"
    components = {f"build-{name}.yml" for name in ("apex", "flash-mla")}
    assert {(name, "Plan the rows that need building") for name in components} <= token_steps
    assert {name for name, _ in token_steps} >= {"_publish.yml", "publish-index.yml", "plan.yml"}
    assert "_build.yml" not in {name for name, _ in token_steps}, "the job running upstream code gets no token"
    assert {step for name, step in token_steps if name == "_publish.yml"} == {"Publish to the release"}
    assert proxy_steps == {
        ("_build.yml", "Restore the compiler cache"),
        ("_build.yml", "Save the compiler cache"),
        ("_build.yml", "Restore an interrupted build"),
        ("_build.yml", "Save the interrupted build"),
        ("_build.yml", "Upload wheel artifact"),
        ("_build.yml", "Download the shards"),
        ("_build_shard.yml", "Restore the compiler cache"),
        ("_build_shard.yml", "Save the compiler cache"),
        ("_build_shard.yml", "Restore an interrupted build"),
        ("_build_shard.yml", "Save the interrupted build"),
        ("_build_shard.yml", "Upload the shard artifact"),
    }


def test_self_hosted_is_detected_one_way(generated):
    # runner.environment, never the runs_on labels (the anchor used both and disagreed with itself)
    for path, text in generated.items():
        for match in re.finditer(r"'self-hosted'", text):
            before = text[max(0, match.start() - 30):match.start()]
            assert re.search(r"runner\.environment [!=]= $", before), f"{path}: {before}{match.group(0)}"
        assert "contains(" not in text, path
        assert text.count("inputs.runs_on") == (1 if path in (BUILD, SHARD) else 0), path


def test_run_scripts_take_values_from_env_only(docs):
    # No ${{ }} inside a script: nothing from an input or an event can be spliced into shell code.
    for path, doc in docs.items():
        for _, step in _steps(doc):
            if "run" in step:
                assert "${{" not in step["run"], f"{path}: {step['name']}"


def test_every_run_is_one_short_command(docs):
    """Anything longer than one command is a script in build_scripts/ci/ (shellcheck-clean, linted by
    `nox -s lint`) that the step calls with its inputs in env; no script text lives in the YAML."""
    used = set()
    for path, doc in docs.items():
        for _, step in _steps(doc):
            if "run" not in step:
                continue
            run = step["run"]
            assert run.endswith("\n") and "\n" not in run[:-1], f"{path}: {step['name']}: {run!r}"
            assert len(run) <= 100, f"{path}: {step['name']}: {run!r}"
            for script in re.findall(r"\b(build_scripts/\S+\.sh)\b", run):
                assert (REPO_ROOT / script).is_file(), f"{path}: {step['name']}: no {script}"
                used.add(script)
    ours = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / workflows.SCRIPTS_DIR).glob("*.sh")}
    assert ours and ours <= used, f"scripts no workflow calls: {sorted(ours - used)}"


def test_checkouts_leave_no_credentials(docs):
    for path, doc in docs.items():
        for _, step in _steps(doc):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, path


def test_third_party_actions_are_pinned_to_commits(docs, generated):
    for path, doc in docs.items():
        for job_id, job in doc["jobs"].items():
            if "uses" in job:
                assert job["uses"].startswith("./.github/workflows/"), (path, job_id)
        for _, step in _steps(doc):
            if "uses" in step:
                assert step["uses"] in workflows.ACTIONS.values(), f"{path}: {step['uses']}"
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"]), f"{path}: {step['uses']}"
    for path, text in generated.items():
        for line in text.splitlines():
            if re.search(r"uses: \S+@[0-9a-f]{40}", line):
                # the release each commit is, for readers and for the next update
                assert re.search(r"@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), f"{path}: {line}"


def test_caches_cannot_carry_one_builds_files_into_another(docs):
    """The build step runs upstream code, which can write into whatever it reaches (adversarial re-run N21):
    the compiler cache is restored only under its exact key (the component and a hash of the build inputs; no
    prefix match), saved only by a successful build that found no entry. A build directory is cached only
    when its build stopped at build_timeout, and read back only by a re-run of the same row (component, arch,
    CUDA, Python, torch) with the same inputs: its key's prefix names all of them. Leftovers of an earlier job
    on a reused self-hosted workspace are removed before anything runs."""
    doc = docs[BUILD]
    steps = {step["name"]: step for _, step in _steps(doc)}
    restore, save = steps["Restore the compiler cache"], steps["Save the compiler cache"]
    resume, keep = steps["Restore an interrupted build"], steps["Save the interrupted build"]
    assert [s for s in steps.values() if "cache" in s.get("uses", "")] == [restore, resume, save, keep]
    inputs = "${{ hashFiles('build_scripts/**', 'patches/**', 'versions.yaml') }}"
    assert restore["with"] == save["with"] == {
        "path": ".cache/compiler-cache/",
        "key": "wheelhouse-cc-${{ inputs.component }}-${{ inputs.arch }}-cu${{ inputs.cuda }}-torch${{ inputs.torch }}-"
               + inputs}
    assert save["if"] == ("steps.build.outcome == 'success' && steps.restore.outputs.cache-hit != 'true' "
                          "&& env.WHEELHOUSE_COMPILER_CACHE_MODE == 'read-only'")
    assert restore["id"] == "restore" and restore["if"] == "env.WHEELHOUSE_COMPILER_CACHE_MODE == 'read-only'"
    row = ("wheelhouse-resume-${{ inputs.component }}-${{ inputs.arch }}-cu${{ inputs.cuda }}-py${{ inputs.python }}-"
           f"torch${{{{ inputs.torch }}}}-{inputs}-")
    assert resume["with"] == {"path": ".cache/builds/\n.cache/compiler-cache/\n", "restore-keys": row,
                              "key": row + "${{ github.run_id }}-${{ github.run_attempt }}"}
    assert keep["with"] == {"path": resume["with"]["path"], "key": resume["with"]["key"]}
    assert keep["if"] == "always() && steps.build.outputs.resumable == 'true'"
    assert tuple(resume["with"]["path"].split()) == workflows.RESUME_PATHS
    names = list(steps)
    assert names.index("Remove the output of earlier jobs") < names.index("Restore the compiler cache") \
        < names.index("Restore an interrupted build") < names.index("Build wheel") \
        < names.index("Save the compiler cache") < names.index("Save the interrupted build")
    assert steps["Remove the output of earlier jobs"]["run"] == "rm -rf dist .cache/builds .cache/compiler-cache/\n"


def test_build_job_runs_the_local_commands(docs, versions):
    doc = docs[BUILD]
    job = doc["jobs"]["build"]
    steps = {step["name"]: step for step in job["steps"]}
    assert job["timeout-minutes"] == "${{ inputs.job_timeout_minutes }}"
    assert job["runs-on"] == "${{ fromJSON(inputs.runs_on) }}"
    assert job["steps"][0]["name"] == "Verify the runner architecture"
    assert job["steps"][0]["run"] == "bash build_scripts/ci/check_runner_arch.sh\n"
    assert job["steps"][0]["env"] == {"WANT_ARCH": "${{ inputs.arch }}"}
    assert steps["Build wheel"]["run"] == 'nox -s "$SESSION" -- --arch "$ARCH" --torch "$TORCH"\n'
    assert steps["Build wheel"]["env"]["SESSION"] == "${{ inputs.session }}"
    assert steps["Install cuDNN"]["if"] == "inputs.requires_cudnn"
    assert "install_cudnn.sh" in steps["Install cuDNN"]["run"]
    for name in ("Free disk space", "Set up swap"):
        assert steps[name]["if"] == "runner.environment != 'self-hosted'"
    upload = steps["Upload wheel artifact"]["with"]
    assert upload["name"] == naming.artifact_name(*(f"${{{{ inputs.{f} }}}}" for f in ("component", "arch", "cuda", "python", "torch")))
    assert upload["path"] == "dist/${{ inputs.world }}/"
    assert job["steps"][-1]["name"] == "Upload wheel artifact", "the build's only way out is its artifact"
    assert "outputs" not in job and "outputs" not in _on(doc)["workflow_call"]
    assert not any("invoke release" in step.get("run", "") for step in job["steps"])

    # every input the callers pass exists, every required input is passed, every row key exists
    row_keys = set(matrix.expand(versions)[0].to_json())
    for reusable in REUSABLE:
        inputs = _on(docs[reusable])["workflow_call"]["inputs"]
        callers = 0
        for path, caller in docs.items():
            for job_id, job in caller["jobs"].items():
                if job.get("uses") != f"./{reusable}":
                    continue
                callers += 1
                assert set(job["with"]) == set(inputs), (path, job_id)
                assert job["strategy"]["fail-fast"] is False
                shard_keys = {"shard", "shard_index"} if reusable == SHARD else set()  # ci/model/shards.py matrix_entries
                for name, value in job["with"].items():
                    assert re.search(r"matrix\.(\w+)", value).group(1) in row_keys | shard_keys, (path, name)
        assert callers, reusable


def test_a_row_split_into_shards_is_built_by_shard_jobs_then_assembled(docs, versions):
    """flashinfer's rows (versions.yaml shards): one _build_shard.yml job per shard, each uploading its modules;
    the row's build job then downloads them all and assembles and checks the wheels; publish is unchanged."""
    doc = docs[f"{WF}/build-flashinfer.yml"]
    assert list(doc["jobs"]) == ["plan", "shards", "build", "build-rest", "publish", "publish-index"]
    plan, shard_jobs, build = doc["jobs"]["plan"], doc["jobs"]["shards"], doc["jobs"]["build"]
    assert plan["outputs"]["shards"] == "${{ steps.plan.outputs.shards || steps.select.outputs.shards }}"
    assert shard_jobs["uses"] == f"./{SHARD}" and shard_jobs["needs"] == "plan"
    assert shard_jobs["if"] == "needs.plan.outputs.has_shards == 'true'"
    assert shard_jobs["strategy"]["matrix"] == {"include": "${{ fromJSON(needs.plan.outputs.shards) }}"}
    assert shard_jobs["with"]["shard"] == "${{ matrix.shard }}" and shard_jobs["permissions"] == {"contents": "read"}
    # a failed shard still lets the build job run: its assembly names the missing shard, other rows build
    assert build["needs"] == ["plan", "shards"] and build["with"]["shards"] == "${{ matrix.shards }}"
    assert build["if"].startswith("always() && needs.plan.result == 'success' && ")
    assert build["if"].endswith("&& needs.shards.result != 'cancelled'")
    assert "shards" not in docs[f"{WF}/build-apex.yml"]["jobs"]  # a row not split: as before

    steps = {step["name"]: step for step in docs[BUILD]["jobs"]["build"]["steps"]}
    row = [f"${{{{ inputs.{f} }}}}" for f in ("component", "arch", "cuda", "python", "torch")]
    download = steps["Download the shards"]
    assert download["if"] == "inputs.shards > 1" and download["with"] == {
        "pattern": workflows.shard_artifact_name(*row, "*"), "merge-multiple": True,
        "path": "dist/${{ inputs.world }}/shards/"}
    assert steps["Build wheel"]["if"] == "inputs.shards <= 1"
    assert steps["Assemble the wheels from the shards"]["if"] == "inputs.shards > 1"
    assert steps["Assemble the wheels from the shards"]["run"] == (
        'invoke assemble-shards --component "$COMPONENT" --python "$PYTHON" --torch "$TORCH" --arch "$ARCH"\n')
    shard_steps = {step["name"]: step for step in docs[SHARD]["jobs"]["build"]["steps"]}
    assert "Download the shards" not in shard_steps and "Assemble the wheels from the shards" not in shard_steps
    assert shard_steps["Build wheel"]["run"] == 'nox -s "$SESSION" -- --arch "$ARCH" --torch "$TORCH" --shard "$SHARD"\n'
    assert shard_steps["Build wheel"]["env"]["SHARD"] == "${{ inputs.shard }}"
    upload = shard_steps["Upload the shard artifact"]["with"]
    assert upload["name"] == workflows.shard_artifact_name(*row, "${{ inputs.shard_index }}")
    assert upload["path"] == "dist/${{ inputs.world }}/shards/" and upload["if-no-files-found"] == "error"
    for name in ("Restore the compiler cache", "Save the compiler cache"):
        assert shard_steps[name]["with"]["key"].endswith("-shard${{ inputs.shard_index }}of${{ inputs.shards }}")
    # the pattern the assembly downloads takes every shard of its row and nothing else
    assert fnmatch.fnmatchcase(workflows.shard_artifact_name("flashinfer", "x86_64", "13.0.2", "3.12", "2.13.0", "7"),
                               workflows.shard_artifact_name("flashinfer", "x86_64", "13.0.2", "3.12", "2.13.0", "*"))
    assert not fnmatch.fnmatchcase(naming.artifact_name("flashinfer", "x86_64", "13.0.2", "3.12", "2.13.0"),
                                   workflows.shard_artifact_name("flashinfer", "x86_64", "13.0.2", "3.12", "2.13.0", "*"))


def test_the_matrix_output_has_one_entry_per_shard(tmp_path):
    out = tmp_path / "github_output"
    subprocess.run([sys.executable, "-m", "invoke", "matrix", "--component", "flashinfer", "--github-output"],
                   cwd=REPO_ROOT, env={**os.environ, "GITHUB_OUTPUT": str(out)}, check=True, capture_output=True)
    lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
    rows = json.loads(lines["matrix"])
    split = json.loads(lines["shards"])
    assert lines["has_shards"] == "true" and len(split) == sum(row["shards"] for row in rows)
    first = next(row for row in rows if row["arch"] == "x86_64")
    mine = [entry for entry in split if entry["arch"] == "x86_64"]
    assert [(e["shard"], e["shard_index"]) for e in mine] == [(f"{i}/{first['shards']}", i)
                                                              for i in range(1, first["shards"] + 1)]
    assert {k: v for k, v in mine[0].items() if k not in ("shard", "shard_index")} == first


def test_publish_runs_no_upstream_code_and_checks_the_wheels_again(docs):
    """The job that can write runs on a fresh GitHub-hosted runner: our checkout, our tools, the artifact."""
    build = {step["name"]: step for step in docs[BUILD]["jobs"]["build"]["steps"]}
    job = docs[PUBLISH]["jobs"]["publish"]
    steps = [step["name"] for step in job["steps"]]
    assert job["runs-on"] == workflows.CONTROL_RUNNER  # never the self-hosted runner the build used
    assert steps == ["Check out", "Set up Python", "Install the wheelhouse tools", "Download the wheel artifact",
                     "Check the wheels again", "Write the provenance predicate", "Sign the provenance",
                     "Publish to the release"]
    by_name = {step["name"]: step for step in job["steps"]}
    assert by_name["Check out"]["with"] == {"persist-credentials": False}
    download = by_name["Download the wheel artifact"]
    assert download["uses"] == workflows.ACTIONS["download-artifact"]
    assert download["with"]["name"] == build["Upload wheel artifact"]["with"]["name"]
    assert download["with"]["path"] == build["Upload wheel artifact"]["with"]["path"] == "dist/${{ inputs.world }}/"
    assert by_name["Check the wheels again"]["run"] == "bash build_scripts/ci/recheck_wheels.sh\n"
    recheck = _script("recheck_wheels.sh")
    assert 'invoke check-wheel --wheel "dist/$WORLD/*.whl" --pythons' in recheck and "--require-archs" in recheck
    # the torch ABI check too: against the row's torch wheel, downloaded and read in place, never installed
    assert 'python -m ci torch-wheel --component "$COMPONENT" --python "$PYTHON" --torch "$TORCH"' in recheck
    assert '--torch "$torch_wheel"' in recheck and "pip install" not in recheck
    env = by_name["Check the wheels again"]["env"]
    assert {env[k] for k in ("COMPONENT", "TORCH", "ARCH")} == {"${{ inputs.component }}", "${{ inputs.torch }}",
                                                              "${{ inputs.arch }}"}
    # our own scripts (build_scripts/ci/) are not the builders
    text = _text(job).replace("build_scripts/ci/", "")
    for upstream in ("nox", "build_scripts", "setup.py", "pip wheel"):
        assert upstream not in text, upstream
    release = by_name["Publish to the release"]
    assert release["run"] == "bash build_scripts/ci/publish_row.sh\n"
    assert 'invoke release --component "$COMPONENT"' in _script("publish_row.sh")
    assert job["outputs"]["published"] == "${{ steps.release.outputs.published }}"
    assert _on(docs[PUBLISH])["workflow_call"]["outputs"]["published"]["value"] == "${{ jobs.publish.outputs.published }}"


def test_publish_index_runs_after_partial_success(docs, versions):
    callers = [f"{WF}/build-{name}.yml" for name in versions.components] + [f"{WF}/release.yml"]
    for path in callers:
        job = docs[path]["jobs"]["publish-index"]
        assert job["uses"] == f"./{PUBLISH_INDEX}"
        condition = job["if"]
        assert condition.startswith("always()"), path
        assert "needs.publish.result != 'cancelled'" in condition
        assert "needs.publish.outputs.published == 'true'" in condition
        assert "== 'success'" not in condition and "success()" not in condition
        assert job["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    assert "publish-index" not in docs[f"{WF}/build-all.yml"]["jobs"]


def test_publish_triggers(docs, versions):
    for name in versions.components:
        doc = docs[f"{WF}/build-{name}.yml"]
        on = _on(doc)
        assert on["push"]["branches"] == ["main"]
        assert f"{WF}/build-{name}.yml" in on["push"]["paths"]
        for path in ("versions.yaml", "build_scripts/**", "patches/**", "ci/**", "requirements-tools.txt"):
            assert path in on["push"]["paths"]
        assert doc["jobs"]["publish"]["if"].endswith(" && github.event_name == 'push'")
        assert doc["jobs"]["publish"]["needs"] == ["plan", "build", "build-rest"]
        plan_steps = {step["id"]: step for step in doc["jobs"]["plan"]["steps"] if "id" in step}
        assert plan_steps["plan"]["run"] == f"invoke plan --component {name} --github-output\n"
        assert plan_steps["select"]["run"].startswith(f"invoke matrix --component {name} ")
    release = docs[f"{WF}/release.yml"]
    assert _on(release) == {"push": {"tags": ["v*"]}}
    assert "github.event_name" not in release["jobs"]["publish"]["if"]
    every = docs[f"{WF}/build-all.yml"]
    assert _on(every)["schedule"] and set(every["jobs"]) == {"plan", "shards", "build", "build-rest"}  # nothing is published


def test_pages_deploy(docs):
    doc = docs[PUBLISH_INDEX]
    assert set(_on(doc)) == {"workflow_call", "workflow_dispatch"}
    build, deploy = doc["jobs"]["build-index"], doc["jobs"]["deploy"]
    assert any(step.get("run") == "invoke publish-index --pages-artifact _site\n" for step in build["steps"])
    assert build["permissions"] == {"contents": "read"}
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    assert deploy["concurrency"] == {"group": "pages", "cancel-in-progress": False}


def test_plan_comment_is_updated_in_place_and_skipped_for_forks(docs):
    doc = docs[f"{WF}/plan.yml"]
    job = doc["jobs"]["plan"]
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    steps = {step["name"]: step for step in job["steps"]}
    assert steps["Plan the builds"]["run"] == "invoke plan --component all --markdown plan.md\n"
    assert steps["Show the plan in the job summary"]["run"] == 'cat plan.md >> "$GITHUB_STEP_SUMMARY"\n'
    comment = steps["Comment the plan on the pull request"]
    assert comment["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
    assert comment["run"] == "bash build_scripts/ci/plan_comment.sh\n"
    assert comment["env"]["MARKER"] == workflows.PLAN_MARKER and comment["env"]["PLAN"] == "plan.md"


def test_invoke_workflows_check_names_the_stale_file(tmp_path):
    """The task itself: passes on the committed tree, fails naming the file once versions.yaml gains a component."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    ok = subprocess.run([sys.executable, "-m", "invoke", "workflows", "--check"], cwd=repo, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    text = (repo / "versions.yaml").read_text() + (
        "\n  causal-conv1d:\n    source: {sdist: causal-conv1d}\n    ref: \"1.7.0\"\n    builder: causal_conv1d\n"
        "    runs_on: ubuntu-24.04\n"
    )
    changed = tmp_path / "versions.yaml"
    changed.write_text(text)
    stale = subprocess.run([sys.executable, "-m", "invoke", "workflows", "--check"], cwd=repo, capture_output=True,
                           text=True, env={**os.environ, "WHEELHOUSE_VERSIONS": str(changed)})
    assert stale.returncode == 1
    assert ".github/workflows/build-causal-conv1d.yml" in stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1


def test_the_first_python_of_each_compile_group_builds_before_the_others(tmp_path, versions, docs):
    """Two build stages: the first Python of each (component, arch, CUDA, torch) saves the compiler cache,
    the other Pythons restore it; every arch and world of a stage runs at once."""
    rows = [row for row in matrix.expand(versions) if row.component == "flash-mla"]
    first, rest = matrix.stages(rows)
    assert [(r.arch, r.python) for r in first] == [("x86_64", "3.11"), ("aarch64", "3.11")]
    assert [(r.arch, r.python) for r in rest] == [("x86_64", "3.12"), ("aarch64", "3.12")]
    jobs = docs[f"{WF}/build-flash-mla.yml"]["jobs"]
    assert jobs["build"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.plan.outputs.first) }}"
    assert jobs["build-rest"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.plan.outputs.rest) }}"
    assert jobs["build-rest"]["needs"] == ["plan", "build"]
    # a failed first row leaves its group's other Pythons to compile cold; only a cancelled run stops them
    assert jobs["build-rest"]["if"] == ("always() && needs.plan.outputs.has_rest == 'true' && "
                                        "needs.build.result != 'cancelled'")
    assert jobs["publish"]["needs"] == ["plan", "build", "build-rest"]
    assert "max-parallel" not in jobs["build"]["strategy"] and "max-parallel" not in jobs["build-rest"]["strategy"]
    # a bundle row is one per group, a one-Python component has no second stage
    assert matrix.stages([r for r in matrix.expand(versions) if r.component in ("deep-gemm", "flashinfer")])[1] == []

    data = _raw_versions()
    data["components"]["flash-mla"]["arch_overrides"] = {"x86_64": {"stage_pythons": False}}
    changed = _write_versions(tmp_path, data)
    first, rest = matrix.stages(r for r in matrix.expand(changed) if r.component == "flash-mla")
    assert [(r.arch, r.python) for r in first] == [("x86_64", "3.11"), ("x86_64", "3.12"), ("aarch64", "3.11")]
    assert [(r.arch, r.python) for r in rest] == [("aarch64", "3.12")]
    data["components"]["flash-mla"]["stage_pythons"] = "yes"
    with pytest.raises(ConfigError, match=r"^versions\.yaml: components\.flash-mla\.stage_pythons: "):
        _write_versions(tmp_path, data)


def test_the_plan_job_writes_both_stages(tmp_path):
    out = tmp_path / "gh_output"
    result = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--component", "flash-mla", "--arch", "x86_64",
                             "--github-output"], cwd=REPO_ROOT, capture_output=True, text=True,
                            env={**os.environ, "GITHUB_OUTPUT": str(out)})
    assert result.returncode == 0, result.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert [r["python"] for r in json.loads(outputs["matrix"])] == ["3.11", "3.12"]
    assert [r["python"] for r in json.loads(outputs["first"])] == ["3.11"]
    assert [r["python"] for r in json.loads(outputs["rest"])] == ["3.12"]
    assert outputs["has_builds"] == outputs["has_rest"] == "true"


# --- the scripts the steps call, run for real ----------------------------------------------------


def test_runner_arch_check_fails_on_another_arch():
    here = os.uname().machine
    assert _run_script("check_runner_arch.sh", {"WANT_ARCH": here}).returncode == 0
    wrong = _run_script("check_runner_arch.sh", {"WANT_ARCH": "sparc64"})
    assert wrong.returncode == 1
    assert wrong.stdout.strip() == (f"::error::this row builds sparc64 but the runner is {here}; "
                                    "fix runs_on in versions.yaml")


def test_python_list_puts_the_build_python_last(tmp_path):
    out = tmp_path / "output"
    assert _run_script("list_pythons.sh", {"PYTHON": "3.13", "BUNDLE": "3.11 3.12 3.13",
                                           "GITHUB_OUTPUT": str(out)}).returncode == 0
    assert out.read_text() == "versions<<EOF\n3.11\n3.12\n3.13\nEOF\n"
    out.unlink()
    assert _run_script("list_pythons.sh", {"PYTHON": "3.12", "BUNDLE": "", "GITHUB_OUTPUT": str(out)}).returncode == 0
    assert out.read_text() == "versions<<EOF\n3.12\nEOF\n"


def test_plan_comment_edits_the_marked_comment_or_creates_one(tmp_path):
    """gh (GitHub's CLI) is replaced by a recorder that answers the comment listing with ``IDS``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> "$GH_LOG"\n'
                                'if [[ "$*" == *--paginate* ]]; then printf "%b" "$IDS"; fi\n')
    (bin_dir / "gh").chmod(0o755)
    (tmp_path / "plan.md").write_text("| row | build |\n")
    log = tmp_path / "gh.log"
    env = {"REPO": "o/r", "PR": "7", "MARKER": workflows.PLAN_MARKER, "PLAN": str(tmp_path / "plan.md"),
           "GH_LOG": str(log)}
    assert _run_script("plan_comment.sh", {**env, "IDS": "41\\n52\\n"}, path=bin_dir).returncode == 0
    listing, edit = log.read_text().splitlines()[:2]
    assert listing.startswith("api --paginate repos/o/r/issues/7/comments --jq ")
    assert f'startswith(\"{workflows.PLAN_MARKER}\")' in listing and "github-actions[bot]" in listing
    assert edit.startswith("api --method PATCH repos/o/r/issues/comments/41 -f body=" + workflows.PLAN_MARKER)
    log.unlink()
    assert _run_script("plan_comment.sh", {**env, "IDS": ""}, path=bin_dir).returncode == 0
    assert log.read_text().splitlines()[1].startswith("api --method POST repos/o/r/issues/7/comments -f body=")


# --- the remote compiler cache (ci/building/remote_cache.py) -----------------------------------------------


def _github_expression(expression: str, context: dict[str, str]) -> object:
    """Evaluate the cache mode's expression as GitHub does: ``&&``/``||`` give an operand (as Python's and/or),
    ``format('{0}', x)`` is str.format, a missing context value is null (an empty string in a format)."""
    body = expression.removeprefix("${{").removesuffix("}}")
    body = body.replace("&&", " and ").replace("||", " or ").replace("format(", "_format(")
    names = sorted(set(re.findall(r"github(?:\.\w+)+", body)), key=len, reverse=True)
    values = {}
    for index, name in enumerate(names):
        body = body.replace(name, f"_v{index}")
        values[f"_v{index}"] = context.get(name)
    assert re.fullmatch(r"[\s()'a-z_0-9/{}=!,.-]+", body), body  # nothing else reaches eval
    return eval(body, {"_format": lambda text, *args: text.format(*("" if a is None else a for a in args))}, values)


@pytest.mark.parametrize(("event", "ref", "mode"), [
    ("push", "refs/heads/main", "read-write"),
    ("schedule", "refs/heads/main", "read-write"),
    ("workflow_dispatch", "refs/heads/main", "read-write"),
    ("workflow_dispatch", "refs/heads/feature", "read-only"),  # a dispatch of another branch's inputs
    ("push", "refs/heads/feature", "read-only"),
    ("push", "refs/tags/v1.0", "read-only"),  # the release workflow's tag: it reads what main wrote
    ("pull_request", "refs/pull/7/merge", "read-only"),
    ("pull_request", "refs/heads/main", "read-only"),
    ("pull_request_target", "refs/heads/main", "read-only"),  # base-branch context running other code: never
])
def test_only_builds_of_the_default_branchs_inputs_write_to_the_remote_compiler_cache(docs, event, ref, mode):
    """TanStack (2026-05): a fork's pull_request_target run wrote a poisoned entry into the shared cache that a
    release on main restored. Here a build writes only when its inputs are on the default branch."""
    for path in (BUILD, SHARD):
        job = docs[path]["jobs"]["build"]
        expression = job["env"]["WHEELHOUSE_COMPILER_CACHE_MODE"]
        context = {"github.event_name": event, "github.ref": ref, "github.event.repository.default_branch": "main"}
        assert _github_expression(expression, context) == mode, (path, event, ref)
    # an event without the repository in its payload reads only
    assert _github_expression(expression, {"github.event_name": "push", "github.ref": "refs/heads/main"}) == "read-only"


def test_the_build_step_uses_the_remote_cache_and_only_it_gets_the_credentials_file(docs):
    for path in (BUILD, SHARD):
        steps = {step["name"]: step for _, step in _steps(docs[path])}
        names = list(steps)
        hand, build_step = steps["Hand the compiler cache's credential to the build"], steps["Build wheel"]
        removal = steps["Remove the compiler cache's credential"]
        secret = "${{ runner.temp }}/wheelhouse-compiler-cache.secret"
        assert hand["uses"] == workflows.ACTIONS["github-script"] and hand["env"] == {"SECRET_FILE": secret}
        script = hand["with"]["script"]
        assert "${{" not in script and "process.env.ACTIONS_RUNTIME_TOKEN" in script and "mode: 0o600" in script
        assert build_step["env"]["WHEELHOUSE_COMPILER_CACHE"] == "gha"
        assert build_step["env"]["WHEELHOUSE_COMPILER_CACHE_SECRET_FILE"] == secret
        assert names.index("Hand the compiler cache's credential to the build") + 1 == names.index("Build wheel")
        assert removal["if"] == "always()" and removal["env"] == {"SECRET_FILE": secret}
        assert names.index("Build wheel") < names.index("Remove the compiler cache's credential") \
            < names.index("Upload wheel artifact" if path == BUILD else "Upload the shard artifact")
        # no other step names the file or the cache's token
        for name, step in steps.items():
            if name not in ("Hand the compiler cache's credential to the build", "Build wheel",
                            "Remove the compiler cache's credential"):
                assert "compiler-cache.secret" not in _text(step) and "RUNTIME_TOKEN" not in _text(step), name
    for path, doc in docs.items():  # and no job of the publish path holds a cache at all
        if path in (PUBLISH, PUBLISH_INDEX):
            assert "compiler-cache" not in _text(doc) and "COMPILER_CACHE" not in _text(doc), path


@pytest.mark.parametrize("extra", ["10.3a", ""])
def test_the_publish_recheck_takes_the_rows_extra_cubins_beside_its_arch_list(tmp_path, docs, extra):
    """_publish.yml checks the wheels again as the build's own check did: TransformerEngine's sm_103a, which its
    CMake adds beside 10.0 (extra_cubins), passes there too, and a row without extra_cubins passes no flag."""
    te = next(row for row in matrix.expand(load()) if row.component == "transformer-engine" and row.arch == "x86_64")
    assert te.to_json()["extra_cubins"] == "10.3a"
    publish = next(step for step in docs[PUBLISH]["jobs"]["publish"]["steps"] if step["name"] == "Check the wheels again")
    assert publish["env"]["EXTRA_CUBINS"] == "${{ inputs.extra_cubins }}"
    caller = docs[f"{WF}/build-transformer-engine.yml"]["jobs"]["publish"]["with"]
    assert caller["extra_cubins"] == "${{ matrix.extra_cubins }}"
    # the script, run with stand-ins for the two commands it calls: what check-wheel is asked
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "invoke").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$CALLED"\n')
    (stand_ins / "python").write_text(f'#!/bin/sh\necho {tmp_path}/torch-2.13.0-cp312-cp312-linux_x86_64.whl\n')
    for tool in stand_ins.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{stand_ins}:{os.environ['PATH']}", "CALLED": str(tmp_path / "called"), "RUNNER_TEMP": str(tmp_path),
           "WORLD": "cu130/torch2.13", "COMPONENT": "transformer-engine", "PYTHON": "3.12", "TORCH": "2.13.0",
           "ARCH": "x86_64", "CUDA": "13.0.2", "ARCH_LIST": "8.0;9.0;10.0", "VERIFY_ARCHS": "true", "EXTRA_CUBINS": extra}
    subprocess.run(["bash", str(REPO_ROOT / "build_scripts" / "ci" / "recheck_wheels.sh")], env=env, check=True,
                   cwd=tmp_path)
    args = (tmp_path / "called").read_text().splitlines()
    assert args[args.index("--require-archs") + 1] == "8.0;9.0;10.0"
    assert (args[args.index("--extra-cubins") + 1] if extra else "--extra-cubins" not in args) == (extra or True)
