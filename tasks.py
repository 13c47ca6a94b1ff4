"""invoke tasks: thin wrappers that parse options, call ci/, and print.

    invoke --list                      every task
    invoke matrix --component apex --arch aarch64 --python 3.12 --json

Every task honours WHEELHOUSE_VERSIONS and WHEELHOUSE_STORE (see
ci/model/environment.py). A WheelhouseError ends the task with its one-line message
and its exit status (2 for a malformed versions file); no traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

# From the defining modules: invoke's package re-exports these implicitly, which mypy --strict does not follow.
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task as invoke_task

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ci.base import log
from ci.base.errors import UsageError, WheelhouseError
from ci.flows import workflows as workflows_module
from ci.model import matrix as matrix_module
from ci.model import naming
from ci.model.environment import Environment, on_github_actions
from ci.model.versions import load
from ci.publish import provenance
from ci.store.model import ReleaseStore

if TYPE_CHECKING:
    from ci.model.matrix import MatrixRow
    from ci.model.versions import Versions

# No automatic short flags: invoke derives them from each task's option names, so `-r`, `-a` or `-s`
# meant different things per task, and `prune`'s `-h` (push_branch) hid `-h` for help.
task = functools.partial(invoke_task, auto_shortflags=False)
_LOG = log.get("tasks")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _core_dry(c: Context) -> bool:
    """invoke's own --dry (`invoke --dry release ...`) means --dry-run for the tasks that have one."""
    return bool(c.config.run.dry)


def _env(store_spec: str | None = None) -> Environment:
    """The environment's settings, with ``--store`` (when given) in place of WHEELHOUSE_STORE."""
    env = Environment.from_mapping(os.environ)
    return replace(env, store_spec=store_spec) if store_spec else env


def reports_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Configure the wheelhouse logger for the task, and turn a WheelhouseError into one line on stderr
    (an ``::error::`` annotation on GitHub Actions) and its exit status."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        log.configure(github_actions=on_github_actions(os.environ))
        try:
            return fn(*args, **kwargs)
        except WheelhouseError as error:
            log.report_error(str(error))
            raise Exit(code=error.exit_code) from None
        except Exit as stop:  # a task's own usage error, `error: ...`: the same one line
            if isinstance(stop.message, str) and stop.message.startswith("error: "):
                log.report_error(stop.message.removeprefix("error: "))
                raise Exit(code=stop.code) from None
            raise
        except BrokenPipeError:
            # The reader left (`| head -1`): stop quietly; later writes go nowhere instead of raising again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise Exit(code=1) from None

    return wrapper


def _write_github_output(rows: list[MatrixRow]) -> None:
    """The matrix outputs a GitHub Actions job reads: matrix=<json> and has_builds=<bool> for every row;
    first= / rest= / has_rest= for the two build stages (ci.model.matrix.stages: the first Python of each compile
    group, then the others, which start from the compiler cache it saved); and the shard jobs' shards=<json>
    and has_shards=<bool> (ci/model/shards.py: one entry per shard of each row split into several)."""
    from ci.model import shards

    target = os.environ.get("GITHUB_OUTPUT")
    if not target:
        raise Exit("error: --github-output needs $GITHUB_OUTPUT (it is set inside GitHub Actions)", code=2)
    first, rest = matrix_module.stages(rows)

    def entries(selected: list[MatrixRow]) -> str:
        return json.dumps([row.to_json() for row in selected], separators=(",", ":"))

    split = shards.matrix_entries([row.to_json() for row in rows])
    text = (f"matrix={entries(rows)}\nhas_builds={'true' if rows else 'false'}\n"
            f"first={entries(first)}\nrest={entries(rest)}\nhas_rest={'true' if rest else 'false'}\n"
            f"shards={json.dumps(split, separators=(',', ':'))}\nhas_shards={'true' if split else 'false'}\n")
    _write_text(Path(target), text, "$GITHUB_OUTPUT", append=True)


def _writable(path: Path, what: str) -> Path:
    """``path`` when a file can be written there; checked before the work whose result goes there."""
    if path.is_dir() or not path.parent.is_dir():
        problem = "is a directory" if path.is_dir() else f"is in {path.parent}, which is not a directory"
        raise UsageError(f"{what} {path} {problem}; name a file in an existing directory")
    return path


