"""How the parallel workers (pyproject's ``-n auto --dist loadscope``) share the tests: one by one, except a module
whose tests share a module-scoped fixture (a build, a served site, the docs' walk-through steps in order), which is
one unit of work, so that one worker makes the fixture once.

The rule lives in the scheduler because marking such modules with ``xdist_group`` stopped grouping anything under
pytest 9.2 (pytest-xdist issue 1386: the group travels in the node id, which pytest no longer lets a plugin
rewrite), and every such fixture was then made once per worker. tests/test_worker_scheduling.py proves the rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling


class ModuleFixtureScheduling(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._shares_a_fixture: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module not in self._shares_a_fixture:
            path = Path(self.config.rootpath) / module
            self._shares_a_fixture[module] = path.is_file() and 'scope="module"' in path.read_text()
        return module if self._shares_a_fixture[module] else nodeid


@pytest.hookimpl(tryfirst=True)  # before xdist's own choice by --dist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    return ModuleFixtureScheduling(config, log) if config.getvalue("dist") == "loadscope" else None
