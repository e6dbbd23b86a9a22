"""`/metrics`, outside /api where scrapers look for it: the server's Prometheus text
(service/telemetry/metrics.py). Behind the API token like every route, or the metrics token
(service/access/guard.py); not in the OpenAPI document, which describes the API."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST

from cohabit.runtime.errors import fault_text
from cohabit.service.api.deps import Context
from cohabit.service.paths import METRICS_PATH
from cohabit.service.telemetry.metrics import log

router = APIRouter()


@router.get(METRICS_PATH, include_in_schema=False)
def metrics(context: Context) -> Response:
    """A sync route: the scrape reads the store, so it runs on the thread pool."""
    try:
        body = context.metrics.exposition()
    except Exception as err:  # the store unreachable: the scrape fails, the server does not
        log.exception("collecting metrics failed")
        return Response(
            f"collecting metrics failed: {fault_text(err)}\n",
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            media_type="text/plain",
        )
    return Response(body, media_type=CONTENT_TYPE_LATEST)