def _write_text(path: Path, text: str, what: str, *, append: bool = False) -> None:
    _writable(path, what)
    try:
        with open(path, "a" if append else "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be written ({exc.strerror}); name a writable file") from None


@task(
    help={
        "component": "one component (default: all)",
        "arch": "x86_64 or aarch64 (default: all)",
        "python": "X.Y (default: all)",
        "torch": "torch version (default: all)",
        "json": "print the rows as a JSON list (the GitHub Actions matrix)",
        "github_output": "append matrix=<json>, has_builds=<bool>, shards=<json> and has_shards=<bool> to "
                         "$GITHUB_OUTPUT",
    }
)
@reports_errors
def matrix(c: Context, component: str | None = None, arch: str | None = None, python: str | None = None,
           torch: str | None = None, json_: bool = False, github_output: bool = False) -> None:
    """Print the build rows of versions.yaml."""
    versions = load(_env().versions_path)
    rows = matrix_module.select(
        matrix_module.expand(versions), versions=versions, component=component, arch=arch, python=python, torch=torch
    )
    if github_output:
        _write_github_output(rows)
    if json_:
        log.out(json.dumps([row.to_json() for row in rows], indent=2))
    elif not github_output:
        from ci.timing import size_model, time_model

        first, _ = matrix_module.stages(rows)
        for row in rows:
            cuda = naming.cuda_label(row.cuda)
            prediction = time_model.predict(row)
            predicted = prediction.short() if prediction else "not timed yet"
            stage = "first" if row in first else "then"
            sizes = size_model.predict(row).short()
            log.out(f"{row.session:40} {row.arch:8} {cuda:10} py{'+'.join(row.pythons):10} torch{row.torch:8} "
                  f"{stage:5} {predicted:24} {sizes:42} {row.release_tag}")
        over = [row for row in rows if (p := time_model.predict(row)) is not None and not p.fits]
        log.out(f"{len(rows)} row(s)" + (f"; {len(over)} predicted over build_timeout (the resumable path; "
                                       "`nox -s build-<component>-<python> -- --dry-run` says how many runs)"
                                       if over else ""))


def _store(store_spec: str | None = None, *, dry_run: bool = False, must_exist: bool = False) -> ReleaseStore:
    from ci.store import open_store

    env = _env(store_spec)
    progress = log.TransferProgress(bar=sys.stderr.isatty() and not env.github_actions)
    return open_store(env, dry_run=dry_run, progress=progress, must_exist=must_exist)


def _wheel_paths(specs: list[str]) -> list[Path]:
    """The wheels that the --wheel values name: each one path (spaces and all) or a quoted glob."""
    import glob

    if not specs:
        raise Exit("error: name at least one --wheel FILE (repeat it; quote a glob: --wheel 'dist/cu130/torch2.13/*.whl')",
                   code=2)
    paths = []
    for spec in specs:
        matches = [spec] if Path(spec).exists() else sorted(glob.glob(spec))
        if not matches and glob.has_magic(spec):
            raise UsageError(f"--wheel {spec!r} matches no file; check the glob (e.g. 'dist/cu130/torch2.13/*.whl')")
        for path in map(Path, matches or [spec]):
            if path.is_dir():
                raise UsageError(f"--wheel {path} is a directory; name wheel files, or a glob such as '{path}/*.whl'")
            paths.append(path)
    return paths


@task(
    iterable=["wheel"],
    help={
        "wheel": "a wheel file to check, or a quoted glob (repeat --wheel for several)",
        "torch": "target torch: a python interpreter, site-packages dir, torch dir, or a torch wheel read in place",
        "require_archs": ("CUDA archs each shared object must hold as exact targets, e.g. '8.0;9.0a;12.0f' "
                          "(sm_90a serves 9.0; 9.0a needs sm_90a)"),
        "extra_cubins": ("cubins beyond --require-archs that the build adds on purpose, accepted by the arch gate, "
                         "e.g. '10.3a' (a component's extra_cubins in versions.yaml)"),
        "pythons": "CPython versions that must each have every extension module, e.g. 3.10,3.11",
        "audit": "also run auditwheel show on each wheel",
        "json": "print the versioned JSON report",
    },
)
@reports_errors
def check_wheel(c: Context, wheel: list[str] | None = None, torch: str | None = None,
                require_archs: str | None = None, extra_cubins: str | None = None, pythons: str | None = None,
                audit: bool = False, json_: bool = False) -> None:
    """Check wheels before they ship: torch ABI, Python coverage, CUDA archs, archive safety."""
    from ci.checks.check import check_wheels
    from ci.formats.archs import parse_arch_list

    if extra_cubins and not require_archs:
        raise UsageError("--extra-cubins widens --require-archs; pass the arch list too")
    extra = {str(arch): "named by --extra-cubins" for arch in parse_arch_list(extra_cubins).archs} if extra_cubins else None
    report = check_wheels(_wheel_paths(wheel or []), torch_target=torch, require_archs=require_archs,
                          extra_cubins=extra, pythons=pythons, audit=audit)
    log.out(report.to_json() if json_ else report.render_text())
    if not report.ok:
        raise Exit(code=1)


