"""Shared test helpers: where fixtures live and how to run the command line as a user does;
and the order in which `make test`'s workers get the modules (slow ones first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def recorded_node(name: str) -> dict[str, Any]:
    """A recorded node (name, labels, allocatable, capacity, and where it was recorded) from
    tests/fixtures/kube or tests/fixtures/hardware."""
    for folder in (FIXTURES / "kube", FIXTURES / "hardware"):
        path = folder / name
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
    raise FileNotFoundError(name)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m cohabit ARGS` in a subprocess, as a user would, and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "cohabit", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def run_only_when_asked(config: pytest.Config, items: list[pytest.Item], marker: str) -> None:
    """Deselect (not skip) tests carrying `marker` unless the `-m` expression names it, so a
    plain run neither fails on tests that need hardware it lacks nor reports them skipped."""
    if marker in (config.getoption("markexpr") or ""):
        return
    dropped = [item for item in items if item.get_closest_marker(marker) is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.get_closest_marker(marker) is None]


@pytest.hookimpl(trylast=True)  # after pytest groups the items by their fixtures' parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move every module holding a `slow` test to the front, keeping the order within and
    between modules. `make test` hands whole modules to its workers in this order
    (`--dist loadscope --no-loadscope-reorder`), so the long ones start at once and the many
    short ones fill in around them, instead of one long module running alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
