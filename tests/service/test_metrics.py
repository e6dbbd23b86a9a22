"""`/metrics` over real HTTP, parsed with prometheus_client's own parser: the ledger's
reservations, the deployments' budgets and statuses, the reconciler's counts (placements,
NoFits by reason, engine starts and failures by code, pass durations) and the gateway's
traffic counters; the metrics token opens /metrics and nothing else.

Engines are the scripted double (tests/service/scripted_runtime.py). The gateway's traffic
is fed to the server's `Activity` directly: the gateway's proxy does not call
`begin`/`finish` on this code line yet, and what /metrics owes is to export what that
object holds. The meter (live memory) is a stand-in with figures in the shape the collector
reads (`metrics.MeterReadings`), for the same reason."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.exc import OperationalError

from cohabit.hardware.slots import SlotKey
from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.service.app import Backend, create_app
from cohabit.service.context import ServiceContext
from cohabit.service.telemetry.activity import Activity
from cohabit.service.telemetry.metrics import StateCollector, metered
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.server import (
    T4_FLEET,
    deploy,
    register_tiny_gguf,
    serving_app,
    settings_for,
    wait_status,
)

TOKEN = "api-s3cret"
SCRAPE_TOKEN = "scrape-s3cret"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def scrape(metrics_url: str, token: str = SCRAPE_TOKEN) -> Samples:
    response = httpx.get(metrics_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return parse(response.text)


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> FastAPI:
    settings = settings_for(tmp_path, database_url, token=TOKEN, metrics_token=SCRAPE_TOKEN)
    runtime = ScriptedRuntime(scripts={"crashy": Script(fail_code=RuntimeErrorCode.OOM)})
    return create_app(settings, Backend(runtime=runtime, fleet=T4_FLEET))


@pytest.fixture
def served(app: FastAPI) -> Iterator[tuple[httpx.Client, str]]:
    """An admin client on the API root, and the /metrics URL."""
    with (
        serving_app(app) as api,
        httpx.Client(
            base_url=api, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as client,
    ):
        yield client, api.removesuffix("/api") + "/metrics"


def test_metrics_show_budgets_traffic_and_what_the_reconciler_did(
    app: FastAPI, served: tuple[httpx.Client, str], tmp_path: Path
) -> None:
    client, metrics_url = served
    tiny = register_tiny_gguf(client, tmp_path)
    crashy = register_tiny_gguf(client, tmp_path, name="crashy")
    first = deploy(client, tiny["id"], vram_allocation=10 * GIB).json()
    record = wait_status(client, first)
    assert record["status"] == "DEPLOYED"
    second = wait_status(client, deploy(client, tiny["id"], vram_allocation=10 * GIB).json())
    assert (second["status"], second["last_error_code"]) == ("FAILED", "NoFitError")
    failed = wait_status(client, deploy(client, crashy["id"], vram_allocation=GIB).json())
    assert (failed["status"], failed["last_error_code"]) == ("FAILED", "OOM")

    context: ServiceContext = app.state.context
    context.activity.begin(first)
    context.activity.finish(first, seconds=0.03, ok=True, completion_tokens=7)
    context.activity.begin(first)
    context.activity.finish(first, seconds=2.0, ok=False)

    samples = scrape(metrics_url)
    device = {"node": "node-a", "gpu": "0", "partition": "", "kind": "gpu"}
    ours = {"id": first, "model": "tiny"}
    assert value(samples, "cohabit_device_capacity_bytes", **device) == 16 * GIB
    assert value(samples, "cohabit_device_reserved_bytes", **device) == record["allocated_bytes"]
    assert value(samples, "cohabit_deployment_budget_bytes", **ours) == record["allocated_bytes"]
    assert value(samples, "cohabit_deployment_status", **ours, status="DEPLOYED") == 1
    assert value(samples, "cohabit_deployment_status", **ours, status="INITIALIZING") == 0
    assert value(samples, "cohabit_deployment_copies", **ours) == 1
    # Ended deployments are not exported: the series stay as many as the live ones.
    assert {dict(labels).get("id") for _name, labels in samples} - {None} == {first}

    assert value(samples, "cohabit_gateway_requests_total", **ours) == 2
    assert value(samples, "cohabit_gateway_request_errors_total", **ours) == 1
    assert value(samples, "cohabit_gateway_completion_tokens_total", **ours) == 7
    latency = "cohabit_gateway_request_duration_seconds"
    assert value(samples, f"{latency}_bucket", **ours, le="0.025") == 0
    assert value(samples, f"{latency}_bucket", **ours, le="0.05") == 1
    assert value(samples, f"{latency}_bucket", **ours, le="2.5") == 2
    assert value(samples, f"{latency}_bucket", **ours, le="+Inf") == 2
    assert value(samples, f"{latency}_count", **ours) == 2
    assert value(samples, f"{latency}_sum", **ours) == pytest.approx(2.03)

    assert value(samples, "cohabit_placement_decisions_total", outcome="placed") == 2
    assert value(samples, "cohabit_placement_decisions_total", outcome="no_fit") == 1
    no_fits = "cohabit_placement_no_fits_total"
    assert value(samples, no_fits, reason="insufficient_capacity") == 1
    assert value(samples, no_fits, reason="vendor_mismatch") == 0
    assert value(samples, "cohabit_engine_starts_total") == 2
    assert value(samples, "cohabit_engine_failures_total", code="OOM") == 1
    assert value(samples, "cohabit_engine_failures_total", code="CUDA_ERROR") == 0
    assert value(samples, "cohabit_reconciler_pass_duration_seconds_count") > 0

    # The counters move with the traffic between two scrapes.
    context.activity.begin(first)
    context.activity.finish(first, seconds=0.2, ok=True, completion_tokens=5)
    later = scrape(metrics_url)
    assert value(later, "cohabit_gateway_requests_total", **ours) == 3
    assert value(later, "cohabit_gateway_completion_tokens_total", **ours) == 12


# (path, token presented, answer) on a server with both tokens.
TOKEN_CASES = [
    ("/metrics", None, 401),
    ("/metrics", "wrong", 401),
    ("/metrics", SCRAPE_TOKEN, 200),
    ("/metrics", TOKEN, 200),
    ("/api/models/", SCRAPE_TOKEN, 401),
    ("/api/serving/deployments", SCRAPE_TOKEN, 401),
    ("/api/models/", TOKEN, 200),
]


def test_the_metrics_token_opens_metrics_only(tmp_path: Path) -> None:
    """SQLite suffices: nothing here depends on the store's SQL."""
    settings = settings_for(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", token=TOKEN, metrics_token=SCRAPE_TOKEN
    )
    with serving_app(
        create_app(settings, Backend(runtime=ScriptedRuntime(), fleet=T4_FLEET))
    ) as api:
        root = api.removesuffix("/api")
        answers = [
            httpx.get(
                root + path,
                headers={} if token is None else {"Authorization": f"Bearer {token}"},
                timeout=30,
            ).status_code
            for path, token, _status in TOKEN_CASES
        ]
    assert answers == [status for _path, _token, status in TOKEN_CASES]


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    key: SlotKey
    used_bytes: int
    foreign_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    used_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    devices: tuple[Device, ...] = ()
    deployments: Mapping[str, Engine] = field(default_factory=dict)