@task(
    iterable=["wheel"],
    help={
        "wheel": "a wheel file to rewrite, or a quoted glob (repeat --wheel for several)",
        "strip_local_version": "drop the +local version segment (filename, METADATA, dist-info, RECORD)",
        "repair": "auditwheel repair to this manylinux tag, excluding torch/CUDA/NCCL/NVSHMEM libraries",
        "out": "output directory (default: beside each wheel, replacing it)",
    },
)
@reports_errors
def fix_wheel(c: Context, wheel: list[str] | None = None, strip_local_version: bool = False,
              repair: str | None = None, out: str | None = None) -> None:
    """Rewrite wheels: strip a +local version and/or repair to a manylinux tag."""
    from ci.checks import audit
    from ci.formats import rewrite

    if not (strip_local_version or repair):
        raise Exit("error: fix-wheel: choose --strip-local-version and/or --repair TAG", code=2)
    paths = _wheel_paths(wheel or [])
    if strip_local_version:
        rewrite.check_strip_collisions(paths, Path(out) if out else None)
    for path in paths:
        current = path
        target_dir = Path(out) if out else path.parent
        if strip_local_version:
            current = rewrite.strip_local_version(current, target_dir)
            if current != path and not out:
                path.unlink()
        if repair:
            current = audit.audit_repair(current, target_dir, plat=repair)
        log.out(str(current))


def _release_row(versions: Versions, component: str, python: str | None, torch: str | None,
                 arch: str | None, cuda: str | None = None) -> MatrixRow:
    from ci.building import job

    rows = matrix_module.select(
        matrix_module.expand(versions), versions=versions, component=component, python=python, torch=torch,
        arch=arch or job.host_arch(), cuda=cuda,
    )
    if len(rows) != 1:
        raise WheelhouseError(
            f"{len(rows)} rows match component={component} python={python} torch={torch} arch={arch} cuda={cuda}; "
            "name --python, --torch, --arch and --cuda so that exactly one matches"
        )
    return rows[0]


@task(
    help={
        "component": "component to release (required)",
        "python": "the row's Python (X.Y)",
        "torch": "the row's torch version",
        "arch": "the row's arch (default: this machine's)",
        "cuda": "the row's CUDA version, or cpu (when the matrix has several for this Python and torch)",
        "dist": "where the build put the wheels (default: dist/)",
        "dry_run": "print the exact steps (and API calls) without changing anything",
        "replace": "replace a wheel (and its .metadata) the release already serves with other bytes",
        "predicate_out": "write the provenance predicate this release would carry to FILE (to be signed), upload nothing",
        "provenance_bundle": "the Sigstore bundle the signing step made of that predicate: uploaded in place of the "
                             "unsigned statement",
        "store": "override WHEELHOUSE_STORE",
    }
)
@reports_errors
def release(c: Context, component: str | None = None, python: str | None = None, torch: str | None = None,
            arch: str | None = None, cuda: str | None = None, dist: str = "dist", dry_run: bool = False,
            replace: bool = False, store: str | None = None, predicate_out: str | None = None,
            provenance_bundle: str | None = None) -> None:
    """Upload one built row: ensure the release, upload wheels and .metadata, then the manifest last."""
    from ci.publish import release as release_module

    if not component:
        raise Exit("error: release: name --component C (invoke matrix lists the components)", code=2)
    dry_run = dry_run or _core_dry(c)

    versions = load(_env().versions_path)
    row = _release_row(versions, component, python, torch, arch, cuda)
    plan = release_module.plan(versions, row, Path(dist).resolve(),
                               bundle=Path(provenance_bundle) if provenance_bundle else None)
    if predicate_out:
        _write_predicate(Path(predicate_out), plan.statement["predicate"])
        return
    target = _store(store, dry_run=dry_run)
    log.out(f"release {row.release_tag} in {target.description}:")
    log.out(plan.render())
    if dry_run and target.rehearsed_calls() is None:
        log.out("dry run: nothing changed")
        return
    release_module.apply(plan, target, replace=replace, dry_run=dry_run)
    if dry_run:
        log.out("dry run: the API calls it would make:")
        for call in target.rehearsed_calls() or ():
            log.out(f"  {call}")


