"""Cold starts: request → first token for a model whose engine is not running, through
cohabit's `/v1` and through a bare engine start, round by round in one run; and swaps, two
models alternating on a budget that holds one.

The engine is llama-cpp-python's server on the CPU with the tiny GGUF of
`cohabit.runtime.tinymodel`, the same command line for every side. llama-swap, the peer that
does this job, is not served by the Go module proxy this machine may use
(`go list -m -versions github.com/mostlygeek/llama-swap`: 403), so it cannot be built here;
the baseline is what llama-swap itself does on a request for a model that is not running:
start the engine's command, poll its health until it answers (every 5 ms here, tighter than
any proxy's), send the request. That is a bare engine start, with nothing in front of it.

Each round, in turn:
- bare: the engine process started; polled at `/v1/models` every 5 ms; a streamed chat
  request (`max_tokens: 1`) sent the moment it answers; stopped after its first chunk.
- cohabit (two servers, each `cohabit serve` in its own process on loopback with SQLite and
  a simulated 16 GiB card): a deployment scaled to zero (`min_copies: 0`, `keep_alive: 0`,
  so it unloads once idle) gets the same streamed request by name; the gateway holds it,
  the reconciler places and starts the engine, and the request goes on once it serves.
  One server starts engines from its pre-imported launcher, the other as fresh processes
  (`COHABIT_PREIMPORT_ENGINES=0`). The time splits at the engine process's creation (its
  engine.json) and at the engine's first answer (polled directly every 5 ms): control plane
  before the engine, the engine's own load, and after it. The control-plane share is the
  time that is not the engine's: before + after − the bare engine's own answer → first
  chunk of the same round. The client each request goes through is made before the clock
  starts, on every side. Each cohabit load's phases as its timeline recorded them (the
  `healthy` event's `load_phases_s`: placing, starting, engine_import, weights_load,
  engine_warmup, engine_load) are printed per side, launcher against fresh processes.
- swaps: two deployments that never unload by themselves (`keep_alive: -1`), 10 GiB each on
  the 16 GiB card, requested in turn: each request unloads the other (preemption of an idle
  copy) and loads its own; against the bare engine, stopping the running process, then
  starting the other.

Run: .venv/bin/python benchmarks/cold_start.py               (~2 minutes)
     .venv/bin/python benchmarks/cold_start.py --rounds 20
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from cohabit.runtime.engines import llamacpp
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.control.loadphases import LOAD_PHASES
from cohabit.units import GIB
from gateway import CHAT, ENDED, cohabit_serve, engine_state, free_port

POLL_S = 0.005
TIMEOUT_S = 180.0


def sender() -> httpx.Client:
    """The client a timed request goes through, made before the clock starts on every side:
    making one takes about 20 ms here (mostly its TLS context), which is neither side's."""
    return httpx.Client(timeout=TIMEOUT_S, trust_env=False)


def first_chunk(client: httpx.Client, url: str, model: str) -> float:
    """Send the streamed chat request; when its first chunk arrived (time.time())."""
    body = {**CHAT, "model": model, "stream": True, "max_tokens": 1}
    with client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
        if answer.status_code != 200:
            answer.read()
            raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:300]}")
        for _ in answer.iter_raw():
            return time.time()
    raise RuntimeError(f"{url}: no chunk")


