"""What a command imports: `cohabit --help` no command at all, `cohabit NAME --help` none of the
heavy stacks, and `cohabit ps` against a real server over HTTP neither the estimator, the
planner, the server, httpx, pydantic nor rich — each checked in a fresh process by the modules
loaded when it exits, never by a timing (docs/cli.md; benchmarks/cli_startup.py has the
figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cohabit.cli.commands import COMMANDS
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import deploy, register_tiny_gguf, serving, settings_for, wait_status

# Runs the command line as the console script does; when it exits, writes every module
# loaded to the file named first.
PROBE = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "cohabit"
from cohabit.cli.app import main
main()
"""
# No command's start-up pays for these.
HEAVY = (
    "numpy",
    "gguf",
    "httpx",
    "pydantic",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "markdown_it",  # typer's rich help
    "cohabit.estimate",
    "cohabit.runtime",
    "cohabit.store",
    "cohabit.kube",
    "cohabit.hub",
    "cohabit.service.app",
    "cohabit.sdk.client",
    "cohabit.sdk.schemas",
)
# Nor does `cohabit ps`, which shows a list it reads as JSON in a table of its own, pay for
# these.
PS_HEAVY = (*HEAVY, "yaml", "rich", "cohabit.placement", "cohabit.hardware", "cohabit.service")
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def run_probe(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`cohabit ARGS` in a fresh process, and the modules it had loaded when it exited. The
    environment has no COHABIT_ variable and no proxy (with one, `ps` takes httpx on
    purpose), then `env`."""
    out = tmp_path / "modules.json"
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COHABIT_") and k.lower() not in PROXIES
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        capture_output=True,
        text=True,
        env=base | (env or {}),
        timeout=120,
        check=False,
    )
    return result, set(json.loads(out.read_text()))


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are, or are inside, one of `prefixes`."""
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in prefixes))


def test_help_imports_no_command(tmp_path: Path) -> None:
    result, modules = run_probe(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    for name, command in COMMANDS.items():
        assert f"  {name} " in result.stdout
        assert command.module not in modules
    assert loaded(modules, (*PS_HEAVY, "rich")) == []


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_commands_help_imports_no_heavy_stack(tmp_path: Path, name: str) -> None:
    result, modules = run_probe(tmp_path, name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: cohabit {name} ")
    assert loaded(modules, HEAVY) == []


@pytest.fixture
def api(tmp_path: Path) -> Iterator[str]:
    """A server with one deployment serving (the scripted engine double in place of the
    engines); yields its API root."""
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with (
        serving(settings, ScriptedRuntime()) as root,
        httpx.Client(base_url=root, timeout=30) as client,
    ):
        model = register_tiny_gguf(client, tmp_path)
        deployment_id = deploy(client, model["id"], vram_allocation=GIB).json()
        assert wait_status(client, deployment_id)["status"] == "DEPLOYED"
        yield root


@pytest.mark.parametrize("args", [(), ("--verbose", "--wide"), ("--json",)])
def test_ps_against_a_server_imports_no_heavy_stack(
    tmp_path: Path, api: str, args: tuple[str, ...]
) -> None:
    result, modules = run_probe(tmp_path, "ps", *args, env={"COHABIT_BASE_URL": api})
    assert result.returncode == 0, result.stderr
    assert "tiny" in result.stdout and "DEPLOYED" in result.stdout
    assert loaded(modules, PS_HEAVY) == []


def test_ps_through_a_proxy_takes_httpx(tmp_path: Path, api: str) -> None:
    """The plain socket knows no proxy: with one set, `ps` goes through httpx, which does."""
    env = {"COHABIT_BASE_URL": api, "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}
    result, modules = run_probe(tmp_path, "ps", env=env)
    assert result.returncode == 0, result.stderr
    assert "httpx" in modules
    assert loaded(modules, ("pydantic", "numpy", "cohabit.estimate")) == []


def test_plan_json_imports_neither_pydantic_nor_rich(tmp_path: Path) -> None:
    """A `--json` plan takes its path and choice arguments without typer's pydantic coercion,
    and prints without rich; its answer is the planner's all the same."""
    requests = tmp_path / "requests.yaml"
    requests.write_text("requests:\n  - name: a\n    vram: 1GiB\n")
    fleet = Path(__file__).parents[1] / "fixtures" / "fleets" / "issue_example.yaml"
    result, modules = run_probe(
        tmp_path, "plan", "--json", "--policy", "spread", str(fleet), str(requests)
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["summary"] == {"placed": 1, "failed": 0}
    assert loaded(modules, ("pydantic", "rich", "httpx", "cohabit.service")) == []


def test_a_choice_not_offered_is_refused_by_name(tmp_path: Path) -> None:
    result, modules = run_probe(tmp_path, "plan", "--policy", "nope", "f.yaml", "r.yaml")
    assert result.returncode == 2
    assert "Invalid value for '--policy': 'nope' is not one of 'binpack', 'spread'." in (
        result.stderr
    )
    assert "pydantic" not in modules