def _write_predicate(path: Path, predicate: Mapping[str, object]) -> None:
    try:
        path.write_bytes(json.dumps(predicate, sort_keys=True, indent=2).encode() + b"\n")
    except OSError as exc:
        raise UsageError(f"--predicate-out {path}: cannot write it ({exc.strerror}); name a file in a writable "
                         "directory") from None
    log.out(f"provenance predicate ({provenance.PREDICATE_TYPE}) written to {path}")


@task(
    help={
        "component": "one component, or all (default)",
        "arch": "only this arch",
        "python": "only this Python",
        "markdown": "also write the plan as a markdown table to this file (PR comments)",
        "github_output": "append matrix=<rows to build> and has_builds to $GITHUB_OUTPUT",
        "store": "override WHEELHOUSE_STORE",
    }
)
@reports_errors
def plan(c: Context, component: str = "all", arch: str | None = None, python: str | None = None,
         markdown: str | None = None, github_output: bool = False, store: str | None = None) -> None:
    """Mark each matrix row build or skip, with the reason, without downloading any wheel."""
    from ci.flows import plan as plan_module

    if markdown:
        _writable(Path(markdown), "--markdown")
    versions = load(_env().versions_path)
    rows = matrix_module.select(matrix_module.expand(versions), versions=versions, component=component, arch=arch,
                                python=python)
    result = plan_module.decide(versions, rows, _store(store))
    log.out(result.render_text())
    if markdown:
        _write_text(Path(markdown), result.render_markdown(), "--markdown")
    if github_output:
        _write_github_output(result.to_build)


@task(
    help={
        "store": "override WHEELHOUSE_STORE",
        "out": "write the site into this directory (default for a local store: <store>/site)",
        "default_world": "world served at /simple/ (default: the first build_matrix row's)",
        "push_branch": "commit the site to this branch of --remote (e.g. gh-pages)",
        "remote": "git remote URL or path for --push-branch (default: this repository's origin)",
        "pages_artifact": "write a Pages artifact directory for actions/upload-pages-artifact",
        "base_url": "public URL of the site (default: https://<owner>.github.io/<repo> or the file:// URL)",
        "dry_run": "print what would change, write nothing",
        "allow_shrink": "publish even when more than half (or all) of the published wheel links would go",
        "adopt": "take over a site published before wheelhouse-site.json that also holds other files (they are kept)",
        "force": "publish over the index of another store, or into a branch that holds no index (the default "
                 "branch included), replacing its tree",
    }
)
@reports_errors
def publish_index(c: Context, store: str | None = None, out: str | None = None,
                  default_world: str | None = None, push_branch: str | None = None, remote: str | None = None,
                  pages_artifact: str | None = None, base_url: str | None = None, dry_run: bool = False,
                  allow_shrink: bool = False, adopt: bool = False, force: bool = False) -> None:
    """Publish one PEP 503 index per CUDA/torch world from the store's releases."""
    from ci.publish import pages

    dry_run = dry_run or _core_dry(c)
    where_to = {"out": out, "pages_artifact": pages_artifact, "push_branch": push_branch, "remote": remote,
                "base_url": base_url}
    _check_index_options(store, default_world=default_world, missing_target="publish-index: name --out, "
                         "--pages-artifact or --push-branch for a GitHub store", **where_to)
    env = _env(store)
    versions = load(env.versions_path)
    release_store = _store(store, must_exist=True)
    where = pages.index_where(release_store, versions, github_repo=env.github_repo, chosen_world=default_world,
                              out=out, pages_artifact=pages_artifact, push_branch=push_branch, remote=remote,
                              base_url=base_url, force=force, adopt=adopt)
    outcome = pages.publish(release_store, where, dry_run=dry_run, allow_shrink=allow_shrink, force=force)
    for warning in outcome.warnings:
        _LOG.warning(f"warning: {warning}")
    log.out(outcome.summary.line())
    log.out(f"{outcome.result.target}: {outcome.result.changes.line()}" + (" (dry run)" if dry_run else ""))