def poll_answering(base_url: str, name: str, alive: Callable[[], bool] = lambda: True) -> float:
    """When the engine serving `name` first answers /v1/models (llama-cpp-python's server
    has no /health); raises when `alive` says its process ended first (its port was taken)."""
    deadline = time.monotonic() + TIMEOUT_S
    with httpx.Client(timeout=2, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                answer = client.get(f"{base_url}/v1/models")
                if answer.status_code == 200 and name in answer.text:
                    return time.time()
            except httpx.TransportError:
                pass
            if not alive():
                raise EngineGone(f"the engine for {base_url} exited before answering")
            time.sleep(POLL_S)
    raise RuntimeError(f"{base_url} never answered")


class EngineGone(RuntimeError):
    """A bare engine's process ended before it answered."""


# --- the bare engine -------------------------------------------------------------------


class BareEngine:
    """The engine's command as cohabit's launcher writes it (CPU, the sized context), run
    directly: what a process-swapping proxy starts."""

    def __init__(self, model: Path, name: str, work: Path) -> None:
        self.model, self.name, self.work = model, name, work
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        port = free_port()
        argv = [sys.executable, "-m", llamacpp.PYTHON_MODULE, f"--model={self.model}"]
        argv += [f"--model_alias={self.name}", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--n_ctx", "256", "--n_gpu_layers", "0"]
        log = (self.work / f"bare-{self.name}.log").open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        return f"http://127.0.0.1:{port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def bare_cold(engine: BareEngine) -> dict[str, float]:
    for _attempt in range(3):  # a free port another process took before the engine bound it
        client = sender()
        t0 = time.time()
        url = engine.start()
        try:
            answering = poll_answering(url, engine.name, engine.running)
            chunk = first_chunk(client, url, engine.name)
        except EngineGone:
            continue
        finally:
            engine.stop()
        return {
            "total": chunk - t0,
            "engine_load": answering - t0,
            "after_engine": chunk - answering,
        }
    raise RuntimeError(f"the bare engine for {engine.name} never started")


# --- cohabit ---------------------------------------------------------------------------


class Server:
    """One `cohabit serve` with its API client and data dir."""

    def __init__(self, root: str, data_dir: Path) -> None:
        self.root, self.data_dir = root, data_dir
        self.api = httpx.Client(base_url=f"{root}/api", timeout=60, trust_env=False)

    def register(self, name: str, path: Path) -> str:
        answer = self.api.post("/models/", json={"name": name, "path": str(path)})
        if answer.status_code != 201:
            raise RuntimeError(f"registering {name} failed: {answer.text}")
        return str(answer.json()["id"])

    def deploy(self, model_id: str, name: str, *, keep_alive: int) -> str:
        """Deploy the model (served under its registered `name`) scaled to zero."""
        body = {
            "m_id": model_id,
            "vram_allocation": 10 * GIB,
            "min_copies": 0,
            "starting_copies": 0,
            "keep_alive": keep_alive,
        }
        answer = self.api.post("/serving/deploy_model", json=body)
        if answer.status_code != 202:
            raise RuntimeError(f"deploy of {name} refused: {answer.text}")
        return str(answer.json())

    def status(self, deployment_id: str) -> str:
        return str(self.api.get(f"/serving/deployment/{deployment_id}").json()["status"])

    def wait_status(self, deployment_id: str, wanted: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while (status := self.status(deployment_id)) != wanted:
            if status in ENDED or time.monotonic() > deadline:
                raise RuntimeError(f"{deployment_id} is {status}, waiting for {wanted}")
            time.sleep(0.05)

    def events_after(self, deployment_id: str, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """The deployment's timeline after `cursor` (every page), and the new cursor."""
        found: list[dict[str, Any]] = []
        while True:
            page = self.api.get(
                f"/serving/deployment/{deployment_id}/events", params={"after": cursor}
            ).json()
            if not page["events"]:
                return found, cursor
            found += page["events"]
            cursor = page["cursor"]

    def load_phases(self, deployment_id: str, cursor: int) -> dict[str, float]:
        """The phases of the load after `cursor`, as its `healthy` event recorded them (the
        event follows DEPLOYED by a moment: waited for)."""
        deadline = time.monotonic() + TIMEOUT_S
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            more, cursor = self.events_after(deployment_id, cursor)
            seen += more
            for event in seen:
                if event["kind"] == "healthy":
                    return dict((event.get("data") or {}).get("load_phases_s") or {})
            time.sleep(POLL_S)
        raise RuntimeError(f"no healthy event for the load of {deployment_id}")

    def launched_after(
        self, deployment_id: str, previous_pid: int | None, failed: list[BaseException]
    ) -> dict[str, Any]:
        """The engine state of a launch newer than `previous_pid`, once written (raises when
        the request failed meanwhile)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if failed:
                raise RuntimeError(f"the cold request failed: {failed[0]}")
            state = engine_state(self.data_dir, deployment_id)
            if state is not None and state["pid"] != previous_pid:
                return state
            time.sleep(POLL_S)
        raise RuntimeError(f"no engine started for {deployment_id}")


def cohabit_cold(server: Server, deployment_id: str, name: str) -> dict[str, float]:
    """A request for an unloaded deployment, split at the engine's start and first answer."""
    server.wait_status(deployment_id, "UNLOADED")
    before = engine_state(server.data_dir, deployment_id)
    previous = before["pid"] if before else None
    if previous is not None:  # the bare side, too, starts once its last engine has exited
        wait_gone(previous)
    chunk: list[float] = []
    failed: list[BaseException] = []
    _events, cursor = server.events_after(deployment_id, 0)
    client = sender()

    def send() -> None:
        try:
            chunk.append(first_chunk(client, server.root, name))
        except BaseException as err:  # reported by the caller
            failed.append(err)

    t0 = time.time()
    thread = threading.Thread(target=send)
    thread.start()
    state = server.launched_after(deployment_id, previous, failed)
    launched = Path(server.data_dir / "engines" / deployment_id / "engine.json").stat().st_mtime
    answering = poll_answering(state["base_url"], name)
    thread.join(TIMEOUT_S)
    if failed or not chunk:
        raise RuntimeError(f"the cold request failed: {failed}")
    timeline = server.load_phases(deployment_id, cursor)
    return {
        "total": chunk[0] - t0,
        "before_engine": launched - t0,
        "engine_load": answering - launched,
        "after_engine": chunk[0] - answering,
        **{f"{PHASE}{name}": seconds for name, seconds in timeline.items()},
    }


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while _running(pid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"engine {pid} still runs after its unload")
        time.sleep(POLL_S)


PHASE = "phase:"  # a timeline phase's key in a round's figures


# --- the run ---------------------------------------------------------------------------


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
    }


@contextmanager
def serving(work: Path, *, preimport: bool) -> Iterator[Server]:
    env = {"COHABIT_PREIMPORT_ENGINES": "1" if preimport else "0"}
    with cohabit_serve(work, env=env) as (root, _pid):
        server = Server(root, work / "data")
        try:
            yield server
        finally:
            server.api.close()


def timed_rounds(rounds: int, steps: dict[str, Callable[[], dict[str, float]]]) -> dict[str, Any]:
    """Every step once per round, the order rotating each round."""
    names = list(steps)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for index in range(rounds):
        turn = names[index % len(names) :] + names[: index % len(names)]
        for name in turn:
            results[name].append(steps[name]())
        print(f"round {index + 1}/{rounds}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="cold starts of each kind")
    parser.add_argument("--swaps", type=int, default=10, help="alternating requests of each")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cohabit-cold-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        models = {n: write_tiny_model(work / f"{n}.gguf", seed=i) for i, n in enumerate("ab")}
        (work / "warm").mkdir()
        (work / "fresh").mkdir()
        warm = stack.enter_context(serving(work / "warm", preimport=True))
        fresh = stack.enter_context(serving(work / "fresh", preimport=False))
        cold_ids = {}
        for label, server in (("warm", warm), ("fresh", fresh)):
            model_id = server.register("cold", models["a"])
            cold_ids[label] = server.deploy(model_id, "cold", keep_alive=0)
        bare = BareEngine(models["a"], "cold", work)
        # One untimed start of each, so every side's files are in the page cache.
        bare_cold(bare)
        cohabit_cold(warm, cold_ids["warm"], "cold")
        cohabit_cold(fresh, cold_ids["fresh"], "cold")
        cold = timed_rounds(
            args.rounds,
            {
                "bare": lambda: bare_cold(bare),
                "cohabit": lambda: cohabit_cold(warm, cold_ids["warm"], "cold"),
                "cohabit_fresh": lambda: cohabit_cold(fresh, cold_ids["fresh"], "cold"),
            },
        )
        swap_ids = {
            n: warm.deploy(warm.register(f"swap-{n}", p), f"swap-{n}", keep_alive=-1)
            for n, p in models.items()
        }
        swaps: dict[str, list[float]] = {"bare": [], "cohabit": []}
        running: BareEngine | None = None
        for index in range(args.swaps * 2):
            name = "ab"[index % 2]
            client = sender()
            t0 = time.time()
            chunk = first_chunk(client, warm.root, f"swap-{name}")
            if index > 0:  # the first request found the card empty
                swaps["cohabit"].append(chunk - t0)
            client = sender()
            t0 = time.time()
            if running is not None:
                running.stop()
            running = BareEngine(models[name], f"swap-{name}", work)
            url = running.start()
            poll_answering(url, f"swap-{name}", running.running)
            chunk = first_chunk(client, url, f"swap-{name}")
            if index > 0:
                swaps["bare"].append(chunk - t0)
        if running is not None:
            running.stop()
        swap_states = {n: warm.status(i) for n, i in swap_ids.items()}
    figures = report(cold, swaps)
    figures |= {
        "swap_states_at_end": swap_states,
        "load_average": [round(value, 2) for value in (*load_before, *os.getloadavg())],
        "cpus": os.cpu_count(),
    }
    print_table(figures)
    print(json.dumps(figures))


def report(
    cold: dict[str, list[dict[str, float]]], swaps: dict[str, list[float]]
) -> dict[str, Any]:
    bare_after = [r["after_engine"] for r in cold["bare"]]
    out: dict[str, Any] = {"cold": {}, "swap": {k: summary(v) for k, v in swaps.items()}}
    for side, rows in cold.items():
        keys = dict.fromkeys(key for row in rows for key in row)  # a phase its log lacked
        phases = {key: summary([row[key] for row in rows if key in row]) for key in keys}
        if "before_engine" in rows[0]:
            share = [
                row["before_engine"] + row["after_engine"] - engine_after
                for row, engine_after in zip(rows, bare_after, strict=True)
            ]
            phases["control_plane"] = summary(share)
        out["cold"][side] = phases
    bare_p50 = out["cold"]["bare"]["total"]["p50"]
    out["ratio_to_bare"] = {
        side: round(out["cold"][side]["total"]["p50"] / bare_p50, 3) for side in cold
    }
    out["swap_ratio"] = round(out["swap"]["cohabit"]["p50"] / out["swap"]["bare"]["p50"], 3)
    return out


def print_table(figures: dict[str, Any]) -> None:
    cold = figures["cold"]
    print("request → first token for an unloaded model, seconds (p50 / min / max)")
    heads = ("total", "before engine", "engine load", "after engine")
    print(f"{'':<28}" + "".join(f"{head:>24}" for head in heads))
    for side, label in (
        ("bare", "bare engine start"),
        ("cohabit", "cohabit /v1, launcher"),
        ("cohabit_fresh", "cohabit /v1, no launcher"),
    ):
        row = cold[side]
        cells = []
        for key in ("total", "before_engine", "engine_load", "after_engine"):
            s = row.get(key)
            cells.append(f"{s['p50']:.3f} / {s['min']:.3f} / {s['max']:.3f}" if s else "—")
        print(f"{label:<28}" + "".join(f"{c:>24}" for c in cells))
    print("the same loads as their timelines recorded them, per phase, seconds (p50)")
    print(f"{'phase':<16}{'launcher':>12}{'no launcher':>14}{'saved':>10}")
    for name in LOAD_PHASES:
        key = f"{PHASE}{name}"
        warm, fresh = cold["cohabit"].get(key), cold["cohabit_fresh"].get(key)
        if warm is None and fresh is None:
            continue
        cells = [f"{x['p50']:.3f}" if x else "—" for x in (warm, fresh)]
        saved = f"{fresh['p50'] - warm['p50']:+.3f}" if warm and fresh else ""
        print(f"{name:<16}{cells[0]:>12}{cells[1]:>14}{saved:>10}")
    for side in ("cohabit", "cohabit_fresh"):
        share = cold[side]["control_plane"]
        print(
            f"{side}: {figures['ratio_to_bare'][side]:.2f}× the bare start at p50; "
            f"control-plane share p50 {share['p50'] * 1000:.0f} ms"
        )
    swap = figures["swap"]
    print(
        f"swap (two models alternating on a budget that holds one), p50: cohabit "
        f"{swap['cohabit']['p50']:.3f} s, bare {swap['bare']['p50']:.3f} s "
        f"({figures['swap_ratio']:.2f}×)"
    )
    print(f"load average {figures['load_average']} on {figures['cpus']} CPUs")


if __name__ == "__main__":
    main()
