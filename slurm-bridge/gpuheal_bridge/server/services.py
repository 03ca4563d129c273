"""What one bridge app serves with, built once by ``create_app`` and kept in ``app.state``.

Routes receive it through ``Depends`` (:data:`Svc`); the middleware and the exception
handlers, which FastAPI gives no dependencies, read it with :func:`services_of`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from gpuheal_bridge.backends.base import Backend, BackendError
from gpuheal_bridge.nodemap import NodeMapper
from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.audit import AuditLog, RefusalThrottle
from gpuheal_bridge.server.auth import Token, TokenAuth
from gpuheal_bridge.server.idempotency import IdempotencyStore
from gpuheal_bridge.server.metrics import Metrics

log = logging.getLogger("gpuheal_bridge")


@dataclass
class Services:
    backend: Backend
    ops: Operations
    mapper: NodeMapper
    auth: TokenAuth
    metrics: Metrics
    audit: AuditLog
    store: IdempotencyStore
    #: Retry-After of a 503, in seconds (a backend may ask for longer).
    retry_after: float
    #: Plain HTTP from a peer not on loopback is served (a proxy in front terminates TLS).
    remote_plain_http: bool
    #: Which refusals (401, 403 before a route runs) get an audit line.
    refusals: RefusalThrottle

    async def check_slurmctld(self) -> tuple[bool, str, str | None]:
        """Ping slurmctld and set the gauges: (up, detail, Slurm version)."""
        try:
            ping = await self.backend.ping()
            up, detail, version = ping.up, ping.detail, ping.version
        except BackendError as exc:
            up, detail, version = False, str(exc), None
        self.metrics.slurmctld_up.set(1 if up else 0)
        self.metrics.slurmctld_checked.set_to_current_time()
        return up, detail, version

    async def watch_slurmctld(self, every: float) -> None:
        while True:
            try:
                await self.check_slurmctld()
            except Exception:  # a bug here must not end the checks
                log.exception("slurmctld check failed")
            await asyncio.sleep(every)

    def reload_tokens(self, read: Callable[[], Mapping[str, str | Token]]) -> None:
        """Swap in the tokens ``read`` returns; on an error the previous ones stay."""
        try:
            self.auth.replace(read())
        except (OSError, ValueError) as exc:
            self.metrics.token_reloads.labels("error").inc()
            log.error("SIGHUP: tokens not reloaded, the previous ones stay: %s", exc)
            return
        self.metrics.token_reloads.labels("ok").inc()
        self.metrics.tokens.set(len(self.auth.names))
        log.warning("SIGHUP: tokens reloaded: %s", ", ".join(self.auth.names))


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


Svc = Annotated[Services, Depends(services_of)]