def _check_index_options(store: str | None, *, out: str | None, pages_artifact: str | None, push_branch: str | None,
                         remote: str | None, base_url: str | None, missing_target: str,
                         default_world: str | None = None) -> None:
    """The usage errors of the options that say where the index goes, raised (exit status 2) before any store
    is opened or any network is touched."""
    from ci.publish.index import check_base_url, check_world

    named = [f"--{name.replace('_', '-')}" for name, value in
             (("push_branch", push_branch), ("pages_artifact", pages_artifact), ("out", out)) if value]
    if len(named) > 1:
        raise UsageError(f"{' and '.join(named)}: name one place to publish the index")
    if remote and not push_branch:
        raise UsageError("--remote names the git remote of --push-branch; add --push-branch BRANCH (e.g. gh-pages)")
    if base_url is not None:
        check_base_url(base_url)
    if default_world is not None:
        check_world(default_world)
    if not named and _env(store).github_repo:
        raise UsageError(missing_target)


@task(help={"component": "only the timed builds of this component (default: all)",
            "record": "add the build of this build record (dist/<world>/<tag>-<arch>.build.json) to the model's "
                      "timed builds (ci/timing/build_times.json) instead"})
@reports_errors
def time_model(c: Context, component: str | None = None, record: str | None = None) -> None:
    """The build-time model (ci/timing/time_model.py) against every timed build: measured, predicted, error."""
    from ci.timing import time_model as model

    if record:
        from ci.timing import timed_builds

        log.out(timed_builds.record(Path(record)))
        return

    checks = [check for check in model.check() if component in (None, check.observed.component)]
    if not checks:
        raise Exit(f"error: --component {component}: no timed build of it; known: "
                   f"{', '.join(sorted(model.calibrations()))}", code=2)
    log.out(model.render_check(checks))


@task(
    help={
        "snapshots": "folder of local upstream snapshots (<owner>/<name>.git or <owner>+<name>/repo)",
        "components": "space-separated components of tests/fixtures/versions-device.yaml (default: the full-arch set)",
        "max_mib": "the most the bundle and the working tree may take together, in MiB (default 64)",
        "no_tools": "leave .whl/ empty (a machine that has nox, invoke and jsonschema)",
        "cache_tools": "write only .cache-tools/ (sccache and a WebDAV server, for the sweep with a remote cache)",
    }
)
@reports_errors
def device_bundle(c: Context, snapshots: str | None = None, components: str | None = None, max_mib: float = 64,
                  no_tools: bool = False, cache_tools: bool = False) -> None:
    """Make .device/ and .whl/ for an offline GPU machine (tests/gpu/run_on_device.sh): mirror, tool wheels, sdists."""
    import importlib.util

    # the GPU machine's kit lives with its script in tests/gpu/, beside make_source_bundles.py, which it uses
    kit = Path(__file__).resolve().parent / "tests" / "gpu"
    sys.path.insert(0, str(kit))
    spec = importlib.util.spec_from_file_location("device_bundle", kit / "device_bundle.py")
    assert spec is not None and spec.loader is not None
    bundle = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bundle  # its dataclasses look their module up there
    spec.loader.exec_module(bundle)

    if cache_tools:
        try:
            parts = bundle.make_cache_tools()
        except bundle.BundleError as error:
            raise Exit(f"error: {error}", code=2) from None
        log.out("sccache and the WebDAV server: .cache-tools/")
        log.out(bundle.describe(parts, max_mib))
        return
    if not snapshots or not Path(snapshots).is_dir():
        raise Exit(f"error: --snapshots {snapshots or '(missing)'}: name the folder of local upstream snapshots",
                   code=2)
    chosen = (components or " ".join(bundle.DEFAULT_COMPONENTS)).split()
    try:
        parts = bundle.make(chosen, snapshots=Path(snapshots), max_mib=max_mib, tools=not no_tools)
    except bundle.BundleError as error:
        raise Exit(f"error: {error}", code=2) from None
    log.out(f"bundle for {', '.join(chosen)}: .device/ and .whl/")
    log.out(bundle.describe(parts, max_mib))


