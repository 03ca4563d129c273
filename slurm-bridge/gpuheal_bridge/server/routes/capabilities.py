"""``/v1/capabilities``: the Slurm release behind the bridge and what its backend can do there
(:mod:`gpuheal_bridge.backends.capabilities`, read again on each request: a ping)."""

from __future__ import annotations

from fastapi import APIRouter

from gpuheal_bridge.api.models import BackendCapabilities
from gpuheal_bridge.backends.capabilities import discover
from gpuheal_bridge.server.errors import ERRORS
from gpuheal_bridge.server.guard import BEARER
from gpuheal_bridge.server.services import Svc

router = APIRouter(prefix="/v1", tags=["capabilities"], responses=ERRORS, dependencies=BEARER)


@router.get("/capabilities", response_model=BackendCapabilities)
async def capabilities(services: Svc) -> BackendCapabilities:
    """Slurm's version, the backend, what it can do there and what it cannot (501)."""
    return (await discover(services.backend)).answer
