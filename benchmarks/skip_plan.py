"""Figure 2: the push-time skip plan for the full real matrix (every row and release of versions.yaml).

Every release exists and is complete, so both approaches skip every row; what differs is what they
read to decide. The GitHub test server runs in process (its request counters and a byte meter on
its sockets are read directly); it holds two copies of the releases:

- ``o/ours``: titles from ``ci.model.matrix.release_title``, the wheels, their ``.metadata`` files and one
  ``wheelhouse-build-manifest-<arch>.json`` per arch made by ``ci.model.manifest`` from each row's
  ``ci.model.fingerprint.build_config`` with a fixed source revision (the resolver returns it: no git);
- ``o/anchor``: the same titles and wheels with the anchor's single schema-3
  ``wheelhouse-build-manifest.json`` (one build config per arch row).

Wheels the anchor downloads (platform wheels of components with an arch list and
``verify_wheel_archs``: apex, deep-ep, flash-attention, transformer-engine) are real synthetic CUDA
wheels (a fatbin holding one cubin per arch) of the sizes in ``WHEEL_MB``, one set of bytes per
component; every other wheel is a size-only asset that neither side downloads.
"""

from __future__ import annotations

import hashlib
import json
import time

from benchmarks.anchor import generate_matrix as anchor
from benchmarks.common import (
    REPO,
    Context,
    Figure,
    Table,
    cuda_wheel,
    human_bytes,
    interleaved,
    metered_server,
    ratio,
    total_requests,
)

NAME = "skip-plan"
TITLE = "2. Skip plan for the full matrix: requests and bytes"
TOKEN = "bench-token"
REVISION = "0123456789abcdef0123456789abcdef01234567"

# Per-wheel sizes in MB (x86_64 and aarch64 alike). Downloaded by the anchor: the first four.
WHEEL_MB = {
    "flash-attn": 200, "transformer-engine": 150, "apex": 100, "deep-ep": 50,
    "flashinfer-jit-cache": 1200, "flashinfer-cubin": 300, "flashinfer-python": 5,
    "flash-mla": 30, "fast-hadamard-transform": 10, "deep-gemm": 5, "megatron-bridge": 3,
}
WHEEL_VERSION = {
    "apex": "0.1", "deep-ep": "1.2.1", "deep-gemm": "2.1.0", "fast-hadamard-transform": "1.0.4",
    "flash-attn": "2.8.3", "flash-mla": "1.0.0", "flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.13",
    "flashinfer-jit-cache": "0.6.13", "megatron-bridge": "0.5.0", "transformer-engine": "2.16.1",
}
PURE = {"flashinfer-python", "flashinfer-cubin", "megatron-bridge"}
OTHER_WHEEL_MB = 10
"""A package of a component the tables above do not name yet (a new one): its wheel's size, version 1.0."""


def _wheel_mb(package: str) -> float:
    return WHEEL_MB.get(package, OTHER_WHEEL_MB)


def _scale(ctx: Context) -> float:
    return 0.002 if ctx.toy else (0.1 if ctx.quick else 1.0)


def _reps(ctx: Context) -> int:
    return 1 if ctx.toy else 3


def wheel_name(package: str, row) -> str:
    module = package.replace("-", "_")
    version = WHEEL_VERSION.get(package, "1.0")
    if package in PURE:
        return f"{module}-{version}-py3-none-any.whl"
    if package == "flashinfer-jit-cache":
        return f"{module}-{version}-cp39-abi3-linux_{row.arch}.whl"
    tag = ".".join(f"cp{p.replace('.', '')}" for p in row.pythons)
    return f"{module}-{version}-{tag}-{tag}-linux_{row.arch}.whl"


