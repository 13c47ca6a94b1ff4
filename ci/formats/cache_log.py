"""Which translation units the compiler cache could not reuse, from the log of a build's sccache server.

sccache's statistics count hits and misses but name no object. Its server, with
``SCCACHE_LOG=sccache::server=debug``, writes one line per answered compile,
``[<output>]: compile result: <cache hit | cache miss | not cacheable | ...>``, into
``SCCACHE_ERROR_LOG``. One nvcc compile is several cached steps (``x.module_id``,
``x.compute_90.ptx``, ``x.compute_90.cubin``, the host ``x.o``) and the outer ``x.o``
itself is "not cacheable": a translation unit counts as reused when every cached step of
it hit, and as not reused when any step missed (or nothing of it was cached at all).
A unit that includes Python's headers is never reused by another Python: its
preprocessed text differs (tests/test_compiler_cache.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

SERVER_LOG_FILTER = "sccache::server=debug"
"""``SCCACHE_LOG`` for the build's server: its per-compile result lines, and nothing of the other modules."""
LOG_NAME = "sccache-server.log"

_RESULT = re.compile(r"\[(?P<output>[^\]]+)\]: compile result: (?P<result>.+?)\s*$")


def read_results(log: Path) -> list[tuple[str, str]]:
    """(output, result) per compile the server answered, in order; empty when there is no log."""
    if not log.is_file():
        return []
    return [(m["output"], m["result"]) for m in map(_RESULT.search, log.read_text(errors="replace").splitlines()) if m]


def translation_unit(output: str) -> str:
    """The unit an output comes from: its file name up to the first dot, ``fixture_cuda`` for every step of
    that nvcc compile. The server logs outputs by file name only, so two units of one name in two
    directories count as one."""
    return PurePosixPath(output).name.split(".", 1)[0]


def not_reused(results: Iterable[tuple[str, str]]) -> list[str]:
    """The translation units of ``results`` the cache could not serve, sorted."""
    steps: dict[str, list[str]] = {}
    for output, result in results:
        steps.setdefault(translation_unit(output), []).append(result)
    missed = []
    for unit, results_of_unit in steps.items():
        cached = [result for result in results_of_unit if result != "not cacheable"]
        if not cached or any(not result.startswith("cache hit") for result in cached):
            missed.append(unit)
    return sorted(missed)


def unit_counts(results: Iterable[tuple[str, str]]) -> dict[str, int] | None:
    """Per translation unit, the counts a build reports: units compiled through the cache (``requests``), served
    whole from it (``hits``), compiled (``misses``). sccache counts its cached steps instead: one nvcc unit is
    one compile request but four steps, so a cold build of three units read "3 compile requests, 0 hits,
    12 misses". None when ``results`` is empty (no log to read)."""
    results = list(results)
    if not results:
        return None
    units = {translation_unit(output) for output, _ in results}
    missed = not_reused(results)
    return {"requests": len(units), "hits": len(units) - len(missed), "misses": len(missed)}


def hit_share(hits: int, requests: int) -> str:
    """A hit rate as a percentage with one decimal, rounded down: 213 hits of 214 read "99.5%", never "100%",
    which is kept for a build with no miss. "-" when nothing was compiled."""
    if not requests:
        return "-"
    return f"{hits * 1000 // requests / 10:.1f}%"  # rounded down in integers
