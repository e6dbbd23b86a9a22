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


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