def anchor_build_config(row) -> dict:
    """``normalize_build_config`` keys of the anchor's schema-3 manifest (reference §4.1)."""
    from ci.model import fingerprint

    s = row.settings
    return {
        "arch": row.arch, "builder": s.builder, "build_inputs": fingerprint.build_inputs(row),
        "command": f"bash ci/build_scripts/{s.builder}.sh", "cuda": row.cuda,
        "cuda_archs": anchor.parse_arch_list(s.torch_cuda_arch_list), "cxx11_abi": row.cxx11_abi,
        "extra_env": dict(s.extra_env), "max_jobs": str(s.max_jobs), "python": row.python,
        "requires_cudnn": s.requires_cudnn, "runs_on": sorted(s.runs_on_labels) if not isinstance(s.runs_on, str)
        else s.runs_on, "torch": row.torch, "torch_audio": row.torch_audio,
        "torch_cuda_arch_list": s.torch_cuda_arch_list or "", "torch_vision": row.torch_vision,
        "wheel_packages": sorted(anchor.normalize(p) for p in s.wheel_packages),
    }


def _downloaded_by_anchor(row) -> bool:
    return bool(row.settings.verify_wheel_archs and row.settings.torch_cuda_arch_list)


def _wheel_blobs(ctx: Context, rows) -> tuple[dict[str, tuple[bytes, str]], dict[str, int]]:
    """(package -> (wheel bytes, digest), package -> size) for every package the anchor downloads."""
    scale = _scale(ctx)
    blobs: dict[str, tuple[bytes, str]] = {}
    sizes: dict[str, int] = {}
    for row in rows:
        if not _downloaded_by_anchor(row):
            continue
        for package in row.settings.wheel_packages:
            if package in blobs:
                continue
            size = int(_wheel_mb(package) * 1e6 * scale)
            component_rows = [r for r in rows if r.component == row.component]
            archs = sorted({a for r in component_rows for a in anchor.parse_arch_list(r.settings.torch_cuda_arch_list)})
            path = cuda_wheel(ctx.cache / "plan-wheels", name=package, version=WHEEL_VERSION.get(package, "1.0"),
                              tags="cp312-cp312-linux_x86_64", size=size, archs=archs)
            data = path.read_bytes()
            blobs[package] = (data, "sha256:" + hashlib.sha256(data).hexdigest())
            sizes[package] = len(data)
    return blobs, sizes


def seed(gh, ctx: Context, versions, rows) -> dict[str, int]:  # noqa: C901 - one straight setup pass over rows and packages for both repositories
    """Both repositories; returns the wheel size used per downloaded package."""
    from ci.model import fingerprint, manifest, matrix

    blobs, sizes = _wheel_blobs(ctx, rows)
    by_tag: dict[str, list] = {}
    for row in rows:
        by_tag.setdefault(row.release_tag, []).append(row)
    for tag, tag_rows in by_tag.items():
        title = matrix.release_title(versions, tag_rows[0])
        wheels: dict[str, tuple[str, int, bytes | None, str]] = {}  # name -> (package, size, data, digest)
        per_arch: dict[str, list[str]] = {}
        for row in tag_rows:
            for package in row.settings.wheel_packages:
                name = wheel_name(package, row)
                per_arch.setdefault(row.arch, []).append(name)
                if name in wheels:
                    continue
                if package in blobs and package not in PURE:
                    data, digest = blobs[package]
                    wheels[name] = (package, len(data), data, digest)
                else:
                    size = int(_wheel_mb(package) * 1e6)
                    wheels[name] = (package, size, None, "sha256:" + hashlib.sha256(name.encode()).hexdigest())
        for repo in ("o/ours", "o/anchor"):
            synthetic = [(n, size, digest) for n, (_, size, data, digest) in wheels.items() if data is None]
            if repo == "o/ours":
                synthetic += [(f"{n}.metadata", 1200, "sha256:" + hashlib.sha256(n.encode() + b"m").hexdigest())
                              for n in wheels]
            rel = gh.seed_release(tag, repo=repo, name=title, body="Prebuilt CUDA wheel(s)", synthetic_assets=synthetic)
            for n, (_, _, data, digest) in wheels.items():
                if data is not None:
                    gh.state.add_asset(rel, n, data, digest=digest)
            if repo == "o/ours":
                for row in tag_rows:
                    config = fingerprint.declared_config(versions, row, REVISION)
                    entries = tuple(manifest.WheelEntry(n, wheels[n][3].split(":", 1)[1], wheels[n][1])
                                    for n in per_arch[row.arch])
                    text = manifest.Manifest(
                        component=row.component, release_tag=tag, arch=row.arch, pythons=row.pythons,
                        torch=row.torch, fingerprint=fingerprint.fingerprint(config), build_config=config,
                        wheels=entries, checks_passed=True, source={"kind": "git", "revision": REVISION},
                    ).to_json().encode()
                    gh.state.add_asset(rel, manifest.asset_name(row.arch), text)
            else:
                doc = {"schema": 3, "component": tag_rows[0].component, "python": tag_rows[0].python,
                       "torch": tag_rows[0].torch, "builds": [anchor_build_config(r) for r in tag_rows]}
                gh.state.add_asset(rel, anchor.MANIFEST_ASSET, json.dumps(doc, indent=2, sort_keys=True).encode())
    return sizes


