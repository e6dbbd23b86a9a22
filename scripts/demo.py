"""`make demo`: two tiny models sharing one simulated 16 GiB card, served for real on the CPU.

Writes two tiny GGUF models into a fresh data dir, starts `cohabit serve --fleet
examples/demo-fleet.yaml` on a free loopback port, registers and deploys both (6 GiB each),
prints where each landed and one chat reply from each, then keeps the service running with
its URL printed until Ctrl-C. With COHABIT_DEMO_EXIT=1, or when stdin is not a terminal, it
stops everything and exits 0 right after printing (tests/e2e/test_demo.py runs it so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cohabit.runtime.process import free_port, group_alive
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB, format_gib

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "demo-fleet.yaml"
MODELS = (("tiny-a", 1), ("tiny-b", 2))  # served name, seed
BUDGET_BYTES = 6 * GIB
START_TIMEOUT_S = 60.0
DEPLOY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
PROMPT = "hello"


class DemoFailed(Exception):
    """Something the demo needs did not happen; the message says what."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="keep data here (default: a temp dir)")
    parser.add_argument(
        "--port", type=int, default=0, help="port (default: 8420, cohabit's own, when free)"
    )
    args = parser.parse_args()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="cohabit-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does
    server: subprocess.Popen[bytes] | None = None
    deployment_ids: list[str] = []
    root = ""
    try:
        server, root = start_service(data_dir, args.port or demo_port())
        with httpx.Client(base_url=f"{root}/api", timeout=60, trust_env=False) as api:
            for record in deploy_models(api, data_dir, deployment_ids):
                name, endpoint = record["m_name"], record["endpoint"]
                print(f"{name} says: {chat(endpoint, name)!r}")
        print()
        print(f"cohabit is running at {root}")
        print(f"  API      {root}/api   (docs: {root}/api/docs)")
        print(f"  OpenAI   {root}/v1    (model: {', '.join(n for n, _ in MODELS)})")
        kept = "" if args.data_dir else " (removed when the demo stops)"
        print(f"  data     {data_dir}{kept}")
        if os.environ.get("COHABIT_DEMO_EXIT") == "1" or not sys.stdin.isatty():
            print("demo done: stopping (COHABIT_DEMO_EXIT=1 or no terminal)")
        else:
            print("press Ctrl-C to stop it")
            wait_for_interrupt(server)
        return 0
    except KeyboardInterrupt:
        print("\nstopping")
        return 0
    except DemoFailed as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 1
    finally:
        stop_everything(server, root, data_dir, deployment_ids)
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def demo_port(preferred: int = 8420) -> int:
    """cohabit's usual port when nothing holds it, so the URLs in the docs work; else any."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


def start_service(data_dir: Path, port: int) -> tuple[subprocess.Popen[bytes], str]:
    """`cohabit serve` in its own session (Ctrl-C reaches this script, which stops the
    deployments first: the server leaves engines running for the next start to adopt)."""
    log_path = data_dir / "serve.log"
    command = [sys.executable, "-m", "cohabit", "serve", "--fleet", str(FLEET)]
    command += ["--port", str(port), "--data-dir", str(data_dir)]
    env = {k: v for k, v in os.environ.items() if k != "COHABIT_API_TOKEN"}
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    root = f"http://127.0.0.1:{port}"
    print(f"starting cohabit serve --fleet {FLEET.relative_to(ROOT)} on {root} (data {data_dir})")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy(root):
        if server.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise DemoFailed(f"cohabit serve did not start:\n{tail}")
        time.sleep(0.1)
    return server, root


def _healthy(root: str) -> bool:
    try:
        response = httpx.get(f"{root}/api/serving/health", timeout=2, trust_env=False)
    except httpx.TransportError:
        return False
    return response.status_code == 200


def deploy_models(api: httpx.Client, data_dir: Path, ids: list[str]) -> list[dict[str, Any]]:
    """Register and deploy both models (their ids go into `ids` at once, for the clean-up);
    wait until both are DEPLOYED and print where."""
    for name, seed in MODELS:
        path = write_tiny_model(data_dir / "models" / f"{name}.gguf", seed=seed)
        model = _ok(api.post("/models/", json={"name": name, "path": str(path)}))
        body = {"m_id": model["id"], "vram_allocation": BUDGET_BYTES}
        ids.append(_ok(api.post("/serving/deploy_model", json=body)))
        print(f"registered {name} ({path.name}); deploying it with {format_gib(BUDGET_BYTES)}")
    records = [wait_deployed(api, deployment_id) for deployment_id in ids]
    print()
    print(f"{'model':8} {'status':9} {'node':10} {'gpu':4} {'classes':27} {'allocated':>9}")
    for record in records:
        classes = f"{record['hardware_class']}/{record['sharing_class']}"
        gpu = "-" if record["gpu_index"] is None else str(record["gpu_index"])
        allocated = f"{record['allocated_capacity_gb']} GiB"
        print(
            f"{record['m_name']:8} {record['status']:9} {record['node_name']:10} {gpu:4} "
            f"{classes:27} {allocated:>9}  {record['endpoint']}"
        )
    for node in _ok(api.get("/cluster/hardware")):
        for slot in node["slots"]:
            print(
                f"{slot['location']}: {format_gib(slot['reserved_bytes'])} reserved, "
                f"{format_gib(slot['free_bytes'])} free of {format_gib(slot['capacity_bytes'])}"
            )
    print()
    return records


def wait_deployed(api: httpx.Client, deployment_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while True:
        record: dict[str, Any] = _ok(api.get(f"/serving/deployment/{deployment_id}"))
        if record["status"] == "DEPLOYED":
            return record
        if record["status"] not in ("REQUESTED", "DEPLOYING", "INITIALIZING"):
            raise DemoFailed(
                f"{record['m_name']} ended {record['status']}: "
                f"{record['last_error_code']}: {record['last_error_message']}"
            )
        if time.monotonic() > deadline:
            raise DemoFailed(
                f"{record['m_name']} still {record['status']} after {DEPLOY_TIMEOUT_S:g} s"
            )
        time.sleep(0.2)


def chat(endpoint: str, model: str) -> str:
    """One chat completion through the gateway (the deployment's own OpenAI endpoint)."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12}
    response = httpx.post(f"{endpoint}/chat/completions", json=body, timeout=120, trust_env=False)
    content: str = _ok(response)["choices"][0]["message"]["content"]
    return content


def wait_for_interrupt(server: subprocess.Popen[bytes]) -> None:
    """Until Ctrl-C (KeyboardInterrupt) or the server ends by itself."""
    while server.poll() is None:
        time.sleep(0.5)
    raise DemoFailed(f"cohabit serve ended by itself (exit code {server.returncode})")


def stop_everything(
    server: subprocess.Popen[bytes] | None, root: str, data_dir: Path, deployment_ids: list[str]
) -> None:
    """Stop the deployments while the server runs (it stops their engines; on its own
    shutdown it would leave them running for the next start to adopt), then the server;
    kill whatever engine is left."""
    if server is not None and server.poll() is None:
        for deployment_id in deployment_ids:
            try:
                httpx.delete(
                    f"{root}/api/serving/deployment/{deployment_id}", timeout=30, trust_env=False
                )
            except httpx.TransportError:
                break
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(map(group_alive, engine_pids(data_dir))) and time.monotonic() < deadline:
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=STOP_TIMEOUT_S)
    for pid in engine_pids(data_dir):
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    if deployment_ids:
        print(f"stopped {len(deployment_ids)} deployment(s) and the service")


def engine_pids(data_dir: Path) -> list[int]:
    """Every engine this demo's runtime started (each has its own process group)."""
    pids = []
    for state in (data_dir / "engines").glob("*/engine.json"):
        try:
            pid = json.loads(state.read_text()).get("pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise DemoFailed(
            f"{response.request.method} {response.url}: {response.status_code} {response.text}"
        )
    return response.json()


if __name__ == "__main__":
    sys.exit(main())
