"""``GET /metrics``: the ledger's metrics in Prometheus' text format (docs/design.md §16,
Metrics).

Behind the same token as everything else (Prometheus sends it as ``Authorization: Bearer``).
The collector reads the ledger, so it runs in a worker thread, not on the event loop; one
collector per app keeps its place in the change feed between scrapes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response


async def metrics(request: Request) -> Response:
    from anyio import to_thread
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from procledger.application.metrics import metrics_registry

    state = request.app.state
    collectors = getattr(state, "metrics", None)
    if collectors is None:  # set on the event loop: two first scrapes make one
        collectors = state.metrics = metrics_registry(state.registry)
    body = await to_thread.run_sync(generate_latest, collectors)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