def run(ctx: Context) -> Figure:
    from ci.flows import plan
    from ci.model import matrix
    from ci.model.versions import load
    from ci.store.github import GitHubStore

    versions = load(REPO / "versions.yaml")
    rows = matrix.expand(versions)
    anchor_rows = [anchor.Row(r.release_tag, r.arch, matrix.release_title(versions, r), list(r.settings.wheel_packages),
                              r.settings.torch_cuda_arch_list, r.settings.verify_wheel_archs, anchor_build_config(r),
                              r.label) for r in rows]
    reps = _reps(ctx)
    gh = metered_server(token=TOKEN, keep_log=False)
    try:
        ctx.log(f"  seeding {len(rows)} rows / {len({r.release_tag for r in rows})} releases")
        sizes = seed(gh, ctx, versions, rows)
        store = GitHubStore("o/ours", token=TOKEN, api_url=gh.api_url)
        store.list_releases()  # open the keep-alive connection before timing (ghapi imports lazily)
        stats: dict[str, dict] = {}

        def measured(name: str, fn) -> None:
            gh.reset_counters()
            gh.bytes_out.clear()
            result = fn()
            stats[name] = {"requests": total_requests(gh), "bytes": sum(gh.bytes_out.values()),
                           "object_bytes": gh.bytes_out["objects"], "result": result,
                           "by_endpoint": dict(gh.counters)}

        def ours() -> None:
            measured("ours", lambda: plan.decide(versions, rows, store, resolve=lambda row: REVISION))

        def anchor_run() -> None:
            client = anchor.GhClient(gh.api_url, "o/anchor", TOKEN)
            measured("anchor", lambda: anchor.evaluate_matrix_rows(client, anchor_rows))

        times = interleaved(reps, {"ours": ours, "anchor": anchor_run}, ctx.log)
        store.close()
    finally:
        gh.stop()

    ours_plan = stats["ours"]["result"]
    verdicts = stats["anchor"]["result"]
    ours_skips = sum(not d.build for d in ours_plan.decisions)
    anchor_skips = sum(v.skip for v in verdicts)
    not_skipped = [f"{d.row.label}: {d.reason}" for d in ours_plan.decisions if d.build]
    not_skipped += [f"anchor {v.row.label}: {v.reason}" for v in verdicts if not v.skip]
    o, a = stats["ours"], stats["anchor"]
    main = Table(
        ["", "ours (`ci.flows.plan.decide`)", "anchor (§4.4)", "anchor / ours"],
        [
            [f"rows skipped (of {len(rows)})", f"{ours_skips}", f"{anchor_skips}", ""],
            ["requests", f"{o['requests']}", f"{a['requests']}", f"{a['requests'] / o['requests']:.1f}x"],
            ["bytes received (all answers)", human_bytes(o["bytes"]), human_bytes(a["bytes"]),
             f"{a['bytes'] / o['bytes']:,.0f}x"],
            ["  of which asset downloads", human_bytes(o["object_bytes"]), human_bytes(a["object_bytes"]), ""],
            ["wall time (min / median)", times["ours"].fmt(), times["anchor"].fmt(), ratio(times["anchor"], times["ours"])],
        ],
    )
    per_component = []
    for component in sorted({r.component for r in rows}):
        comp_rows = [r for r in rows if r.component == component]
        downloads = [r for r in comp_rows if _downloaded_by_anchor(r)]
        per_row = sum(sizes.get(p, 0) for p in comp_rows[0].settings.wheel_packages) if downloads else 0
        per_component.append([component, len(comp_rows), len(downloads),
                              human_bytes(per_row) if per_row else "0 (no fatbin check)",
                              human_bytes(per_row * len(downloads)) if per_row else "0"])
    endpoints = Table(["endpoint", "ours", "anchor"], [
        [k, o["by_endpoint"].get(k, 0), a["by_endpoint"].get(k, 0)]
        for k in sorted(set(o["by_endpoint"]) | set(a["by_endpoint"]))
    ])
    scale = _scale(ctx)
    fig = Figure(
        NAME, TITLE,
        compared=(f"deciding that all {len(rows)} rows of versions.yaml can be skipped: ours `ci.flows.plan.decide` (one release "
                  "listing, one small manifest per row, wheel digests compared; resolver returns a fixed revision) vs "
                  "the anchor's `release_covers_combo` per row (`benchmarks/anchor/generate_matrix.py`: release view, "
                  "manifest download per row, every platform wheel of the row's arch downloaded whole and its "
                  "fatbin scanned)"),
        where="this machine; GitHub test server in process on 127.0.0.1",
        repetitions=f"{reps} interleaved runs of each; requests and bytes are identical in every run (last run shown)",
        tables=[main,
                Table(["component", "rows", "rows whose wheel the anchor downloads", "anchor bytes per such row",
                       "anchor wheel bytes per plan"], per_component),
                endpoints],
        notes=[
            ("Wheel sizes used: " + ", ".join(f"{p} {human_bytes(s)}" for p, s in sorted(sizes.items()))
             + (f" (scaled by {scale} from {', '.join(f'{p} {_wheel_mb(p)} MB' for p in sorted(sizes))}; the "
                "anchor's bytes grow linearly with wheel size, ours do not depend on it)" if scale != 1 else
                " (estimates of real CUDA 13 wheels; the anchor's bytes grow linearly with them, ours do not)")),
            "Bytes are counted on the server's sockets: status lines, headers and bodies of every answer.",
            "Our per-row cost is the `GET /releases/tags/{tag}` inside `GitHubStore.read_asset` plus the manifest "
            "download (302 to object storage, then the object); the release listing is one request.",
            "The anchor's `gh release view` results are cached per tag, as `evaluate_matrix_rows` does; its manifest "
            "and wheel downloads are not (once per row). Null-arch components (deep-gemm, fast-hadamard-transform, "
            "flash-mla, megatron-bridge) and flashinfer (`verify_wheel_archs: false`) download no wheel.",
            "On GitHub each anchor call was also a `gh` process, and each wheel a 100 MB-1 GB transfer from object "
            "storage: the loopback wall times here understate the gap.",
        ] + ([f"Not skipped: {'; '.join(not_skipped)}"] if not_skipped else []),
        summary=[f"skip plan for all {len(rows)} rows (all skipped by both): {o['requests']} vs {a['requests']} requests, "
                 f"{human_bytes(o['bytes'])} vs {human_bytes(a['bytes'])} received (anchor / ours "
                 f"{a['bytes'] / o['bytes']:,.0f}x); wall time anchor / ours {ratio(times['anchor'], times['ours'])}"],
    )
    return fig


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
