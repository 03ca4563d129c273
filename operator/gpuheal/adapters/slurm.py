"""The operator's side of the Slurm bridge: a small port over `gpuheal_bridge.client`.

The bridge owns Slurm semantics (ownership by reason prefix, idempotent drain, requeue
outcomes); this port only maps its answers and errors to what a remediation step needs:
done, not ours, not a Slurm node, or "try again later".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

from gpuheal import crashpoints
from gpuheal.api.meta import redact_url, redact_urls
from gpuheal_bridge.api.models import (
    DrainResponse,
    JobResult,
    JobSignalResult,
    JobsResponse,
    NodeState,
    RebootResponse,
    RequeueOptions,
    ReserveResponse,
    ResumeResponse,
)
from gpuheal_bridge.client import (
    BridgeClient,
    BridgeConflict,
    BridgeError,
    BridgeNotFound,
    BridgeUnauthorized,
    BridgeUnavailable,
)

T = TypeVar("T")


class SlurmError(Exception):
    """The bridge refused for good (bad request, unsupported): the step fails and says why."""


class SlurmUnavailable(SlurmError):
    """The bridge or slurmctld cannot be reached now: retry with backoff."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SlurmNotFound(SlurmError):
    """Slurm does not know this node: it is not part of the Slurm cluster."""


class SlurmConflict(SlurmError):
    """Someone else's drain (resume refused): gpuheal leaves it alone. ``current``: the
    node's state as the bridge saw it when it refused, when it said."""

    def __init__(self, message: str, current: NodeState | None = None) -> None:
        super().__init__(message)
        self.current = current


class UnknownCluster(SlurmError):
    """The node names a Slurm cluster the operator has no bridge for: a person must say
    which (``--bridges-file``) or fix the label."""


