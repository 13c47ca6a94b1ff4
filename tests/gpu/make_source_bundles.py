#!/usr/bin/env python3
"""Make a git mirror for the GPU machine from local snapshots of the upstream repositories.

The GPU machine reaches no network and takes at most 64 MiB per call, yet its
builds must take our real git path (``source: {git: https://github.com/...}``,
shallow fetch, submodules, clean checkout). This script writes, for every git
component of a versions file, a bare repository per upstream repository into
``OUT/<owner>/<name>.git``, holding only the commits the builds need, depth 1:
the component's ref and, recursively, the submodule commits its tree points to.
The GPU machine then points git at it with its own ``url.<base>.insteadOf``
(README, "Building offline or from a mirror").

Snapshots are bare repositories of the upstream projects, found as
``SNAPSHOTS/<owner>/<name>.git`` or ``SNAPSHOTS/<owner>+<name>/repo`` (or ``--snapshot owner/name=PATH``).

Trimming. A repository listed in TRIM_RULES keeps only the paths a build reads
(plus its top-level files): CUTLASS's full tree is 139 MB, its headers 27 MB,
and snapshots may lack a blob a build never reads. A trimmed tree is a new
commit, so everything pointing to it is rewritten too: the new commits keep the
author, dates and message and add trailers naming the upstream commit they
stand for. Rewriting is deterministic, so the same snapshots always give the
same commit ids, and a versions file can pin them. Commits that need no trim
are served unchanged (their upstream ids).

    python tests/gpu/make_source_bundles.py --versions tests/fixtures/versions-device.yaml \\
        --snapshots DIR --out .device/mirror [--upstream COMPONENT=COMMIT ...]

``--upstream`` names the upstream commit to serve for a component whose
versions-file ref is the id of its trimmed rewrite; the script checks that the
rewrite it makes has exactly that id, so the versions file and the mirror
cannot drift apart. The last lines printed are one row per component: its
upstream commit, the commit the mirror serves, and the submodules.

``--stand-in OWNER/NAME@COMMIT=ARCHIVE:PREFIX`` serves a submodule commit that
no snapshot has as a commit of the files under PREFIX of a tar archive (an
upstream sdist that carries that submodule's tree, say), with trailers naming
both; the commits pointing to it are rewritten as for a trim. ``--component``
(repeatable) limits the mirror to those components.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ci.base.errors import WheelhouseError  # noqa: E402
from ci.model import versions as versions_mod  # noqa: E402

# What a build reads of a repository that is too large (or incomplete in a
# snapshot) to carry whole. Top-level files (licences, READMEs) are always kept.
TRIM_RULES: dict[str, tuple[str, ...]] = {
    "NVIDIA/cutlass": ("include", "tools/util/include"),
    # TransformerEngine reads its headers and its cmake/cuDNN.cmake
    "NVIDIA/cudnn-frontend": ("include", "cmake"),
    # its wheel is src/megatron/bridge; the snapshot lacks a blob under docs/ (a 4 MiB gif)
    "NVIDIA-NeMo/Megatron-Bridge": ("src",),
    # what flashinfer's wheels and its ahead-of-time compile read (its docs, tests and benchmarks are most of it)
    "flashinfer-ai/flashinfer": ("flashinfer", "flashinfer-jit-cache", "csrc", "include", "licenses", "3rdparty"),
    # the three trees flashinfer includes (cub, libcu++, thrust), 418 MB of history and tests besides
    "NVIDIA/cccl": ("cub/cub", "libcudacxx/include", "thrust/thrust"),
}

_GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$")
# Fixed identity for nothing: commit-tree takes author and committer from the
# upstream commit, so the rewrite is reproducible on any machine.
_PLAIN_GIT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


class BundleError(WheelhouseError):
    pass


def git(*args: str, git_dir: Path, env: dict | None = None, stdin: str | None = None,
        stdin_bytes: bytes | None = None) -> str:
    data = stdin_bytes if stdin_bytes is not None else (stdin.encode() if stdin is not None else None)
    result = subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, input=data,
                            env={**os.environ, **_PLAIN_GIT, **(env or {})})
    if result.returncode != 0:
        error = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise BundleError(f"git {' '.join(args[:3])} in {git_dir}: {error}")
    return result.stdout.decode()


def repo_name(url: str) -> str:
    """``owner/name`` of a GitHub URL; the mirror is laid out by it."""
    match = _GITHUB.match(url)
    if not match:
        raise BundleError(f"{url}: not a https://github.com/<owner>/<name> URL; the mirror is laid out by owner/name")
    return f"{match.group(1)}/{match.group(2)}"


@dataclass
class Served:
    """What the mirror serves for one upstream commit."""

    repo: str
    upstream: str
    commit: str
    submodules: list[Served] = field(default_factory=list)

    def describe(self) -> str:
        text = self.upstream[:12] if self.commit == self.upstream else f"{self.upstream[:12]} as {self.commit[:12]} (trimmed)"
        return text


@dataclass(frozen=True)
class StandIn:
    """The files under ``prefix`` of a tar ``archive``, served for a commit no snapshot has."""

    archive: Path
    prefix: str


def find_snapshot(root: Path, repo: str) -> Path | None:
    """The bare snapshot of ``repo`` (``owner/name``) under ``root``, in either layout snapshots come in:
    ``<owner>/<name>.git`` or ``<owner>+<name>/repo``; None when neither is there."""
    laid_out = (root / f"{repo}.git", root / repo.replace("/", "+") / "repo")
    return next((path for path in laid_out if path.is_dir()), None)


class MirrorBuilder:
    def __init__(self, snapshots: dict[str, Path], snapshot_root: Path | None, out: Path,
                 stand_ins: dict[tuple[str, str], StandIn] | None = None):
        self.snapshots = snapshots
        self.snapshot_root = snapshot_root
        self.out = out
        self.stand_ins = stand_ins or {}
        self.done: dict[tuple[str, str], Served] = {}

    def snapshot(self, repo: str) -> Path:
        path = self.snapshots.get(repo)
        if path is None and self.snapshot_root is not None:
            path = find_snapshot(self.snapshot_root, repo)
        if path is None or not path.is_dir():
            raise BundleError(f"no snapshot of {repo}: pass --snapshot {repo}=PATH or put it at SNAPSHOTS/{repo}.git")
        return path

    def mirror(self, repo: str) -> Path:
        path = self.out / f"{repo}.git"
        if not path.is_dir():
            path.mkdir(parents=True)
            git("init", "-q", "--bare", git_dir=path)
            # Submodule updates fetch commits by id, which no branch may advertise.
            git("config", "uploadpack.allowAnySHA1InWant", "true", git_dir=path)
            # Trimming reads objects straight from the snapshot; `finish` packs
            # what is reachable and drops this link.
            alternates = path / "objects" / "info" / "alternates"
            if self._has_snapshot(repo):  # a repository only stood in for has none
                alternates.write_text(str((self.snapshot(repo) / "objects").resolve()) + "\n")
        return path

    def _has_snapshot(self, repo: str) -> bool:
        try:
            self.snapshot(repo)
        except BundleError:
            return False
        return True

    def resolve(self, repo: str, ref: str) -> str:
        snapshot = self.snapshot(repo)
        try:
            return git("rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}", git_dir=snapshot).strip()
        except BundleError:
            raise BundleError(f"{repo}: ref {ref} is not in its snapshot; name a commit the snapshot has "
                              "(--upstream COMPONENT=COMMIT)") from None

    def serve(self, repo: str, commit: str, submodules_wanted: bool | tuple[str, ...] = True) -> Served:
        """Put ``commit`` (and the submodule commits a build fetches: all, none, or the paths
        named) into the mirror; return what is served."""
        if (repo, commit) in self.done:
            return self.done[(repo, commit)]
        if (repo, commit) in self.stand_ins:
            served = Served(repo, commit, self._stand_in(repo, commit, self.stand_ins[(repo, commit)]))
            git("update-ref", f"refs/heads/wheelhouse/{commit}", served.commit, git_dir=self.mirror(repo))
            self.done[(repo, commit)] = served
            return served
        snapshot = self.snapshot(repo)
        mirror = self.mirror(repo)
        submodules = []
        replaced: dict[str, str] = {}
        urls = self._submodule_urls(snapshot, commit)
        for path, gitlink in self._gitlinks(snapshot, commit):
            if path not in urls:
                continue  # a gitlink without a .gitmodules entry is never checked out
            if not submodules_wanted or (isinstance(submodules_wanted, tuple) and path not in submodules_wanted):
                continue  # the build never fetches it: its gitlink stays as upstream wrote it
            sub = self.serve(repo_name(urls[path]), gitlink)
            submodules.append(sub)
            if sub.commit != gitlink:
                replaced[path] = sub.commit
        keep = TRIM_RULES.get(repo)
        if keep is None and not replaced:
            self._check_complete(repo, snapshot, commit, None)
            served = Served(repo, commit, commit, submodules)
        else:
            served = Served(repo, commit, self._rewrite(repo, mirror, commit, keep, replaced), submodules)
        git("update-ref", f"refs/heads/wheelhouse/{commit}", served.commit, git_dir=mirror)
        self.done[(repo, commit)] = served
        return served

    def name_ref(self, repo: str, ref: str, served: Served) -> None:
        """Make a branch or tag name of the versions file resolve in the mirror, as upstream."""
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            return
        snapshot = self.snapshot(repo)
        kind = "tags" if git("show-ref", "--tags", "--", ref, git_dir=snapshot).strip() else "heads"
        git("update-ref", f"refs/{kind}/{ref}", served.commit, git_dir=self.mirror(repo))

    def finish(self) -> None:
        """Pack each mirror into one self-contained pack, depth 1, and point HEAD at a served commit."""
        for mirror in sorted(self.out.glob("*/*.git")):
            heads = git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/wheelhouse/", git_dir=mirror)
            served = [line.split() for line in heads.splitlines()]
            # Unchanged upstream commits keep their parents out: mark them shallow.
            shallow = sorted({commit for _, commit in served if git("rev-list", "--parents", "-n1", commit,
                                                                      git_dir=mirror).split()[1:]})
            (mirror / "shallow").write_text("".join(f"{c}\n" for c in shallow))
            git("symbolic-ref", "HEAD", served[0][0], git_dir=mirror)
            # Exactly the objects of the served commits (rev-list stops at the shallow ones), in one
            # pack of the mirror's own: no reference to the snapshot remains.
            objects = git("rev-list", "--objects", "--no-object-names", *(c for _, c in served), git_dir=mirror)
            git("pack-objects", "-q", str(mirror / "objects" / "pack" / "pack"), git_dir=mirror, stdin=objects)
            (mirror / "objects" / "info" / "alternates").unlink(missing_ok=True)
            shutil.rmtree(mirror / "hooks", ignore_errors=True)
            git("fsck", "--connectivity-only", "--no-dangling", git_dir=mirror)

    def _stand_in(self, repo: str, commit: str, stand_in: StandIn) -> str:
        """A commit of the archive's files under its prefix (dated at the newest of them), standing for ``commit``."""
        mirror = self.mirror(repo)
        prefix = stand_in.prefix.rstrip("/") + "/"
        entries, newest = [], 0
        with tarfile.open(stand_in.archive) as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                if not member.isfile() or not member.name.startswith(prefix):
                    continue
                data = archive.extractfile(member).read()  # type: ignore[union-attr]
                sha = git("hash-object", "-w", "--stdin", git_dir=mirror, stdin_bytes=data).strip()
                mode = "100755" if member.mode & 0o111 else "100644"
                entries.append(f"{mode} {sha}\t{member.name[len(prefix):]}\0")
                newest = max(newest, int(member.mtime))
        if not entries:
            raise BundleError(f"{stand_in.archive}: holds no file under {prefix}; name the prefix of the submodule's tree")
        index = {"GIT_INDEX_FILE": str(mirror / "wheelhouse-index")}
        git("read-tree", "--empty", git_dir=mirror, env=index)
        git("update-index", "-z", "--index-info", git_dir=mirror, env=index, stdin="".join(entries))
        tree = git("write-tree", git_dir=mirror, env=index).strip()
        (mirror / "wheelhouse-index").unlink()
        date = f"{newest} +0000"
        identity = {"GIT_AUTHOR_NAME": "wheelhouse mirror", "GIT_AUTHOR_EMAIL": "mirror@wheelhouse.invalid",
                    "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_NAME": "wheelhouse mirror",
                    "GIT_COMMITTER_EMAIL": "mirror@wheelhouse.invalid", "GIT_COMMITTER_DATE": date}
        body = (f"{repo}@{commit[:12]}, from {stand_in.archive.name}\n\n"
                f"Wheelhouse-stand-in-for: {repo}@{commit}\n"
                f"Wheelhouse-tree-from: {stand_in.archive.name}:{prefix}\n")
        return git("-c", "commit.gpgSign=false", "commit-tree", tree, git_dir=mirror, env=identity, stdin=body).strip()

    @staticmethod
    def _gitlinks(snapshot: Path, commit: str) -> list[tuple[str, str]]:
        lines = git("ls-tree", "-r", "-z", commit, git_dir=snapshot).split("\0")
        found = []
        for line in filter(None, lines):
            meta, path = line.split("\t", 1)
            _mode, kind, sha = meta.split()
            if kind == "commit":
                found.append((path, sha))
        return found

    @staticmethod
    def _submodule_urls(snapshot: Path, commit: str) -> dict[str, str]:
        if not git("ls-tree", commit, "--", ".gitmodules", git_dir=snapshot).strip():
            return {}
        result = subprocess.run(["git", f"--git-dir={snapshot}", "config", "--blob", f"{commit}:.gitmodules",
                                 "--get-regexp", r"^submodule\..*\.(path|url)$"],
                                capture_output=True, text=True, env={**os.environ, **_PLAIN_GIT})
        names: dict[str, dict[str, str]] = {}
        for line in result.stdout.splitlines():  # exit 1: no submodule entries
            key, value = line.split(" ", 1)
            name, attribute = key[len("submodule."):].rsplit(".", 1)
            names.setdefault(name, {})[attribute] = value
        return {entry["path"]: entry["url"] for entry in names.values() if "path" in entry and "url" in entry}

    def _check_complete(self, repo: str, snapshot: Path, commit: str, paths: tuple[str, ...] | None) -> None:
        listing = git("ls-tree", "-r", "-z", commit, "--", *(paths or ()), git_dir=snapshot).split("\0")
        blobs = {}
        for line in filter(None, listing):
            meta, path = line.split("\t", 1)
            if meta.split()[1] == "blob":
                blobs[meta.split()[2]] = path
        answer = git("cat-file", "--batch-check", git_dir=snapshot, stdin="".join(f"{b}\n" for b in blobs))
        missing = [blobs[line.split()[0]] for line in answer.splitlines() if line.endswith(" missing")]
        if missing:
            raise BundleError(f"{repo}@{commit[:12]}: the snapshot lacks {len(missing)} file(s), e.g. {missing[0]}; "
                              f"add a TRIM_RULES entry for {repo} that leaves them out")

    def _rewrite(self, repo: str, mirror: Path, commit: str, keep: tuple[str, ...] | None,
                 replaced: dict[str, str]) -> str:
        snapshot = self.snapshot(repo)
        index = {"GIT_INDEX_FILE": str(mirror / "wheelhouse-index")}
        if keep is None:
            git("read-tree", commit, git_dir=mirror, env=index)
        else:
            self._check_complete(repo, snapshot, commit, keep)
            top = [line for line in git("ls-tree", "-z", commit, git_dir=snapshot).split("\0")
                   if line and line.split()[1] == "blob"]
            below = [line for line in git("ls-tree", "-r", "-z", commit, "--", *keep, git_dir=snapshot).split("\0")
                     if line]
            git("read-tree", "--empty", git_dir=mirror, env=index)
            git("update-index", "-z", "--index-info", git_dir=mirror, env=index,
                stdin="".join(f"{line}\0" for line in top + below))
        for path, new in sorted(replaced.items()):
            git("update-index", "--cacheinfo", f"160000,{new},{path}", git_dir=mirror, env=index)
        tree = git("write-tree", git_dir=mirror, env=index).strip()
        (mirror / "wheelhouse-index").unlink()
        fields = git("log", "-1", "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd%x00%B", "--date=raw", commit,
                     git_dir=snapshot).split("\0")
        author, email, date, committer, committer_email, committer_date, message = fields
        trailers = [f"Wheelhouse-trimmed-from: {repo}@{commit}"]
        if keep is not None:
            trailers.append(f"Wheelhouse-kept-paths: {' '.join(keep)} and top-level files")
        trailers += [f"Wheelhouse-submodule: {path} -> {new}" for path, new in sorted(replaced.items())]
        body = message.rstrip("\n") + "\n\n" + "\n".join(trailers) + "\n"
        identity = {"GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
                    "GIT_COMMITTER_NAME": committer, "GIT_COMMITTER_EMAIL": committer_email,
                    "GIT_COMMITTER_DATE": committer_date}
        return git("-c", "commit.gpgSign=false", "commit-tree", tree, git_dir=mirror, env=identity, stdin=body).strip()


