"""``/v1/nodes``: a node's state and jobs, and what gpuheal does to it in Slurm: drain and
resume (:class:`Operations`), reboot and hand to the reserve pool (:mod:`gpuheal_bridge.repair`).
"""

from __future__ import annotations

import datetime as dt
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from gpuheal_bridge import repair
from gpuheal_bridge.api.models import (
    DrainRequest,
    DrainResponse,
    JobsResponse,
    NodeState,
    RebootRequest,
    RebootResponse,
    ReserveRequest,
    ReserveResponse,
    ResumeRequest,
    ResumeResponse,
)
from gpuheal_bridge.api.names import NODE_NAME_MAX, NODE_NAME_PATTERN
from gpuheal_bridge.server.errors import ERRORS
from gpuheal_bridge.server.guard import BEARER
from gpuheal_bridge.server.mutation import Mutate
from gpuheal_bridge.server.services import Svc

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
router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses=ERRORS, dependencies=BEARER)


@router.get("/{node}", response_model=NodeState)
async def get_node(node: NodeName, services: Svc) -> NodeState:
    """State, drain reason and its owner (gpuheal or other)."""
    return await services.ops.get_node(node, services.mapper.to_slurm(node))


@router.get("/{node}/jobs", response_model=JobsResponse)
async def node_jobs(
    node: NodeName, services: Svc, ended_since: dt.datetime | None = None, gpus: bool = False
) -> JobsResponse:
    """Jobs allocated on the node that have not finished; with ``ended_since`` (ISO time
    or Unix seconds) also the jobs that ended there since then, each with ``ended`` (how)
    and ``end_time``, as long as slurmctld remembers them (MinJobAge); with ``gpus=true``
    each unfinished job's ``gpus``: the GRES indexes it holds on the node."""
    slurm_name = services.mapper.to_slurm(node)
    return await services.ops.jobs(node, slurm_name, ended_since, gpus=gpus)


@router.post("/{node}/drain", response_model=DrainResponse)
async def drain_node(node: NodeName, body: DrainRequest, mutation: Mutate) -> JSONResponse:
    """DRAIN with reason ``gpuheal: <incident> xid=<n>``; optionally requeue its jobs.

    Idempotent: a node gpuheal drained already is reported ``already_drained``; a node
    drained or down by someone else is reported ``drained_by_other`` and its reason is
    left untouched (so it is never resumed without force). Either way its jobs are
    requeued when asked: who drained a node does not decide whether its jobs move.
    """
    return await mutation.on_node(node, body, mutation.services.ops.drain)


@router.post("/{node}/resume", response_model=ResumeResponse)
async def resume_node(
    node: NodeName, mutation: Mutate, body: ResumeRequest | None = None
) -> JSONResponse:
    """RESUME only a drain gpuheal set (409 otherwise) unless ``force``; with
    ``reserve_reason`` (one of the bridge's ``--reserve-reasons``, else 403) only a spare
    drained with exactly that reason (its pool's; an admin's or another tool's drain is
    409); not drained: no-op."""
    return await mutation.on_node(node, body or ResumeRequest(), mutation.services.ops.resume)


@router.post("/{node}/reboot", response_model=RebootResponse)
async def reboot_node(node: NodeName, body: RebootRequest, mutation: Mutate) -> JSONResponse:
    """Reboot through Slurm's RebootProgram (`scontrol reboot`), once the node is idle.

    `next_state: drain` (default): the node is drained with gpuheal's reason (if it is
    not already) and stays drained after the reboot, until gpuheal resumes it once its
    check passed. `resume`: `scontrol reboot ASAP nextstate=RESUME`, Slurm undrains it.
    A node drained or down by someone else is refused (409). The response's
    `previous.boot_time` is what a caller compares with later `GET /v1/nodes/{node}`
    answers to verify the reboot happened (`current.flags` shows REBOOT_REQUESTED /
    REBOOT_ISSUED meanwhile).
    """
    return await mutation.on_node(node, body, partial(repair.reboot, mutation.services.ops))


@router.post("/{node}/reserve", response_model=ReserveResponse)
async def reserve_node(node: NodeName, body: ReserveRequest, mutation: Mutate) -> JSONResponse:
    """Hand a node gpuheal drained (for `incident`) to the reserve pool: DRAIN with the
    pool's reason (`reserve pool`), which promotion later resumes (resume with
    `reserve_reason`: only while that reason is still the node's). Someone
    else's drain is refused (409); the pool's reason already there is a no-op."""
    return await mutation.on_node(node, body, partial(repair.reserve, mutation.services.ops))
