"""What the configured backend can do on the Slurm it is connected to, read once at start.

The bridge pings Slurm (``scontrol ping`` + ``scontrol --version``, or slurmrestd's
``/openapi/v3`` and ping, whose ``meta`` names the release), then asks each backend it uses
what it can do there: the CLI backend does everything on every release; slurmrestd's writes
depend on its API version (``backends/rest.py``), and where it lacks one a ``--rest-write-fallback
cli`` does it with scontrol. The result is logged in one line and served at
``/v1/capabilities``.

gpuheal's promise is that a drained node's jobs move: a bridge whose backend cannot requeue
on its Slurm refuses to start (:func:`refusal`) with one line that says what to configure
instead, rather than answering 501 at the first fault.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuheal_bridge.api.models import BackendCapabilities
from gpuheal_bridge.backends.base import ALL_CAPABILITIES, Backend, BackendError, Capability
from gpuheal_bridge.backends.rest import RestBackend


@dataclass(frozen=True)
class Discovered:
    """What :func:`discover` found: the answer, and whether Slurm answered at all (an
    unreachable Slurm says nothing about what a backend can do there)."""

    answer: BackendCapabilities
    reached: bool


async def discover(backend: Backend) -> Discovered:
    """Ping Slurm through ``backend`` and list what it (and its fallback) can do there."""
    try:
        ping = await backend.ping()
        reached, version, detail = ping.up, ping.version, ping.detail
    except BackendError as exc:
        reached, version, detail = False, None, str(exc)
    can = backend.capabilities()
    per_backend = {backend.name: _sorted(can)}
    api = None
    if isinstance(backend, RestBackend):
        api = backend.version
        per_backend[backend.name] = _sorted(backend.own_capabilities())
        if backend.fallback is not None:
            per_backend[backend.fallback.name] = _sorted(backend.fallback.capabilities())
    answer = BackendCapabilities(
        backend=backend.name,
        slurm_version=version,
        rest_api_version=api,
        slurmctld=detail,
        capabilities=_sorted(can),
        missing=_sorted(ALL_CAPABILITIES - can),
        backends=per_backend,
    )
    return Discovered(answer, reached)


def _sorted(caps: frozenset[Capability]) -> list[str]:
    return sorted(c.value for c in caps)


def summary(found: Discovered) -> str:
    """The start-up log line."""
    a = found.answer
    where = f"Slurm {a.slurm_version or 'version unknown'}"
    if a.rest_api_version:
        where += f" (slurmrestd {a.rest_api_version})"
    if not found.reached:
        where += f", not reachable ({a.slurmctld}): capabilities read again on request"
    cannot = f"; cannot: {', '.join(a.missing)}" if a.missing else ""
    by = "; ".join(f"{name}: {', '.join(caps)}" for name, caps in a.backends.items())
    return f"backend {a.backend} on {where}: can {', '.join(a.capabilities)}{cannot} [{by}]"


def refusal(found: Discovered) -> str | None:
    """Why this bridge must not start (its backend cannot requeue on the Slurm it reached),
    as one line with what to configure instead; None when it may."""
    a = found.answer
    if not found.reached or Capability.REQUEUE.value in a.capabilities:
        return None
    api = f"slurmrestd {a.rest_api_version}" if a.rest_api_version else "its API"
    return (
        f"the {a.backend} backend cannot requeue jobs on Slurm {a.slurm_version or '?'} "
        f"({api} has no requeue the bridge can use), so drained nodes would keep their jobs: "
        "run with --backend cli (scontrol of the same Slurm release on this host), or keep "
        "--backend rest and add --rest-write-fallback cli"
    )
