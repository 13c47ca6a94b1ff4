"""Run the benchmark figures and (re)write ``benchmarks/RESULTS.md``.

    python -m benchmarks                     # every figure, full sizes (about 20-30 min on 2 cores)
    python -m benchmarks --quick             # smaller sizes, no 2 GB wheels, no GPU-machine figure (< 10 min)
    python -m benchmarks --only listing,strip
    python -m benchmarks --list

With ``--only``, the other figures' sections of an existing RESULTS.md are kept as they were (each
section states its own mode and date). Big inputs are made once and kept under ``.cache/bench/``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

from benchmarks import (
    builds,
    cross_python,
    fatbin_scan,
    hostile,
    listing,
    nvcc_threads,
    pacing,
    python_reuse,
    rebuilds,
    remote_cache,
    resolution,
    skip_plan,
    staged_pythons,
    strip,
    venvs,
)
from benchmarks.common import CACHE, RESULTS, Context, Figure, machine

FIGURES: list[ModuleType] = [listing, skip_plan, strip, fatbin_scan, resolution, builds, hostile, pacing, venvs,
                             cross_python, rebuilds, python_reuse, staged_pythons, nvcc_threads, remote_cache]
_SECTION = re.compile(r"<!-- figure:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /figure:(?P=name) -->", re.S)
_SUMMARY = re.compile(r"<!-- summary: (?P<line>.*?) -->")


def _section(fig: Figure, mode: str, taken: str) -> str:
    fig.taken = f"{taken}, {mode} mode"
    body = fig.markdown()
    hidden = "".join(f"<!-- summary: {line} -->\n" for line in fig.summary)
    return f"<!-- figure:{fig.name} -->\n{body}{hidden}<!-- /figure:{fig.name} -->"


def render(sections: dict[str, str], facts: dict[str, str], *, mode: str, wall_s: float, command: str) -> str:
    summaries = []
    for module in FIGURES:
        body = sections.get(module.NAME)
        if body:
            summaries += [(module.TITLE.split(" ", 1)[0], m["line"]) for m in _SUMMARY.finditer(body)]
    lines = [
        "# Benchmarks",
        "",
        "Ratios of our approach to the anchor's (verl-wheelhouse), each measured side by side in one run on one "
        "machine, repetitions interleaved; every figure states what was compared, where, how many repetitions, "
        "and min / median. The anchor's approaches are reproduced as measuring sticks in `benchmarks/anchor/`. "
        "Regenerate with `invoke bench` (`--quick` for the short run, `--only NAME,...` for some figures).",
        "",
        "## Machine and run",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in facts.items()],
        f"| run | `{command}` ({mode} mode), {wall_s / 60:.1f} min |",
        "",
        "## Headline figures",
        "",
        "| figure | result |",
        "|---|---|",
        *[f"| {num} | {line} |" for num, line in summaries],
        "",
    ]
    for module in FIGURES:
        if module.NAME in sections:
            lines += [sections[module.NAME], ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes; skips the 2 GB wheels and figure 6(b)")
    ap.add_argument("--only", default="", help="comma-separated figure names (see --list)")
    ap.add_argument("--list", action="store_true", help="list the figures and exit")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where to write the results (default: %(default)s)")
    ap.add_argument("--cache", type=Path, default=CACHE, help="where big inputs are kept (default: %(default)s)")
    ap.add_argument("--toy", action="store_true", help="tiny sizes: checks the machinery only (the smoke test)")
    args = ap.parse_args(argv)

    if args.list:
        for module in FIGURES:
            print(f"{module.NAME:14} {module.TITLE}")
        return 0
    known = {m.NAME: m for m in FIGURES}
    wanted = [n.strip() for n in args.only.split(",") if n.strip()] or list(known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        print(f"error: unknown figure(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2

    try:  # before any figure runs: a full run takes an hour, and the file is written after each figure
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"error: --out {args.out}: its folder cannot be made ({error.strerror}); pass a path in a folder "
              "you can write", file=sys.stderr)
        return 2
    ctx = Context(quick=args.quick, toy=args.toy, cache=args.cache, work=args.cache / "work")
    facts = machine()
    command = "python -m benchmarks" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    sections: dict[str, str] = {}
    if args.only and args.out.is_file():
        sections = {m["name"]: m.group(0) for m in _SECTION.finditer(args.out.read_text())}
    failed = []
    started = time.perf_counter()
    try:
        for name in wanted:
            module = known[name]
            ctx.log(f"[{name}] {module.TITLE}")
            t0 = time.perf_counter()
            try:
                fig = module.run(ctx)
            except Exception as error:  # a broken figure is reported, the others still run
                traceback.print_exc()
                failed.append(name)
                fig = Figure(name, module.TITLE, compared="(failed)", where="this machine", repetitions="-",
                             notes=[f"This figure failed in this run: {type(error).__name__}: {error}"])
            fig.seconds = time.perf_counter() - t0
            ctx.log(f"[{name}] done in {fig.seconds:.0f} s")
            sections[name] = _section(fig, ctx.mode, facts["date"])
            args.out.write_text(render(sections, facts, mode=ctx.mode, wall_s=time.perf_counter() - started,
                                       command=command))
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
    total = time.perf_counter() - started
    ctx.log(f"wrote {args.out} ({ctx.mode} mode, {total / 60:.1f} min)")
    if failed:
        ctx.log(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
