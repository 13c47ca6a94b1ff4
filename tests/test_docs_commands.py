"""The maintainer's guide and the agent skill, run: their commands are the ones that work.

Every fenced ```bash block of docs/maintaining-components.md and of the skill
(.cursor/skills/manage-wheelhouse-components/SKILL.md) is a step, taken in the order the files
give them, against one scratch copy of the repository (its tracked and untracked files, as a git
repository of its own) for the whole module:

- A block that runs offline runs there (``bash -e -o pipefail``, the test interpreter's bin directory
  first on PATH, no GitHub variables) and must exit 0, or the status its ``# exits: N`` line names.
- A block whose first lines say ``# needs: github|gpu|network|build`` cannot run here (a GitHub store
  and token; a CUDA machine; upstream sources or a package index; a real build, or what one wrote): its
  commands are checked, not run.
- Every block, run or not, is checked: bash parses it, each ``invoke`` task and flag is one
  ``invoke --list`` / ``invoke --help <task>`` lists, each ``nox -s`` session is one ``nox -l`` lists at
  that point of the guide and each flag after ``--`` one the build session's ``--help`` lists, and a
  script a command runs (``bash build_scripts/...sh``, ``python patches/...py``) exists.
- A ```text block right after a block that ran is its output, trimmed: each of its lines must occur in
  that order in what the block printed (stdout and stderr together); ``…`` in a line stands for any
  text, and lines may be left out. The output of a block that cannot run is quoted from a real run
  elsewhere and not compared.
- A ```diff block (``--- a/<file>``, ``+++ b/<file>``, then lines prefixed `` ``, ``-``, ``+``) is an
  edit the reader makes by hand; the test makes it (its old lines must occur exactly once).
- ``<!-- docs-test: publish every row -->`` stands for CI publishing what was merged: every row of the
  scratch versions.yaml gets its release (tag and title) in the scratch's local store.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ci.model import matrix
from ci.model.versions import load
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "maintaining-components.md"
SKILL = REPO / ".cursor" / "skills" / "manage-wheelhouse-components" / "SKILL.md"
DOCS = (GUIDE, SKILL)
NEEDS = {
    "github": "a GitHub store and token",
    "gpu": "a machine with a CUDA toolkit (and a GPU for the kernel tests)",
    "network": "upstream sources or a package index",
    "build": "a real build, or what one wrote to dist/ or .cache/builds/",
}
PUBLISH = "<!-- docs-test: publish every row -->"
DOCS_CACHE = REPO / ".cache" / "docs-test" / ".cache"
ELLIPSIS = "…"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
# what a command line may hold besides the command: variable assignments before it
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"|", "||", "&&", ";", "(", ")", "$(", "&"}


@dataclass(frozen=True)
class Step:
    """One thing the reader does, in order: a bash block, a diff to apply, or CI publishing."""

    doc: Path
    line: int  # 1-based line of the block's opening fence (or of the directive)
    kind: str  # "bash", "diff" or "publish"
    text: str = ""
    output: str | None = None  # the ```text block right after a bash block
    previous: tuple[Step, ...] = field(default=(), compare=False, repr=False)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    def header(self, key: str) -> str | None:
        """``# key: value`` among the block's leading comment lines."""
        for raw in self.text.splitlines():
            if not raw.startswith("#"):
                break
            m = re.match(rf"#\s*{key}:\s*(\S+)", raw)
            if m:
                return m[1]
        return None

    @property
    def needs(self) -> str | None:
        return self.header("needs")

    @property
    def exits(self) -> int:
        return int(self.header("exits") or 0)


