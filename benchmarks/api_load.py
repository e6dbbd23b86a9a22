"""API load: concurrent clients against a real `cohabit` server (its own process, loopback,
SQLite) that holds a long history of ended deployments and some live ones.

The history (10,000 STOPPED, FAILED and ERROR records of the last six days) is written
straight into the database before the server starts; the live deployments go through the
API (deploy_model → placed and reserved by the reconciler → DEPLOYED). Their engines are one
stub OpenAI server in a process of its own, so the gateway's figures are the gateway's: the
per-deployment route and the route by model name reach the same engine, and their difference
is what routing by name costs.

Each client sends a request, waits for the answer, pauses a random 0-2x `--think` seconds
and sends the next, for `--duration` seconds per phase: the deployments list (default page),
the hardware view, the web page's fleet map, then the two gateway routes mixed.

Besides the latencies, each route gets the server process's CPU time per request over its
phase (less what the idle server uses: the reconciler's passes), which depends far less on
what else runs on the machine than the latencies do; the load average is printed at the start
and at the end.

Run: .venv/bin/python benchmarks/api_load.py                      (~2 minutes)
     .venv/bin/python benchmarks/api_load.py --phases deployments,hardware
     .venv/bin/python benchmarks/api_load.py --records 300 --live 4 --clients 4 --duration 1
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))

from cohabit.hardware.model import Fleet
from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    EngineStatus,
    LaunchRequest,
)
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.store import ledger
from cohabit.store.database import Database, sqlite_url, utcnow
from cohabit.store.records import DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from fleetgen import random_fleet

HERE = Path(__file__)
FLEET_NODES, GPUS_PER_NODE = 8, 8
LIVE_BYTES = 6 * GIB
PHASES = ("deployments", "hardware", "fleet", "gateway")
IDLE_S = 2.0  # how long the server's CPU use is watched before the load starts
HISTORY_DAYS = 6.0  # inside the default retention (7 days): nothing is purged under load
ENDED = (  # status, error code, share of the history
    (DeploymentStatus.STOPPED, None, 0.7),
    (DeploymentStatus.FAILED, "OOM", 0.2),
    (DeploymentStatus.ERROR, "CONTAINER_EXITED", 0.1),
)
CHAT_ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()


def fleet() -> Fleet:
    return random_fleet(FLEET_NODES, GPUS_PER_NODE, seed=3)


# --- the engine stub and the server (child processes) -----------------------------------


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One keep-alive connection: every request gets the same small chat completion."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(CHAT_ANSWER), CHAT_ANSWER)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def run_engine() -> None:
    async def main() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", 0)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    asyncio.run(main())


class StubRuntime:
    """Every engine is the stub at `base_url`: started at once, always ready."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def start(self, request: LaunchRequest) -> EngineHandle:
        return EngineHandle(deployment_id=request.deployment_id, base_url=self.base_url)

    def status(self, handle: EngineHandle) -> EngineStatus:
        return EngineStatus(state=EngineState.READY)

    def stop(self, handle: EngineHandle) -> None:
        del handle

    def adopt(self, handle: EngineHandle) -> bool:
        return True

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        return []

    def engines(self) -> list[EngineHandle]:
        return []  # the stub engine is shared and never ends with a deployment

    def discard(self, deployment_id: str) -> None:
        del deployment_id


