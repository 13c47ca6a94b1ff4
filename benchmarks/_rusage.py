"""Run a command; print one JSON line with its wall time and the peak RSS of its process tree.

Started by :func:`benchmarks.common.measure_command` through ``/bin/sh`` (which forks), so this
process begins from a small address space: Linux carries a spawner's peak RSS into the children's
``ru_maxrss`` across fork+exec, and the benchmark runner itself is large.
``RUSAGE_CHILDREN`` is the largest peak of any waited-for descendant (a shell script's tools included).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time


def main() -> int:
    cwd = None
    args = sys.argv[1:]
    if args[:1] == ["--cwd"]:
        cwd, args = args[1], args[2:]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, capture_output=True, check=False)
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "rc": proc.returncode,
        "wall_s": wall,
        "maxrss_kb": children.ru_maxrss,
        "wrapper_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "stdout": proc.stdout.decode(errors="replace")[-4000:],
        "stderr": proc.stderr.decode(errors="replace")[-4000:],
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
