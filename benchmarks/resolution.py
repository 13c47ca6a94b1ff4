"""Figure 5: bytes a resolver pulls from our index for a >= 200 MB wheel, with and without PEP 658
``.metadata`` files.

Same setup as the slow test in ``tests/test_index_clients.py`` (its helpers from
``tests/index_helpers.py``): a loopback HTTP server counting body bytes per path, one wheel with a
210 MiB stored member, and two indexes published by ``ci.publish.pages.publish_index`` over it: one whose
release carries ``<wheel>.metadata`` (so the links carry ``data-core-metadata``) and one without.
``uv pip compile`` resolves ``bigpkg`` against each with a fresh cache every time; without
``.metadata`` it is run with HTTP Range support on (uv then reads the zip's tail) and off (a static
host without ranges: the whole wheel). The anchor's index (§7.3) has no ``.metadata`` and GitHub's
asset URLs redirect to object storage, so "without" is the anchor's case.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import Context, Figure, MiB, Samples, Table, human_bytes, ratio

NAME = "resolution"
TITLE = "5. Resolution bytes: uv pip compile with and without .metadata"
WORLD = "cu130/torch2.13"


def _big_wheel(ctx: Context) -> Path:
    from tests.wheel_factory import build_wheel

    size = 1 * MiB if ctx.toy else 210 * MiB
    out = ctx.cache / f"resolution-wheel-{size}"
    wheel = out / "bigpkg-1.0-py3-none-any.whl"
    if not (wheel.exists() and Path(str(wheel) + ".metadata").exists()):
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        build_wheel(staging, name="bigpkg", version="1.0", tags="py3-none-any", requires_python=">=3.8", random_member_bytes=size, sidecar=True)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return wheel


def _served_file(folder: Path):
    """The bytes of an asset of this figure's release: the file of its name in ``folder``, which the
    server mounts at /big/."""
    def fetch(asset):
        with open(folder / asset.name, "rb") as source:
            while chunk := source.read(1 << 20):
                yield chunk
    return fetch


def run(ctx: Context) -> Figure:
    from ci.publish.pages import DirectoryTarget, publish_index
    from ci.store.model import Release
    from tests.index_helpers import UV, CountingServer, client_env, release_of
    from tests.index_helpers import run as run_client

    if not UV:
        raise RuntimeError("uv is not installed in the development venv (requirements.txt installs it)")
    reps = 1 if ctx.toy else 3
    wheel = _big_wheel(ctx)
    sidecar = Path(str(wheel) + ".metadata")
    tmp = ctx.work / "resolution"
    shutil.rmtree(tmp, ignore_errors=True)
    root = tmp / "www"
    root.mkdir(parents=True)
    (tmp / "req.in").write_text("bigpkg\n")
    env = client_env(tmp)
    venv = tmp / "venv"
    proc = run_client([UV, "venv", "--quiet", "--python", sys.executable, str(venv)], env)
    if proc.returncode != 0:
        raise RuntimeError(f"uv venv failed: {proc.stderr}")
    cases = [("with .metadata", "with", True), ("without, Range on", "without", True),
             ("without, Range off", "without", False)]
    walls = {label: Samples() for label, _, _ in cases}
    served: dict[str, tuple[int, int, int]] = {}
    with CountingServer(root, mounts={"big": wheel.parent}) as server:
        base = release_of("big-v1", "bigpkg v1 - cu13.0.2 py3.11 torch2.13.0", [wheel, sidecar], server.url)
        with_meta = Release(base.tag, base.title, assets=tuple(
            a.__class__(a.name, a.size, f"{server.url}/big/{a.name}", a.digest, id=a.id) for a in base.assets))
        without = Release(with_meta.tag, with_meta.title, assets=(with_meta.asset(wheel.name),))
        for label, rel in (("with", with_meta), ("without", without)):
            # the index reads the wheel once to compare its METADATA with the sidecar (served from wheel.parent)
            summary = publish_index([rel], DirectoryTarget(root / label), base_url=f"{server.url}/{label}",
                                    default_world=WORLD, fetch=_served_file(wheel.parent)).summary
            if summary.warnings:
                raise RuntimeError(f"index warnings: {summary.warnings}")
        counter = 0
        for rep in range(reps):
            for label, index, ranges in (cases if rep % 2 == 0 else list(reversed(cases))):
                counter += 1
                server.set_ranges(ranges)
                server.log.reset()
                started = time.perf_counter()
                proc = run_client([UV, "pip", "compile", "--quiet", "--python", str(venv / "bin" / "python"),
                                   "--index-url", f"{server.url}/{index}/{WORLD}/simple/",
                                   "--cache-dir", str(tmp / f"cache-{counter}"), str(tmp / "req.in")], env)
                elapsed = time.perf_counter() - started
                if proc.returncode != 0 or "bigpkg==1.0" not in proc.stdout:
                    raise RuntimeError(f"uv pip compile ({label}) failed: {proc.stderr[-2000:]}")
                walls[label].add(elapsed)
                log = server.log.bytes_by_path
                served[label] = (log[f"/big/{wheel.name}"], log[f"/big/{sidecar.name}"], sum(log.values()))
                ctx.log(f"    {label}: rep {rep + 1}/{reps} {elapsed:.2f} s, {human_bytes(served[label][2])} served")
                shutil.rmtree(tmp / f"cache-{counter}", ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    ref = "with .metadata"
    rows = []
    for label, _, _ in cases:
        whl, meta, total = served[label]
        rows.append([label, human_bytes(whl), human_bytes(meta), human_bytes(total),
                     f"{total / served[ref][2]:,.0f}x" if label != ref else "1x",
                     walls[label].fmt(), ratio(walls[label], walls[ref]) if label != ref else "1x"])
    return Figure(
        NAME, TITLE,
        compared=("`uv pip compile` of one wheel from our generated index served over loopback HTTP: links with "
                  "`data-core-metadata` (our release uploads `<wheel>.metadata`) vs the same index without "
                  "`.metadata` (the anchor's index has none)"),
        where=f"this machine; `tests/index_helpers.CountingServer` on 127.0.0.1; uv {_uv_version(UV)}",
        repetitions=f"{reps} interleaved runs per case, fresh uv cache each; bytes identical every run (last shown)",
        tables=[Table(["index", "wheel bytes served", ".metadata bytes served", "all bytes served",
                       "bytes vs with", "wall (min / median)", "wall vs with"], rows)],
        notes=[f"Wheel: {wheel.name}, {human_bytes(wheel.stat().st_size)} (one stored random member, .dist-info "
               f"last as bdist_wheel writes it); its .metadata: {sidecar.stat().st_size} bytes.",
               "With Range on, uv reads the zip's central directory and METADATA through range requests; GitHub's "
               "asset downloads redirect to object storage, and a resolver that cannot use ranges there downloads "
               "the whole wheel (the last row).",
               "Loopback moves 220 MB in a fraction of a second, so the wall times barely differ here; over the "
               "internet the last row is a full wheel download for every resolution on a machine without a warm "
               "cache (CI runners, fresh containers)."],
        summary=[f"`uv pip compile` of a {human_bytes(wheel.stat().st_size)} wheel: {human_bytes(served[ref][2])} served "
                 f"with .metadata vs {human_bytes(served['without, Range on'][2])} (Range) / "
                 f"{human_bytes(served['without, Range off'][2])} (no Range) without"],
    )


def _uv_version(uv: str) -> str:
    import subprocess

    out = subprocess.run([uv, "--version"], capture_output=True, text=True, check=False).stdout.split()
    return out[1] if len(out) > 1 else "unknown"


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
