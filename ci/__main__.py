"""``python -m ci <command>``: the library's commands that builders, CI steps and maintainers run where invoke and
nox are not the entry (a builder's shell, the publish job's recheck, a data file regenerated):

- ``strip-local-version WHEEL...``: a wheel's ``+local`` version stripped in place (build_scripts/lib/wheel_pack.sh);
- ``jit-cache merge|select|finish-shard|pack``: flashinfer-jit-cache's steps (build_scripts/lib/flashinfer.sh);
- ``torch-wheel``: a row's torch wheel downloaded, not installed (the publish job's ABI recheck);
- ``shard-model``: a row's shards modelled on another runner from measured module times;
- ``size-model [--write|--check]`` and ``timing-data [--check]``: the data files the plans read (ci/timing/),
  written again from benchmarks/device_results.json, or checked against it.

One error path: a usage error is argparse's (exit 2); anything the library refuses is one ``error:`` line
(``::error::`` on GitHub Actions) and its exit status. Results go to stdout, everything else to the log (stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ci.base import log
from ci.base.errors import WheelhouseError
from ci.formats import rewrite
from ci.model import jit_cache
from ci.model.environment import on_github_actions
from ci.publish import torch_wheel
from ci.timing import shard_model, size_model, timing_data

COMMANDS = (rewrite, jit_cache, torch_wheel, shard_model, size_model, timing_data)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m ci", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_command(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    log.configure(github_actions=on_github_actions(os.environ))
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except WheelhouseError as error:
        log.report_error(str(error))
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
