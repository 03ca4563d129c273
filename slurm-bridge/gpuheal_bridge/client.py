"""Async client of the bridge for the operator (httpx).

- Bearer token on every request (a string, or a function called per request: a rotated
  token file is read again without a new client).
- One ``Idempotency-Key`` per logical call (generated unless given), reused by its retries,
  so a retried drain/requeue is answered from the bridge's store instead of acting twice.
- Retries (tenacity) with full-jitter exponential backoff on connection errors, timeouts,
  502/503/504 and 429; a ``Retry-After`` header is the floor of the wait (capped by
  ``max_backoff``).
- Timeouts: ``timeout`` per request, extended for calls that wait on Slurm (checkpoint
  grace, waiting for the job to run again).
- Errors are typed: :class:`BridgeNotFound`, :class:`BridgeConflict` (someone else's drain),
  :class:`BridgeInvalid`, :class:`BridgeUnauthorized`, :class:`BridgeUnavailable` (retry
  later), :class:`BridgeUnsupported`; all subclass :class:`BridgeError`.

It imports only the API models, httpx, tenacity and the standard library.

Why tenacity (over stamina, which is built on it): the client takes an injectable ``sleep``
so tests check the waits without waiting, and the wait is tenacity's jittered exponential
with the server's Retry-After as a floor; stamina fixes its own sleep and uses a returned
Retry-After *instead of* its backoff.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import uuid
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from gpuheal_bridge.api.models import (
    BackendCapabilities,
    DrainRequest,
    DrainResponse,
    ErrorResponse,
    JobRequeueRequest,
    JobResult,
    JobSignalRequest,
    JobSignalResult,
    JobsResponse,
    JobState,
    NodeState,
    Readiness,
    RebootNextState,
    RebootRequest,
    RebootResponse,
    RequeueOptions,
    ReserveRequest,
    ReserveResponse,
    ResumeRequest,
    ResumeResponse,
    SignalTarget,
)

M = TypeVar("M", bound=BaseModel)
RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(eq=False)  # exceptions compare and hash by identity
class BridgeError(Exception):
    """The bridge refused, or could not be reached; ``status`` and ``error`` when it answered."""

    message: str
    status: int | None = None
    error: ErrorResponse | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)  # str(), args and pickling as for any exception


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


@dataclass(eq=False)
class BridgeUnavailable(BridgeError):
    """Bridge or slurmctld unreachable after all retries; ``retry_after`` when the bridge said."""

    retry_after: float | None = None


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


def retry_wait(base: float, cap: float) -> Callable[[RetryCallState], float]:
    """tenacity wait: full-jitter exponential backoff; a server's Retry-After is the floor
    (capped)."""
    jitter = wait_random_exponential(multiplier=base, max=cap)

    def wait(state: RetryCallState) -> float:
        delay = jitter(state)
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, BridgeUnavailable) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, cap))
        return delay

    return wait


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer <token>`` with the token of the moment: ``token`` is called for
    every request, so a rotated token file is picked up without a new client."""

    def __init__(self, token: str | Callable[[], str]) -> None:
        self._token = token if callable(token) else (lambda: token)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token()}"
        yield request


