"""CUDA arch lists."""

from __future__ import annotations

import pytest

from ci.base.errors import ConfigError
from ci.formats.archs import CudaArch, missing_archs, parse_arch_list


def test_parse_spellings() -> None:
    parsed = parse_arch_list("8.0;9.0a 10.0 12.0f")
    assert [str(a) for a in parsed.archs] == ["8.0", "9.0a", "10.0", "12.0f"]
    assert not parsed.ptx
    assert [str(a) for a in parse_arch_list("80,90").archs] == ["8.0", "9.0"]
    ptx = parse_arch_list("8.6 9.0+PTX")
    assert ptx.ptx and [str(a) for a in ptx.archs] == ["8.6", "9.0"]
    assert [str(a) for a in parse_arch_list("sm_100a;compute_120").archs] == ["10.0a", "12.0"]
    assert str(parse_arch_list("9.0;8.0;9.0")) == "8.0;9.0"


def test_bad_token() -> None:
    with pytest.raises(ConfigError, match="'hopper' is not an architecture"):
        parse_arch_list("8.0;hopper")


def test_base_arch_coverage() -> None:
    required = parse_arch_list("8.0;9.0;10.0")
    found = [CudaArch.from_sm(90, "a"), CudaArch.from_sm(100, "f")]
    assert missing_archs(required, found) == (CudaArch(8, 0),)
    assert CudaArch.from_sm(121).sm == "sm_121"