class TokenFile:
    """The bearer token in a file, read again whenever the file changes (a Secret volume
    swaps its files on rotation): the next call uses the new token, nothing restarts. If the
    file cannot be read for a moment, the last token stays."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self._token = self._read(strict=True)

    def _read(self, *, strict: bool = False) -> str:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                self._token, self._stamp = self.path.read_text().strip(), stamp
        except OSError:
            if strict:
                raise
        return self._token

    def __call__(self) -> str:
        return self._read()


class BridgeSlurm:
    """The bridge's async client, its errors mapped to what a step needs to know."""

    def __init__(
        self, client: BridgeClient, *, on_call: Callable[[str, str], None] | None = None
    ) -> None:
        self.client = client
        self.on_call = on_call or (lambda operation, result: None)

    @classmethod
    def from_settings(
        cls,
        url: str,
        token_file: str | None,
        ca_file: str | None,
        *,
        retries: int = 2,
        on_call: Callable[[str, str], None] | None = None,
    ) -> BridgeSlurm:
        """``on_call(operation, result)`` hears of every call: ok, error or unavailable."""
        token: str | TokenFile = TokenFile(token_file) if token_file else ""
        verify: bool | str = ca_file if ca_file else True
        return cls(BridgeClient(url, token, retries=retries, verify=verify), on_call=on_call)

    @property
    def where(self) -> str:
        """The bridge as messages name it: scheme, host and port (its URL may carry more)."""
        return f"Slurm bridge {redact_url(self.client.base_url)}"

    async def _guard(self, operation: str, call: Awaitable[T]) -> T:
        result = "error"
        effect = f"bridge-{operation}" if operation != "node" else None  # node: a read
        try:
            if effect:
                crashpoints.at(effect, "before")
            value = await call
            result = "ok"
            if effect:
                crashpoints.at(effect, "after")
            return value
        except BridgeUnavailable as exc:
            result = "unavailable"
            raise SlurmUnavailable(f"{self.where}: {exc}", exc.retry_after) from exc
        except BridgeNotFound as exc:
            raise SlurmNotFound(str(exc)) from exc
        except BridgeConflict as exc:
            raise SlurmConflict(str(exc), exc.error.current if exc.error else None) from exc
        except BridgeError as exc:
            raise SlurmError(str(exc)) from exc
        except httpx.HTTPError as exc:  # transport errors the client did not wrap
            result = "unavailable"
            raise SlurmUnavailable(redact_urls(f"{self.where}: {exc}")) from exc
        finally:
            self.on_call(operation, result)

    async def ready(self) -> bool:
        """Does the bridge answer /readyz with slurmctld reachable?"""
        try:
            return (await self.client.ready()).ready
        except (httpx.HTTPError, ValueError):
            return False

    async def misconfigured(self) -> tuple[str, str] | None:
        """("refused" or "unreachable", what to fix) when a call behind the token cannot get
        through: the bridge refuses the token (401/403), or nothing answers at its URL. None
        when it answered, slurmctld's own outage included (`ready` and its gauge tell that)."""
        where = f"the Slurm bridge at {self.client.base_url}"
        try:
            await self.client.capabilities()
        except BridgeUnauthorized as exc:
            return "refused", (
                f"{where} refused the operator's token ({exc.status}): the token file must "
                "hold a token listed in the bridge's --token-file"
            )
        except BridgeUnavailable as exc:
            if exc.status is None:  # no HTTP answer at all
                cause = exc.__cause__ or exc
                return "unreachable", f"{where} cannot be reached ({type(cause).__name__}: {cause})"
        except (BridgeError, httpx.HTTPError, ValueError):
            pass  # it answered: whatever it said, the URL and the token are right
        return None

    async def node(self, node: str) -> NodeState:
        return await self._guard("node", self.client.get_node(node))

    async def drain(
        self,
        node: str,
        *,
        incident: str,
        xid: int | None,
        requeue: RequeueOptions | None,
        idempotency_key: str,
    ) -> DrainResponse:
        return await self._guard(
            "drain",
            self.client.drain(
                node, incident=incident, xid=xid, requeue=requeue, idempotency_key=idempotency_key
            ),
        )

    async def jobs(
        self, node: str, *, ended_since: dt.datetime | None = None, gpus: bool = False
    ) -> JobsResponse:
        """The node's unfinished jobs and those that ended there since ``ended_since``; with
        ``gpus`` the GPU indexes each holds there."""
        listing = self.client.node_jobs(node, ended_since=ended_since, gpus=gpus)
        return await self._guard("jobs", listing)

    async def requeue_job(
        self, job_id: int, options: RequeueOptions, *, from_node: str, idempotency_key: str
    ) -> JobResult:
        """Requeue one job that ran on ``from_node`` (which it then avoids)."""
        return await self._guard(
            "requeue",
            self.client.requeue_job(
                job_id, options, from_node=from_node, idempotency_key=idempotency_key
            ),
        )

    async def signal_job(
        self, job_id: int, *, from_node: str, signal: str, idempotency_key: str
    ) -> JobSignalResult:
        """Send one job running on ``from_node`` the signal alone (checkpoint now): no requeue."""
        return await self._guard(
            "signal",
            self.client.signal_job(
                job_id, from_node=from_node, signal=signal, idempotency_key=idempotency_key
            ),
        )

    async def resume(
        self,
        node: str,
        *,
        incident: str | None,
        force: bool = False,
        reserve_reason: str | None = None,
        idempotency_key: str,
    ) -> ResumeResponse:
        """Resume our drain (``incident``), any drain (``force``), or a spare's only while
        it carries its pool's ``reserve_reason`` (someone else's drain: SlurmConflict)."""
        return await self._guard(
            "resume",
            self.client.resume(
                node,
                incident=incident,
                force=force,
                reserve_reason=reserve_reason,
                idempotency_key=idempotency_key,
            ),
        )

    async def reboot(
        self, node: str, *, incident: str, xid: int | None, idempotency_key: str
    ) -> RebootResponse:
        """`scontrol reboot` through the bridge; the node stays drained afterwards (ours)."""
        return await self._guard(
            "reboot",
            self.client.reboot(node, incident=incident, xid=xid, idempotency_key=idempotency_key),
        )

    async def reserve(
        self, node: str, *, incident: str, reason: str, idempotency_key: str
    ) -> ReserveResponse:
        """Hand our drain of the node to the reserve pool (its drain reason)."""
        return await self._guard(
            "reserve",
            self.client.reserve(
                node, incident=incident, reason=reason, idempotency_key=idempotency_key
            ),
        )

    async def close(self) -> None:
        await self.client.aclose()