@task(
    help={
        "component": "component whose row to assemble (required)",
        "python": "the row's Python (X.Y)",
        "torch": "the row's torch version",
        "arch": "the row's arch (default: this machine's)",
        "cuda": "the row's CUDA version, or cpu (when the matrix has several for this Python and torch)",
        "dist": "where the shards are (<dist>/<world>/shards/<release tag>-<arch>/) and the wheels go (default: dist/)",
        "shards": "take the shards from this directory instead",
        "reuse_env": "build in the current interpreter (verified), as the build session's --reuse-env",
        "source": "a local checkout instead of the ref, as the build session's --source",
    }
)
@reports_errors
def assemble_shards(c: Context, component: str | None = None, python: str | None = None, torch: str | None = None,
                    arch: str | None = None, cuda: str | None = None, dist: str = "dist", shards: str | None = None,
                    reuse_env: bool = False, source: str | None = None) -> None:
    """Assemble a row's wheels from every shard of it (nox -s build-... -- --shard I/N), check them, and put them
    in dist/<world>/ with their .metadata and build record, as a build does."""
    from ci.building import job

    if not component:
        raise Exit("error: assemble-shards: name --component C (invoke matrix lists the components)", code=2)
    env = _env()
    versions = load(env.versions_path)
    row = _release_row(versions, component, python, torch, arch, cuda)
    dist_root = Path(dist).resolve()
    checkout = Path(source).resolve() if source else None
    if checkout is not None and not checkout.is_dir():
        raise UsageError(f"--source {source}: not a directory; pass the path of a source checkout")
    options = job.BuildOptions(
        cache_dir=env.cache_dir, dist_root=dist_root, reuse_env=reuse_env, source=checkout,
        torch_index=env.torch_index, max_jobs=env.max_jobs,
        assemble=Path(shards).resolve() if shards else job.shard_directory(row, dist_root),
    )
    result = job.run(versions, row, options)
    for wheel in result.wheels:
        log.out(f"built {wheel}")
    log.out(f"build record {result.record}")


@task(help={"check": "change nothing; list the files that differ from versions.yaml and fail if any do"})
@reports_errors
def workflows(c: Context, check: bool = False) -> None:
    """Write .github/workflows/ from versions.yaml (generated files only; stale ones are removed)."""
    root = Path(__file__).resolve().parent
    versions = load(_env().versions_path)
    if check:
        stale = workflows_module.check(versions, root)
        if stale:
            raise Exit(
                f"error: {len(stale)} workflow file(s) differ from versions.yaml: {', '.join(stale)}; "
                "run `invoke workflows` and commit the result",
                code=1,
            )
        log.out("workflows are current")
        return
    changed = workflows_module.write(versions, root)
    for rel in changed:
        log.out(f"{'wrote' if (root / rel).exists() else 'removed'} {rel}")
    log.out(f"{len(changed)} file(s) changed" if changed else "workflows are current")


# ---------------------------------------------------------------------------- maintenance


@task(
    help={
        "apply": "rename (default: print the plan only)",
        "skip_unparseable": "leave releases with unparseable titles or colliding targets as they are; migrate the rest",
        "delete_old_tags": "delete the git tags the renamed releases leave behind (GitHub keeps them)",
        "store": "override WHEELHOUSE_STORE",
    }
)
@reports_errors
def migrate_tags(c: Context, apply: bool = False, skip_unparseable: bool = False, delete_old_tags: bool = False,
                 store: str | None = None) -> None:
    """Retag releases of the older schemes (<component>-<ref>[-pyX.Y][-torchT], no world) to
    <component>-<ref>-<cuXY|cpu>-py<X.Y>-torch<T>."""
    from ci.maintenance import migrate

    target = _store(store, must_exist=True)
    plan = migrate.plan_for(target, skip_unparseable=skip_unparseable, delete_old_tags=delete_old_tags)
    log.out(plan.render())
    refusal = plan.refusal()
    if refusal is not None:
        for line in refusal.offenders:
            _LOG.warning(line)
        raise refusal
    if not apply:
        log.out("dry run: nothing changed (pass --apply)")
        return
    log.out(migrate.apply(plan, target).render())


