"""Who may hold the operator's Lease, timed so that skewed wall clocks cannot make two leaders.

client-go's rule: a standby never compares the holder's ``renewTime`` with its own wall clock
(two machines' clocks a second or two apart would let it take a Lease that is still being
renewed). It times, on its own monotonic clock, how long it has seen the Lease record
unchanged, and takes the Lease only after ``leaseDurationSeconds`` of no change. The holder,
for its part, gives up once it has not renewed for its renew deadline, measured on *its*
monotonic clock from the moment it began its last successful renewal: the renewal it wrote
is what a standby sees first, so the holder stops before any standby may start.

Times here are seconds of a monotonic clock (``time.monotonic()``), never wall-clock times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: Renew deadline as a share of the Lease duration (client-go's defaults: 10 s of 15 s). The
#: rest is the margin for a holder that is slow to notice (a stalled event loop) and to stop.
RENEW_DEADLINE_SHARE = 2 / 3

#: Fields of a Lease that change with every write; any change restarts a standby's wait.
_RECORD_FIELDS = ("holderIdentity", "renewTime", "acquireTime", "leaseTransitions",
                  "leaseDurationSeconds")  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Sighting:
    """A Lease record as one copy last saw it, and since when (its monotonic clock) it has
    seen it unchanged."""

    record: tuple[Any, ...]
    since: float


def record_of(lease: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies one write of the Lease: its spec fields and its resourceVersion."""
    spec = lease.get("spec") or {}
    rv = (lease.get("metadata") or {}).get("resourceVersion")
    return (rv, *(spec.get(f) for f in _RECORD_FIELDS))


def sight(previous: Sighting | None, record: tuple[Any, ...], now: float) -> Sighting:
    """The sighting after reading ``record`` at ``now``: unchanged keeps its start."""
    if previous is not None and previous.record == record:
        return previous
    return Sighting(record, now)


def may_take(
    spec: Mapping[str, Any], me: str, seen: Sighting, now: float, default_duration: float
) -> bool:
    """May ``me`` write itself into the Lease whose ``spec`` it has seen unchanged since
    ``seen.since``? Yes if nobody holds it, ``me`` holds it, or the record has not changed
    for the holder's own ``leaseDurationSeconds`` on ``me``'s clock."""
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    duration = float(spec.get("leaseDurationSeconds") or default_duration)
    return now - seen.since >= duration


def renew_deadline(duration: float) -> float:
    return duration * RENEW_DEADLINE_SHARE


def must_give_up(renewed_at: float | None, now: float, duration: float) -> bool:
    """A holder that began its last successful renewal at ``renewed_at`` (None: never)
    must stop acting at ``now``."""
    return renewed_at is None or now - renewed_at >= renew_deadline(duration)


def renewal_budget(renewed_at: float | None, now: float, duration: float) -> float:
    """Seconds a renewal that starts at ``now`` may take before the holder must give up."""
    if renewed_at is None:
        return 0.0
    return max(0.0, renewed_at + renew_deadline(duration) - now)