class RecordedMeter:
    """A meter's last sample in the shape the collector reads (`metrics.MeterReadings`): one
    card with 9 GiB in use, 3 GiB of it held by a process cohabit did not start; one engine
    measured at 6 GiB, another the driver could not measure."""

    def latest(self) -> Sample:
        card = Device(key=("node-a", 0, None), used_bytes=9 * GIB, foreign_bytes=3 * GIB)
        return Sample(
            devices=(card,),
            deployments={"d-1": Engine(used_bytes=6 * GIB), "d-2": Engine(used_bytes=None)},
        )


def test_used_and_foreign_bytes_come_from_the_meter_when_there_is_one(db: Database) -> None:
    registry = CollectorRegistry()
    registry.register(StateCollector(db, Activity(), meter=RecordedMeter()))
    samples = parse(generate_latest(registry).decode())
    device = {"node": "node-a", "gpu": "0", "partition": "", "kind": "gpu"}
    assert value(samples, "cohabit_device_used_bytes", **device) == 9 * GIB
    assert value(samples, "cohabit_device_foreign_bytes", **device) == 3 * GIB
    assert value(samples, "cohabit_device_reserved_bytes", **device) == 0
    # Engines the driver could not measure are left out rather than shown as 0.
    assert metered(RecordedMeter()).deployments == {"d-1": 6 * GIB}

    without = CollectorRegistry()
    without.register(StateCollector(db, Activity()))
    names = {name for name, _labels in parse(generate_latest(without).decode())}
    assert "cohabit_device_capacity_bytes" in names
    assert not names & {"cohabit_device_used_bytes", "cohabit_device_foreign_bytes"}


class UnreachableStore:
    """A collector that fails as a store read does when the database is gone."""

    def collect(self) -> Iterator[Any]:
        raise OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


def test_a_scrape_that_cannot_read_the_store_is_a_503(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    app = create_app(settings, Backend(runtime=ScriptedRuntime(), fleet=T4_FLEET))
    with serving_app(app) as api:
        app.state.context.metrics.watch(UnreachableStore())
        response = httpx.get(api.removesuffix("/api") + "/metrics", timeout=30)
    assert response.status_code == 503
    assert response.text.startswith("collecting metrics failed: OperationalError: ")
    assert response.text.count("\n") == 1
