"""The server's public URL layout, in one place: the rooms that serve a path and the guard
that decides who may call it read these names, so neither repeats the other's strings."""

from __future__ import annotations

API_PREFIX = "/api"  # the REST API (service/api/)
HEALTH_PATH = "/api/serving/health"  # open: load balancers and `cohabit ps` ask it first
METRICS_PATH = "/metrics"  # Prometheus (service/api/metrics.py)
OPENAI_PREFIX = "/v1"  # the gateway by the body's model name (service/gateway/proxy.py)
RUNTIME_PREFIX = "/runtime/models"  # the gateway by deployment id: {RUNTIME_PREFIX}/{id}/v1/…
GATEWAY_PREFIXES = (f"{OPENAI_PREFIX}/", f"{RUNTIME_PREFIX}/")  # every path the gateway serves


def access_path(deployment_id: str) -> str:
    """Where a deployment's engine is served through the gateway (add `/v1/...`)."""
    return f"{RUNTIME_PREFIX}/{deployment_id}"