def read_steps(doc: Path) -> list[Step]:
    """The steps of one markdown file: fenced bash and diff blocks (a ```text block right after a bash block
    is its output) and publish directives."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, str, str]] = []  # (line, kind, text)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            if lines[i].strip() == PUBLISH:
                found.append((i + 1, "publish", ""))
            i += 1
            continue
        indent, start = len(m["indent"]), i
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        found.append((start + 1, m["lang"], "\n".join(body) + "\n"))
        i += 1
    steps: list[Step] = []
    for n, (line, kind, text) in enumerate(found):
        if kind == "text" and steps and steps[-1].kind == "bash" and found[n - 1][1] == "bash" \
                and _only_blank_between(lines, found[n - 1], line):
            steps[-1] = Step(doc, steps[-1].line, "bash", steps[-1].text, text)
        elif kind in ("bash", "diff", "publish"):
            steps.append(Step(doc, line, kind, text))
    return steps


def _only_blank_between(lines: list[str], before: tuple[int, str, str], line: int) -> bool:
    """The output block follows its command block with nothing but blank lines between."""
    end = before[0] + before[2].count("\n") + 1  # the closing fence's line (1-based)
    return all(not text.strip() for text in lines[end:line - 1])


def all_steps() -> list[Step]:
    steps: list[Step] = []
    for doc in DOCS:
        for step in read_steps(doc):
            steps.append(Step(step.doc, step.line, step.kind, step.text, step.output, tuple(steps)))
    return steps


STEPS = all_steps()


# ---------------------------------------------------------------------------- what the output must show


def unmatched_output(expected: str, actual: str) -> str | None:
    """The first line of ``expected`` that does not occur, after the ones before it, in ``actual``."""
    out = [line.rstrip() for line in actual.splitlines()]
    at = 0
    for want in (line.rstrip() for line in expected.splitlines()):
        if not want.strip() or want.strip() == ELLIPSIS:
            continue
        while at < len(out) and not _line_matches(want, out[at]):
            at += 1
        if at == len(out):
            return want
        at += 1
    return None


def _line_matches(pattern: str, line: str) -> bool:
    """``pattern`` with ``…`` standing for any text matches the whole of ``line``."""
    regex = ".*".join(re.escape(piece) for piece in pattern.split(ELLIPSIS))
    return re.fullmatch(regex, line) is not None


# ---------------------------------------------------------------------------- diff blocks


def apply_diff(root: Path, text: str) -> None:
    """Apply a ```diff block: ``--- a/FILE`` / ``+++ b/FILE`` headers, then context, removed and added lines."""
    target: Path | None = None
    old: list[str] = []
    new: list[str] = []
    for raw in text.splitlines():
        if raw.startswith("--- "):
            continue
        if raw.startswith("+++ "):
            target = root / raw[4:].removeprefix("b/")
            continue
        if raw.startswith("@@"):
            continue
        mark, line = (raw[0], raw[1:]) if raw else (" ", "")
        if mark in " -":
            old.append(line)
        if mark in " +":
            new.append(line)
    assert target is not None, "the diff names no file (+++ b/<file>)"
    content = target.read_text(encoding="utf-8")
    before = "\n".join(old) + "\n"
    count = content.count(before)
    assert count == 1, f"the diff's old lines occur {count} time(s) in {target.relative_to(root)}, not once:\n{before}"
    target.write_text(content.replace(before, "\n".join(new) + "\n"), encoding="utf-8")


# ---------------------------------------------------------------------------- the commands a block runs


def commands(script: str) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Each simple command of a bash block: (the variables assigned before it, its words); redirections,
    heredoc bodies and comments are left out. Enough shell for documentation, not a shell parser."""
    heredoc: str | None = None
    for line in script.replace("\\\n", " ").splitlines():
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            heredoc = m[1]
            line = line[: m.start()]
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        redirect = False
        for token in [*lexer, ";"]:
            if redirect:  # the redirection's target
                redirect = False
            elif set(token) <= set("<>&") and set(token) & set("<>"):
                redirect = True
                if words and words[-1].isdigit():  # 2>&1: the descriptor is not a word
                    words.pop()
            elif token in SEPARATORS or set(token) <= set("|&;()"):
                assigned = {}
                while words and ASSIGNMENT.match(words[0]):
                    name, _, value = words.pop(0).partition("=")
                    assigned[name] = value
                if words:
                    yield assigned, words
                words = []
            else:
                words.append(token)


class Tools:
    """What invoke and nox accept in one copy of the repository: tasks and their flags, sessions and the
    build sessions' flags. invoke's answers depend on tasks.py only; nox's sessions on versions.yaml too."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self._answers: dict[tuple[tuple[str, ...], str | None, str], str] = {}

    def _run(self, *argv: str, versions: str | None = None) -> str:
        """What the command prints (asked once per arguments and content of the versions file)."""
        content = hashlib.sha256((self.root / versions).read_bytes()).hexdigest() if versions else ""
        key = (argv, versions, content)
        if key not in self._answers:
            env = {**self.env, "WHEELHOUSE_VERSIONS": versions} if versions else self.env
            result = subprocess.run(argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, (
                f"{' '.join(argv)} failed in the scratch copy:\n{result.stdout}{result.stderr}")
            self._answers[key] = result.stdout
        return self._answers[key]

    @property
    def tasks(self) -> set[str]:
        listing = self._run("invoke", "--list")
        return set(re.findall(r"^  ([a-z][\w-]*)", listing, re.MULTILINE))

    @property
    def core_flags(self) -> set[str]:
        return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", self._run("invoke", "--help").split("Core options:")[-1]))

    def task_flags(self, task: str) -> set[str]:
        text = self._run("invoke", "--help", task).split("Options:")[-1]
        return {"--help", "-h", *re.findall(r"^\s+(--[a-z][\w-]*)", text, re.MULTILINE)}

    def sessions(self, versions: str) -> set[str]:
        """The sessions ``nox -l`` lists for that versions file, as it is now."""
        return set(re.findall(r"^[*-] (\S+)", self._run("nox", "-l", versions=versions), re.MULTILINE))

    def build_flags(self, session: str, versions: str) -> set[str]:
        text = self._run("nox", "-s", session, "--", "--help", versions=versions)
        return set(re.findall(r"^\s+(--?[a-z][\w-]*)", text, re.MULTILINE))

    def problems(self, assigned: dict[str, str], words: list[str]) -> list[str]:
        """What is wrong with one command: an invoke task or flag, a nox session or flag, a script path."""
        program, args = Path(words[0]).name, words[1:]
        if program in ("invoke", "inv"):
            return self._invoke_problems(args)
        if program == "nox":
            return self._nox_problems(args, assigned.get("WHEELHOUSE_VERSIONS", "versions.yaml"))
        if program in ("bash", "python", "python3") and args and re.search(r"\.(sh|py)$", args[0]) \
                and not args[0].startswith(("/", "$")):
            return [] if (self.root / args[0]).is_file() else [f"{args[0]} does not exist"]
        return []

    def _invoke_problems(self, args: list[str]) -> list[str]:
        while args and args[0].startswith("-"):
            if args[0] in ("--help", "-h") and len(args) > 1:  # `invoke --help <task>`
                args = args[1:]
                break
            if args[0] not in self.core_flags:
                return [f"invoke has no core option {args[0]} (see `invoke --help`)"]
            args = args[1:]
        if not args:
            return []
        task, flags = args[0], [a.split("=")[0] for a in args[1:] if a.startswith("-")]
        if task not in self.tasks:
            return [f"invoke has no task {task!r} (`invoke --list`: {', '.join(sorted(self.tasks))})"]
        known = self.task_flags(task)
        return [f"invoke {task} has no flag {flag} (`invoke --help {task}`: {', '.join(sorted(known))})"
                for flag in flags if flag not in known]

    def _nox_problems(self, args: list[str], versions: str) -> list[str]:
        own, _, posargs = (args[: args.index("--")], "--", args[args.index("--") + 1:]) if "--" in args else (args, "", [])
        session = None
        for i, arg in enumerate(own):
            if arg in ("-s", "--session", "--sessions") and i + 1 < len(own):
                session = own[i + 1]
            elif arg.startswith("--session="):
                session = arg.split("=", 1)[1]
        if session is None:
            return []
        path = self.root / versions
        if not path.is_file():
            return [f"WHEELHOUSE_VERSIONS={versions}: no such file"]
        known = self.sessions(versions)
        if session not in known:
            return [f"nox has no session {session!r} for {versions} here (`nox -l` lists {len(known)})"]
        if not session.startswith("build-"):
            return []  # the tests session passes its arguments to pytest
        flags = self.build_flags(session, versions)
        return [f"{session} has no flag {flag} (`nox -s {session} -- --help`: {', '.join(sorted(flags))})"
                for flag in (a.split("=")[0] for a in posargs if a.startswith("-")) if flag not in flags]


# ---------------------------------------------------------------------------- the scratch copy


def scratch_env(root: Path, home: Path) -> dict[str, str]:
    """The reader's shell: our venv's tools first on PATH, nothing pointing at GitHub or another versions file."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WHEELHOUSE_", "GITHUB_", "GH_", "ACTIONS_", "RUNNER_", "NOX_", "PYTEST_"))}
    env.pop("VIRTUAL_ENV", None)
    bin_dir = str(Path(sys.executable).parent)
    # The builds' checkouts and compiler cache outlive the scratch copy (named .cache, as the guide's paths
    # show it): the CPU-world walk-through's compile is a cache hit after the first run.
    env.update(WHEELHOUSE_CACHE=str(DOCS_CACHE))
    env.update(PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]), PYTHONUNBUFFERED="1", HOME=str(home),
               GIT_AUTHOR_NAME="docs", GIT_AUTHOR_EMAIL="docs@example.invalid", GIT_COMMITTER_NAME="docs",
               GIT_COMMITTER_EMAIL="docs@example.invalid", WHEELHOUSE_WRITE_GAP="0", NO_COLOR="1")
    return env


class Scratch:
    """One copy of the repository, brought forward step by step; each step is taken once."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.env = scratch_env(root, home)
        self.tools = Tools(root, self.env)
        self.outcomes: dict[Step, Outcome] = {}

    def take(self, step: Step) -> Outcome:
        for earlier in (*step.previous, step):
            if earlier not in self.outcomes:
                self.outcomes[earlier] = self._take(earlier)
        return self.outcomes[step]

    def _take(self, step: Step) -> Outcome:
        try:
            if step.kind == "diff":
                apply_diff(self.root, step.text)
                return Outcome()
            if step.kind == "publish":
                self._publish_every_row()
                return Outcome()
            return self._bash(step)
        except AssertionError as error:
            return Outcome(problems=[str(error)])

    def _bash(self, step: Step) -> Outcome:
        syntax = subprocess.run(["bash", "-n"], input=step.text, capture_output=True, text=True)
        problems = [f"bash cannot parse it: {syntax.stderr.strip()}"] if syntax.returncode else []
        exported: dict[str, str] = {}  # `export WHEELHOUSE_VERSIONS=...` holds for the block's later commands
        for assigned, words in commands(step.text):
            if words[0] == "export":
                exported.update(w.partition("=")[::2] for w in words[1:] if ASSIGNMENT.match(w))
                continue
            problems += [f"`{shlex.join(words)}`: {p}" for p in self.tools.problems({**exported, **assigned}, words)]
        if step.needs is not None or problems:
            return Outcome(problems=problems)
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step.text], cwd=self.root, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        return Outcome(ran=True, returncode=result.returncode, output=result.stdout)

    def _publish_every_row(self) -> None:
        versions = load(self.root / "versions.yaml")
        store = LocalStore(self.root / "wheelhouse")
        for row in matrix.expand(versions):
            store.ensure_release(row.release_tag, matrix.release_title(versions, row), "")


@dataclass
class Outcome:
    ran: bool = False
    returncode: int = 0
    output: str = ""
    problems: list[str] = field(default_factory=list)


def make_scratch(root: Path, home: Path) -> Scratch:
    """A copy of the working tree as it is (tracked and untracked, not ignored), committed in a repository
    of its own, so the guide's git commands see what a maintainer's clone shows."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel, follow_symlinks=False)
    home.mkdir(parents=True, exist_ok=True)
    scratch = Scratch(root, home)
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "base"]):
        subprocess.run(argv, cwd=root, env=scratch.env, check=True)
    return scratch


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Scratch:
    base = tmp_path_factory.mktemp("docs")
    return make_scratch(base / "repo", base / "home")


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("step", STEPS, ids=[f"{s.where}-{s.kind}" for s in STEPS])
def test_step(scratch: Scratch, step: Step) -> None:
    """Each step does what the guide says: it parses, names tasks, sessions and flags that exist, and (where it
    runs here) exits as stated and prints what the guide quotes."""
    if step.kind == "bash":
        assert step.needs is None or step.needs in NEEDS, (
            f"{step.where}: `# needs: {step.needs}` is not one of {', '.join(NEEDS)}")
    outcome = scratch.take(step)
    assert not outcome.problems, f"{step.where}:\n" + "\n".join(outcome.problems)
    if not outcome.ran:
        return
    assert outcome.returncode == step.exits, (
        f"{step.where}: exited {outcome.returncode}, the guide says {step.exits}:\n{outcome.output}")
    if step.output is not None:
        missing = unmatched_output(step.output, outcome.output)
        assert missing is None, f"{step.where}: the output lacks, in this order,\n  {missing}\nit printed:\n{outcome.output}"


