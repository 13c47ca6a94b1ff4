"""The ELF reader against binutils on real shared objects compiled here."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from wheel_factory import host_shared_object

from ci.base.errors import CheckFailed
from ci.formats.elf import ElfFile, demangle, is_elf


def _nm(path: Path, *flags: str) -> set[str]:
    out = subprocess.run(["nm", "-D", *flags, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_dynamic_symbols_match_nm() -> None:
    so = host_shared_object()
    with open(so, "rb") as fp:
        elf = ElfFile(fp, "lib.so")
        symbols = list(elf.dynamic_symbols())
    undefined = {s.name + (f"@{s.version}" if s.version else "") for s in symbols if not s.defined}
    assert undefined == _nm(so, "--undefined-only")
    defined = {s.name for s in symbols if s.defined}
    assert defined == {n.split("@")[0] for n in _nm(so, "--defined-only")}
    by_name = {s.name: s for s in symbols}
    assert by_name["puts"].version.startswith("GLIBC_") and by_name["puts"].version_file == "libc.so.6"
    assert by_name["optional_hook"].binding == "WEAK" and not by_name["optional_hook"].defined
    assert by_name["exported_value"].kind == "OBJECT" and by_name["exported_value"].defined
    assert by_name["_Z17exported_functioni"].kind == "FUNC"


def test_fatbin_sections_located() -> None:
    so = host_shared_object()
    with open(so, "rb") as fp:
        elf = ElfFile(fp)
        assert elf.section(".dynsym") is not None
        assert elf.sections_with_prefix(".nv_fatbin") == ()
        text = elf.section(".text")
        assert b"".join(elf.iter_section(text, chunk=7)) == elf.read_section(text)


def test_non_elf_is_refused() -> None:
    stream = io.BytesIO(b"#!/bin/sh\necho not an elf\n")
    assert not is_elf(stream)
    with pytest.raises(CheckFailed, match="not an ELF file"):
        ElfFile(stream, "script.sh")


def test_demangle_batch_and_fallback() -> None:
    names = ["_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "puts"]
    spelled = demangle(names)
    assert spelled[names[0]].startswith("c10::ValueError::ValueError(c10::SourceLocation, std::")
    assert spelled["puts"] == "puts"
