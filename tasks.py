"""invoke tasks: thin wrappers that parse options, call ci/, and print.

    invoke --list                      every task
    invoke matrix --component apex --arch aarch64 --python 3.12 --json

Every task honours WHEELHOUSE_VERSIONS and WHEELHOUSE_STORE (see
ci/environment.py). A WheelhouseError ends the task with its one-line message
and its exit status (2 for a malformed versions file); no traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from pathlib import Path

from invoke import Exit, task

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ci import matrix as matrix_module  # noqa: E402
from ci import workflows as workflows_module  # noqa: E402
from ci.environment import Environment  # noqa: E402
from ci.errors import WheelhouseError  # noqa: E402
from ci.versions import load  # noqa: E402


def _env() -> Environment:
    return Environment.from_mapping(os.environ)


def reports_errors(fn):
    """Turn a WheelhouseError into one line on stderr and its exit status."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WheelhouseError as error:
            raise Exit(f"error: {error}", code=error.exit_code) from None

    return wrapper


@task(
    help={
        "component": "one component (default: all)",
        "arch": "x86_64 or aarch64 (default: all)",
        "python": "X.Y (default: all)",
        "torch": "torch version (default: all)",
        "json": "print the rows as a JSON list (the GitHub Actions matrix)",
        "github_output": "append matrix=<json> and has_builds=<bool> to $GITHUB_OUTPUT",
    }
)
@reports_errors
def matrix(c, component=None, arch=None, python=None, torch=None, json_=False, github_output=False):
    """Print the build rows of versions.yaml."""
    versions = load(_env().versions_path)
    rows = matrix_module.select(
        matrix_module.expand(versions), versions=versions, component=component, arch=arch, python=python, torch=torch
    )
    entries = [row.to_json() for row in rows]
    if github_output:
        target = os.environ.get("GITHUB_OUTPUT")
        if not target:
            raise Exit("error: --github-output needs $GITHUB_OUTPUT (it is set inside GitHub Actions)", code=2)
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(f"matrix={json.dumps(entries, separators=(',', ':'))}\n")
            handle.write(f"has_builds={'true' if entries else 'false'}\n")
    if json_:
        print(json.dumps(entries, indent=2))
    elif not github_output:
        for row in rows:
            print(f"{row.session:40} {row.arch:8} cu{row.cuda:8} py{'+'.join(row.pythons):10} torch{row.torch:8} {row.release_tag}")
        print(f"{len(rows)} row(s)")


def _store(store_spec: str | None = None, *, dry_run: bool = False):
    from dataclasses import replace

    from ci.environment import open_store

    env = _env()
    if store_spec:
        env = replace(env, store_spec=store_spec)
    return open_store(env, dry_run=dry_run, progress=_progress)


_PRINTED_DECILE: dict[str, int] = {}


def _progress(name: str, done: int, total: int) -> None:
    """Upload progress on stderr: one line per tenth of each file."""
    decile = done * 10 // total if total else 10
    if _PRINTED_DECILE.get(name) != decile:
        _PRINTED_DECILE[name] = decile
        print(f"  {name}: {decile * 10}% of {total} bytes", file=sys.stderr, flush=True)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _wheel_paths(spec: str) -> list[Path]:
    """Wheels named by a space-separated list of paths or globs (invoke takes one positional string)."""
    import glob

    paths = [Path(p) for item in spec.split() for p in (sorted(glob.glob(item)) or [item])]
    if not paths:
        raise Exit("error: name at least one wheel file (quote a glob: 'dist/cu130/torch2.13/*.whl')", code=2)
    return paths


@task(
    positional=["wheels"],
    help={
        "wheels": "wheel files to check: paths or quoted globs, space-separated",
        "torch": "target torch: a python interpreter, site-packages dir, torch dir, or a torch wheel read in place",
        "require_archs": "CUDA archs the fat binaries must cover, e.g. '8.0;9.0;10.0' (sm_90a covers 9.0)",
        "pythons": "CPython versions that must each have every extension module, e.g. 3.10,3.11",
        "audit": "also run auditwheel show on each wheel",
        "json": "print the versioned JSON report",
    },
)
@reports_errors
def check_wheel(c, wheels, torch=None, require_archs=None, pythons=None, audit=False, json_=False):
    """Check wheels before they ship: torch ABI, Python coverage, CUDA archs, archive safety."""
    from ci.wheels.check import check_wheels

    report = check_wheels(_wheel_paths(wheels), torch_target=torch, require_archs=require_archs, pythons=pythons, audit=audit)
    print(report.to_json() if json_ else report.render_text())
    if not report.ok:
        raise Exit(code=1)


@task(
    positional=["wheels"],
    help={
        "wheels": "wheel files to rewrite: paths or quoted globs, space-separated",
        "strip_local_version": "drop the +local version segment (filename, METADATA, dist-info, RECORD)",
        "repair": "auditwheel repair to this manylinux tag, excluding torch/CUDA/NCCL/NVSHMEM libraries",
        "out": "output directory (default: beside each wheel, replacing it)",
    },
)
@reports_errors
def fix_wheel(c, wheels, strip_local_version=False, repair=None, out=None):
    """Rewrite wheels: strip a +local version and/or repair to a manylinux tag."""
    from ci.wheels import audit, rewrite

    if not (strip_local_version or repair):
        raise Exit("error: fix-wheel: choose --strip-local-version and/or --repair TAG", code=2)
    for wheel in _wheel_paths(wheels):
        current = wheel
        target_dir = Path(out) if out else wheel.parent
        if strip_local_version:
            current = rewrite.strip_local_version(current, target_dir)
            if current != wheel and not out:
                wheel.unlink()
        if repair:
            current = audit.audit_repair(current, target_dir, plat=repair)
        print(current)