def test_every_runnable_block_runs_somewhere() -> None:
    """The guide is mostly commands that run here: the worked example adds a component, and the matrix,
    nox -l and the dry run show it; a mistyped key is its one line."""
    runnable = [s for s in STEPS if s.kind == "bash" and s.needs is None and s.doc == GUIDE]
    text = "\n".join(s.text for s in runnable)
    for command in (r"invoke matrix --component causal-conv1d", r"nox -l", r"nox -s build-causal-conv1d-\S+ -- .*--dry-run",
                    r"invoke prune", r"invoke workflows",
                    # the CPU world, end to end: a build, its release, the index, which-wheel, the install, a call
                    r"nox -s build-tiny-scale-3\.11 -- --reuse-env", r"invoke release --component tiny-scale",
                    r"invoke publish-index", r"site/which-wheel\.py", r"\| bash -ex", r"tiny_scale\.scale\("):
        assert re.search(command, text), f"no runnable block of the guide runs {command!r}"
    assert any(s.exits == 2 and s.output and "unknown key" in s.output for s in runnable), \
        "the guide shows no mistyped key answered by its one line"


def test_skill_front_matter() -> None:
    """The skill is an Agent Skill: YAML front matter with a `name` (its directory's) and a `description`
    saying what it does and when to use it, then the checklist."""
    text = SKILL.read_text(encoding="utf-8")
    m = re.match(r"^---\n(.*?)\n---\n", text, re.DOTALL)
    assert m, "SKILL.md must open with YAML front matter between --- lines"
    meta = yaml.safe_load(m[1])
    assert set(meta) >= {"name", "description"}, meta
    assert meta["name"] == SKILL.parent.name and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", meta["name"])
    assert len(meta["name"]) <= 64 and 0 < len(meta["description"]) <= 1024


