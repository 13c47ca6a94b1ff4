"""Shared pieces of the benchmarks: context, timing, tables, machine facts, big synthetic wheels,
peak-RSS measurement, and a GitHub test server that counts response bytes.

Every figure is a ratio of two approaches measured side by side in one run, repetitions interleaved
(ours, anchor, ours, anchor, ...) so that a noisy neighbour slows both alike.
"""

from __future__ import annotations

import base64
import csv
import datetime as _dt
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "bench"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
DEVICE_RESULTS = Path(__file__).resolve().parent / "device_results.json"

MB = 1000 * 1000
MiB = 1 << 20
GB = 1000 * MB


# ----------------------------------------------------------------------------- context and results


@dataclass
class Context:
    quick: bool = False
    toy: bool = False
    """Tiny sizes for the smoke test: checks the machinery, measures nothing meaningful."""
    cache: Path = CACHE
    work: Path = field(default_factory=lambda: CACHE / "work")
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)

    @property
    def mode(self) -> str:
        return "toy" if self.toy else ("quick" if self.quick else "full")


@dataclass
class Table:
    headers: Sequence[str]
    rows: list[Sequence[object]]

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |", "|" + "|".join("---" for _ in self.headers) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


@dataclass
class Figure:
    name: str
    title: str
    compared: str
    where: str
    repetitions: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    """One line per headline ratio, for the summary table at the top of RESULTS.md."""
    seconds: float = 0.0
    taken: str = ""
    """When and in which mode it was measured (set by the runner)."""

    def markdown(self) -> str:
        parts = [f"## {self.title}", "", f"- **Compared:** {self.compared}", f"- **Where:** {self.where}"]
        if self.taken:
            parts.append(f"- **Taken:** {self.taken}")
        parts += [f"- **Repetitions:** {self.repetitions}", f"- **Figure wall time:** {self.seconds:.0f} s", ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.notes:
            parts += [f"- {note}" for note in self.notes] + [""]
        return "\n".join(parts)


# ----------------------------------------------------------------------------- timing


@dataclass
class Samples:
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def fmt(self, unit: str = "s", digits: int = 3) -> str:
        """``min / median`` with a unit."""
        if not self.values:
            return "n/a"
        return f"{_num(self.min, digits)} / {_num(self.median, digits)} {unit}"


def _num(value: float, digits: int = 3) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def ratio(slow: Samples, fast: Samples) -> str:
    """``median ratio (min ratio)``: how many times ``fast`` beats ``slow``."""
    if not slow.values or not fast.values or fast.median == 0 or fast.min == 0:
        return "n/a"
    return f"{slow.median / fast.median:,.1f}x (min {slow.min / fast.min:,.1f}x)"


def interleaved(reps: int, runs: dict[str, Callable[[], float | None]],
                log: Callable[[str], None] | None = None) -> dict[str, Samples]:
    """Run each callable ``reps`` times, alternating between them, starting order rotating.

    A callable returns its own measured seconds, or None to be timed here around the call.
    """
    out = {name: Samples() for name in runs}
    names = list(runs)
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            started = time.perf_counter()
            measured = runs[name]()
            elapsed = time.perf_counter() - started
            out[name].add(measured if measured is not None else elapsed)
            if log:
                log(f"    {name}: rep {rep + 1}/{reps} {out[name].values[-1]:.3f} s")
    return out


def human_bytes(n: float) -> str:
    for unit, size in (("GB", GB), ("MB", MB), ("kB", 1000)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


# ----------------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "RAM": ram,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
    }


def free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free


def require_free(path: Path, needed: int, what: str) -> None:
    free = free_bytes(path)
    if free < needed:
        raise RuntimeError(f"{what}: needs {human_bytes(needed)} free under {path}, only {human_bytes(free)} left")


# ----------------------------------------------------------------------------- peak RSS


@dataclass(frozen=True)
class Measured:
    wall_s: float
    maxrss_kb: int
    stdout: str


def measure_command(cmd: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` in a grandchild and return its wall time and peak RSS (of its whole process tree).

    ``/bin/sh`` runs two commands (so it forks rather than exec'ing), which starts the measuring
    process from the shell's small address space instead of this large one.
    """
    wrapper = [sys.executable, str(Path(__file__).resolve().parent / "_rusage.py")]
    if cwd is not None:
        wrapper += ["--cwd", str(cwd)]
    proc = subprocess.run(["/bin/sh", "-c", '"$0" "$@"; exit $?', *wrapper, *cmd], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"measuring {cmd[:3]} failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    if data["rc"] != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:200]} exited {data['rc']}: {data['stderr'][-2000:]}")
    return Measured(data["wall_s"], data["maxrss_kb"], data["stdout"])


# ----------------------------------------------------------------------------- synthetic CUDA wheels

FATBIN_MAGIC = 0xBA55ED50
_ARCH_SPECIFIC = 1 << 20
_FAMILY = 1 << 21
# Random filler without "s" or "c": the anchor's regex (sm|compute)_NN then only finds the arch
# notes we plant, as in a real cubin (whose .note.nv.tkinfo carries "-arch sm_90 -m 64").
_NO_S_OR_C = bytes(b + 1 if b in (0x63, 0x73) else b for b in range(256))
_BLOCK = 16 * MiB


def _filler_block() -> bytes:
    import random

    return random.Random(1234).randbytes(_BLOCK).translate(_NO_S_OR_C)


def _filler(size: int, block: bytes, shift: int) -> Iterable[bytes]:
    """``size`` incompressible bytes: a 16 MiB random block at varying offsets (deflate's 32 KiB
    window never sees the repetition)."""
    left, step = size, 0
    while left > 0:
        start = (shift * 1_000_003 + step * 104_729) % (len(block) // 2)
        chunk = block[start: start + min(left, len(block) // 2)]
        yield chunk
        left -= len(chunk)
        step += 1


def _arch_token(token: str) -> tuple[int, int, str]:
    """``9.0a`` -> (90, flags, "a")."""
    token = token.strip()
    suffix = token[-1] if token[-1] in "af" else ""
    base = token[: -1] if suffix else token
    major, _, minor = base.partition(".")
    sm = int(major) * 10 + int(minor or 0)
    flags = _ARCH_SPECIFIC if suffix == "a" else (_FAMILY if suffix == "f" else 0)
    return sm, flags, suffix


def fatbin_chunks(total: int, archs: Sequence[str], block: bytes) -> Iterable[bytes]:
    """A fatbin container of ``total`` bytes: one cubin entry per arch, payloads of random filler
    that each start with the arch note a real cubin carries (``-arch sm_90 -m 64``)."""
    parsed = [_arch_token(a) for a in archs]
    body = total - 16
    per_entry = body // len(parsed)
    header = struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, body)
    yield header
    for i, (sm, flags, suffix) in enumerate(parsed):
        size = per_entry if i < len(parsed) - 1 else body - per_entry * (len(parsed) - 1)
        payload = size - 64
        entry = bytearray(64)
        struct.pack_into("<HHIQ", entry, 0, 2, 0x0101, 64, payload)
        struct.pack_into("<I", entry, 28, sm)
        struct.pack_into("<Q", entry, 40, flags)
        yield bytes(entry)
        note = f"\x7fELF\0-arch sm_{sm}{suffix} -m 64\0".encode()
        yield note
        yield from _filler(payload - len(note), block, i)


class _HashingWriter(io.RawIOBase):
    def __init__(self, target) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        self.target.write(data)
        return len(data)


def _record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def cuda_wheel(out_dir: Path, *, name: str, version: str, tags: str, size: int, archs: Sequence[str],
               compresslevel: int = 1) -> Path:
    """A valid wheel of about ``size`` bytes (deflated; incompressible content) whose one shared object
    is an ELF with a ``.text`` section and a ``.nv_fatbin`` holding one cubin per arch.

    Made once and kept under ``out_dir`` (keyed by every argument). Deflate level 1 only speeds up
    making it: the content is incompressible, so the archive is the same size at any level.
    """
    import tests.wheel_factory as factory  # write_synthetic_elf

    key = hashlib.sha256(json.dumps([name, version, tags, size, list(archs), compresslevel, 2]).encode()).hexdigest()[:12]
    module = name.replace("-", "_")
    filename = f"{module}-{version}-{tags}.whl"
    target_dir = out_dir / key
    target = target_dir / filename
    if target.is_file():
        return target
    staging = target_dir.with_name(key + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    block = _filler_block()
    dist_info = f"{module}-{version}.dist-info"
    so_name = f"{module}/_C.so"
    text_size = max(4096, size // 100)
    fatbin_size = max(64 * len(archs) + 4096, size - text_size - 8192)
    small: dict[str, bytes] = {
        f"{module}/__init__.py": b"from . import _C  # noqa\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.10\n\n".encode(),
        f"{dist_info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: benchmarks\nRoot-Is-Purelib: false\n"
                               + "".join(f"Tag: {t}\n" for t in _expand_tags(tags))).encode(),
    }
    record_rows: list[list[str]] = []
    with zipfile.ZipFile(staging / filename, "w", zipfile.ZIP_DEFLATED, compresslevel=compresslevel,
                         allowZip64=True) as zf:
        init = f"{module}/__init__.py"
        zf.writestr(_info(init, compresslevel), small[init])
        record_rows.append([init, _record_hash(hashlib.sha256(small[init]).digest()), str(len(small[init]))])
        with zf.open(_info(so_name, compresslevel), "w", force_zip64=True) as member:
            writer = _HashingWriter(member)
            factory.write_synthetic_elf(writer, [
                (".text", text_size, _filler(text_size, block, 99)),
                (".nv_fatbin", fatbin_size, fatbin_chunks(fatbin_size, archs, block)),
            ])
        record_rows.append([so_name, _record_hash(writer.sha.digest()), str(writer.size)])
        for path in (f"{dist_info}/METADATA", f"{dist_info}/WHEEL"):
            zf.writestr(_info(path, compresslevel), small[path])
            record_rows.append([path, _record_hash(hashlib.sha256(small[path]).digest()), str(len(small[path]))])
        record_rows.append([f"{dist_info}/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(record_rows)
        zf.writestr(_info(f"{dist_info}/RECORD", compresslevel), buf.getvalue())
    shutil.rmtree(target_dir, ignore_errors=True)
    staging.rename(target_dir)
    return target


def _info(name: str, compresslevel: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0))
    info.external_attr = 0o100755 << 16 if name.endswith(".so") else 0o100644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    info._compresslevel = compresslevel  # type: ignore[attr-defined]
    return info


def _expand_tags(tags: str) -> list[str]:
    interp, abi, plat = tags.split("-")
    return [f"{i}-{a}-{p}" for i in interp.split(".") for a in abi.split(".") for p in plat.split(".")]


# ----------------------------------------------------------------------------- GitHub test server


class _CountingWriter:
    def __init__(self, inner, count: Callable[[int], None]) -> None:
        self._inner = inner
        self._count = count

    def write(self, data) -> int:
        self._count(len(data))
        return self._inner.write(data)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def metered_server(**kwargs):
    """A started :class:`tests.github_server.GitHubTestServer` whose ``bytes_out`` counts every byte it
    answers with (status line, headers and body), keyed ``api`` / ``objects`` (asset downloads)."""
    from tests.github_server import GitHubTestServer

    gh = GitHubTestServer(**kwargs)
    gh.bytes_out = Counter()  # type: ignore[attr-defined]
    gh.start()
    for srv in gh._servers:  # a measuring wrapper around the test server's handlers
        base = srv.RequestHandlerClass

        def setup(self, _base=base) -> None:
            _base.setup(self)
            path_holder = self

            def count(n: int) -> None:
                kind = "objects" if "/_objects/" in getattr(path_holder, "path", "") else "api"
                with gh._meta:
                    gh.bytes_out[kind] += n

            self.wfile = _CountingWriter(self.wfile, count)

        srv.RequestHandlerClass = type(base.__name__ + "Metered", (base,), {"setup": setup})
    return gh


def total_requests(gh) -> int:
    return sum(gh.counters.values())
