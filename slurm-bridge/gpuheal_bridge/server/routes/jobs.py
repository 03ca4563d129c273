"""``/v1/jobs``: one job's state, its requeue (:meth:`Operations.requeue_job`) and a signal
alone (:meth:`Operations.signal_job`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from gpuheal_bridge.api.models import (
    JobRequeueRequest,
    JobResult,
    JobSignalRequest,
    JobSignalResult,
    JobState,
)
from gpuheal_bridge.api.names import JOB_ID_PATTERN, InvalidName, validate_job_id
from gpuheal_bridge.nodemap import NotAllowed, NotMapped
from gpuheal_bridge.server.errors import ERRORS
from gpuheal_bridge.server.guard import BEARER
from gpuheal_bridge.server.mutation import Mutate, Mutation
from gpuheal_bridge.server.services import Svc

JobId = Annotated[
    str,
    Path(
        description="A Slurm job id: 1..4294967293 in decimal (no array syntax).",
        json_schema_extra={"pattern": JOB_ID_PATTERN},
    ),
]
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERRORS, dependencies=BEARER)


@router.get("/{job_id}", response_model=JobState)
async def get_job(job_id: JobId, services: Svc) -> JobState:
    """One job (finished ones too, while Slurm remembers them)."""
    return await services.backend.get_job(validate_job_id(job_id))


@router.post("/{job_id}/requeue", response_model=JobResult)
async def requeue_job(job_id: JobId, body: JobRequeueRequest, mutation: Mutate) -> JSONResponse:
    """Requeue one running batch job (see RequeueOptions) that runs on ``from_node``
    (required, inside the allowed nodes); never revives a finished job."""
    ops = mutation.services.ops
    return await _on_node(job_id, body, mutation, lambda j, n: ops.requeue_job(j, body, n))


@router.post("/{job_id}/signal", response_model=JobSignalResult)
async def signal_job(job_id: JobId, body: JobSignalRequest, mutation: Mutate) -> JSONResponse:
    """Send one running job a signal (ask it to checkpoint now) without requeueing it: it
    keeps running on ``from_node`` (required, inside the allowed nodes)."""
    ops = mutation.services.ops
    return await _on_node(job_id, body, mutation, lambda j, n: ops.signal_job(j, body, n))


async def _on_node(
    job_id: str,
    body: JobRequeueRequest | JobSignalRequest,
    mutation: Mutation,
    act: Callable[[int, str], Awaitable[BaseModel]],
) -> JSONResponse:
    """The job id and ``from_node`` checked (valid, mapped, allowed: else refused before
    anything runs), then ``act(job, its Slurm node)`` once per idempotency key."""
    try:
        jid = validate_job_id(job_id)
        from_node = mutation.services.mapper.to_slurm(body.from_node)
    except (InvalidName, NotMapped, NotAllowed) as exc:
        return mutation.refuse(exc, body)
    return await mutation.run(target=str(jid), body=body, action=lambda: act(jid, from_node))
