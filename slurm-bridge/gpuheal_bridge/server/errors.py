"""Every refusal the bridge answers: the exception -> status map, the ``ErrorResponse`` body,
the audit line of a mutating request refused before it ran, and the app's exception handlers.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuheal_bridge.api.models import ErrorCode, ErrorResponse
from gpuheal_bridge.api.names import InvalidName
from gpuheal_bridge.backends.base import BackendError, NotFound, Rejected, Unavailable
from gpuheal_bridge.backends.base import Unsupported as BackendUnsupported
from gpuheal_bridge.nodemap import NotAllowed, NotMapped
from gpuheal_bridge.operations import OwnershipConflict, ReasonNotAllowed
from gpuheal_bridge.server.audit import TEXT_MAX, bounded, summary
from gpuheal_bridge.server.idempotency import KeyMismatch
from gpuheal_bridge.server.services import services_of

#: (status, ErrorResponse body, headers)
Refusal = tuple[int, dict[str, Any], dict[str, str]]

#: The error answers of every /v1 operation in the OpenAPI document.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "The body is not valid JSON.",
        401: "Missing or invalid bearer token; nothing was done.",
        403: "The token lacks a scope the request needs (the message names it), the node is "
        "outside the bridge's allowed nodes, a reserve_reason is not one of the bridge's "
        "reserve pool reasons, or plain HTTP came from a client not on loopback; nothing was "
        "done.",
        404: "Unknown node or job (or no mapping for the node name).",
        409: "Refused: someone else's drain, or Slurm refused the operation.",
        413: "The body is larger than 64 KiB; nothing was done.",
        422: "Invalid node name, job id, body, or idempotency key reuse.",
        503: "slurmctld unreachable or a Slurm call timed out; see Retry-After.",
    }.items()
}


def error(
    status: int,
    code: ErrorCode,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Refusal:
    body = ErrorResponse(error=code, message=message, **extra).model_dump(mode="json")
    return status, body, headers or {}


def map_exception(  # noqa: PLR0911 - one return per error class
    exc: Exception, retry_after: float
) -> Refusal:
    """Exception -> (status, ErrorResponse body, headers). Unknown exceptions re-raise."""
    if isinstance(exc, InvalidName):
        return error(422, ErrorCode.INVALID, str(exc))
    if isinstance(exc, NotAllowed | ReasonNotAllowed):
        return error(403, ErrorCode.FORBIDDEN, str(exc))
    if isinstance(exc, NotFound | NotMapped):
        return error(404, ErrorCode.NOT_FOUND, str(exc).strip("'\""))
    if isinstance(exc, OwnershipConflict):
        return error(
            409, ErrorCode.CONFLICT, str(exc), owner=exc.current.owner, current=exc.current
        )
    if isinstance(exc, KeyMismatch):
        return error(422, ErrorCode.IDEMPOTENCY_MISMATCH, str(exc))
    if isinstance(exc, Unavailable):
        wait = max(retry_after, exc.retry_after)
        return error(
            503,
            ErrorCode.UNAVAILABLE,
            f"slurmctld unavailable: {exc}",
            headers={"Retry-After": str(int(wait))},
            retry_after_seconds=wait,
        )
    if isinstance(exc, BackendUnsupported):
        return error(501, ErrorCode.UNSUPPORTED, str(exc))
    if isinstance(exc, Rejected | BackendError):
        return error(409, ErrorCode.SLURM_ERROR, f"slurm refused: {exc}")
    raise exc


def audit_refusal(
    request: Request, status: int, out: Any, *, payload: Any = None, key: str | None = None
) -> None:
    """An audit line for a mutating request refused before it ran, or any request refused
    403 (a node outside the allowed nodes): who (the token's name), from where, what, on
    what, and why. (The guard writes its own refusals: 401, and 403 for a scope.)"""
    who = getattr(request.state, "who", None)
    if who is None or (request.method != "POST" and status != 403):
        return
    params = request.path_params
    target = str(params.get("node") or params.get("job_id") or request.url.path)
    services_of(request).audit.write(
        who=who,
        peer=request.client.host if request.client else None,
        op=getattr(request.state, "op", "other"),
        target=target[:TEXT_MAX],
        request=bounded(payload),
        status=status,
        result=summary(out),
        idempotency_key=bounded(key or request.headers.get("idempotency-key")),
        replayed=False,
        duration_seconds=None,
    )


def refuse(request: Request, refusal: Refusal, *, payload: Any, key: str | None) -> JSONResponse:
    status, out, headers = refusal
    audit_refusal(request, status, out, payload=payload, key=key)
    return JSONResponse(out, status, headers=headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    parts = [
        f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()
    ]
    message = "; ".join(parts)[:TEXT_MAX] or "invalid"
    return refuse(request, error(422, ErrorCode.INVALID, message), payload=exc.body, key=None)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.INVALID}.get(exc.status_code)
    code = code or (ErrorCode.INVALID if exc.status_code < 500 else ErrorCode.SLURM_ERROR)
    status, body, _hdrs = error(exc.status_code, code, str(exc.detail))
    return refuse(request, (status, body, dict(exc.headers or {})), payload=None, key=None)


async def _mapped(request: Request, exc: Exception) -> JSONResponse:
    refusal = map_exception(exc, services_of(request).retry_after)
    return refuse(request, refusal, payload=None, key=None)


def add_exception_handlers(app: FastAPI) -> None:
    app.exception_handler(RequestValidationError)(_invalid_request)
    app.exception_handler(StarletteHTTPException)(_http_error)
    for exc_type in (
        BackendError,
        InvalidName,
        NotMapped,
        NotAllowed,
        ReasonNotAllowed,
        OwnershipConflict,
        KeyMismatch,
    ):
        app.add_exception_handler(exc_type, _mapped)
