"""The bridge's HTTP app: :func:`create_app` assembles the routers (``routes/``: probes, nodes,
jobs), the guard, the body limit and the exception handlers around one :class:`Services`.

Why FastAPI (over aiohttp): the request/response models in :mod:`gpuheal_bridge.api` are
pydantic v2 models shared with the operator's client; FastAPI validates requests against
exactly those models, serialises responses through them and publishes the OpenAPI document
(``/openapi.json``) that the schemathesis fuzz test and client authors use, with no second
schema to keep in sync. It runs on uvicorn, supports TLS there, and its TestClient makes
the HTTP layer unit-testable with a fake backend.

Order of checks for every request: plain HTTP from a peer that is not on loopback (403,
unless ``remote_plain_http``); then for ``/v1``: bearer token (401, nothing else runs), the
scope of the route (403, nothing else runs), name validation, mapping and allowed nodes
(422/404/403), the scopes the body asks for (403), idempotency replay, per-node/per-job
lock, Slurm.

Left running beside the requests: a slurmctld check every ``health_interval`` seconds (the
``gpuheal_bridge_slurmctld_up`` gauge does not wait for someone to call ``/readyz``), and,
with ``reload_tokens``, a SIGHUP handler that reads the tokens again and swaps them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path as FilePath

from fastapi import FastAPI
from starlette.routing import Route

from gpuheal_bridge.api.models import Owner
from gpuheal_bridge.backends.base import Backend
from gpuheal_bridge.exclusions import ExclusionLedger
from gpuheal_bridge.nodemap import NodeMapper
from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.audit import AuditLog, RefusalThrottle
from gpuheal_bridge.server.auth import Token, TokenAuth
from gpuheal_bridge.server.errors import add_exception_handlers, map_exception
from gpuheal_bridge.server.guard import MAX_BODY_BYTES, BodyLimit, Guard
from gpuheal_bridge.server.idempotency import IdempotencyStore
from gpuheal_bridge.server.metrics import Metrics, MetricsEndpoint
from gpuheal_bridge.server.routes import capabilities, jobs, nodes, probes
from gpuheal_bridge.server.services import Services

log = logging.getLogger("gpuheal_bridge")
ROUTERS = (probes.router, nodes.router, jobs.router, capabilities.router)


@dataclass
class BridgeSettings:
    backend: Backend
    # name -> token (a plain string: every scope but admin, as a line without scopes)
    tokens: Mapping[str, str | Token]
    state_dir: FilePath | None = None
    audit_log: FilePath | None = None
    node_mapper: NodeMapper = field(default_factory=NodeMapper)
    idempotency_ttl: float = 86400.0
    retry_after: float = 5.0
    operations: Operations | None = None
    # Plain HTTP from a peer not on loopback: refused (403) unless True (a proxy in front
    # terminates TLS). Requests that came over TLS are always served.
    remote_plain_http: bool = False
    # Seconds between slurmctld checks that refresh gpuheal_bridge_slurmctld_up (0: only
    # when /readyz is called).
    health_interval: float = 15.0
    # Reads the tokens again (SIGHUP); None: no reload.
    reload_tokens: Callable[[], Mapping[str, str | Token]] | None = None
    # Audit lines of refusals (401, 403 before a route runs): one per address and status
    # this often; the next says how many were left out.
    refusals: RefusalThrottle = field(default_factory=RefusalThrottle)


def services_for(settings: BridgeSettings) -> Services:
    db = None
    if settings.state_dir is not None:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        db = settings.state_dir / "idempotency.sqlite3"
    store = IdempotencyStore(db, ttl=settings.idempotency_ttl)
    store.purge()
    auth = TokenAuth(settings.tokens)
    metrics = Metrics()
    metrics.tokens.set(len(auth.names))
    ops = settings.operations or Operations(
        settings.backend, exclusions=ExclusionLedger.in_dir(settings.state_dir)
    )
    return Services(
        backend=settings.backend,
        ops=ops,
        mapper=settings.node_mapper,
        auth=auth,
        metrics=metrics,
        audit=AuditLog(settings.audit_log),
        store=store,
        retry_after=settings.retry_after,
        remote_plain_http=settings.remote_plain_http,
        refusals=settings.refusals,
    )


def _lifespan(
    services: Services, settings: BridgeSettings
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The slurmctld watcher and the SIGHUP token reload while the app runs; on its end the
    requeues still expediting in the background, the backend and the store closed."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        watcher = None
        if settings.health_interval > 0:
            watcher = asyncio.create_task(services.watch_slurmctld(settings.health_interval))
        sighup = False
        if (read := settings.reload_tokens) is not None:
            try:
                loop.add_signal_handler(signal.SIGHUP, services.reload_tokens, read)
                sighup = True
            except (RuntimeError, ValueError) as exc:  # not the main thread (a test client)
                log.warning("no token reload on SIGHUP here: %s", exc)
        try:
            yield
        finally:
            if sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await services.ops.settled(within=10.0)
            await services.backend.aclose()
            services.store.close()

    return lifespan


def create_app(settings: BridgeSettings) -> FastAPI:
    services = services_for(settings)
    app = FastAPI(
        title="gpuheal Slurm bridge",
        version="1",
        description="Drain/resume Slurm nodes and requeue their jobs for gpuheal. "
        "All /v1 endpoints need `Authorization: Bearer <token>`. Plain HTTP is served to "
        "loopback clients only (403 otherwise) unless the bridge runs with --insecure-http.",
        lifespan=_lifespan(services, settings),
    )
    app.state.services = services
    metrics = Route(
        "/metrics", MetricsEndpoint(services.metrics), methods=["GET"], name="metrics_endpoint"
    )
    app.router.routes.append(metrics)
    for router in ROUTERS:
        app.include_router(router)
    # Inside the guard (added before it): the route's own body reads go through it.
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    # The guard names each request by its route before routing: the app's own routes (the
    # OpenAPI document and its pages, /metrics) and the routers' (each holds its full path).
    own = [route for route in app.router.routes if isinstance(route, Route)]
    app.add_middleware(Guard, routes=[*own, *(r for router in ROUTERS for r in router.routes)])
    add_exception_handlers(app)
    return app


__all__ = ["MAX_BODY_BYTES", "BridgeSettings", "Owner", "create_app", "map_exception"]
