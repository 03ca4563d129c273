"""The bridge's HTTP app.

Why FastAPI (over aiohttp): the request/response models in :mod:`gpuheal_bridge.api` are
pydantic v2 models shared with the operator's client; FastAPI validates requests against
exactly those models, serialises responses through them and publishes the OpenAPI document
(``/openapi.json``) that the schemathesis fuzz test and client authors use, with no second
schema to keep in sync. It runs on uvicorn, supports TLS there, and its TestClient makes
the HTTP layer unit-testable with a fake backend.

Order of checks for every request: plain HTTP from a peer that is not on loopback (403,
unless ``remote_plain_http``); then for ``/v1``: bearer token (401, nothing else runs), name
validation and mapping (422/404), idempotency replay, per-node/per-job lock, Slurm.

Left running beside the requests: a slurmctld check every ``health_interval`` seconds (the
``gpuheal_bridge_slurmctld_up`` gauge does not wait for someone to call ``/readyz``), and,
with ``reload_tokens``, a SIGHUP handler that reads the tokens again and swaps them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Header, Path, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, WithJsonSchema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuheal_bridge import repair
from gpuheal_bridge.api.models import (
    DrainRequest,
    DrainResponse,
    ErrorCode,
    ErrorResponse,
    Health,
    JobRequeueRequest,
    JobResult,
    JobsResponse,
    JobState,
    NodeState,
    Owner,
    Readiness,
    RebootRequest,
    RebootResponse,
    ReserveRequest,
    ReserveResponse,
    ResumeRequest,
    ResumeResponse,
)
from gpuheal_bridge.api.names import (
    IDEMPOTENCY_KEY_MAX,
    IDEMPOTENCY_KEY_PATTERN,
    JOB_ID_PATTERN,
    NODE_NAME_MAX,
    NODE_NAME_PATTERN,
    InvalidName,
    validate_job_id,
)
from gpuheal_bridge.backends.base import Backend, BackendError, NotFound, Rejected, Unavailable
from gpuheal_bridge.backends.base import Unsupported as BackendUnsupported
from gpuheal_bridge.exclusions import ExclusionLedger
from gpuheal_bridge.nodemap import NodeMapper, NotMapped
from gpuheal_bridge.operations import Operations, OwnershipConflict
from gpuheal_bridge.server.audit import AuditLog
from gpuheal_bridge.server.auth import TokenAuth, is_loopback
from gpuheal_bridge.server.idempotency import (
    IdempotencyStore,
    KeyMismatch,
    fingerprint,
    valid_key,
)
from gpuheal_bridge.server.metrics import Metrics, MetricsEndpoint, result_label

B = TypeVar("B", bound=BaseModel)
log = logging.getLogger("gpuheal_bridge")
REPLAYED_HEADER = "Idempotency-Replayed"
# The bearer scheme in the OpenAPI document (components.securitySchemes + security on every
# /v1 operation). The check itself is the middleware's, before anything else runs.
_BEARER = [
    Security(
        HTTPBearer(
            scheme_name="bearer",
            description="`Authorization: Bearer <token>`: one of the bridge's named tokens.",
            auto_error=False,
        )
    )
]
# The OpenAPI document shows the grammar the server enforces (its own checks, which say why
# a name is refused: ``node_name_problem``, ``validate_job_id``, ``valid_key``).
IdemKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retries with the same key get the first answer (kept for a TTL). 1-200 "
        "printable ASCII characters, one per request: reused for a different request, 422.",
    ),
    WithJsonSchema(
        {
            "type": "string",
            "minLength": 1,
            "maxLength": IDEMPOTENCY_KEY_MAX,
            "pattern": IDEMPOTENCY_KEY_PATTERN,
            "title": "Idempotency-Key",
        }
    ),
]
NodeName = Annotated[
    str,
    Path(
        description="One node (its Kubernetes name): letters, digits, '.', '_', '-', starting "
        "with a letter or digit; no hostlist.",
        json_schema_extra={
            "minLength": 1,
            "maxLength": NODE_NAME_MAX,
            "pattern": NODE_NAME_PATTERN,
        },
    ),
]
JobId = Annotated[
    str,
    Path(
        description="A Slurm job id: 1..4294967293 in decimal (no array syntax).",
        json_schema_extra={"pattern": JOB_ID_PATTERN},
    ),
]
#: Request bodies above this are refused (413) before they are read: a drain request is a few
#: hundred bytes.
MAX_BODY_BYTES = 64 * 1024
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "The body is not valid JSON.",
        401: "Missing or invalid bearer token; nothing was done.",
        403: "Plain HTTP from a client not on loopback; nothing was done (use https).",
        404: "Unknown node or job (or no mapping for the node name).",
        409: "Refused: someone else's drain, or Slurm refused the operation.",
        413: "The body is larger than 64 KiB; nothing was done.",
        422: "Invalid node name, job id, body, or idempotency key reuse.",
        503: "slurmctld unreachable or a Slurm call timed out; see Retry-After.",
    }.items()
}


@dataclass
class BridgeSettings:
    backend: Backend
    tokens: dict[str, str]
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
    reload_tokens: Callable[[], dict[str, str]] | None = None


def _error(
    status: int,
    code: ErrorCode,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    body = ErrorResponse(error=code, message=message, **extra).model_dump(mode="json")
    return status, body, headers or {}


def map_exception(  # noqa: PLR0911 - one return per error class
    exc: Exception, retry_after: float
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Exception -> (status, ErrorResponse body, headers). Unknown exceptions re-raise."""
    if isinstance(exc, InvalidName):
        return _error(422, ErrorCode.INVALID, str(exc))
    if isinstance(exc, NotFound | NotMapped):
        return _error(404, ErrorCode.NOT_FOUND, str(exc).strip("'\""))
    if isinstance(exc, OwnershipConflict):
        return _error(
            409, ErrorCode.CONFLICT, str(exc), owner=exc.current.owner, current=exc.current
        )
    if isinstance(exc, KeyMismatch):
        return _error(422, ErrorCode.IDEMPOTENCY_MISMATCH, str(exc))
    if isinstance(exc, Unavailable):
        wait = max(retry_after, exc.retry_after)
        return _error(
            503,
            ErrorCode.UNAVAILABLE,
            f"slurmctld unavailable: {exc}",
            headers={"Retry-After": str(int(wait))},
            retry_after_seconds=wait,
        )
    if isinstance(exc, BackendUnsupported):
        return _error(501, ErrorCode.UNSUPPORTED, str(exc))
    if isinstance(exc, Rejected | BackendError):
        return _error(409, ErrorCode.SLURM_ERROR, f"slurm refused: {exc}")
    raise exc


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


