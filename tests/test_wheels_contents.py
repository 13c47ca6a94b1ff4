"""Wheels that carry their kernels as data are complete only with all of them (ci/checks/contents.py).

The rules were checked against upstream's own 0.6.13 wheels of flashinfer-python and flashinfer-cubin
(the real 458 MB cubin wheel passes); here, small wheels of the same layout.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from wheel_factory import build_wheel, write_synthetic_elf

from ci.checks.check import check_wheels
from ci.checks.contents import FLASHINFER_HEADERS

MANIFEST_DIR = "flashinfer_cubin/cubins/158f6fa11ef139a098cfddcdddce73ca99d164ad/fmha/trtllm-gen"


def _elf(payload: bytes) -> bytes:
    """A small real ELF file (cubins are ELF: the wheel check opens every member named like one)."""
    stream = io.BytesIO()
    write_synthetic_elf(stream, [(".text", len(payload), [payload])])
    return stream.getvalue()


def _cubin_files(drop: str | None = None, corrupt: str | None = None) -> dict[str, bytes]:
    kernels = {"fmhaSm100aKernel_a.cubin": _elf(b"a" * 64), "fmhaSm100aKernel_b.cubin": _elf(b"b" * 64),
               "include/flashInferMetaInfo.h": b"// meta\n"}
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()} {name}\n" for name, data in kernels.items())
    # a CuTe-DSL style entry: loaded at run time, never in upstream's wheel
    manifest += f"{'0' * 64} cute_dsl_fmha_bf16_h128_tvmffi.so\n"
    files = {f"{MANIFEST_DIR}/checksums.txt": manifest.encode()}
    for name, data in kernels.items():
        if name != drop:
            files[f"{MANIFEST_DIR}/{name}"] = _elf(b"x" * 64) if name == corrupt else data
    return files


def _problems(wheel: Path) -> tuple[str, ...]:
    return check_wheels([wheel], use_cuobjdump=False).problems


def test_flashinfer_cubin_with_every_listed_kernel_passes(tmp_path):
    wheel = build_wheel(tmp_path, _cubin_files(), name="flashinfer_cubin", version="0.6.13", tags="py3-none-any")
    assert _problems(wheel) == ()


def test_flashinfer_cubin_missing_or_changed_kernel_fails(tmp_path):
    missing = build_wheel(tmp_path / "a", _cubin_files(drop="fmhaSm100aKernel_b.cubin"), name="flashinfer_cubin",
                          version="0.6.13", tags="py3-none-any")
    assert _problems(missing) == (
        f"{missing.name}: lacks {MANIFEST_DIR}/fmhaSm100aKernel_b.cubin, which {MANIFEST_DIR}/checksums.txt lists; "
        "the cubin download was incomplete: rebuild or rehost the wheel",)
    changed = build_wheel(tmp_path / "b", _cubin_files(corrupt="fmhaSm100aKernel_a.cubin"), name="flashinfer_cubin",
                          version="0.6.13", tags="py3-none-any")
    assert _problems(changed) == (
        f"{changed.name}: {MANIFEST_DIR}/fmhaSm100aKernel_a.cubin does not match its sha256 in "
        f"{MANIFEST_DIR}/checksums.txt; rebuild or rehost the wheel",)
    empty = build_wheel(tmp_path / "c", {"flashinfer_cubin/__init__.py": b""}, name="flashinfer_cubin",
                        version="0.6.13", tags="py3-none-any")
    assert "has no flashinfer_cubin/cubins/**/checksums.txt" in _problems(empty)[0]


def test_flashinfer_python_without_a_header_tree_fails(tmp_path):
    files = {name: b"" for name in FLASHINFER_HEADERS} | {"flashinfer/__init__.py": b""}
    complete = build_wheel(tmp_path / "a", files, name="flashinfer_python", version="0.6.13", tags="py3-none-any")
    assert _problems(complete) == ()
    del files["flashinfer/data/spdlog/include/spdlog/spdlog.h"]
    partial = build_wheel(tmp_path / "b", files, name="flashinfer_python", version="0.6.13", tags="py3-none-any")
    assert _problems(partial) == (
        f"{partial.name}: lacks flashinfer/data/spdlog/include/spdlog/spdlog.h, which its JIT compiles kernels "
        "with; build from sources with every header submodule checked out (cutlass, cccl, spdlog)",)


def test_flashinfer_jit_cache_without_a_module_fails(tmp_path):
    empty = build_wheel(tmp_path, {"flashinfer_jit_cache/__init__.py": b""}, name="flashinfer_jit_cache",
                        version="0.6.13+cu130", tags="cp39-abi3-manylinux_2_28_x86_64")
    assert _problems(empty) == (
        f"{empty.name}: has no compiled module under flashinfer_jit_cache/jit_cache/; its ahead-of-time compile "
        "produced nothing: rebuild or rehost the wheel",)


def test_other_packages_have_no_content_rule(tmp_path):
    wheel = build_wheel(tmp_path, {"pkg/__init__.py": b""}, name="pkg", tags="py3-none-any")
    assert _problems(wheel) == ()
