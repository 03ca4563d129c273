"""Which of a ReservePool's nodes can be promoted, and why the others cannot; when the pool
asks its refill provider for more spares. Pure: the clock and Slurm's answers passed in."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping

from gpuheal.api.meta import parse_duration
from gpuheal.api.names import Reason
from gpuheal.api.reservepool import RefillProvider, RefillStatus, ReservePoolSpec
from gpuheal.policy.types import NodeView
from gpuheal_bridge.api.models import NodeState

REFUSED = "Refused"


@dataclasses.dataclass(frozen=True, slots=True)
class Unavailable:
    """Why a node of the pool cannot be promoted now: a CamelCase reason and words."""

    reason: str
    message: str


def slurm_unavailable(state: NodeState, reserve_reason: str) -> Unavailable | None:
    """Why Slurm keeps this spare out, unless it is the pool's own drain (``reserve_reason``,
    which promotion lifts) or no drain at all. Anyone else's drain or DOWN (an admin's
    "admin: bad fan", another tool's, Slurm's "Not responding", an incident's) is theirs to
    lift: promotion never resumes it."""
    if not state.unavailable or (state.drain and state.reason == reserve_reason):
        return None
    what = "drained" if state.drain else state.state.lower()
    by = f" by {state.reason_user}" if state.reason_user else ""
    return Unavailable(
        Reason.DRAINED_IN_SLURM if state.drain else Reason.DOWN_IN_SLURM,
        f"{what} in Slurm{by}: {state.reason or 'no reason'!r} (not the pool's "
        f"{reserve_reason!r}); left as it is",
    )


def spare_unavailable(
    node: NodeView, slurm: Mapping[str, Unavailable] | None = None
) -> Unavailable | None:
    """Why a node of the pool (unclaimed) cannot be promoted now; None: it can. ``slurm``:
    what Slurm said of the pool's spares last (`slurm_unavailable`), by node."""
    if node.cordoned_by is not None:
        return Unavailable(
            Reason.HELD_BY_INCIDENT, f"kept out by gpuheal incident {node.cordoned_by}"
        )
    if node.unschedulable:
        # The pool never cordons its spares (taints keep work off them), so a cordon is a
        # person's or another tool's: promoting the node would lift nothing and hide it.
        return Unavailable(Reason.CORDONED, "cordoned, not by gpuheal; uncordon it to use it")
    if not node.ready:
        return Unavailable(Reason.NOT_READY, "Ready is not True")
    return (slurm or {}).get(node.name)


@dataclasses.dataclass(frozen=True, slots=True)
class RefillAsk:
    """Ask the provider for `wanted` spares; `key` is the same for one shortfall."""

    wanted: int
    since: dt.datetime
    key: str


def refill_due(
    pool: str,
    spec: ReservePoolSpec,
    available: int,
    *,
    low_since: dt.datetime | None,
    last: RefillStatus | None,
    now: dt.datetime,
) -> RefillAsk | None:
    """A new shortfall (the pool went below minAvailable at `low_since`, or more spares
    are missing than last asked for) is asked for at once; the same shortfall again after
    `refill.webhook.interval`, unless the provider refused it (4xx: a person looks)."""
    webhook = spec.refill.webhook
    wanted = spec.min_available - available
    if spec.refill.provider is RefillProvider.NONE or webhook is None or wanted <= 0:
        return None
    since = low_since or now
    ask = RefillAsk(wanted, since, f"{pool}-{int(since.timestamp())}-{wanted}")
    if last is None or last.since != since or last.wanted < wanted:
        return ask
    if last.result == REFUSED:
        return None
    if now - last.requested_at >= parse_duration(webhook.interval):
        return ask
    return None
