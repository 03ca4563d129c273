"""Prometheus metrics of the bridge (own registry per app, so tests can build many apps).

``/metrics`` is prometheus-client's own ASGI app over that registry (content negotiation,
OpenMetrics, gzip), with the process, platform and GC collectors registered next to ours.
"""

from __future__ import annotations

import functools

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_asgi_app,
)
from starlette.types import Receive, Scope, Send

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(Histogram, registry=self.registry, buckets=BUCKETS)
        self.requests = counter(
            "gpuheal_bridge_requests_total",
            "HTTP requests by operation and result.",
            ["operation", "result"],
        )
        self.duration = histogram(
            "gpuheal_bridge_request_duration_seconds",
            "HTTP request latency by operation.",
            ["operation"],
        )
        self.jobs = counter(
            "gpuheal_bridge_jobs_total", "Jobs handled by requeue calls, by outcome.", ["outcome"]
        )
        self.requeue_to_running = histogram(
            "gpuheal_bridge_requeue_to_running_seconds",
            "Requeue call until the job runs again (when the caller waited for it).",
        )
        self.slurmctld_up = gauge(
            "gpuheal_bridge_slurmctld_up",
            "1 when the last slurmctld check (every --health-interval, and /readyz) reached it.",
        )
        self.slurmctld_checked = gauge(
            "gpuheal_bridge_slurmctld_check_timestamp_seconds",
            "When slurmctld was last checked (Unix time).",
        )
        self.token_reloads = counter(
            "gpuheal_bridge_token_reloads_total",
            "Token reloads on SIGHUP, by result (error: the previous tokens stay).",
            ["result"],
        )
        self.tokens = gauge("gpuheal_bridge_tokens", "Bearer tokens accepted now.")


class MetricsEndpoint:
    """prometheus-client's ASGI app, served by a Starlette ``Route`` at exactly ``/metrics``.

    ``app.mount("/metrics", make_asgi_app())`` answers ``GET /metrics`` with a 307 to
    ``/metrics/`` (prometheus/client_python#1016). A Route whose endpoint is not a plain
    function is served as an ASGI app as it is, so this class only makes it one.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._app = make_asgi_app(registry=metrics.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def result_label(status: int, replayed: bool) -> str:
    if replayed:
        return "replayed"
    return {
        401: "unauthorized",
        403: "forbidden",  # a scope or the allowlist (the guard counts insecure itself)
        404: "not_found",
        409: "conflict",
        422: "invalid",
        501: "unsupported",
        503: "unavailable",
    }.get(status, "success" if status < 400 else ("client_error" if status < 500 else "error"))
