"""`cohabit serve` run the way a deployment keeps its secrets: the admin token read from
`--token-file`, the metrics token, the database URL and a Hugging Face token in its
environment. The real llama.cpp server (llama-cpp-python) serves the tiny model on a
simulated CPU box; its environment, read back from /proc, holds none of those secrets, and
the server's own command line holds no token, while the token from the file is the one the
API wants. An engine forked from the server's pre-imported launcher (once that is ready) shows
the launcher's environment in /proc, which is all it inherited; what the child then sets is
exactly what a fresh process gets (tests/runtime/test_forkserver.py reads it back)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store.database import sqlite_url
from cohabit.units import GIB
from tests.cli.test_serve import CPU_BOX, cohabit_serve
from tests.e2e.engines import deploy, engine_pid, environ_of, kill_engines, wait_deployed


@pytest.mark.slow
def test_no_secret_reaches_an_engine_or_the_command_line(tmp_path: Path) -> None:
    token = f"admin-{secrets.token_hex(12)}"
    (tmp_path / "token").write_text(f"{token}\n")
    data_dir = tmp_path / "data"
    server_env = {
        "COHABIT_METRICS_TOKEN": f"metrics-{secrets.token_hex(12)}",
        "COHABIT_DATABASE_URL": sqlite_url(data_dir),
        "HF_TOKEN": f"hf_{secrets.token_hex(16)}",
    }
    kept_secret = [token, *server_env.values()]
    model = write_tiny_model(tmp_path / "models" / "tiny.gguf")
    try:
        with cohabit_serve(
            tmp_path, CPU_BOX, "--token-file", str(tmp_path / "token"), env=server_env
        ) as (api, server):
            assert httpx.get(f"{api}/models/", timeout=30).status_code == 401
            bearer = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=api, headers=bearer, timeout=30) as client:
                record = wait_deployed(client, deploy(client, model, "tiny", 6 * GIB))
            pid = engine_pid(data_dir, record["id"])
            assert pid is not None
            engine_env = environ_of(pid)
            command_line = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode()
            assert [s for s in kept_secret if any(s in v for v in engine_env.values())] == []
            assert token not in command_line and "--token-file" in command_line
    finally:
        kill_engines(data_dir)
    assert "warning:" not in (tmp_path / "stderr.txt").read_text()
