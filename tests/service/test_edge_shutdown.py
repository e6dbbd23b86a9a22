"""A shutdown no caller can hold up: `cohabit serve`, run as a user runs it (a subprocess), with
a stand-in `llama-server` on PATH that streams without end (tests/service/streaming_engine.py;
no real engine here streams for long enough) deployed on a CPU fleet through the real
llama.cpp launcher and local runtime. A caller starts a streamed chat through the gateway
and never reads it; on SIGTERM the server waits for it at most its shutdown deadline, then
cuts it, stops the engine and hands the deployment back, as it does when nothing is in
flight."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store import deployments
from cohabit.store.database import Database, sqlite_url
from cohabit.store.records import DeploymentStatus
from tests.cli.test_serve import CPU_BOX, _alive, cohabit_serve
from tests.e2e.engines import kill_engines, wait_deployed

STREAMING_ENGINE = Path(__file__).with_name("streaming_engine.py")
SHUTDOWN_S = 2
# Past the deadline: the engine's stop (SIGTERM, which the stand-in obeys at once) and the
# lifespan's own steps, with room for a busy machine.
MARGIN_S = 20


def streaming_llama_server(bin_dir: Path) -> None:
    """`llama-server` in `bin_dir`: becomes the streaming stand-in (same pid, same env)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"engine = {str(STREAMING_ENGINE)!r}\n"
        "os.execv(sys.executable, [sys.executable, engine, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)


@pytest.mark.slow
def test_a_stream_nobody_reads_holds_the_shutdown_no_longer_than_its_deadline(
    tmp_path: Path,
) -> None:
    streaming_llama_server(tmp_path / "bin")
    env = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "COHABIT_SHUTDOWN_TIMEOUT_S": str(SHUTDOWN_S),
    }
    model = write_tiny_model(tmp_path / "tiny.gguf")
    data_dir = tmp_path / "data"
    try:
        with (
            cohabit_serve(tmp_path, CPU_BOX, env=env) as (api, process),
            httpx.Client(base_url=api, timeout=30, trust_env=False) as client,
        ):
            model_id = client.post("/models/", json={"path": str(model)}).json()["id"]
            deployment_id = client.post("/serving/deploy_model", json={"m_id": model_id}).json()
            record = wait_deployed(client, deployment_id)
            engine = int(record["instances"][0]["container_id"])
            where = urlsplit(api)
            caller = socket.socket()
            # A small window: the server's writes stall at once when the caller stops reading.
            caller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            caller.settimeout(30)
            caller.connect((where.hostname or "", where.port or 0))
            body = b'{"model": "tiny", "stream": true, "messages": []}'
            caller.sendall(
                b"POST /runtime/models/%s/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (deployment_id.encode(), len(body), body)
            )
            assert caller.recv(15) == b"HTTP/1.1 200 OK"  # streaming; never read again
            signalled = time.monotonic()  # before the signal: the server's wait begins after
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=SHUTDOWN_S + MARGIN_S)
            took_s = time.monotonic() - signalled
            caller.close()
        assert SHUTDOWN_S <= took_s < SHUTDOWN_S + MARGIN_S  # it waited, then went on
        assert not _alive(engine)  # stopped, as at any shutdown
        db = Database(sqlite_url(data_dir))
        try:
            handed_back = deployments.get(db, deployment_id)
        finally:
            db.dispose()
        assert handed_back.status is DeploymentStatus.DEPLOYED  # the next start runs it again
        assert (handed_back.claimed_by, handed_back.claimed_until) == (None, None)
        log = (tmp_path / "stderr.txt").read_text()
        assert "timeout graceful shutdown exceeded" in log, log[-3000:]
    finally:
        kill_engines(data_dir)
