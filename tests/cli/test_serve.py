"""`cohabit serve`, run as a user runs it (a subprocess): bad options and files give one line
and exit 2; without a token it listens on 127.0.0.1 only and says so; with one, every route
but health wants it; and a real deployment of a tiny GGUF on a simulated CPU fleet goes to
DEPLOYED through the real local runtime (a llama.cpp server on the CPU), then stops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cohabit.runtime.process import free_port
from cohabit.runtime.tinymodel import write_tiny_model
from tests.conftest import run_cli

T4 = (
    "nodes:\n  - name: node-a\n    gpus: [{index: 0, vendor: nvidia, product: T4, memory: 16GiB}]\n"
)
CPU_BOX = "nodes:\n  - name: box\n    memory: 16GiB\n"
LONG_TOKEN = "s3cret-0f-16-chars"


# argv: soft and hard RLIMIT_NOFILE, then the command to become.
_LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


@contextmanager
def cohabit_serve(
    tmp_path: Path,
    fleet: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    open_files: tuple[int, int] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`cohabit serve` on a free loopback port, with `env` added to its environment and,
    given `open_files`, that (soft, hard) RLIMIT_NOFILE to start with; stderr goes to
    tmp_path/stderr.txt."""
    (tmp_path / "fleet.yaml").write_text(fleet)
    port = free_port()
    given = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHABIT_")} | dict(given)
    command = [sys.executable, "-m", "cohabit", "serve", "--fleet", str(tmp_path / "fleet.yaml")]
    command += ["--port", str(port), "--data-dir", str(tmp_path / "data"), *args]
    if open_files is not None:  # set by a shim that then becomes the server (no preexec_fn:
        # it is unsafe in a process with threads)
        command = [sys.executable, "-c", _LIMITED, *map(str, open_files), *command]
    api = f"http://127.0.0.1:{port}/api"
    with (tmp_path / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env
        )
        try:
            # Its imports take a few seconds alone, far more with every core busy (the suite
            # runs on one worker per core); a live server answers as soon as it can.
            deadline = time.monotonic() + 120
            while not _answers(api):
                assert process.poll() is None, (tmp_path / "stderr.txt").read_text()
                assert time.monotonic() < deadline, "cohabit serve never answered"
                time.sleep(0.1)
            yield api, process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}/serving/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize(
    ("args", "fleet", "message"),
    [
        (["--host", "0.0.0.0"], T4, "--host 0.0.0.0 needs an API token"),
        ([], "nodes: [{name: x, gpus: [{index: 0}]}]", "fleet.yaml"),
        (["--port", "99999"], T4, "port"),
        (["--startup-timeout", "0"], T4, "--startup-timeout"),
        (["--enforce", "hami-core"], T4, "--enforce hami-core: HAMi-core's libvgpu.so is not at"),
        (["--token", "s3cr\u00e9t"], T4, "token: the API token must be visible ASCII"),
        (["--allow-host", "bad host"], T4, "'bad host' is not a host name"),
        (["--token", "a", "--token-file", "/t"], T4, "--token and --token-file: give one"),
        (["--token-file", "/no/token"], T4, "--token-file /no/token: No such file or directory"),
        (["--metrics-token-file", "/dev/null"], T4, "--metrics-token-file /dev/null is empty"),
        (["--scale-per-copy", "0"], T4, "--scale-per-copy"),
        (["--scale-window", "4000"], T4, "setting scale_window_s: Input should be less than"),
        (["--token", "x"], T4, "--token: the token has 1 characters; give at least 16"),
        (
            ["--token", LONG_TOKEN, "--metrics-token", "m3trics"],
            T4,
            "--metrics-token: the token has 7 characters; give at least 16",
        ),
    ],
    ids=[
        "wide-host-without-token",
        "bad-fleet-file",
        "bad-port",
        "zero-startup-timeout",
        "hami-core-not-installed",
        "non-ascii-token",
        "bad-allowed-host",
        "token-twice",
        "missing-token-file",
        "empty-metrics-token-file",
        "zero-scale-per-copy",
        "scale-window-over-an-hour",
        "one-character-token",
        "short-metrics-token",
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], fleet: str, message: str
) -> None:
    (tmp_path / "fleet.yaml").write_text(fleet)
    result = run_cli(
        "serve", "--fleet", str(tmp_path / "fleet.yaml"), "--data-dir", str(tmp_path), *args
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_busy_port_is_one_line_naming_the_address_and_exit_2(tmp_path: Path) -> None:
    """Another server already listens on the port: bad environment (exit 2), not a failed
    deployment (3), and said before the database is opened."""
    (tmp_path / "fleet.yaml").write_text(T4)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli(
            "serve", "--fleet", str(tmp_path / "fleet.yaml"), "--data-dir", str(tmp_path / "data"),
            "--port", str(port),
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_token_on_the_command_line_gets_a_one_line_warning(tmp_path: Path) -> None:
    """Every user of the machine can read a command line (ps). The fleet file is refused,
    so the server stops right after its warnings."""
    (tmp_path / "fleet.yaml").write_text("nodes: [{name: x, gpus: [{index: 0}]}]")
    result = run_cli(
        "serve", "--fleet", str(tmp_path / "fleet.yaml"), "--data-dir", str(tmp_path),
        "--token", LONG_TOKEN, "--metrics-token", f"m3trics-{LONG_TOKEN}",
    )  # fmt: skip
    assert result.returncode == 2
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    flags = (("--token", "COHABIT_API_TOKEN"), ("--metrics-token", "COHABIT_METRICS_TOKEN"))
    assert warnings == [
        f"warning: {flag} on the command line is visible to every user of this machine (ps); "
        f"give it in {flag}-file or {env} instead"
        for flag, env in flags
    ]


def test_without_a_token_it_listens_on_loopback_and_says_so(tmp_path: Path) -> None:
    with cohabit_serve(tmp_path, T4) as (api, process):
        nodes = httpx.get(f"{api}/cluster/hardware").json()
        assert [n["name"] for n in nodes] == ["node-a"]
    assert (
        "listening on 127.0.0.1 only" in process.stderr.read()
        if process.stderr and not process.stderr.closed
        else True
    )


def test_without_a_token_only_loopback_and_allowed_host_names_are_answered(
    tmp_path: Path,
) -> None:
    with cohabit_serve(tmp_path, T4, "--allow-host", "cohabit.test") as (api, _process):
        for host in ("127.0.0.1", "localhost:8420", "cohabit.test"):
            assert httpx.get(f"{api}/models/", headers={"Host": host}).status_code == 200
        refused = httpx.get(f"{api}/models/", headers={"Host": "evil.example"})
        assert refused.status_code == 403
        assert "--allow-host" in refused.json()["detail"]


def test_with_a_token_every_route_but_health_wants_it(tmp_path: Path) -> None:
    with cohabit_serve(tmp_path, T4, "--token", LONG_TOKEN) as (api, _process):
        assert httpx.get(f"{api}/serving/deployments").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(f"{api}/models/", headers=wrong).status_code == 401
        right = {"Authorization": f"Bearer {LONG_TOKEN}"}
        assert httpx.get(f"{api}/serving/deployments", headers=right).json() == []
        assert httpx.get(f"{api}/serving/health").status_code == 200


@pytest.mark.slow
def test_a_tiny_gguf_deploys_on_the_cpu_and_stops(tmp_path: Path) -> None:
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    with (
        cohabit_serve(tmp_path, CPU_BOX) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        model = client.post("/models/", json={"path": str(model_path)}).json()
        deployment_id = client.post("/serving/deploy_model", json={"m_id": model["id"]}).json()
        pid = None
        try:
            deadline = time.monotonic() + 120
            while (record := client.get(f"/serving/deployment/{deployment_id}").json())[
                "status"
            ] not in ("DEPLOYED", "FAILED", "ERROR"):
                assert time.monotonic() < deadline, record
                time.sleep(0.2)
            assert record["status"] == "DEPLOYED", record["last_error_message"]
            assert (record["hardware_class"], record["node_name"]) == ("cpu", "box")
            instance = record["instances"][0]
            pid = int(instance["container_id"])
            base_url = instance["extra_details"]["base_url"]
            assert httpx.get(f"{base_url}/v1/models", timeout=10).status_code == 200
            assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
            deadline = time.monotonic() + 30
            while _alive(pid):
                assert time.monotonic() < deadline, "the engine outlived its deployment"
                time.sleep(0.1)
        finally:
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of the (still running) server counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
