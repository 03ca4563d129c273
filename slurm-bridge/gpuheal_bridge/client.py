"""Async client of the bridge for the operator (httpx).

- Bearer token on every request.
- One ``Idempotency-Key`` per logical call (generated unless given), reused by its retries,
  so a retried drain/requeue is answered from the bridge's store instead of acting twice.
- Retries with exponential backoff and jitter on connection errors, timeouts, 502/503/504
  and 429, honouring ``Retry-After`` (capped by ``max_backoff``).
- Timeouts: ``timeout`` per request, extended for calls that wait on Slurm (checkpoint
  grace, waiting for the job to run again).
- Errors are typed: :class:`BridgeNotFound`, :class:`BridgeConflict` (someone else's drain),
  :class:`BridgeInvalid`, :class:`BridgeUnauthorized`, :class:`BridgeUnavailable` (retry
  later), :class:`BridgeUnsupported`; all subclass :class:`BridgeError`.

It imports only the API models, httpx and the standard library.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from gpuheal_bridge.api.models import (
    DrainRequest,
    DrainResponse,
    ErrorResponse,
    JobRequeueRequest,
    JobResult,
    JobsResponse,
    JobState,
    NodeState,
    Readiness,
    RequeueOptions,
    ResumeRequest,
    ResumeResponse,
)

M = TypeVar("M", bound=BaseModel)
RETRY_STATUSES = frozenset({429, 502, 503, 504})


class BridgeError(Exception):
    def __init__(self, message: str, status: int | None = None, error: ErrorResponse | None = None):
        super().__init__(message)
        self.status = status
        self.error = error


class BridgeUnauthorized(BridgeError):
    pass


class BridgeInvalid(BridgeError):
    pass


class BridgeNotFound(BridgeError):
    pass


class BridgeConflict(BridgeError):
    """409: someone else's drain (``.error.owner``/``.error.current``) or a Slurm refusal."""


class BridgeUnsupported(BridgeError):
    pass


class BridgeUnavailable(BridgeError):
    """Bridge or slurmctld unreachable after all retries; ``retry_after`` when the bridge said."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        error: ErrorResponse | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status, error)
        self.retry_after = retry_after


_BY_STATUS: dict[int, type[BridgeError]] = {
    401: BridgeUnauthorized,
    403: BridgeUnauthorized,
    404: BridgeNotFound,
    409: BridgeConflict,
    422: BridgeInvalid,
    501: BridgeUnsupported,
}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form; dates are ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None,
    rand: Callable[[], float] = random.random,
) -> float:
    """Full-jitter exponential backoff; a server's Retry-After is the floor (capped)."""
    delay = rand() * min(cap, base * float(1 << attempt))
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


class BridgeClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        verify: bool | str = True,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "User-Agent": "gpuheal-bridge-client"},
            timeout=timeout,
            verify=verify,
            transport=transport,
        )

    async def __aenter__(self) -> BridgeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---- API ---------------------------------------------------------------------------------
    async def ready(self) -> Readiness:
        """``/readyz`` as a model (does not raise when slurmctld is down: ``ready`` is False)."""
        resp = await self._http.get("/readyz")
        return Readiness.model_validate(resp.json())

    async def get_node(self, node: str) -> NodeState:
        return await self._call("GET", f"/v1/nodes/{node}", NodeState)

    async def node_jobs(self, node: str) -> JobsResponse:
        return await self._call("GET", f"/v1/nodes/{node}/jobs", JobsResponse)

    async def get_job(self, job_id: int) -> JobState:
        return await self._call("GET", f"/v1/jobs/{int(job_id)}", JobState)

    async def drain(
        self,
        node: str,
        *,
        incident: str,
        xid: int | None = None,
        requeue: RequeueOptions | None = None,
        idempotency_key: str | None = None,
    ) -> DrainResponse:
        body = DrainRequest(incident=incident, xid=xid, requeue=requeue)
        return await self._call(
            "POST",
            f"/v1/nodes/{node}/drain",
            DrainResponse,
            body=body,
            key=idempotency_key or _new_key(),
            extra_timeout=_wait_budget(requeue),
        )

    async def resume(
        self,
        node: str,
        *,
        incident: str | None = None,
        force: bool = False,
        idempotency_key: str | None = None,
    ) -> ResumeResponse:
        body = ResumeRequest(incident=incident, force=force)
        return await self._call(
            "POST",
            f"/v1/nodes/{node}/resume",
            ResumeResponse,
            body=body,
            key=idempotency_key or _new_key(),
        )

    async def requeue_job(
        self,
        job_id: int,
        options: RequeueOptions | None = None,
        *,
        from_node: str | None = None,
        idempotency_key: str | None = None,
    ) -> JobResult:
        opts = options or RequeueOptions()
        body = JobRequeueRequest(**opts.model_dump(), from_node=from_node)
        return await self._call(
            "POST",
            f"/v1/jobs/{int(job_id)}/requeue",
            JobResult,
            body=body,
            key=idempotency_key or _new_key(),
            extra_timeout=_wait_budget(opts),
        )

    # ---- transport -----------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        model: type[M],
        *,
        body: BaseModel | None = None,
        key: str | None = None,
        extra_timeout: float = 0.0,
    ) -> M:
        headers = {"Idempotency-Key": key} if key else {}
        payload: Any = body.model_dump(mode="json", exclude_none=True) if body else None
        timeout = self.timeout + extra_timeout
        last: BridgeError | None = None
        for attempt in range(self.retries + 1):
            retry_after: float | None = None
            try:
                resp = await self._http.request(
                    method, path, json=payload, headers=headers, timeout=timeout
                )
            except httpx.TransportError as exc:  # connect/read errors and timeouts
                last = BridgeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}")
            else:
                if resp.status_code < 400:
                    return model.model_validate(resp.json())
                error = _error_body(resp)
                message = f"{method} {path}: {resp.status_code} " + (
                    error.message if error else resp.text[:200]
                )
                if resp.status_code not in RETRY_STATUSES:
                    raise _BY_STATUS.get(resp.status_code, BridgeError)(
                        message, resp.status_code, error
                    )
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                last = BridgeUnavailable(message, resp.status_code, error, retry_after)
            if attempt < self.retries:
                await self._sleep(
                    backoff_delay(
                        attempt, base=self.backoff, cap=self.max_backoff, retry_after=retry_after
                    )
                )
        assert last is not None
        raise last


def _error_body(resp: httpx.Response) -> ErrorResponse | None:
    try:
        return ErrorResponse.model_validate(resp.json())
    except (ValueError, ValidationError):
        return None


def _new_key() -> str:
    return f"gpuheal-{uuid.uuid4()}"


def _wait_budget(opts: RequeueOptions | None) -> float:
    """Extra seconds a call may legitimately take on the bridge (grace, waits)."""
    if opts is None:
        return 0.0
    grace = opts.checkpoint.grace_seconds if opts.checkpoint else 0.0
    return grace + opts.wait_running_seconds + (30.0 if opts.expedite else 0.0) + 30.0
