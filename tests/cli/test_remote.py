"""The commands that talk to a server, run as a user runs them (subprocesses) against a real
`cohabit serve` with real llama.cpp engines serving the tiny GGUF on a simulated CPU box:
models add/ls, deploy (watching the status), ps, logs (and --follow), chat through the
gateway, stop; a no-fit prints the reason and the fix and exits 3; bad input and an absent
server give one line and their exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cohabit.placement.reasons import HINTS, NoFitReason
from cohabit.runtime.process import free_port
from tests.conftest import cli_json, run_cli
from tests.sdk.live import LiveServer, add_tiny, live_server, point_at, stop_everything

ORDER = ["REQUESTED", "DEPLOYING", "INITIALIZING", "DEPLOYED"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("cli-live")) as running:
        yield running


@pytest.fixture(autouse=True)
def reach(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Commands find the server through the environment, as a user's shell would; each test
    leaves nothing deployed."""
    point_at(server, monkeypatch)
    yield
    stop_everything(server)


@pytest.fixture(scope="module")
def model_id(server: LiveServer) -> str:
    """`cohabit models add` once for the module (it reads the environment the test sets)."""
    added = add_tiny(server)
    assert (added["name"], added["format"]) == ("tiny", "gguf")
    return str(added["id"])


def statuses_shown(stderr: str) -> list[str]:
    return re.findall(r"^(REQUESTED|DEPLOYING|INITIALIZING|DEPLOYED|FAILED)\s", stderr, re.M)


def test_models_ls(model_id: str) -> None:
    table = run_cli("models", "ls")
    assert table.returncode == 0, table.stderr
    assert re.search(rf"{model_id[:8]}\s+tiny\s+/\S+\s+gguf\s+0\.4 MiB", table.stdout), table.stdout
    assert "engine=llamacpp max_model_len=256" in table.stdout
    assert [m["id"] for m in cli_json("models", "ls")] == [model_id]


@pytest.mark.slow
def test_deploy_watch_ps_logs_chat_stop(model_id: str, server: LiveServer) -> None:
    deployed = run_cli("deploy", "tiny")

    assert deployed.returncode == 0, deployed.stderr
    shown = statuses_shown(deployed.stderr)
    assert shown[-1] == "DEPLOYED" and shown == sorted(shown, key=ORDER.index)
    (deployment,) = cli_json("ps")
    deployment_id = deployment["id"]
    assert f"DEPLOYED tiny {deployment_id}" in deployed.stdout
    endpoint = f"{server.api.removesuffix('/api')}/runtime/models/{deployment_id}/v1"
    assert f"endpoint  {endpoint}" in deployed.stdout
    assert deployment["endpoint"] == endpoint
    assert (deployment["node_name"], deployment["hardware_class"]) == ("box", "cpu")

    ps = run_cli("ps")
    assert re.search(
        rf"{deployment_id[:8]}\s+tiny\s+DEPLOYED\s+1/1\s+box pool\s+cpu/cpu", ps.stdout
    )

    logs = run_cli("logs", deployment_id[:8])
    assert logs.returncode == 0 and "llama" in logs.stdout.lower(), logs.stderr
    chat = run_cli("chat", deployment_id[:8], "hello", "--max-tokens", "4")
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr

    stopped = run_cli("stop", deployment_id)
    assert stopped.returncode == 0 and f"stopped {deployment_id}" in stopped.stdout
    assert "1 stopped: --all" in run_cli("ps").stdout
    assert [d["status"] for d in cli_json("ps", "--all")] == ["STOPPED"]
    late = run_cli("chat", deployment_id, "hello")
    assert late.returncode == 2 and "is STOPPED, not DEPLOYED" in late.stderr


def test_gpus_shows_what_the_server_holds(model_id: str, server: LiveServer) -> None:
    """`cohabit gpus --url` reads the server's own view: the pool with 5 GiB reserved."""
    assert run_cli("deploy", "tiny", "--vram", "5GiB").returncode == 0

    document = cli_json("gpus", "--url", server.api)

    assert document["source"] == "server"
    ((node,),) = [document["nodes"]]
    (pool,) = node["slots"]
    assert (node["name"], pool["location"], pool["hardware_class"]) == (
        "box",
        "box cpu pool",
        "cpu",
    )
    assert (pool["capacity_bytes"], pool["reserved_bytes"]) == (8 * 2**30, 5 * 2**30)
    assert pool["free_bytes"] == 3 * 2**30
    table = run_cli("gpus", "--url", server.api)
    assert table.returncode == 0, table.stderr
    assert re.search(
        r"box\s+cpu pool\s+cpu\s+CPU\s+cpu\s+cpu\s+16 GiB\s+8 GiB\s+3 GiB\s+5 GiB", table.stdout
    ), table.stdout


def test_gpus_url_does_not_mix_with_a_fleet_file(server: LiveServer) -> None:
    mixed = run_cli("gpus", "--url", server.api, "--fleet", "fleet.yaml")
    assert mixed.returncode == 2
    assert "--url shows a server's hardware" in mixed.stderr


def test_no_wait_then_stop_the_model(model_id: str) -> None:
    accepted = cli_json("deploy", model_id, "--no-wait")
    assert accepted["status"] == "REQUESTED"

    assert cli_json("stop", "tiny") == {"stopped": [accepted["id"]], "already_ended": []}
    assert "tiny has no active deployments" in run_cli("stop", "tiny").stdout