@task(
    iterable=["run"],
    help={
        "run": "workflow run id whose artifacts to restore (repeat for several runs; the newest artifact of a name wins)",
        "torch": "restore only artifacts built against this torch version",
        "versions_ref": "git ref whose versions.yaml names the releases (git show REF:versions.yaml)",
        "artifacts_dir": "take artifacts from DIR/<run id>/<artifact name>.zip instead of GitHub (needed for a local store)",
        "clobber": "replace release assets whose bytes differ (safely, without a missing-file window)",
        "accept_undigested": "also restore artifacts without a digest (their download cannot be verified)",
        "apply": "download and upload (default: print the plan only)",
        "store": "override WHEELHOUSE_STORE",
    },
)
@reports_errors
def restore_wheels(c: Context, run: list[str] | None = None, torch: str | None = None,
                   versions_ref: str | None = None, artifacts_dir: str | None = None, clobber: bool = False,
                   accept_undigested: bool = False, apply: bool = False, store: str | None = None) -> None:
    """Put wheels back into releases from the workflow artifacts of earlier CI runs."""
    from ci.maintenance import restore
    from ci.store import open_artifacts

    if not run or not torch or not versions_ref:
        raise Exit("error: restore-wheels: name --run ID (one or more), --torch T and --versions-ref REF", code=2)
    target = _store(store)
    source = open_artifacts(target, artifacts_dir)
    versions = restore.versions_from_text(restore.versions_text_at(versions_ref), ref=versions_ref)
    listings = restore.collect(source, run)
    log.out(restore.artifact_summary(listings))
    plan = restore.plan(versions, listings, torch=torch, versions_ref=versions_ref, releases=target.list_releases(),
                        clobber=clobber, source=source.description, store=target.description,
                        accept_undigested=accept_undigested)
    log.out(plan.render())
    empty = plan.nothing_to_restore()
    if empty is not None:
        raise empty
    if not apply:
        log.out("dry run: nothing downloaded or changed (pass --apply)")
        return
    result = restore.apply(plan, target, source)
    log.out(result.render())
    if not result.ok:
        raise Exit(f"error: restore-wheels: {len(result.refused)} artifact(s) or asset(s) refused (listed above); "
                   "the rest was restored", code=1)


@task(
    help={
        "keep_worlds": "never delete releases in these worlds, e.g. cu130/torch2.13,cpu/torch2.13",
        "older_than": "delete only releases published longer ago than this (90d, 12h, 2w)",
        "apply": "re-publish the index without the releases to delete, then delete them (default: print the plan)",
        "store": "override WHEELHOUSE_STORE",
        "out": "re-publish the index into this directory (default for a local store: <store>/site)",
        "pages_artifact": "re-publish the index as a Pages artifact directory",
        "push_branch": "re-publish the index to this branch of --remote (e.g. gh-pages)",
        "remote": "git remote URL or path for --push-branch (default: this repository's origin)",
        "base_url": "public URL of the site (as publish-index)",
        "force": "delete even every release, more than half of them, or releases of components the versions file "
                 "does not name; publish over a drop in wheel links or another store's index",
    }
)
@reports_errors
def prune(c: Context, keep_worlds: str | None = None, older_than: str | None = None, apply: bool = False,
          store: str | None = None, out: str | None = None, pages_artifact: str | None = None,
          push_branch: str | None = None, remote: str | None = None, base_url: str | None = None,
          force: bool = False) -> None:
    """Delete releases versions.yaml no longer names (never one a matrix row maps to), after re-indexing without them."""
    from ci.maintenance import prune as prune_module
    from ci.publish import pages

    worlds = prune_module.parse_worlds(keep_worlds)
    age = prune_module.parse_age(older_than) if older_than else None
    where_to = {"out": out, "pages_artifact": pages_artifact, "push_branch": push_branch, "remote": remote,
                "base_url": base_url}
    if apply:
        _check_index_options(store, missing_target="prune --apply: name where to re-publish the index (--out, "
                             "--pages-artifact or --push-branch) for a GitHub store", **where_to)
    env = _env(store)
    versions = load(env.versions_path)
    release_store = _store(store, must_exist=True)
    plan = prune_module.plan(versions, release_store.list_releases(), keep_worlds=worlds, older_than=age,
                             store=release_store.description)
    log.out(plan.render())
    refusal = None if force else plan.refusal()
    if not apply:
        if refusal is not None:
            _LOG.warning(f"warning: --apply will refuse this plan: {refusal}")
        log.out("dry run: nothing deleted (pass --apply)")
        return
    if refusal is not None:
        raise refusal
    where = pages.index_where(release_store, versions, github_repo=env.github_repo, out=out,
                              pages_artifact=pages_artifact, push_branch=push_branch, remote=remote, base_url=base_url,
                              force=force)
    result = prune_module.apply(plan, release_store, index=where, force=force)
    for warning in result.index.warnings if result.index is not None else ():
        _LOG.warning(f"warning: {warning}")
    log.out(result.render())


