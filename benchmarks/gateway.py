"""Gateway cost: what the gateway adds to a request against a real llama.cpp engine, and how
long a request to a deployment whose engine is not running yet takes to its first token.

One run: `cohabit serve` as a user starts it (its own process, loopback, SQLite, a simulated
16 GiB card; the engine is llama-cpp-python's server on the CPU with the tiny GGUF of
`cohabit.runtime.tinymodel`).

- Cold start: a deployment is requested and, at once, a streamed chat request is sent through
  the gateway by model name; the gateway holds it until the engine serves. The time to its
  first chunk is split into the control plane before the engine (admission, placement,
  reservation, spawning: deploy request → engine process created), the engine's own start
  (process created → it answers, seen by polling the engine directly every 5 ms) and the
  control plane after it (engine answering → first chunk), itself split at the moment the
  deployment was recorded DEPLOYED: the reconciler's readiness probe before it; routing the
  held request and the engine's first generation after it.
  This branch has no unload, so the engine is "not running yet" because the deployment is
  fresh, not because it was unloaded; the output says so.
- Warm: `--requests` one-token chat completions (`max_tokens: 1`) in rounds of three, one
  each straight to the engine, through `/runtime/models/{id}/v1` and through `/v1` by model
  name (the order rotating every round), each over its own keep-alive connection; p50/p99
  and what the gateway adds (gateway − direct) at each.

Run: .venv/bin/python benchmarks/gateway.py                 (~3 minutes on a loaded 2-core machine)
     .venv/bin/python benchmarks/gateway.py --requests 20
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB

FLEET = (
    "nodes:\n  - name: node-a\n    gpus: [{index: 0, vendor: nvidia, product: T4, memory: 16GiB}]\n"
)
MODEL = "tiny"
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ROUTES = ("direct", "deployment", "by_name")
ENDED = {"ERROR", "FAILED", "MUST_REDOWNLOAD", "STOPPED"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def cohabit_serve(work: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """`cohabit serve` on a free loopback port (with `env`'s COHABIT_* settings); yields the
    server's root URL and pid."""
    (work / "fleet.yaml").write_text(FLEET)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHABIT_")} | (env or {})
    command = [sys.executable, "-m", "cohabit", "serve", "--fleet", str(work / "fleet.yaml")]
    command += ["--port", str(port), "--data-dir", str(work / "data")]
    root = f"http://127.0.0.1:{port}"
    with (work / "server.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        try:
            deadline = time.monotonic() + 90
            while not _answers(f"{root}/api/serving/health"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"cohabit serve did not start: {_tail(work)}")
                time.sleep(0.1)
            yield root, process.pid
        finally:
            process.send_signal(signal.SIGTERM)  # stops its engines too
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _tail(work: Path) -> str:
    return (work / "server.log").read_text()[-2000:]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def engine_state(data_dir: Path, deployment_id: str) -> dict[str, Any] | None:
    """The spawner's record of a deployment's engine (pid, base_url), once it wrote one."""
    path = data_dir / "engines" / deployment_id / "engine.json"
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("pid") and state.get("base_url") else None


def wait_deployed(api: httpx.Client, deployment_id: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        record = api.get(f"/serving/deployment/{deployment_id}").json()
        if record["status"] == "DEPLOYED":
            return
        if record["status"] in ENDED or time.monotonic() > deadline:
            raise RuntimeError(f"deployment ended as {record['status']}: {record}")
        time.sleep(0.1)


def cold_start(root: str, api: httpx.Client, data_dir: Path, model_id: str) -> dict[str, float]:
    """Deploy scaled to zero (no copy started: UNLOADED, no engine, no budget), send a
    streamed request by name, which loads it, and split its time to first chunk."""
    body = {
        "m_id": model_id,
        "vram_allocation": 2 * GIB,
        "min_copies": 0,
        "starting_copies": 0,
    }
    deployed = api.post("/serving/deploy_model", json=body)
    if deployed.status_code != 202:
        raise RuntimeError(f"deploy refused: {deployed.text}")
    deployment_id: str = deployed.json()
    status = api.get(f"/serving/deployment/{deployment_id}").json()["status"]
    if status != "UNLOADED":
        raise RuntimeError(f"a deployment with no starting copy is {status}, not UNLOADED")
    t0 = time.time()
    chat = {**CHAT, "model": MODEL, "stream": True, "max_tokens": 1}
    first_chunk: list[float] = []

    def send() -> None:
        url = f"{root}/v1/chat/completions"
        with (
            httpx.Client(timeout=300, trust_env=False) as client,
            client.stream("POST", url, json=chat) as answer,
        ):
            if answer.status_code == 200:
                for _ in answer.iter_raw():
                    first_chunk.append(time.time())
                    break

    sender = threading.Thread(target=send)
    sender.start()
    state = None
    while state is None:
        time.sleep(0.005)
        state = engine_state(data_dir, deployment_id)
    launched = time.time()  # engine.json is written as the engine process is started
    engine_ready = _poll_engine(state["base_url"])
    sender.join(300)
    if not first_chunk:
        raise RuntimeError("the cold request got no answer")
    record = api.get(f"/serving/deployment/{deployment_id}").json()
    deployed = datetime.fromisoformat(record["deployed_at"].replace("Z", "+00:00")).timestamp()
    return {
        "deployment_id": deployment_id,  # type: ignore[dict-item]
        "to_first_chunk_s": first_chunk[0] - t0,
        "control_plane_before_engine_s": launched - t0,
        "engine_start_s": engine_ready - launched,
        "control_plane_after_engine_s": first_chunk[0] - engine_ready,
        # ... of which: the reconciler seeing the engine ready and recording DEPLOYED, then
        # the gateway routing the held request and the engine's first generation.
        "ready_to_deployed_s": deployed - engine_ready,
        "deployed_to_first_chunk_s": first_chunk[0] - deployed,
    }


def _poll_engine(base_url: str) -> float:
    """When the engine itself first answers (llama-cpp-python's server: /v1/models)."""
    with httpx.Client(timeout=2, trust_env=False) as client:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if client.get(f"{base_url}/v1/models").status_code == 200:
                    return time.time()
            except httpx.TransportError:
                pass
            time.sleep(0.005)
    raise RuntimeError("the engine never answered")


def warm(root: str, engine_url: str, deployment_id: str, requests: int) -> dict[str, list[float]]:
    urls = {
        "direct": f"{engine_url}/v1/chat/completions",
        "deployment": f"{root}/runtime/models/{deployment_id}/v1/chat/completions",
        "by_name": f"{root}/v1/chat/completions",
    }
    body = json.dumps({**CHAT, "model": MODEL}).encode()
    headers = {"content-type": "application/json"}
    clients = {name: httpx.Client(timeout=60, trust_env=False) for name in ROUTES}
    samples: dict[str, list[float]] = {name: [] for name in ROUTES}
    try:
        for name in ROUTES:  # open each connection, warm each path
            for _ in range(3):
                clients[name].post(urls[name], content=body, headers=headers).raise_for_status()
        for index in range(requests):
            shift = index % len(ROUTES)
            for name in ROUTES[shift:] + ROUTES[:shift]:
                started = time.perf_counter()
                answer = clients[name].post(urls[name], content=body, headers=headers)
                samples[name].append(time.perf_counter() - started)
                if answer.status_code != 200 or answer.json()["usage"]["completion_tokens"] != 1:
                    raise RuntimeError(f"{name}: {answer.status_code} {answer.text[:200]}")
    finally:
        for client in clients.values():
            client.close()
    return samples


def server_cpu_ms(pid: int, root: str, deployment_id: str, requests: int) -> dict[str, float]:
    """CPU time the server process spends per proxied request, by route: the wall-clock
    figures follow whatever else runs on the machine, this does much less. The server's
    background work (reconciler passes, the route table's reads), measured over an idle
    second, is taken out."""
    server = psutil.Process(pid)
    body = json.dumps({**CHAT, "model": MODEL}).encode()
    headers = {"content-type": "application/json"}
    urls = {
        "deployment": f"{root}/runtime/models/{deployment_id}/v1/chat/completions",
        "by_name": f"{root}/v1/chat/completions",
    }
    figures = {}
    with httpx.Client(timeout=60, trust_env=False) as client:
        for name, url in urls.items():
            client.post(url, content=body, headers=headers).raise_for_status()
            idle_from, idle_at = _cpu_s(server), time.perf_counter()
            time.sleep(1.0)
            idle_rate = (_cpu_s(server) - idle_from) / (time.perf_counter() - idle_at)
            busy_from, busy_at = _cpu_s(server), time.perf_counter()
            for _ in range(requests):
                client.post(url, content=body, headers=headers).raise_for_status()
            busy = _cpu_s(server) - busy_from - idle_rate * (time.perf_counter() - busy_at)
            figures[name] = round(1000 * busy / requests, 3)
    return figures


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def quantile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarise(samples: dict[str, list[float]]) -> dict[str, Any]:
    routes = {
        name: {
            "requests": len(values),
            "p50_ms": round(quantile_ms(values, 0.5), 3),
            "p99_ms": round(quantile_ms(values, 0.99), 3),
            "mean_ms": round(1000 * statistics.fmean(values), 3),
        }
        for name, values in samples.items()
    }
    direct = routes["direct"]
    added = {
        name: {
            "p50_ms": round(routes[name]["p50_ms"] - direct["p50_ms"], 3),
            "p99_ms": round(routes[name]["p99_ms"] - direct["p99_ms"], 3),
        }
        for name in ("deployment", "by_name")
    }
    by_name_over_deployment = round(routes["by_name"]["p50_ms"] - routes["deployment"]["p50_ms"], 3)
    return {
        "routes": routes,
        "added": added,
        "by_name_over_deployment_p50_ms": by_name_over_deployment,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="warm requests per route")
    parser.add_argument(
        "--no-cold", action="store_true", help="deploy and wait instead of timing a cold start"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cohabit-gateway-") as tmp:
        work = Path(tmp)
        path = write_tiny_model(work / f"{MODEL}.gguf")
        with (
            cohabit_serve(work) as (root, pid),
            httpx.Client(base_url=f"{root}/api", timeout=60, trust_env=False) as api,
        ):
            registered = api.post("/models/", json={"name": MODEL, "path": str(path)})
            if registered.status_code != 201:
                raise RuntimeError(f"registering the model failed: {registered.text}")
            model_id = registered.json()["id"]
            if args.no_cold:
                deployed = api.post(
                    "/serving/deploy_model", json={"m_id": model_id, "vram_allocation": 2 * GIB}
                )
                cold: dict[str, Any] = {"deployment_id": deployed.json()}
            else:
                cold = cold_start(root, api, work / "data", model_id)
            deployment_id = str(cold.pop("deployment_id"))
            wait_deployed(api, deployment_id)
            state = engine_state(work / "data", deployment_id)
            assert state is not None
            samples = warm(root, state["base_url"], deployment_id, args.requests)
            cpu = server_cpu_ms(pid, root, deployment_id, args.requests)
    figures = summarise(samples)
    figures |= {
        "server_cpu_ms_per_request": cpu,
        "cold_start": {key: round(value, 3) for key, value in cold.items()},
        "cold_start_from": "none" if args.no_cold else "a request to an unloaded deployment",
        "load_average": [round(value, 2) for value in (*load_before, *os.getloadavg())],
        "cpus": os.cpu_count(),
    }
    print_table(figures)
    print(json.dumps(figures))


def print_table(figures: dict[str, Any]) -> None:
    print(f"{'route':<12} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, route in figures["routes"].items():
        print(
            f"{name:<12} {route['requests']:>8} {route['p50_ms']:>8.3f} "
            f"{route['p99_ms']:>8.3f} {route['mean_ms']:>8.3f}"
        )
    for name, added in figures["added"].items():
        print(f"gateway ({name}) adds {added['p50_ms']:.3f} ms p50, {added['p99_ms']:.3f} ms p99")
    print(
        f"by name adds {figures['by_name_over_deployment_p50_ms']:.3f} ms p50 over per-deployment"
    )
    for name, cpu_ms in figures["server_cpu_ms_per_request"].items():
        print(f"server CPU per request ({name}): {cpu_ms:.3f} ms")
    cold = figures["cold_start"]
    if cold:
        print(
            f"cold start ({figures['cold_start_from']}): {cold['to_first_chunk_s']:.2f} s to the "
            f"first chunk = control plane {cold['control_plane_before_engine_s']:.2f} s before the "
            f"engine + engine start {cold['engine_start_s']:.2f} s + control plane "
            f"{cold['control_plane_after_engine_s']:.2f} s after it (engine ready → DEPLOYED "
            f"{cold['ready_to_deployed_s']:.2f} s, DEPLOYED → first chunk "
            f"{cold['deployed_to_first_chunk_s']:.2f} s)"
        )
    load = figures["load_average"]
    print(f"load average {load[0]:.2f} before, {load[3]:.2f} after, on {figures['cpus']} CPUs")


if __name__ == "__main__":
    main()