class BridgeClient:
    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], str],
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        verify: bool | str | ssl.SSLContext = True,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.timeout = timeout
        self.base_url = base_url.rstrip("/")
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(retries + 1),
            wait=retry_wait(backoff, max_backoff),
            retry=retry_if_exception_type(BridgeUnavailable),
            sleep=sleep,
            reraise=True,  # the last BridgeUnavailable, not tenacity's RetryError
        )
        if isinstance(verify, str):  # a CA bundle (PEM): trust it, and only it
            verify = ssl.create_default_context(cafile=verify)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"User-Agent": "gpuheal-bridge-client"},
            auth=BearerAuth(token),
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

    async def capabilities(self) -> BackendCapabilities:
        """``/v1/capabilities``: a read behind the bearer token, so also "is the token good?"."""
        return await self._call("GET", "/v1/capabilities", BackendCapabilities)

    async def get_node(self, node: str) -> NodeState:
        return await self._call("GET", f"/v1/nodes/{node}", NodeState)

    async def node_jobs(
        self, node: str, ended_since: dt.datetime | None = None, *, gpus: bool = False
    ) -> JobsResponse:
        """The node's unfinished jobs, and those that ended there since ``ended_since``;
        with ``gpus`` the GPU indexes each unfinished job holds on the node."""
        query = []
        if ended_since is not None:
            query.append(f"ended_since={ended_since.timestamp():.3f}")
        if gpus:
            query.append("gpus=true")
        path = f"/v1/nodes/{node}/jobs" + (f"?{'&'.join(query)}" if query else "")
        return await self._call("GET", path, JobsResponse)

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
        path = f"/v1/nodes/{node}/drain"
        return await self._post(path, DrainResponse, body, idempotency_key, _wait_budget(requeue))

    async def resume(
        self,
        node: str,
        *,
        incident: str | None = None,
        force: bool = False,
        reserve_reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> ResumeResponse:
        body = ResumeRequest(incident=incident, force=force, reserve_reason=reserve_reason)
        return await self._post(f"/v1/nodes/{node}/resume", ResumeResponse, body, idempotency_key)

    async def reboot(
        self,
        node: str,
        *,
        incident: str,
        xid: int | None = None,
        next_state: RebootNextState = RebootNextState.DRAIN,
        idempotency_key: str | None = None,
    ) -> RebootResponse:
        body = RebootRequest(incident=incident, xid=xid, next_state=next_state)
        return await self._post(f"/v1/nodes/{node}/reboot", RebootResponse, body, idempotency_key)

    async def reserve(
        self,
        node: str,
        *,
        incident: str,
        reason: str = "reserve pool",
        idempotency_key: str | None = None,
    ) -> ReserveResponse:
        body = ReserveRequest(incident=incident, reason=reason)
        return await self._post(f"/v1/nodes/{node}/reserve", ReserveResponse, body, idempotency_key)

    async def requeue_job(
        self,
        job_id: int,
        options: RequeueOptions | None = None,
        *,
        from_node: str,
        idempotency_key: str | None = None,
    ) -> JobResult:
        opts = options or RequeueOptions()
        body = JobRequeueRequest(**opts.model_dump(), from_node=from_node)
        path = f"/v1/jobs/{int(job_id)}/requeue"
        return await self._post(path, JobResult, body, idempotency_key, _wait_budget(opts))

    async def signal_job(
        self,
        job_id: int,
        *,
        from_node: str,
        signal: str = "USR1",
        target: SignalTarget = SignalTarget.FULL,
        idempotency_key: str | None = None,
    ) -> JobSignalResult:
        """Signal one job running on ``from_node`` (checkpoint now); no requeue."""
        body = JobSignalRequest(from_node=from_node, signal=signal, target=target)
        return await self._post(
            f"/v1/jobs/{int(job_id)}/signal", JobSignalResult, body, idempotency_key
        )

    # ---- transport -----------------------------------------------------------------------------
    async def _post(
        self,
        path: str,
        model: type[M],
        body: BaseModel,
        idempotency_key: str | None,
        extra_timeout: float = 0.0,
    ) -> M:
        """A mutation: one Idempotency-Key for the call and all its retries."""
        key = idempotency_key or _new_key()
        return await self._call(
            "POST", path, model, body=body, key=key, extra_timeout=extra_timeout
        )

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
        """One logical call; retried (same key) while it raises BridgeUnavailable."""
        headers = {"Idempotency-Key": key} if key else {}
        payload: Any = body.model_dump(mode="json", exclude_none=True) if body else None
        timeout = self.timeout + extra_timeout

        async def attempt() -> M:
            try:
                resp = await self._http.request(
                    method, path, json=payload, headers=headers, timeout=timeout
                )
            except httpx.TransportError as exc:  # connect/read errors and timeouts
                raise BridgeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            if resp.status_code < 400:
                return model.model_validate(resp.json())
            error = _error_body(resp)
            message = f"{method} {path}: {resp.status_code} " + (
                error.message if error else resp.text[:200]
            )
            if resp.status_code in RETRY_STATUSES:
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                raise BridgeUnavailable(message, resp.status_code, error, retry_after)
            raise _BY_STATUS.get(resp.status_code, BridgeError)(message, resp.status_code, error)

        return await self._retrying.copy()(attempt)


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
    # a stuck job: KillWait (30 s by default) + stuck_after_seconds, then the settle wait
    stuck = 0.0 if opts.stuck_after_seconds is None else opts.stuck_after_seconds + 90.0
    return grace + opts.wait_running_seconds + (30.0 if opts.expedite else 0.0) + 30.0 + stuck
