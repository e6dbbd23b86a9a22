"""The Grafana dashboard (deploy/grafana/cohabit.json) against a real scrape of a server
that has placed a deployment: every metric a panel's query names is one the server exports,
and every family the server exports has a panel. Engines are the scripted double; the meter's
families come without samples when the server has none, and count as exported (their HELP
and TYPE lines are in the scrape)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cohabit.service.app import Backend, create_app
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    T4_FLEET,
    deploy,
    register_tiny_gguf,
    serving_app,
    settings_for,
    wait_status,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cohabit.json"
METRIC = re.compile(r"\bcohabit_[a-z_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(text: str) -> dict[str, set[str]]:
    """Family name → the series names it may show, from the scrape's TYPE lines."""
    return {
        family.name: {family.name + suffix for suffix in SUFFIXES[family.type]}
        for family in text_string_to_metric_families(text)
        if family.name.startswith("cohabit_")
    }


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    found += [var["definition"] for var in dashboard["templating"]["list"] if "definition" in var]
    return found


def test_the_dashboard_names_what_the_server_exports(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for expr in queries(dashboard):
        assert expr.count("(") == expr.count(")"), expr

    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    app = create_app(settings, Backend(runtime=ScriptedRuntime(), fleet=T4_FLEET))
    with serving_app(app) as api, httpx.Client(base_url=api, timeout=30) as client:
        model = register_tiny_gguf(client, tmp_path)
        deployment = deploy(client, model["id"], vram_allocation=GIB).json()
        assert wait_status(client, deployment)["status"] == "DEPLOYED"
        scrape = httpx.get(api.removesuffix("/api") + "/metrics", timeout=30)
    assert scrape.status_code == 200
    families = exported(scrape.text)
    series = set().union(*families.values())
    named = {name for expr in queries(dashboard) for name in METRIC.findall(expr)}
    assert named - series == set()
    shown = {family for family, names in families.items() if names & named}
    assert set(families) - shown == set()