def create_app(settings: BridgeSettings) -> FastAPI:  # noqa: PLR0915 - routes are closures
    auth = TokenAuth(settings.tokens)
    backend = settings.backend
    ops = settings.operations or Operations(
        backend, exclusions=ExclusionLedger.in_dir(settings.state_dir)
    )
    mapper = settings.node_mapper
    metrics = Metrics()
    audit = AuditLog(settings.audit_log)
    db = None
    if settings.state_dir is not None:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        db = settings.state_dir / "idempotency.sqlite3"
    store = IdempotencyStore(db, ttl=settings.idempotency_ttl)
    store.purge()

    async def check_slurmctld() -> tuple[bool, str, str | None]:
        try:
            ping = await backend.ping()
            up, detail, version = ping.up, ping.detail, ping.version
        except BackendError as exc:
            up, detail, version = False, str(exc), None
        metrics.slurmctld_up.set(1 if up else 0)
        metrics.slurmctld_checked.set_to_current_time()
        return up, detail, version

    async def watch_slurmctld(every: float) -> None:
        while True:
            try:
                await check_slurmctld()
            except Exception:  # a bug here must not end the checks
                log.exception("slurmctld check failed")
            await asyncio.sleep(every)

    def reload_tokens() -> None:
        assert settings.reload_tokens is not None
        try:
            auth.replace(settings.reload_tokens())
        except (OSError, ValueError) as exc:
            metrics.token_reloads.labels("error").inc()
            log.error("SIGHUP: tokens not reloaded, the previous ones stay: %s", exc)
            return
        metrics.token_reloads.labels("ok").inc()
        metrics.tokens.set(len(auth.names))
        log.warning("SIGHUP: tokens reloaded: %s", ", ".join(auth.names))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        watcher = None
        if settings.health_interval > 0:
            watcher = asyncio.create_task(watch_slurmctld(settings.health_interval))
        sighup = False
        if settings.reload_tokens is not None:
            try:
                loop.add_signal_handler(signal.SIGHUP, reload_tokens)
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
            await ops.settled(within=10.0)  # requeues still expediting in the background
            await backend.aclose()
            store.close()

    app = FastAPI(
        title="gpuheal Slurm bridge",
        version="1",
        description="Drain/resume Slurm nodes and requeue their jobs for gpuheal. "
        "All /v1 endpoints need `Authorization: Bearer <token>`. Plain HTTP is served to "
        "loopback clients only (403 otherwise) unless the bridge runs with --insecure-http.",
        lifespan=lifespan,
    )
    metrics.tokens.set(len(auth.names))
    app.state.metrics = metrics
    app.state.auth = auth
    app.state.store = store
    app.state.operations = ops

    def operation_of(request: Request) -> str:
        for route in app.router.routes:
            match, _ = route.matches(request.scope)
            if match is Match.FULL:
                return str(getattr(route, "name", "other"))
        return "other"

    # Inside the guard (added before it): the route's own body reads go through it.
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.middleware("http")
    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        t0 = time.perf_counter()
        op = request.state.op = operation_of(request)
        peer = request.client.host if request.client else None
        if (
            request.url.scheme == "http"
            and not settings.remote_plain_http
            and not is_loopback(peer)
        ):
            status, body, _ = _error(
                403,
                ErrorCode.INSECURE_TRANSPORT,
                "plain HTTP is served to loopback clients only: use https (the bridge's "
                "--tls-cert/--tls-key)",
            )
            metrics.requests.labels(op, "insecure").inc()
            return JSONResponse(body, status)
        if request.url.path.startswith("/v1"):
            who = auth.who(request.headers.get("authorization"))
            if who is None:
                status, body, _ = _error(
                    401, ErrorCode.UNAUTHORIZED, "missing or invalid bearer token"
                )
                response: Response = JSONResponse(
                    body, status, headers={"WWW-Authenticate": 'Bearer realm="gpuheal-bridge"'}
                )
                metrics.requests.labels(op, "unauthorized").inc()
                return response
            request.state.who = who
        response = await call_next(request)
        metrics.requests.labels(
            op, result_label(response.status_code, REPLAYED_HEADER.lower() in response.headers)
        ).inc()
        metrics.duration.labels(op).observe(time.perf_counter() - t0)
        return response

    def audit_refusal(
        request: Request, status: int, out: Any, *, payload: Any = None, key: str | None = None
    ) -> None:
        """An audit line for a mutating request refused before it ran: who (the token's
        name; a 401 has none and is not written), what, on what, and why."""
        who = getattr(request.state, "who", None)
        if who is None or request.method != "POST":
            return
        params = request.path_params
        target = str(params.get("node") or params.get("job_id") or request.url.path)
        audit.write(
            who=who,
            op=getattr(request.state, "op", "other"),
            target=target[:_AUDIT_TEXT_MAX],
            request=_bounded(payload),
            status=status,
            result=_summary(out),
            idempotency_key=_bounded(key or request.headers.get("idempotency-key")),
            replayed=False,
            duration_seconds=None,
        )

    def refuse(
        request: Request,
        refusal: tuple[int, dict[str, Any], dict[str, str]],
        *,
        payload: Any,
        key: str | None,
    ) -> JSONResponse:
        status, out, headers = refusal
        audit_refusal(request, status, out, payload=payload, key=key)
        return JSONResponse(out, status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [
            f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        ]
        message = "; ".join(parts)[:_AUDIT_TEXT_MAX] or "invalid"
        refusal = _error(422, ErrorCode.INVALID, message)
        return refuse(request, refusal, payload=exc.body, key=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.INVALID}.get(exc.status_code)
        code = code or (ErrorCode.INVALID if exc.status_code < 500 else ErrorCode.SLURM_ERROR)
        status, body, _hdrs = _error(exc.status_code, code, str(exc.detail))
        return refuse(request, (status, body, dict(exc.headers or {})), payload=None, key=None)

    async def mapped(_: Request, exc: Exception) -> JSONResponse:
        status, body, headers = map_exception(exc, settings.retry_after)
        return JSONResponse(body, status, headers=headers)

    for exc_type in (BackendError, InvalidName, NotMapped, OwnershipConflict, KeyMismatch):
        app.add_exception_handler(exc_type, mapped)

    async def mutate(
        request: Request,
        *,
        target: str,
        body: BaseModel,
        key: str | None,
        action: Callable[[], Awaitable[BaseModel]],
    ) -> JSONResponse:
        """Run ``action`` once per idempotency key, count its jobs, write the audit line."""
        who: str = request.state.who
        op: str = request.state.op  # the route's name, set by the guard
        t0 = time.perf_counter()
        payload = body.model_dump(mode="json")
        fp = fingerprint(request.method, request.url.path, payload)
        replayed = False

        async def execute() -> tuple[int, Any, dict[str, str]]:
            try:
                result = await action()
            except Exception as exc:
                return map_exception(exc, settings.retry_after)
            return 200, result.model_dump(mode="json"), {}

        if key is None:
            status, out, headers = await execute()
        else:
            if not valid_key(key):
                message = "Idempotency-Key must be 1-200 printable ASCII characters"
                refusal = _error(422, ErrorCode.INVALID, message)
                return refuse(request, refusal, payload=payload, key=key)
            async with store.lock(who, key):
                try:
                    stored = store.get(who, key, fp)
                except KeyMismatch as exc:
                    refusal = map_exception(exc, settings.retry_after)
                    return refuse(request, refusal, payload=payload, key=key)
                if stored is not None:
                    replayed = True
                    status, out, headers = stored.status, stored.body, {REPLAYED_HEADER: "true"}
                else:
                    status, out, headers = await execute()
                    store.put(who, key, fp, status, out)
        if op == "requeue_job" and not replayed and status == 200:
            _count_jobs([out])
        elif op == "drain_node" and not replayed and status == 200:
            _count_jobs(out.get("jobs") or [])
        audit.write(
            who=who,
            op=op,
            target=target,
            request=payload,
            status=status,
            result=_summary(out),
            idempotency_key=key,
            replayed=replayed,
            duration_seconds=round(time.perf_counter() - t0, 4),
        )
        return JSONResponse(out, status, headers=headers)

    async def mutate_node(
        request: Request,
        node: str,
        body: B,
        key: str | None,
        action: Callable[[str, str, B], Awaitable[BaseModel]],
    ) -> JSONResponse:
        """A mutation of one node: map its name to Slurm's first (422/404 before anything)."""
        try:
            slurm = mapper.to_slurm(node)
        except (InvalidName, NotMapped) as exc:
            refusal = map_exception(exc, settings.retry_after)
            return refuse(request, refusal, payload=body.model_dump(mode="json"), key=key)
        return await mutate(
            request, target=node, body=body, key=key, action=lambda: action(node, slurm, body)
        )

    def _count_jobs(results: list[dict[str, Any]]) -> None:
        for r in results:
            metrics.jobs.labels(str(r.get("outcome"))).inc()
            if r.get("requeue_to_running_seconds") is not None:
                metrics.requeue_to_running.observe(float(r["requeue_to_running_seconds"]))

    # ---- probes and metrics ------------------------------------------------------------------
    @app.get("/healthz", response_model=Health, tags=["probes"])
    async def healthz() -> Health:
        """The bridge process answers (no Slurm call)."""
        return Health()

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["probes"],
        responses={503: {"model": Readiness, "description": "slurmctld not reachable"}},
    )
    async def readyz() -> JSONResponse:
        """slurmctld reachable (``scontrol ping`` or the REST ping)."""
        up, detail, version = await check_slurmctld()
        body = Readiness(
            ready=up,
            backend=backend.name,
            slurmctld=detail,
            slurm_version=version,
            capabilities=sorted(c.value for c in backend.capabilities()),
        )
        headers = {} if up else {"Retry-After": str(int(settings.retry_after))}
        return JSONResponse(body.model_dump(mode="json"), 200 if up else 503, headers=headers)

    app.router.routes.append(
        Route("/metrics", MetricsEndpoint(metrics), methods=["GET"], name="metrics_endpoint")
    )

    # ---- /v1 -------------------------------------------------------------------------------
    @app.get(
        "/v1/nodes/{node}",
        response_model=NodeState,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def get_node(node: NodeName) -> NodeState:
        """State, drain reason and its owner (gpuheal or other)."""
        return await ops.get_node(node, mapper.to_slurm(node))

    @app.get(
        "/v1/nodes/{node}/jobs",
        response_model=JobsResponse,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def node_jobs(node: NodeName, ended_since: dt.datetime | None = None) -> JobsResponse:
        """Jobs allocated on the node that have not finished; with ``ended_since`` (ISO time
        or Unix seconds) also the jobs that ended there since then, each with ``ended`` (how)
        and ``end_time``, as long as slurmctld remembers them (MinJobAge)."""
        return await ops.jobs(node, mapper.to_slurm(node), ended_since)

    @app.post(
        "/v1/nodes/{node}/drain",
        response_model=DrainResponse,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def drain_node(
        node: NodeName, body: DrainRequest, request: Request, idempotency_key: IdemKey = None
    ) -> JSONResponse:
        """DRAIN with reason ``gpuheal: <incident> xid=<n>``; optionally requeue its jobs.

        Idempotent: a node gpuheal drained already is reported ``already_drained``; a node
        drained or down by someone else is reported ``drained_by_other`` and its reason is
        left untouched (so it is never resumed without force). Either way its jobs are
        requeued when asked: who drained a node does not decide whether its jobs move.
        """
        return await mutate_node(request, node, body, idempotency_key, ops.drain)

    @app.post(
        "/v1/nodes/{node}/resume",
        response_model=ResumeResponse,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def resume_node(
        node: NodeName,
        request: Request,
        body: ResumeRequest | None = None,
        idempotency_key: IdemKey = None,
    ) -> JSONResponse:
        """RESUME only a drain gpuheal set (409 otherwise) unless ``force``; with
        ``reserve_reason`` only a spare drained with exactly that reason (its pool's; an
        admin's or another tool's drain is 409); not drained: no-op."""
        req = body or ResumeRequest()
        return await mutate_node(request, node, req, idempotency_key, ops.resume)

    @app.post(
        "/v1/nodes/{node}/reboot",
        response_model=RebootResponse,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def reboot_node(
        node: NodeName, body: RebootRequest, request: Request, idempotency_key: IdemKey = None
    ) -> JSONResponse:
        """Reboot through Slurm's RebootProgram (`scontrol reboot`), once the node is idle.

        `next_state: drain` (default): the node is drained with gpuheal's reason (if it is
        not already) and stays drained after the reboot, until gpuheal resumes it once its
        check passed. `resume`: `scontrol reboot ASAP nextstate=RESUME`, Slurm undrains it.
        A node drained or down by someone else is refused (409). The response's
        `previous.boot_time` is what a caller compares with later `GET /v1/nodes/{node}`
        answers to verify the reboot happened (`current.flags` shows REBOOT_REQUESTED /
        REBOOT_ISSUED meanwhile).
        """
        return await mutate_node(
            request, node, body, idempotency_key, lambda k, s, b: repair.reboot(ops, k, s, b)
        )

    @app.post(
        "/v1/nodes/{node}/reserve",
        response_model=ReserveResponse,
        responses=_ERRORS,
        tags=["nodes"],
        dependencies=_BEARER,
    )
    async def reserve_node(
        node: NodeName, body: ReserveRequest, request: Request, idempotency_key: IdemKey = None
    ) -> JSONResponse:
        """Hand a node gpuheal drained (for `incident`) to the reserve pool: DRAIN with the
        pool's reason (`reserve pool`), which promotion later resumes (resume with
        `reserve_reason`: only while that reason is still the node's). Someone
        else's drain is refused (409); the pool's reason already there is a no-op."""
        return await mutate_node(
            request, node, body, idempotency_key, lambda k, s, b: repair.reserve(ops, k, s, b)
        )

    @app.get(
        "/v1/jobs/{job_id}",
        response_model=JobState,
        responses=_ERRORS,
        tags=["jobs"],
        dependencies=_BEARER,
    )
    async def get_job(job_id: JobId) -> JobState:
        """One job (finished ones too, while Slurm remembers them)."""
        return await backend.get_job(validate_job_id(job_id))

    @app.post(
        "/v1/jobs/{job_id}/requeue",
        response_model=JobResult,
        responses=_ERRORS,
        tags=["jobs"],
        dependencies=_BEARER,
    )
    async def requeue_job(
        job_id: JobId, body: JobRequeueRequest, request: Request, idempotency_key: IdemKey = None
    ) -> JSONResponse:
        """Requeue one running batch job (see RequeueOptions); never revives a finished job."""
        try:
            jid = validate_job_id(job_id)
            from_node = mapper.to_slurm(body.from_node) if body.from_node else None
        except (InvalidName, NotMapped) as exc:
            refusal = map_exception(exc, settings.retry_after)
            payload = body.model_dump(mode="json")
            return refuse(request, refusal, payload=payload, key=idempotency_key)
        return await mutate(
            request,
            target=str(jid),
            body=body,
            key=idempotency_key,
            action=lambda: ops.requeue_job(jid, body, from_node),
        )

    return app


_AUDIT_TEXT_MAX = 2048


def _bounded(value: Any) -> Any:
    """``value``, or the start of its JSON text when that is long (a hostile body or name)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= _AUDIT_TEXT_MAX:
        return value
    return f"{text[:_AUDIT_TEXT_MAX]}... ({len(text)} characters)"


def _summary(out: Any) -> Any:
    if not isinstance(out, dict):
        return out
    keys = ("outcome", "error", "message", "owner", "job_id", "detail", "restart_count")
    summary = {k: out[k] for k in keys if k in out}
    if "jobs" in out:
        summary["jobs"] = [
            {k: j.get(k) for k in ("job_id", "outcome", "restart_count")} for j in out["jobs"]
        ]
    return summary


__all__ = ["BridgeSettings", "Owner", "create_app", "map_exception"]
