#!/usr/bin/env python3
"""How fast this machine compiles, measured the same way on every machine, so that build times from two hosts of
one kind can be told apart from a change in what was built.

Two hosts of one kind (the same GPU, 16 cores, the same CPU name) spent 609 s and 1044 s in the CMake part of one
TransformerEngine build, same sources, same settings: nothing in a device record said which host was which. The
probe compiles one fixed C++ unit (the standard library's maps, streams and sort: template work like a CUDA
extension's host side) with ``$CXX -O2``, alone (one core's speed) and then once per core at the same time (the
whole machine's throughput: shared or throttled cores show there), best of ``repeats`` each. A sweep or all-archs
record carries it; two records compare by ``one_s`` and ``all_cores_s``.

    python tests/gpu/host_probe.py [--out host-probe.json]

run_on_device.sh runs it in its machine section, before any build, and hands the file to ``sweep.py run`` and
``full_archs.py result`` (``--host-probe``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

UNIT = r"""
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

std::map<std::string, std::vector<std::string>> words_by_key(const std::string &text) {
    std::map<std::string, std::vector<std::string>> found;
    std::istringstream in(text);
    for (std::string word; in >> word;) {
        const auto equals = word.find('=');
        if (equals != std::string::npos) found[word.substr(0, equals)].push_back(word.substr(equals + 1));
    }
    return found;
}

std::string joined(const std::unordered_map<std::string, std::shared_ptr<std::vector<int>>> &values) {
    std::ostringstream out;
    std::vector<std::string> keys;
    for (const auto &[key, _] : values) keys.push_back(key);
    std::sort(keys.begin(), keys.end(), std::greater<>());
    for (const auto &key : keys) out << key << ':' << values.at(key)->size() << ';';
    return out.str();
}
"""
WHAT = "{compiler} -O2 -c of one fixed C++ unit (maps, streams, sort), best of {repeats}: alone, and {cores} at once"
# about 1.6 s on a 2-core CPU machine: a compile this slow is a stuck compiler, and the builds it comes before wait
COMPILE_TIMEOUT_S = 120


def _compile(compiler: str, source: Path, index: int, timeout_s: float) -> float:
    started = time.monotonic()
    subprocess.run([compiler, "-O2", "-std=c++17", "-c", str(source), "-o", str(source.with_name(f"unit-{index}.o"))],
                   check=True, capture_output=True, timeout=timeout_s)
    return time.monotonic() - started


def probe(*, compiler: str | None = None, cores: int | None = None, repeats: int = 3,
          timeout_s: float = COMPILE_TIMEOUT_S) -> dict:
    """The probe's record: ``one_s`` (one compile alone) and ``all_cores_s`` (``cores`` compiles at once, the
    longest of them), each the best of ``repeats``; ``error`` instead when the compiler cannot run or one compile
    takes longer than ``timeout_s``."""
    compiler = compiler or os.environ.get("CXX") or "g++"
    cores = cores or os.cpu_count() or 1
    record: dict = {"what": WHAT.format(compiler=Path(compiler).name, repeats=repeats, cores=cores), "cores": cores}
    if not shutil.which(compiler):
        return {**record, "error": f"no compiler {compiler!r} on PATH"}
    with tempfile.TemporaryDirectory(prefix="host-probe-") as tmp:
        source = Path(tmp) / "unit.cpp"
        source.write_text(UNIT)
        try:
            alone = min(_compile(compiler, source, 0, timeout_s) for _ in range(repeats))
            with ThreadPoolExecutor(max_workers=cores) as pool:
                together = min(max(pool.map(lambda i: _compile(compiler, source, i, timeout_s), range(cores)))
                               for _ in range(repeats))
        except subprocess.CalledProcessError as error:
            said = error.stderr.decode(errors="replace").strip()[-200:]
            return {**record, "error": f"{compiler} exit {error.returncode}: {said}"}
        except subprocess.TimeoutExpired:
            return {**record, "error": f"{compiler} took longer than {timeout_s:g} s for one compile; stopped"}
    return {**record, "one_s": round(alone, 2), "all_cores_s": round(together, 2)}


def read(path: Path) -> dict:
    """The record the machine section of run_on_device.sh wrote, or why there is none (a probe that failed must
    not stop the run it describes)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return {"error": f"{path}: {error}"}


def line(record: dict) -> str:
    """One line for a log or a summary."""
    if "error" in record:
        return f"host probe: not measured ({record['error']})"
    return (f"host probe: {record['one_s']} s alone, {record['all_cores_s']} s with {record['cores']} at once "
            f"({record['what']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the record here as JSON")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    record = probe(repeats=args.repeats)
    print(line(record))
    if args.out:
        args.out.write_text(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
