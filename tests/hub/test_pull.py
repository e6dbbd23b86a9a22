"""`cohabit models pull`, run as a user runs it, against `cohabit serve` (a subprocess, SQLite
in its data dir, the real llama.cpp engine on the CPU) whose Hub is the stand-in (recorded
answers of the real Hub API, tests/hub/standin.py, reached through HF_ENDPOINT).

The variant's file is throttled so the server can be killed (SIGKILL) half way: the restarted
server resumes it from its `.part` file with an HTTP Range request, the second pull
follows it to the end, and the model deploys. Its file deleted, a deployment ends in
MUST_REDOWNLOAD; pulling again fetches it again and the model deploys again."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cohabit.units import MIB
from tests.cli.test_serve import CPU_BOX, cohabit_serve
from tests.conftest import run_cli
from tests.e2e.engines import kill_engines
from tests.hub.repos import TINY_REPO
from tests.hub.standin import StandInHub

BIG = "tiny-llama-F16.gguf"  # the largest variant: the default on a 16 GiB box


def test_pull_survives_a_killed_server_and_the_model_deploys(
    hub: StandInHub, tmp_path: Path
) -> None:
    hub.throttle[BIG] = 4 * MIB  # bytes per second: about five seconds for 22 MiB
    data = tmp_path / "data"
    try:
        with cohabit_serve(tmp_path, CPU_BOX) as (api, server):
            pulling = subprocess.Popen(
                [sys.executable, "-m", "cohabit", "models", "pull", TINY_REPO, "--url", api],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                part = _wait_for_part(data, at_least=5 * MIB)
                server.kill()  # a crash, half way through the file
                server.wait(30)
            finally:
                out, err = pulling.communicate(timeout=60)
        assert "chose F16: F16 is the largest variant that fits" in out, out + err
        assert pulling.returncode == 4, err  # the server went away: "unreachable"
        assert part.exists()  # the part survives the crash

        with (
            cohabit_serve(tmp_path, CPU_BOX) as (api, _server),
            httpx.Client(base_url=api, timeout=30) as client,
        ):
            again = run_cli("models", "pull", TINY_REPO, "--url", api)
            assert again.returncode == 0, again.stderr
            assert BIG in again.stdout and "pulled" in again.stdout
            # `bytes=N-`: the rest of the file (the variant table reads headers as `bytes=0-M`).
            resumed = [h["range"] for h in hub.gets(BIG) if h.get("range", "").endswith("-")]
            assert len(resumed) == 1
            assert int(resumed[0].removeprefix("bytes=").rstrip("-")) >= 5 * MIB
            model = client.get("/models/").json()[0]
            path = Path(model["model_path"])
            assert path.name == BIG and path.is_relative_to(data / "models" / TINY_REPO)
            published = hub.repos[TINY_REPO].files[BIG].sha256
            assert hashlib.sha256(path.read_bytes()).hexdigest() == published

            assert _deploy(client, model["id"])["status"] == "DEPLOYED"
            _stop_all(client)
            path.unlink()  # the files are gone
            gone = _deploy(client, model["id"])
            assert (gone["status"], gone["last_error_code"]) == (
                "MUST_REDOWNLOAD",
                "MUST_REDOWNLOAD",
            )
            hub.throttle.clear()
            fixed = run_cli("models", "pull", f"{TINY_REPO}:F16", "--url", api)
            assert fixed.returncode == 0, fixed.stderr
            assert path.is_file()
            assert _deploy(client, model["id"])["status"] == "DEPLOYED"
            _stop_all(client)
    finally:
        kill_engines(data)


def _wait_for_part(data: Path, *, at_least: int) -> Path:
    """The part an unfinished download leaves in the store's `.partial` folder."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for part in data.glob("models/**/.partial/*.part"):
            if part.stat().st_size >= at_least:
                return part
        time.sleep(0.05)
    raise AssertionError("no partial download appeared")


def _deploy(client: httpx.Client, model_id: str) -> dict[str, object]:
    deployment_id = client.post("/serving/deploy_model", json={"m_id": model_id}).json()
    deadline = time.monotonic() + 120
    while True:
        record: dict[str, object] = client.get(f"/serving/deployment/{deployment_id}").json()
        if record["status"] in ("DEPLOYED", "FAILED", "ERROR", "MUST_REDOWNLOAD"):
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.2)


def _stop_all(client: httpx.Client) -> None:
    for deployment in client.get("/serving/deployments").json():
        if deployment["status"] == "DEPLOYED":
            assert client.delete(f"/serving/deployment/{deployment['id']}").json() is True