@task(
    help={
        "quick": "smaller sizes (under 10 min on 2 cores): no 2 GB wheels, no GPU-machine figure 6(b)",
        "only": "comma-separated figure names (python -m benchmarks --list)",
    }
)
@reports_errors
def bench(c: Context, quick: bool = False, only: str | None = None) -> None:
    """Run benchmarks/ (ratios against the anchor's approaches) and rewrite benchmarks/RESULTS.md."""
    import subprocess

    from ci.model import credentials

    # The benchmarks build third-party code (fast-hadamard-transform's setup.py, the fixture's), which could
    # read a token from this process's /proc/<pid>/environ: start again without credentials, as nox does.
    credentials.reexec_without_credentials([sys.executable, *sys.orig_argv[1:]], os.environ)
    credentials.refuse_if_exposed_above(os.environ)
    args = [sys.executable, "-m", "benchmarks", *(["--quick"] if quick else []), *(["--only", only] if only else [])]
    code = subprocess.call(args, cwd=Path(__file__).resolve().parent)
    if code:
        raise Exit(f"error: the benchmarks failed (exit status {code}); see the log above", code=code)


@task(
    help={
        "wheel": "the downloaded wheel to check",
        "manifest": "its release's wheelhouse-build-manifest-<arch>.json (the provenance statement is read beside it)",
        "release": "a folder holding its release's downloaded assets (gh release download TAG -D DIR)",
        "provenance": "its release's wheelhouse-provenance-<arch>.sigstore.json (signed) or .intoto.json, when not "
                      "beside the manifest",
        "repo": "OWNER/REPO whose publish workflow must have signed the provenance (default: WHEELHOUSE_STORE's)",
        "trusted_root": "the Sigstore trusted root to verify the signature against (`gh attestation trusted-root > "
                        "FILE`); default: the public-good root sigstore-python carries",
    }
)
@reports_errors
def verify_wheel(c: Context, wheel: str | None = None, manifest: str | None = None, release: str | None = None,
                 provenance: str | None = None, repo: str | None = None, trusted_root: str | None = None) -> None:
    """Check a downloaded wheel offline against its release's manifest and provenance and its own SBOM; say who
    published it only from a verified signature."""
    from ci.publish import verify

    if not wheel:
        raise UsageError("name the wheel to check with --wheel PATH")
    store = os.environ.get("WHEELHOUSE_STORE", "")
    repository = repo or (store.removeprefix("github:") if store.startswith("github:") else None)
    result = verify.verify_wheel(Path(wheel), manifest_path=Path(manifest) if manifest else None,
                                 release_dir=Path(release) if release else None,
                                 provenance_path=Path(provenance) if provenance else None,
                                 repository=repository, trusted_root=Path(trusted_root) if trusted_root else None)
    for mismatch in result.mismatches:
        log.report_error(mismatch)
    if not result.ok:
        raise Exit(code=2)
    log.out(result.summary)


@task(
    iterable=["package"],
    help={
        "index": "the published index: its directory (wheelhouse/site) or URL (https://<owner>.github.io/<repo>)",
        "package": "a component to answer for (repeat for several); default: every one the matching world serves",
    },
)
@reports_errors
def which_wheel(c: Context, index: str | None = None, package: list[str] | None = None) -> None:
    """Which world and wheels fit this interpreter's torch, Python, platform and GPUs, and how to install them."""
    # The same code the published site serves as which-wheel.py (standard library only): this is its wrapper.
    from ci.publish import which_wheel as which

    try:
        answer = which.answer(index, package or [])
    except which.IndexProblem as problem:
        raise UsageError(str(problem)) from None
    log.out(answer.render())
    if answer.exit_code:
        raise Exit(code=answer.exit_code)
