"""`cohabit events`, run as a user runs it (subprocesses) against a real `cohabit serve` whose
engines are real llama.cpp servers of the tiny GGUF on a simulated CPU box: a deploy that is
placed, served (a chat through the gateway) and stopped shows requested → placed → reserved →
started → healthy → stopped with where, why, the budget, the engine's pid and who stopped it;
`--follow` prints the steps as they come and exits 0 once it has stopped (or, quietly, on
Ctrl-C); a deploy that does not fit beside it shows `no_fit`; an engine that cannot load its
model shows `failed` with its code."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cohabit.runtime.tinymodel import write_tiny_model
from tests.conftest import cli_json, run_cli
from tests.sdk.live import LiveServer, add_tiny, live_server, point_at, stop_everything

LIFECYCLE = [
    "requested", "placed", "reserved", "started", "engine_imported", "weights_loaded", "healthy",
    "stopped",
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("events-live")) as running:
        yield running


@pytest.fixture(autouse=True)
def reach(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Commands find the server through the environment; each test leaves nothing deployed."""
    point_at(server, monkeypatch)
    yield
    stop_everything(server)


@pytest.fixture(scope="module")
def model_id(server: LiveServer) -> str:
    return str(add_tiny(server)["id"])


def kinds_of(lines: list[str]) -> list[str]:
    """The KIND column of `cohabit events --follow` lines (time, kind, message)."""
    return [line.split()[2] for line in lines]


def interrupted_follower_exits_quietly(deployment_id: str) -> bool:
    """A second follower (JSON lines) of a live deployment, stopped with Ctrl-C (SIGINT)."""
    command = [sys.executable, "-m", "cohabit", "events", deployment_id, "-f", "--json"]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal starts it: a runner started in the background (SIGINT ignored, which
        # children inherit) would otherwise make Ctrl-C a no-op here.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as follower:
        try:
            assert follower.stdout is not None and follower.stderr is not None
            first = json.loads(follower.stdout.readline())
            assert (first["deployment_id"], first["kind"]) == (deployment_id, "requested")
            follower.send_signal(signal.SIGINT)
            assert follower.wait(timeout=30) == 0
            assert follower.stderr.read() == ""
        finally:
            if follower.poll() is None:
                follower.kill()
    return True


def test_a_deploy_placed_served_and_stopped_shows_its_whole_timeline(
    model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Followed from the start (`--follow` exits 0 once it is stopped), then read whole; a
    deploy that does not fit beside it meanwhile gets `no_fit` on its own timeline."""
    monkeypatch.setenv("COLUMNS", "300")  # the table on one line per event, to read it back
    deployment_id = cli_json("deploy", "tiny", "--vram", "1GiB", "--no-wait")["id"]
    command = [sys.executable, "-m", "cohabit", "events", deployment_id[:8], "--follow"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as follow:
        try:
            assert follow.stdout is not None
            seen = [follow.stdout.readline() for _ in range(7)]
            assert kinds_of(seen) == LIFECYCLE[:7], seen
            (instance,) = cli_json("ps")[0]["instances"]
            assert interrupted_follower_exits_quietly(deployment_id)
            chat = run_cli("chat", deployment_id[:8], "hello", "--max-tokens", "4")
            assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
            refused = json.loads(run_cli("deploy", "tiny", "--vram", "7.5GiB", "--json").stdout)
            assert run_cli("stop", deployment_id).returncode == 0
            assert follow.wait(timeout=60) == 0
            assert kinds_of(follow.stdout.read().splitlines()) == ["stopped"]
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(timeout=30)

    shown = run_cli("events", deployment_id[:8])

    assert shown.returncode == 0, shown.stderr
    rows = [line.split(None, 3) for line in shown.stdout.splitlines()]
    steps = [(row[2], row[3].strip()) for row in rows if len(row) == 4 and row[2] in LIFECYCLE]
    assert [kind for kind, _message in steps] == LIFECYCLE, shown.stdout
    messages = dict(steps)
    assert messages["requested"] == (
        "tiny on llamacpp: 1 GiB per device (the vram_allocation it asked for)"
    )
    assert messages["placed"] == (
        "on box cpu pool: binpack: the tightest fit, leaving 7 GiB of 8 GiB free; no "
        "accelerator here can run it, so the CPU pool takes it"
    )
    assert messages["reserved"] == "holds 1 GiB on box cpu pool"
    assert re.fullmatch(r"llamacpp engine started: pid \d+, port \d+", messages["started"])
    assert f"pid {instance['container_id']}," in messages["started"]
    assert re.fullmatch(
        r"serving \d+\.\d s after it was requested; this load: placed in \d+\.\d\d s, its "
        r"engine process started \d+\.\d\d s later and answered \d+\.\d\d s after that "
        r"\(engine_import \d+\.\d\d s, weights_load \d+\.\d\d s, engine_warmup \d+\.\d\d s\)",
        messages["healthy"],
    )
    assert messages["stopped"] == (
        "stopped by bootstrap through the API (was DEPLOYED); its budget is released"
    )
    timeline = cli_json("events", deployment_id)
    assert [event["kind"] for event in timeline] == LIFECYCLE
    placed, reserved = timeline[1]["data"], timeline[2]["data"]
    assert (placed["node"], placed["hardware_class"], placed["locations"]) == (
        "box",
        "cpu",
        ["box cpu pool"],
    )
    assert reserved["total_bytes"] == 2**30
    assert timeline[3]["data"]["pid"] == int(instance["container_id"])
    assert 0 < timeline[6]["data"]["seconds_from_request"] < 300
    assert [e["id"] for e in timeline] == sorted(e["id"] for e in timeline)

    no_fit = cli_json("events", refused["id"])
    assert [event["kind"] for event in no_fit] == ["requested", "no_fit"]
    assert no_fit[1]["message"] == refused["last_error_message"]
    assert no_fit[1]["message"].startswith("insufficient_system_memory: 0/1 nodes fit")
    details = no_fit[1]["data"]
    assert (details["reason"], details["largest_free_bytes"]) == (
        "insufficient_system_memory",
        7 * 2**30,
    )
    assert details["largest_free_location"] == "box cpu pool"


def test_an_engine_that_cannot_load_its_model_shows_failed_with_its_code(
    server: LiveServer, tmp_path: Path
) -> None:
    """The file is registered whole, then cut short: llama.cpp itself refuses to load it."""
    path = write_tiny_model(tmp_path / "broken.gguf")
    added = cli_json("models", "add", str(path), "--name", "broken")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    failed = run_cli("deploy", added["id"], "--vram", "1GiB", "--json")
    record = json.loads(failed.stdout)
    assert record["last_error_code"] == "MODEL_LOADING_FAILURE", record

    timeline = cli_json("events", record["id"])

    assert [event["kind"] for event in timeline] == [
        "requested", "placed", "reserved", "started", "failed",
    ]  # fmt: skip
    last = timeline[-1]
    assert last["data"] == {"code": "MODEL_LOADING_FAILURE", "status": record["status"]}
    assert last["message"] == f"MODEL_LOADING_FAILURE: {record['last_error_message']}"
