"""How every mutating route runs its operation (:class:`Mutation`, handed to the route by
``Depends``): once per idempotency key, its jobs counted, one audit line written, its
exceptions answered as refusals."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, WithJsonSchema

from gpuheal_bridge.api.models import ErrorCode
from gpuheal_bridge.api.names import IDEMPOTENCY_KEY_MAX, IDEMPOTENCY_KEY_PATTERN, InvalidName
from gpuheal_bridge.nodemap import NotAllowed, NotMapped
from gpuheal_bridge.server.audit import summary
from gpuheal_bridge.server.auth import Caller, body_scopes, missing_message
from gpuheal_bridge.server.errors import error, map_exception, refuse
from gpuheal_bridge.server.idempotency import REPLAYED_HEADER, KeyMismatch, fingerprint, valid_key
from gpuheal_bridge.server.services import Services, Svc

B = TypeVar("B", bound=BaseModel)
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


@dataclass
class Mutation:
    """A mutating request being served (who asks is the guard's ``request.state.who``) and
    its idempotency key: runs its operation once per key, counts its jobs, writes its audit
    line, answers its exceptions as refusals."""

    request: Request
    services: Services
    key: str | None

    def refuse(self, exc: Exception, body: BaseModel) -> JSONResponse:
        """Refused before anything ran: a name that is invalid (422), not mapped (404) or
        outside the allowed nodes (403)."""
        refusal = map_exception(exc, self.services.retry_after)
        return refuse(self.request, refusal, payload=body.model_dump(mode="json"), key=self.key)

    async def on_node(
        self, node: str, body: B, action: Callable[[str, str, B], Awaitable[BaseModel]]
    ) -> JSONResponse:
        """``action(node, its Slurm name, body)``: the name is mapped first (422/404)."""
        try:
            slurm = self.services.mapper.to_slurm(node)
        except (InvalidName, NotMapped, NotAllowed) as exc:
            return self.refuse(exc, body)
        return await self.run(target=node, body=body, action=lambda: action(node, slurm, body))

    async def run(
        self, *, target: str, body: BaseModel, action: Callable[[], Awaitable[BaseModel]]
    ) -> JSONResponse:
        """Run ``action`` once per idempotency key, count its jobs, write the audit line.
        What the body asks for beyond the route's scope (the guard checked that one) is
        checked first: 403 naming the scope missing, nothing run, nothing stored."""
        request, services, key = self.request, self.services, self.key
        who: str = request.state.who
        op: str = request.state.op  # the route's name, set by the guard
        t0 = time.perf_counter()
        payload = body.model_dump(mode="json")
        caller = Caller(who, request.state.scopes)
        if missing := caller.missing(body_scopes(body)):
            message = missing_message(caller, missing, f"{op.replace('_', ' ')} with this body")
            if "admin" in missing and getattr(body, "force", False):
                message += (
                    " (force lifts a drain gpuheal did not set; a reserve pool's spare is "
                    "resumed with reserve_reason)"
                )
            refusal = error(403, ErrorCode.FORBIDDEN, message)
            return refuse(request, refusal, payload=payload, key=key)
        fp = fingerprint(request.method, request.url.path, payload)
        replayed = False

        async def execute() -> tuple[int, Any, dict[str, str]]:
            try:
                result = await action()
            except Exception as exc:
                return map_exception(exc, services.retry_after)
            return 200, result.model_dump(mode="json"), {}

        if key is None:
            status, out, headers = await execute()
        else:
            if not valid_key(key):
                message = "Idempotency-Key must be 1-200 printable ASCII characters"
                refusal = error(422, ErrorCode.INVALID, message)
                return refuse(request, refusal, payload=payload, key=key)
            async with services.store.lock(who, key):
                try:
                    stored = services.store.get(who, key, fp)
                except KeyMismatch as exc:
                    refusal = map_exception(exc, services.retry_after)
                    return refuse(request, refusal, payload=payload, key=key)
                if stored is not None:
                    replayed = True
                    status, out, headers = stored.status, stored.body, {REPLAYED_HEADER: "true"}
                else:
                    status, out, headers = await execute()
                    services.store.put(who, key, fp, status, out)
        if op == "requeue_job" and not replayed and status == 200:
            self._count_jobs([out])
        elif op == "drain_node" and not replayed and status == 200:
            self._count_jobs(out.get("jobs") or [])
        services.audit.write(
            who=who,
            peer=request.client.host if request.client else None,
            op=op,
            target=target,
            request=payload,
            status=status,
            result=summary(out),
            idempotency_key=key,
            replayed=replayed,
            duration_seconds=round(time.perf_counter() - t0, 4),
        )
        return JSONResponse(out, status, headers=headers)

    def _count_jobs(self, results: list[dict[str, Any]]) -> None:
        metrics = self.services.metrics
        for r in results:
            metrics.jobs.labels(str(r.get("outcome"))).inc()
            if r.get("requeue_to_running_seconds") is not None:
                metrics.requeue_to_running.observe(float(r["requeue_to_running_seconds"]))


def _mutation(request: Request, services: Svc, idempotency_key: IdemKey = None) -> Mutation:
    return Mutation(request, services, idempotency_key)


Mutate = Annotated[Mutation, Depends(_mutation)]