def run_server(data_dir: Path, engine_url: str) -> None:
    import uvicorn

    from cohabit.service.app import Backend, create_app
    from cohabit.service.settings import Settings

    settings = Settings(data_dir=data_dir, database_url=sqlite_url(data_dir))
    app = create_app(
        settings, Backend(runtime=StubRuntime(engine_url), fleet=fleet()), freeze_startup=True
    )  # as `cohabit serve` makes it
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and
    # Nagle against delayed ACKs holds every small keep-alive answer back ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, backlog=512, timeout_keep_alive=30
    )
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def child(*args: str) -> Iterator[tuple[int, int]]:
    """This script in another process (`engine` or `serve`); yields the port it listens on
    and the process id."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, str(HERE), *args], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"{args[0]} did not start: {line!r}")
        yield int(line.split()[1]), process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the history -------------------------------------------------------------------------


def prepare(data_dir: Path, *, models: int, records: int, seed: int) -> list[dict[str, str]]:
    """Migrate, store the fleet, register `models` tiny models and write `records` ended
    deployments of them; returns the models (id, name, config id)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(sqlite_url(data_dir))
    try:
        db.migrate()
        ledger.save_fleet(db, fleet())
        registered = []
        for index in range(models):
            path = write_tiny_model(data_dir / "models" / f"bench-{index:02d}.gguf", seed=index)
            model = register_model(db, Registration(name=f"bench-{index:02d}", path=str(path)))
            registered.append({"id": model.id, "name": model.name, "path": str(path)})
        _write_history(db, registered, records, random.Random(seed))
        return registered
    finally:
        db.dispose()


def _write_history(
    db: Database, models: list[dict[str, str]], count: int, rng: random.Random
) -> None:
    from cohabit.store.catalog import list_configs

    configs = {c.model_id: c.id for c in list_configs(db, default_only=True)}
    slots = ledger.current_state(db).slots
    now = utcnow()
    kinds = [kind for kind in ENDED for _ in range(round(kind[2] * 10))]
    for start in range(0, count, 1000):
        with db.write() as session:
            for _ in range(min(1000, count - start)):
                model = rng.choice(models)
                slot = rng.choice(slots)
                status, code, _share = rng.choice(kinds)
                requested = now - timedelta(days=rng.uniform(0.01, HISTORY_DAYS))
                ended = requested + timedelta(minutes=rng.uniform(0.5, 90))
                deployment_id = str(uuid.uuid4())
                port = rng.randint(30000, 60000)
                session.add(
                    DeploymentRow(
                        id=deployment_id,
                        model_id=model["id"],
                        config_id=configs[model["id"]],
                        file_id=None,
                        model_name=model["name"],
                        engine="llamacpp",
                        status=status.value,
                        request={
                            "m_id": model["id"],
                            "m_config_id": configs[model["id"]],
                            "vram_allocation": LIVE_BYTES,
                            "engine_name": "llamacpp",
                            "min_copies": 1,
                            "force_cpu": False,
                        },
                        model_path=model["path"],
                        requested_bytes=LIVE_BYTES,
                        tensor_parallel=1,
                        max_model_len=256,
                        estimate=None,
                        topology="standalone_cluster",
                        node_name=slot.node,
                        gpu_index=slot.gpu_index,
                        gpu_indices={"indices": [slot.gpu_index]},
                        partition=slot.partition_profile,
                        gpu_vendor=slot.vendor.value,
                        gpu_id=f"GPU-{slot.node}-{slot.gpu_index}",
                        hardware_class=slot.hardware_class.value,
                        sharing_class=slot.sharing_class,
                        allocated_bytes=LIVE_BYTES,
                        device_total_bytes=slot.total_bytes,
                        notices={"codes": []},
                        last_error_code=code,
                        last_error_message=None if code is None else f"engine failed: {code}",
                        last_error_at=None if code is None else ended,
                        engine_handle={
                            "deployment_id": deployment_id,
                            "pid": rng.randint(1000, 90000),
                            "port": port,
                            "base_url": f"http://127.0.0.1:{port}",
                            "log_path": f"/var/lib/cohabit/engines/{deployment_id}/engine.log",
                        },
                        requested_at=requested,
                        deployed_at=requested + timedelta(seconds=20) if code != "OOM" else None,
                        stopped_at=ended if code is None else None,
                        released_at=ended,
                    )
                )


# --- the load ---------------------------------------------------------------------------