def parse_stand_ins(values: list[str]) -> dict[tuple[str, str], StandIn]:
    """``OWNER/NAME@COMMIT=ARCHIVE:PREFIX`` -> {(repo, commit): StandIn}."""
    found = {}
    for value in values:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)@([0-9a-f]{40})=(.+):([^:]+)", value)
        if not match or not Path(match[3]).is_file():
            raise BundleError(f"--stand-in {value!r}: expected OWNER/NAME@<40-hex commit>=ARCHIVE:PREFIX, with an "
                              "existing tar archive")
        found[(match[1], match[2])] = StandIn(Path(match[3]), match[4])
    return found


def parse_pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise BundleError(f"{what} {value!r}: expected KEY=VALUE")
        pairs[key] = rest
    return pairs


def build(versions_path: Path, out: Path, *, snapshot_root: Path | None, snapshots: dict[str, Path],
          upstream: dict[str, str], stand_ins: dict[tuple[str, str], StandIn] | None = None,
          components: tuple[str, ...] = ()) -> list[tuple[str, Served]]:
    versions = versions_mod.load(versions_path, check_tree=False)
    unknown = sorted((set(upstream) | set(components)) - set(versions.components))
    if unknown:
        raise BundleError(f"--upstream/--component {unknown[0]}: no such component in {versions_path}")
    if out.exists():
        shutil.rmtree(out)
    builder = MirrorBuilder(snapshots, snapshot_root, out, stand_ins)
    rows = []
    for name, component in sorted(versions.components.items()):
        if component.source.kind != "git" or (components and name not in components):
            continue
        repo = repo_name(component.source.location)
        commit = builder.resolve(repo, upstream.get(name, component.ref))
        served = builder.serve(repo, commit, component.source.submodules)
        if name in upstream:
            if served.commit != component.ref:
                raise BundleError(f"{versions_path}: components.{name}.ref is {component.ref} but the mirror serves "
                                  f"{upstream[name][:12]} as {served.commit}; write that id into the ref")
        else:
            builder.name_ref(repo, component.ref, served)
            if served.commit != commit:
                raise BundleError(f"{versions_path}: components.{name}: {component.ref} had to be rewritten "
                                  f"(trimmed submodules) into {served.commit}; pin that id as the ref and pass "
                                  f"--upstream {name}={commit}")
        rows.append((name, served))
    builder.finish()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--snapshots", type=Path, help="folder holding <owner>/<name>.git snapshots")
    parser.add_argument("--snapshot", action="append", default=[], metavar="OWNER/NAME=PATH")
    parser.add_argument("--upstream", action="append", default=[], metavar="COMPONENT=COMMIT")
    parser.add_argument("--stand-in", action="append", default=[], metavar="OWNER/NAME@COMMIT=ARCHIVE:PREFIX")
    parser.add_argument("--component", action="append", default=[], help="only these components (repeatable)")
    args = parser.parse_args(argv)
    try:
        snapshots = {repo: Path(path) for repo, path in parse_pairs(args.snapshot, "--snapshot").items()}
        rows = build(args.versions, args.out, snapshot_root=args.snapshots, snapshots=snapshots,
                     upstream=parse_pairs(args.upstream, "--upstream"), stand_ins=parse_stand_ins(args.stand_in),
                     components=tuple(args.component))
    except WheelhouseError as error:
        print(f"make_source_bundles: {error}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"mirror {args.out}: {size / 2**20:.1f} MiB")
    for name, served in rows:
        subs = ", ".join(f"{s.repo} {s.describe()}" for s in served.submodules) or "no submodules"
        print(f"  {name}: {served.repo} {served.describe()}; {subs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
