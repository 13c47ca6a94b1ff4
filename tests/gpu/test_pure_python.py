"""Pure-Python components installed from our own index with --no-deps (run_on_device.sh upstream).

Megatron-Bridge's wheel has no compiled code, and its package's ``__init__`` imports its models, which
need megatron-core (and the rest of its dependencies, which we do not build): the version module is
read from the installed file itself, and what the top-level import needs is printed.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest


def test_megatron_bridge_installed_its_package_and_names_the_built_version():
    namespace = importlib.util.find_spec("megatron")
    if namespace is None:
        pytest.skip("megatron-bridge is not installed")
    info_file = next(Path(p) / "bridge" / "package_info.py" for p in namespace.submodule_search_locations)
    spec = importlib.util.spec_from_file_location("megatron_bridge_package_info", info_file)
    info = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(info)
    print(f"megatron-bridge installed at {info_file.parent}: __version__ = {info.__version__}")
    assert info.__version__.startswith("0.5.")
    assert (info_file.parent / "models" / "conversion" / "auto_bridge.py").is_file()
    try:
        importlib.import_module("megatron.bridge")
    except ImportError as error:  # a dependency we do not build: say which one the import met first
        print(f"import megatron.bridge needs {getattr(error, 'name', None) or error} ({type(error).__name__}: {error})")
    else:
        print("import megatron.bridge: ok")