def _release_row(versions, component, python, torch, arch):
    from ci import build

    rows = matrix_module.select(
        matrix_module.expand(versions), versions=versions, component=component, python=python, torch=torch,
        arch=arch or build.host_arch(),
    )
    if len(rows) != 1:
        raise WheelhouseError(
            f"{len(rows)} rows match component={component} python={python} torch={torch} arch={arch}; "
            "name --python, --torch and --arch so that exactly one matches"
        )
    return rows[0]


@task(
    help={
        "component": "component to release",
        "python": "the row's Python (X.Y)",
        "torch": "the row's torch version",
        "arch": "the row's arch (default: this machine's)",
        "dist": "where the build put the wheels (default: dist/)",
        "dry_run": "print the exact steps (and API calls) without changing anything",
        "no_clobber": "refuse to replace an asset whose bytes differ",
        "store": "override WHEELHOUSE_STORE",
    }
)
@reports_errors
def release(c, component, python=None, torch=None, arch=None, dist="dist", dry_run=False, no_clobber=False, store=None):
    """Upload one built row: ensure the release, upload wheels and .metadata, then the manifest last."""
    from ci import release as release_module

    versions = load(_env().versions_path)
    row = _release_row(versions, component, python, torch, arch)
    plan = release_module.plan(versions, row, Path(dist).resolve())
    target = _store(store, dry_run=dry_run)
    print(f"release {row.release_tag} in {target.description}:")
    print(plan.render())
    if dry_run and not hasattr(target, "plan"):
        print("dry run: nothing changed")
        return
    release_module.apply(plan, target, clobber=not no_clobber, log=_log, dry_run=dry_run)
    if dry_run:
        print("dry run: the API calls it would make:")
        for call in target.plan:
            print(f"  {call}")


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
def plan(c, component="all", arch=None, python=None, markdown=None, github_output=False, store=None):
    """Mark each matrix row build or skip, with the reason, without downloading any wheel."""
    from ci import plan as plan_module

    versions = load(_env().versions_path)
    rows = matrix_module.select(matrix_module.expand(versions), versions=versions, component=component, arch=arch,
                                python=python)
    result = plan_module.decide(versions, rows, _store(store))
    print(result.render_text())
    if markdown:
        Path(markdown).write_text(result.render_markdown(), encoding="utf-8")
    if github_output:
        target = os.environ.get("GITHUB_OUTPUT")
        if not target:
            raise Exit("error: --github-output needs $GITHUB_OUTPUT (it is set inside GitHub Actions)", code=2)
        entries = [row.to_json() for row in result.to_build]
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(f"matrix={json.dumps(entries, separators=(',', ':'))}\n")
            handle.write(f"has_builds={'true' if entries else 'false'}\n")


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
    }
)
@reports_errors
def publish_index(c, store=None, out=None, default_world=None, push_branch=None, remote=None, pages_artifact=None,
                  base_url=None, dry_run=False):
    """Publish one PEP 503 index per CUDA/torch world from the store's releases."""
    from ci import pages

    env = _env()
    versions = load(env.versions_path)
    release_store = _store(store)
    default_world = default_world or matrix_module.expand(versions)[0].world
    if push_branch:
        remote = remote or c.run("git remote get-url origin", hide=True).stdout.strip()
        target = pages.GitBranchTarget(remote, branch=push_branch)
    elif pages_artifact:
        target = pages.ArtifactTarget(Path(pages_artifact))
    else:
        from ci.store.local import LocalStore

        if out is None and not isinstance(release_store, LocalStore):
            raise Exit("error: publish-index: name --out, --pages-artifact or --push-branch for a GitHub store", code=2)
        target = pages.DirectoryTarget(Path(out) if out else release_store.root / "site")
    if base_url is None:
        repo = env.github_repo if not store else None
        if repo:
            owner, name = repo.split("/")
            base_url = f"https://{owner}.github.io/{name}"
        else:
            base_url = Path(out or pages_artifact or getattr(release_store, "root", Path(".")) / "site").resolve().as_uri()
    releases = release_store.list_releases()
    with target if isinstance(target, pages.GitBranchTarget) else contextlib.nullcontext(target) as active:
        outcome = pages.publish_index(releases, active, base_url=base_url, default_world=default_world,
                                      fetch=_url_fetch, dry_run=dry_run)
    for warning in outcome.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(outcome.summary.line())
    print(f"{outcome.result.target}: {outcome.result.changes.line()}" + (" (dry run)" if dry_run else ""))


def _url_fetch(asset):
    """Stream an asset's bytes from its URL (assets without a digest are hashed once, then cached)."""
    import urllib.request

    with urllib.request.urlopen(asset.url, timeout=300) as response:
        while chunk := response.read(1 << 20):
            yield chunk


@task(help={"check": "change nothing; list the files that differ from versions.yaml and fail if any do"})
@reports_errors
def workflows(c, check=False):
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
        print("workflows are current")
        return
    changed = workflows_module.write(versions, root)
    for rel in changed:
        print(f"{'wrote' if (root / rel).exists() else 'removed'} {rel}")
    print(f"{len(changed)} file(s) changed" if changed else "workflows are current")
