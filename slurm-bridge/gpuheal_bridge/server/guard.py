"""What every request passes before its route: the transport and bearer-token checks (and the
request metrics) in :class:`Guard`, the body size limit in :class:`BodyLimit`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuheal_bridge.api.models import ErrorCode
from gpuheal_bridge.server.audit import TEXT_MAX, summary
from gpuheal_bridge.server.auth import is_loopback, missing_message, route_scope
from gpuheal_bridge.server.errors import Refusal, error
from gpuheal_bridge.server.idempotency import REPLAYED_HEADER
from gpuheal_bridge.server.metrics import result_label
from gpuheal_bridge.server.services import services_of

#: Request bodies above this are refused (413) before they are read: a drain request is a few
#: hundred bytes.
MAX_BODY_BYTES = 64 * 1024
# The bearer scheme in the OpenAPI document (components.securitySchemes + security on every
# /v1 operation). The check itself is the guard's, before anything else runs.
BEARER = [
    Security(
        HTTPBearer(
            scheme_name="bearer",
            description="`Authorization: Bearer <token>`: one of the bridge's named tokens.",
            auto_error=False,
        )
    )
]


class Guard(BaseHTTPMiddleware):
    """Plain HTTP from a peer not on loopback: 403; /v1 without a known token: 401; a token
    without the route's scope: 403. Nothing else runs for any of them, and each is written to
    the audit log with the caller's address. Counts and times every request by the name of
    its route, found among ``routes`` before routing (a refused request has a name too)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        super().__init__(app)
        self.routes = routes

    def operation_of(self, request: Request) -> str:
        for route in self.routes:
            match, _ = route.matches(request.scope)
            if match is Match.FULL:
                return str(getattr(route, "name", "other"))
        return "other"

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        services = services_of(request)
        metrics = services.metrics
        t0 = time.perf_counter()
        op = request.state.op = self.operation_of(request)
        peer = request.client.host if request.client else None
        if (
            request.url.scheme == "http"
            and not services.remote_plain_http
            and not is_loopback(peer)
        ):
            status, body, _ = error(
                403,
                ErrorCode.INSECURE_TRANSPORT,
                "plain HTTP is served to loopback clients only: use https (the bridge's "
                "--tls-cert/--tls-key)",
            )
            metrics.requests.labels(op, "insecure").inc()
            return self.refused(request, (status, body, {}), peer)
        if request.url.path.startswith("/v1"):
            caller = services.auth.caller(request.headers.get("authorization"))
            if caller is None:
                refusal = error(
                    401,
                    ErrorCode.UNAUTHORIZED,
                    "missing or invalid bearer token",
                    headers={"WWW-Authenticate": 'Bearer realm="gpuheal-bridge"'},
                )
                metrics.requests.labels(op, "unauthorized").inc()
                return self.refused(request, refusal, peer)
            request.state.who, request.state.scopes = caller.name, caller.scopes
            # No route (op "other"): nothing runs, routing answers 404/405 as it would.
            if op != "other" and (missing := caller.missing({route_scope(op)})):
                message = missing_message(caller, missing, f"call {op}")
                metrics.requests.labels(op, "forbidden").inc()
                return self.refused(request, error(403, ErrorCode.FORBIDDEN, message), peer)
        response = await call_next(request)
        metrics.requests.labels(
            op, result_label(response.status_code, REPLAYED_HEADER.lower() in response.headers)
        ).inc()
        metrics.duration.labels(op).observe(time.perf_counter() - t0)
        return response

    @staticmethod
    def refused(request: Request, refusal: Refusal, peer: str | None) -> Response:
        """The refusal answered, and its audit line: who (the token's name, none for a 401),
        from where, what was asked, and why not; at most one line per address and status
        every ``refusal_log_interval`` seconds, the next one saying how many were left out."""
        status, body, headers = refusal
        services = services_of(request)
        # Bounded: one line per address and status an interval (a flood of bad tokens).
        suppressed = services.refusals.admit(peer, status)
        if suppressed is not None:
            services.audit.write(
                who=getattr(request.state, "who", None),
                peer=peer,
                op=getattr(request.state, "op", "other"),
                method=request.method,
                target=request.url.path[:TEXT_MAX],
                status=status,
                result=summary(body),
                **({"suppressed": suppressed} if suppressed else {}),
            )
        return JSONResponse(body, status, headers=headers)


class BodyLimit:
    """Refuse a request body larger than ``limit`` bytes (413) before it is read: at once when
    its Content-Length says so, else as soon as the chunks received pass the limit. The 413 is
    raised where the route reads its body, so it is answered (and audited) like any refusal,
    after the token check."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        seen, refused = 0, False

        def refuse() -> StarletteHTTPException:
            nonlocal refused
            refused = True  # once: a later read (a disconnect listener) gets what comes
            return StarletteHTTPException(
                413, f"the request body is larger than {self.limit} bytes"
            )

        async def limited() -> Message:
            nonlocal seen
            if refused:
                return await receive()
            if not declared.isdigit() or int(declared) > self.limit:
                raise refuse()
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise refuse()
            return message

        await self.app(scope, limited, send)
