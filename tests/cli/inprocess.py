"""Run a `cohabit` command inside the test process with typer's CliRunner: for tests of many
runs, where a subprocess each would spend most of the test importing (about a second of CPU
a run). The command's own code runs as it does for a user, against a real server."""

from __future__ import annotations

from click.testing import Result
from typer.testing import CliRunner

from cohabit.cli.app import build_app


def invoke(*args: str) -> Result:
    """The command's result: `exit_code`, `stdout`, `stderr`, and `exception` when it raised
    anything but an exit."""
    return CliRunner().invoke(build_app(), list(args))


def succeeded(result: Result) -> bool:
    """Exit 0 with no exception escaping."""
    return result.exit_code == 0 and result.exception is None
