"""Command-line start-up: the wall time of `cohabit --help` and of `cohabit ps` against a real
server, each a fresh process as a user's shell starts it (the `cohabit` console script).

The server is `cohabit serve` in its own process on a loopback port, SQLite in a temporary
folder, serving tests/fixtures/fleets/issue_example.yaml, with a few deployments of the tiny
GGUF started with no copy (UNLOADED: routable, no engine runs), so `ps` prints a table of
several rows. Beside the two commands run the interpreter alone (`python -c pass`) and a bare
`import typer`, for scale: on a shared machine everything slows down together, and these two
say by how much. The commands take turns, one run each per round, so that all of them meet
the same moments of load; each runs once to warm the caches, then `--runs` rounds. The
figures are the median, min and max; the load average is printed at the start and the end.

`--baseline DIR` also times the same two commands from another checkout's `src/` (on
PYTHONPATH), e.g. the code before a change: `git archive HEAD~1 src | tar -x -C /tmp/base`
then `--baseline /tmp/base/src`.

Run: .venv/bin/python benchmarks/cli_startup.py               (~20 s)
     .venv/bin/python benchmarks/cli_startup.py --runs 30 --deployments 20
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cohabit.runtime.process import free_port
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.sdk import Client
from cohabit.units import GIB

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "tests" / "fixtures" / "fleets" / "issue_example.yaml"
COHABIT = Path(sys.executable).parent / "cohabit"  # the console script, as a user runs it
TARGET_MS = 150.0


@contextmanager
def server(data_dir: Path, env: dict[str, str]) -> Iterator[str]:
    """`cohabit serve` on a free loopback port; yields its API root (…/api)."""
    port = free_port()
    command = [str(COHABIT), "serve", "--fleet", str(FLEET), "--port", str(port)]
    command += ["--data-dir", str(data_dir)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    api = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while not _answers(api):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cohabit serve did not start (exit {process.poll()})")
            time.sleep(0.1)
        yield api
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answers(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/serving/health", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def deploy_unloaded(api: str, model_dir: Path, count: int) -> None:
    """`count` deployments of the tiny GGUF with no copy started: UNLOADED, no engine."""
    with Client(base_url=api) as client:
        for index in range(count):
            path = write_tiny_model(model_dir / f"tiny-{index}.gguf", seed=index)
            model = client.models.add_model(path, name=f"tiny-{index}")
            client.serving.deploy_model(
                model.id,
                vram_allocation=GIB,
                min_copies=0,
                starting_copies=0,
                timeout_seconds=60,
                poll_interval_seconds=0.1,
            )


def run_once(args: list[str], env: dict[str, str]) -> float:
    """Seconds one fresh process took; a run that fails stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
    return elapsed


def in_turns(commands: dict[str, tuple[list[str], dict[str, str]]], runs: int) -> dict[str, Any]:
    """Each command once to warm up, then `runs` rounds of one run each; the figures (ms)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for round_index in range(runs + 1):
        for name, (args, env) in commands.items():
            elapsed = run_once(args, env)
            if round_index:
                times[name].append(elapsed)
    return {
        name: {
            "median_ms": 1000 * statistics.median(taken),
            "min_ms": 1000 * min(taken),
            "max_ms": 1000 * max(taken),
        }
        for name, taken in times.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHABIT_")}
    with (
        tempfile.TemporaryDirectory(prefix="cohabit-cli-startup-") as tmp,
        server(Path(tmp) / "data", env) as api,
    ):
        deploy_unloaded(api, Path(tmp) / "models", args.deployments)
        env_ps = env | {"COHABIT_BASE_URL": api}
        python = [sys.executable, "-c"]
        commands = {
            "python -c pass": ([*python, "pass"], env),
            "python -c 'import typer'": ([*python, "import typer"], env),
            "cohabit --help": ([str(COHABIT), "--help"], env),
            "cohabit ps": ([str(COHABIT), "ps"], env_ps),
        }
        if args.baseline is not None:
            base = {"PYTHONPATH": str(args.baseline)}
            commands["baseline: cohabit --help"] = ([str(COHABIT), "--help"], env | base)
            commands["baseline: cohabit ps"] = ([str(COHABIT), "ps"], env_ps | base)
        figures = in_turns(commands, args.runs)
    return {
        "runs": args.runs,
        "deployments": args.deployments,
        "target_ms": TARGET_MS,
        "load_average": [round(load_at_start, 2), round(os.getloadavg()[0], 2)],
        "commands": figures,
    }


def report(result: dict[str, Any]) -> None:
    start, end = result["load_average"]
    print(
        f"{result['runs']} runs each, in turns; `ps` lists {result['deployments']} "
        f"deployments; load average {start} at the start, {end} at the end"
    )
    print(f"{'command':<28} {'median':>8} {'min':>8} {'max':>8}   target")
    for name, shown in result["commands"].items():
        target = f"≤ {TARGET_MS:.0f} ms" if name.startswith("cohabit") else ""
        print(
            f"{name:<28} {shown['median_ms']:6.0f}ms {shown['min_ms']:6.0f}ms "
            f"{shown['max_ms']:6.0f}ms   {target}"
        )
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each command")
    parser.add_argument("--deployments", type=int, default=6, help="deployments `ps` lists")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout's src/ to time the commands from too"
    )
    report(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
