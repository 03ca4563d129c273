"""Liveness and readiness (``/metrics`` is prometheus-client's app, added by the factory)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gpuheal_bridge.api.models import Health, Readiness
from gpuheal_bridge.server.services import Svc

router = APIRouter(tags=["probes"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The bridge process answers (no Slurm call)."""
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "slurmctld not reachable"}},
)
async def readyz(services: Svc) -> JSONResponse:
    """slurmctld reachable (``scontrol ping`` or the REST ping)."""
    up, detail, version = await services.check_slurmctld()
    backend = services.backend
    body = Readiness(
        ready=up,
        backend=backend.name,
        slurmctld=detail,
        slurm_version=version,
        capabilities=sorted(c.value for c in backend.capabilities()),
    )
    headers = {} if up else {"Retry-After": str(int(services.retry_after))}
    return JSONResponse(body.model_dump(mode="json"), 200 if up else 503, headers=headers)
