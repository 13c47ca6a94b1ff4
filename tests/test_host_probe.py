"""The host probe (tests/gpu/host_probe.py): how fast a device host compiles, kept in its sweep and all-archs
records; it runs here with this machine's g++, and a probe that cannot run never stops the run it describes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import host_probe  # noqa: E402
import sweep  # noqa: E402


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ on this machine")
def test_the_probe_times_one_compile_alone_and_one_per_core_at_once(tmp_path):
    assert host_probe.main(["--out", str(tmp_path / "probe.json"), "--repeats", "1"]) == 0
    record = json.loads((tmp_path / "probe.json").read_text())
    assert 0 < record["one_s"] < 60 and 0 < record["all_cores_s"] < 120 and "error" not in record
    assert record["what"].startswith("g++ -O2 -c of one fixed C++ unit") and record["what"].endswith(
        f"{record['cores']} at once")
    assert host_probe.line(record).startswith(f"host probe: {record['one_s']} s alone, {record['all_cores_s']} s with ")


def test_a_probe_that_cannot_run_or_hangs_is_recorded_as_such_and_stops_nothing(tmp_path):
    absent = host_probe.probe(compiler=str(tmp_path / "no-such-g++"), cores=2, repeats=1)
    assert absent["error"] == f"no compiler {str(tmp_path / 'no-such-g++')!r} on PATH" and "one_s" not in absent
    broken = tmp_path / "g++"
    broken.write_text("#!/bin/sh\necho 'cc1plus: out of memory' >&2\nexit 4\n")
    broken.chmod(0o755)
    failed = host_probe.probe(compiler=str(broken), cores=2, repeats=1)
    assert failed["error"].startswith(f"{broken} exit 4: cc1plus: out of memory")
    assert host_probe.line(failed) == f"host probe: not measured ({failed['error']})"
    stuck = tmp_path / "stuck" / "g++"
    stuck.parent.mkdir()
    stuck.write_text("#!/bin/sh\nexec sleep 30\n")
    stuck.chmod(0o755)
    hung = host_probe.probe(compiler=str(stuck), cores=2, repeats=1, timeout_s=0.5)
    assert hung["error"] == f"{stuck} took longer than 0.5 s for one compile; stopped" and "one_s" not in hung
    missing = host_probe.read(tmp_path / "host-probe.json")  # the machine section wrote none
    assert missing["error"].startswith(f"{tmp_path / 'host-probe.json'}: ")


def test_the_sweeps_summary_names_the_hosts_probe() -> None:
    record = {"commit": "a48b306", "machine": "NVIDIA H100 80GB HBM3; 16 CPU cores", "green": 0, "components": {},
              "builds_wall_s": 1, "wall_s": 2,
              "host_probe": {"what": "g++ -O2 ...", "cores": 16, "one_s": 0.61, "all_cores_s": 0.74}}
    assert sweep.summary(record).splitlines()[1] == "  host probe: 0.61 s alone, 0.74 s with 16 at once (g++ -O2 ...)"
