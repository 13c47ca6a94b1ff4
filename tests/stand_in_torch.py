"""A stand-in torch: its libraries are small real ELF files, laid out as a torch directory or a torch wheel.

The torch side of the ABI check then costs nothing; ``cuda=True`` adds a ``libtorch_cuda.so`` as a CUDA
build of torch has.
"""

from __future__ import annotations

from pathlib import Path

from tests.wheel_factory import build_wheel, host_shared_object

VERSION = "2.13.0"


def _files(cuda: bool) -> dict[str, bytes]:
    library = host_shared_object().read_bytes()
    files = {"torch/__init__.py": b"", "torch/version.py": f"__version__ = '{VERSION}'\n".encode(),
             "torch/lib/libc10.so": library}
    if cuda:
        files["torch/lib/libtorch_cuda.so"] = library
    return files


def torch_dir(out: Path, *, cuda: bool = False) -> Path:
    """``out/torch``: a torch package directory."""
    for name, data in _files(cuda).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out / "torch"


def torch_wheel(out: Path, *, cuda: bool = False, tags: str = "cp311-cp311-manylinux_2_28_x86_64") -> Path:
    """A torch wheel, as pip downloads it."""
    return build_wheel(out, _files(cuda), name="torch", version=VERSION, tags=tags)