async def phase(
    root: str,
    kinds: dict[str, Callable[[httpx.AsyncClient], Any]],
    *,
    clients: int,
    duration_s: float,
    think_s: float,
    seed: int,
) -> dict[str, list[float]]:
    """`clients` closed-loop clients for `duration_s`, each choosing one of `kinds` at random
    per request; the latencies (s) of each kind. A non-200 answer stops the benchmark."""
    times: dict[str, list[float]] = {name: [] for name in kinds}
    names = sorted(kinds)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=root, limits=limits, timeout=60, trust_env=False
    ) as client:

        async def one(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            await asyncio.sleep(rng.uniform(0, think_s * 2))  # do not start in lockstep
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                name = rng.choice(names)
                started = time.perf_counter()
                response = await kinds[name](client)
                elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    raise RuntimeError(f"{name}: {response.status_code} {response.text[:300]}")
                times[name].append(elapsed)
                await asyncio.sleep(rng.uniform(0, think_s * 2))

        await asyncio.gather(*(one(index) for index in range(clients)))
    return times


def deploy_live(root: str, models: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """Deploy `count` deployments through the API and wait until every one is DEPLOYED."""
    live = []
    with httpx.Client(base_url=f"{root}/api", timeout=60, trust_env=False) as client:
        deadline = time.monotonic() + 60
        while True:  # the port is bound before the app has started
            try:
                if client.get("/serving/health").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
        for index in range(count):
            model = models[index % len(models)]
            body = {"m_id": model["id"], "vram_allocation": LIVE_BYTES}
            response = client.post("/serving/deploy_model", json=body)
            response.raise_for_status()
            live.append({"id": response.json(), "name": model["name"]})
        deadline = time.monotonic() + 120
        waiting = {d["id"] for d in live}
        while waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} deployments never became DEPLOYED")
            for deployment_id in list(waiting):
                status = client.get(f"/serving/deployment/{deployment_id}/status").json()
                if status == "DEPLOYED":
                    waiting.discard(deployment_id)
                elif status not in ("REQUESTED", "DEPLOYING", "INITIALIZING"):
                    raise RuntimeError(f"deployment {deployment_id} ended {status}")
            time.sleep(0.2)
    return live


def milliseconds(samples: list[float], quantile: float) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def cpu_share(process: psutil.Process, seconds: float) -> float:
    """The share of one CPU `process` uses over `seconds` while no client asks anything."""
    before = cpu_seconds(process)
    time.sleep(seconds)
    return (cpu_seconds(process) - before) / seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cohabit-api-load-") as tmp:
        data_dir = Path(tmp) / "data"
        started = time.perf_counter()
        models = prepare(data_dir, models=args.models, records=args.records, seed=args.seed)
        prepared_s = time.perf_counter() - started
        with (
            child("engine") as (engine_port, _),
            child("serve", str(data_dir), f"http://127.0.0.1:{engine_port}") as (port, pid),
        ):
            root = f"http://127.0.0.1:{port}"
            live = deploy_live(root, models, args.live)
            server = psutil.Process(pid)
            idle_share = cpu_share(server, IDLE_S)
            rng = random.Random(args.seed)
            chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}

            def by_deployment(client: httpx.AsyncClient) -> Any:
                target = rng.choice(live)
                url = f"/runtime/models/{target['id']}/v1/chat/completions"
                return client.post(url, json={"model": target["name"], **chat})

            def by_name(client: httpx.AsyncClient) -> Any:
                return client.post(
                    "/v1/chat/completions", json={"model": rng.choice(live)["name"], **chat}
                )

            phases: dict[str, dict[str, Callable[[httpx.AsyncClient], Any]]] = {
                "deployments": {
                    "GET /api/serving/deployments": lambda c: c.get("/api/serving/deployments")
                },
                "hardware": {"GET /api/cluster/hardware": lambda c: c.get("/api/cluster/hardware")},
                "fleet": {"GET /ui/fleet": lambda c: c.get("/ui/fleet")},
                "gateway": {
                    "POST /runtime/models/{id}/v1/chat/completions": by_deployment,
                    "POST /v1/chat/completions (by name)": by_name,
                },
            }
            results: dict[str, list[float]] = {}
            cpu_ms: dict[str, float] = {}  # the server's CPU time per request, by route
            for index, (phase_name, kinds) in enumerate(phases.items()):
                if phase_name not in args.phases:
                    continue
                cpu_before, started_at = cpu_seconds(server), time.monotonic()
                times = asyncio.run(
                    phase(
                        root,
                        kinds,
                        clients=args.clients,
                        duration_s=args.duration,
                        think_s=args.think,
                        seed=args.seed + index,
                    )
                )
                busy = cpu_seconds(server) - cpu_before
                busy -= idle_share * (time.monotonic() - started_at)  # the reconciler's own
                count = sum(len(samples) for samples in times.values())
                cpu_ms |= {name: 1000 * busy / count for name in times}
                results |= times
            with httpx.Client(base_url=f"{root}/api", trust_env=False) as client:
                page = client.get("/serving/deployments").json()
    return {
        "records": args.records,
        "live": args.live,
        "clients": args.clients,
        "think_s": args.think,
        "duration_s": args.duration,
        "prepare_s": round(prepared_s, 1),
        "default_page": len(page),
        "cpus": os.cpu_count(),
        "load_average_start": load_at_start,
        "load_average": os.getloadavg()[0],
        "server_idle_cpu_percent": round(100 * idle_share, 1),
        "routes": {
            name: {
                "requests": len(samples),
                "server_cpu_ms": round(cpu_ms[name], 2),
                "p50_ms": round(milliseconds(samples, 0.50), 2),
                "p99_ms": round(milliseconds(samples, 0.99), 2),
                "mean_ms": round(1000 * statistics.fmean(samples), 2),
            }
            for name, samples in results.items()
        },
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"{result['records']:,} ended + {result['live']} live deployments, "
        f"{result['clients']} clients (pause 0-{2 * result['think_s']:g} s), "
        f"{result['duration_s']:g} s per phase; default page: {result['default_page']} items; "
        f"load average {result['load_average_start']:.2f} at the start, "
        f"{result['load_average']:.2f} at the end, on {result['cpus']} CPUs; "
        f"the idle server used {result['server_idle_cpu_percent']:g}% of a CPU"
    )
    print(f"{'route':<50} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'server CPU ms':>14}")
    for name, figures in result["routes"].items():
        print(
            f"{name:<50} {figures['requests']:>8} {figures['p50_ms']:>8} {figures['p99_ms']:>8}"
            f" {figures['server_cpu_ms']:>14}"
        )
    routes = result["routes"]
    by_id = routes.get("POST /runtime/models/{id}/v1/chat/completions")
    by_name = routes.get("POST /v1/chat/completions (by name)")
    if by_id and by_name:
        print(
            f"by name adds {by_name['p50_ms'] - by_id['p50_ms']:+.2f} ms at p50, "
            f"{by_name['p99_ms'] - by_id['p99_ms']:+.2f} ms at p99"
        )
    print(json.dumps(result))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "engine":
        run_engine()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        run_server(Path(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000, help="ended deployments")
    parser.add_argument("--live", type=int, default=50, help="DEPLOYED deployments")
    parser.add_argument("--models", type=int, default=25, help="distinct served models")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--think", type=float, default=1.0, help="mean pause (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--phases",
        type=lambda value: value.split(","),
        default=PHASES,
        help=f"which phases to run, comma-separated (default: {','.join(PHASES)})",
    )
    args = parser.parse_args()
    if unknown := set(args.phases) - set(PHASES):
        parser.error(
            f"--phases: no phase {', '.join(sorted(unknown))} (phases: {', '.join(PHASES)})"
        )
    report(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
