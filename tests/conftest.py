"""Shared test helpers: where fixtures live and how to run the command line as a user does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


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


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