def test_max_model_len_makes_one_config_and_reuses_it(model_id: str, server: LiveServer) -> None:
    first = cli_json("deploy", "tiny", "--max-model-len", "128")
    second = cli_json("deploy", "tiny", "--max-model-len", "128")

    assert first["status"] == second["status"] == "DEPLOYED"
    assert first["m_config_id"] == second["m_config_id"]
    with server.client() as client:
        configs = {str(c.id): c for c in client.models.get_model_configs(model_id)}
    made = configs[first["m_config_id"]]
    assert (made.default, made.config["max_model_len"]) == (False, 128)
    assert len(configs) == 2


def test_a_no_fit_prints_the_reason_and_the_fix_and_exits_3(model_id: str) -> None:
    assert run_cli("deploy", "tiny", "--vram", "5GiB").returncode == 0

    refused = run_cli("deploy", "tiny", "--vram", "5GiB")

    assert refused.returncode == 3
    assert re.search(
        r"error: deployment \S+ FAILED: NoFitError: insufficient_system_memory: 0/1 nodes fit",
        refused.stderr,
    )
    assert f"fix: {HINTS[NoFitReason.INSUFFICIENT_SYSTEM_MEMORY]}" in refused.stderr
    assert "Traceback" not in refused.stderr
    document = json.loads(run_cli("deploy", "tiny", "--vram", "5GiB", "--json").stdout)
    assert (document["status"], document["last_error_code"]) == ("FAILED", "NoFitError")
    assert document["fix"] == HINTS[NoFitReason.INSUFFICIENT_SYSTEM_MEMORY]


def test_what_never_fits_is_refused_with_the_fix(model_id: str) -> None:
    refused = run_cli("deploy", "tiny", "--vram", "40GiB")
    assert refused.returncode == 3
    assert "refused: it fits no device even on an empty fleet" in refused.stderr
    assert "insufficient_system_memory" in refused.stderr and "fix: " in refused.stderr


def test_logs_follow_ends_when_the_deployment_stops(model_id: str, server: LiveServer) -> None:
    deployment = cli_json("deploy", "tiny")
    with subprocess.Popen(
        [sys.executable, "-m", "cohabit", "logs", deployment["id"], "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as follow:
        try:
            assert follow.stdout is not None
            assert follow.stdout.readline().strip()  # it is following
            assert run_cli("stop", deployment["id"]).returncode == 0
            assert follow.wait(timeout=60) == 0
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait(timeout=30)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["ps", "--url", "http://127.0.0.1:{port}/api"], 4, "cannot reach the cohabit server"),
        (["ps", "--url", "{root}"], 2, "is the URL the API root, ending in /api?"),
        (["ps", "--url", "nope"], 2, "--url: base URL 'nope' is not an http(s) URL"),
        (["logs", "00000000"], 2, "no deployment '00000000'"),
        (["stop", "nothing-like-this"], 2, "no deployment or model 'nothing-like-this'"),
        (["deploy", "no-such-model"], 2, "no model 'no-such-model' in the catalog"),
        (["deploy", "tiny", "--vram", "6XB"], 2, "--vram: unknown unit 'XB'"),
        (["deploy", "tiny", "--config", "fast"], 2, "no config 'fast' for this model"),
        (["models", "add", "/no/such/model.gguf"], 2, "/no/such/model.gguf"),
    ],
    ids=[
        "server-down",
        "url-without-api",
        "url-not-http",
        "unknown-deployment",
        "unknown-target",
        "unknown-model",
        "bad-size",
        "unknown-config",
        "missing-file",
    ],
)
def test_bad_input_is_one_line_and_a_documented_exit_code(
    model_id: str, server: LiveServer, args: list[str], code: int, message: str
) -> None:
    root = server.api.removesuffix("/api")
    result = run_cli(*[arg.format(port=free_port(), root=root) for arg in args])
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_wrong_token_is_refused(model_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COHABIT_API_TOKEN", "wrong")
    result = run_cli("ps")
    assert result.returncode == 2
    assert "401: missing or wrong bearer token" in result.stderr
    assert "set COHABIT_API_TOKEN" in result.stderr


def test_deploy_scaling_flags_and_ps_shows_unloaded(model_id: str, server: LiveServer) -> None:
    """`--copies 0 --min-copies 0`: admitted UNLOADED (no engine until a request loads it),
    listed by `ps` with its endpoint; the flags land in the deployment as given."""
    deployed = run_cli(
        "deploy", "tiny", "--copies", "0", "--min-copies", "0", "--keep-alive", "30",
        "--priority", "3", "--duration", "10",
    )  # fmt: skip
    assert deployed.returncode == 0, deployed.stderr
    shown = re.search(r"^UNLOADED tiny (\S+) in ", deployed.stdout, re.MULTILINE)
    assert shown is not None, deployed.stdout
    assert "loads     on its first request" in deployed.stdout
    (deployment,) = [d for d in cli_json("ps") if d["id"] == shown[1]]
    fields = ("status", "min_copies", "starting_copies", "keep_alive", "priority", "duration")
    assert [deployment[key] for key in fields] == ["UNLOADED", 0, 0, 30, 3, 10]
    assert deployment["ends_at"] is not None and deployment["instances"] == []
    root = server.api.removesuffix("/api")
    assert deployment["endpoint"] == f"{root}/runtime/models/{deployment['id']}/v1"
    ps = run_cli("ps")
    short = deployment["id"][:8]
    assert re.search(rf"{short}\s+tiny\s+UNLOADED\s+0/1\s+-\s+-\s+-\s+-\s+/v1", ps.stdout), (
        ps.stdout
    )


def test_a_scaling_value_the_server_refuses_is_one_line(model_id: str) -> None:
    before = cli_json("ps", "--all")
    refused = run_cli("deploy", "tiny", "--priority", "5000")
    assert refused.returncode == 2, refused.stderr
    assert "priority" in refused.stderr and "1000" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert cli_json("ps", "--all") == before