def test_links_into_the_guide_land_on_its_headings() -> None:
    """Every link of the skill into the guide, and of the guide into itself, lands on one of its headings."""
    guide = GUIDE.read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", guide, re.MULTILINE)}
    from_skill = re.findall(r"maintaining-components\.md#([\w-]+)", SKILL.read_text(encoding="utf-8"))
    assert from_skill, "the skill points nowhere into the guide"
    assert sorted(set(from_skill + re.findall(r"\]\(#([\w-]+)\)", guide)) - anchors) == []


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_a_renamed_flag_fails_the_check(tmp_path: Path) -> None:
    """Rename a flag the guide uses only in a block that cannot run here (prune's --keep-worlds), in a copy
    of tasks.py: the check names the guide's line, the command and the flag."""
    users = [s for s in STEPS if s.kind == "bash" and s.needs and "--keep-worlds" in s.text]
    assert users, "the guide no longer uses prune --keep-worlds in a block that cannot run; pick another flag"
    scratch = make_scratch(tmp_path / "repo", tmp_path / "home")
    tasks_py = scratch.root / "tasks.py"
    tasks_py.write_text(tasks_py.read_text().replace("keep_worlds", "keep_world"))
    outcome = scratch._bash(users[0])
    assert any("invoke prune has no flag --keep-worlds" in p for p in outcome.problems), outcome.problems
