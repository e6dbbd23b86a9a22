"""Shared test helpers: where fixtures live, how to run the command line as a user does and
LocalRuntimes that stop what they started; and the order in which `make test`'s workers get
the modules (slow ones first)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from cohabit.runtime.spawner import LocalRuntime

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


def cli_json(*args: str) -> Any:
    """`run_cli(*args, "--json")`, which must succeed; what it printed, read as JSON."""
    result = run_cli(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


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


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[Callable[..., LocalRuntime]]:
    """Make LocalRuntimes on one data dir; every engine they know is stopped afterwards."""
    from cohabit.runtime.spawner import LocalRuntime

    made: list[LocalRuntime] = []

    def make(**kwargs: object) -> LocalRuntime:
        runtime = LocalRuntime(tmp_path / "data", **kwargs)  # type: ignore[arg-type]
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.stop_all()
