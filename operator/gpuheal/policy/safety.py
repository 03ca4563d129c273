"""The safety arithmetic: how many nodes a policy may take out at once, the breaker with
its storm cooldown, the rate limit, and the cluster counts they read."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from gpuheal.api.meta import parse_duration, scaled_value
from gpuheal.api.names import Reason
from gpuheal.api.remediationpolicy import Safety
from gpuheal.policy.types import ClusterCounts, IncidentSummary, NodeView, PoolCounts


def allowed_unhealthy(safety: Safety, selected: int) -> int:
    """maxUnhealthy (rounded down, but at least 1 for a non-zero percent) or selected -
    minHealthy (rounded up), never below 0.

    The floor: "10%" of a 5-node group rounds down to 0, which would silently turn a policy
    that plainly means "heal, a few at a time" into one that never heals small groups.
    A count, "0%" or minHealthy say exactly what they mean and get no floor.
    """
    if safety.max_unhealthy is not None:
        allowed = scaled_value(safety.max_unhealthy, selected, round_up=False)
        if allowed == 0 and selected > 0 and _nonzero_percent(safety.max_unhealthy):
            allowed = 1
    elif safety.min_healthy is not None:
        allowed = selected - scaled_value(safety.min_healthy, selected, round_up=True)
    else:  # unreachable for validated policies; be safe rather than permissive
        allowed = 0
    return max(0, min(allowed, selected))


def _nonzero_percent(value: int | str) -> bool:
    return isinstance(value, str) and value.endswith("%") and int(value[:-1]) > 0


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """May one more node be taken out of service? `blocked` says why not; `breaker` is the
    breaker's new state when this look changes it (opened now, closed now)."""

    blocked: tuple[Reason, str, dt.datetime | None] | None
    breaker: bool | None = None


def admit(safety: Safety, counts: ClusterCounts, now: dt.datetime) -> Admission:
    """The gate before an incident's first disruptive step (the one that takes its slot).

    The breaker opens when every slot is taken (`maxUnhealthy` nodes out of service): a
    storm more likely has one cause than many, and taking more nodes out makes it worse.
    It closes at the first look that finds a free slot; then `stormCooldown` must pass
    before a new node is taken. Incidents that hold a slot already never come here, and
    nothing here ever holds back a return to service.
    """
    allowed = allowed_unhealthy(safety, counts.selected)
    if counts.remediating >= allowed:
        message = (
            f"{counts.remediating} of {counts.selected} selected nodes already out of service; "
            f"the policy allows {allowed} at once"
        )
        opens = None if counts.breaker_open else True
        return Admission((Reason.BREAKER_OPEN, message, None), opens)
    closes = False if counts.breaker_open else None
    closed_at = now if counts.breaker_open else counts.breaker_changed_at
    cooldown = parse_duration(safety.storm_cooldown)
    if closed_at is not None and now < closed_at + cooldown:
        until = closed_at + cooldown
        message = (
            f"breaker closed at {closed_at.isoformat()}; cooling down {safety.storm_cooldown} "
            f"(until {until.isoformat()})"
        )
        return Admission((Reason.STORM_COOLDOWN, message, until), closes)
    if safety.rate_limit is not None:
        window = parse_duration(safety.rate_limit.window)
        recent = sorted(t for t in counts.recent_starts if now - window < t <= now)
        if len(recent) >= safety.rate_limit.remediations:
            retry = recent[len(recent) - safety.rate_limit.remediations] + window
            message = (
                f"{len(recent)} remediations started in the last {safety.rate_limit.window}; "
                f"the limit is {safety.rate_limit.remediations}"
            )
            return Admission((Reason.RATE_LIMITED, message, retry), closes)
    return Admission(None, closes)


def cluster_counts(
    policy: str,
    selected: int,
    incidents: Iterable[IncidentSummary],
    kept_out: Iterable[NodeView],
    *,
    local_slots: Iterable[str] = (),
    breaker_open: bool = False,
    breaker_changed_at: dt.datetime | None = None,
    pools: Mapping[str, PoolCounts] | None = None,
) -> ClusterCounts:
    """Counts for `policy` from what the operator knows (or a CLI read from the cluster).

    A slot is held by an open incident that took a disruptive step, by a node gpuheal still
    keeps cordoned after its incident closed (return to service turned off, a failed step),
    and by an incident of this process that took its slot a moment ago but is not visible in
    the views yet (`local_slots`). Counting open incidents alone let a storm cordon far more
    nodes than the policy allows, one closed incident at a time.

    A node whose incident brought in a spare (`replacement`) holds no slot from then on,
    while it waits for repair or is being repaired: the spare restored the capacity the
    limit protects (NodeHealthCheck counts the same way: a node whose remediation is done
    no longer counts as unhealthy). Without this, 12 replaced nodes waiting for repair on a
    125-node pool with maxUnhealthy 10% would stop all new healing.
    """
    everything = list(incidents)
    replaced = {i.name for i in everything if i.replacement}
    mine = [i for i in everything if i.policy == policy]
    holders = {i.name for i in mine if i.active and i.holds_slot}
    busy = {i.node for i in mine if i.active and i.holds_slot}
    # A node counts once: its mark may name an earlier (or made-up) incident while an open one
    # holds its slot.
    holders |= {n.kept_out_by for n in kept_out if n.kept_out_by and n.name not in busy}
    holders -= replaced
    holders |= set(local_slots) - replaced
    unhealthy = {i.node for i in mine if i.active} | {n.name for n in kept_out}
    return ClusterCounts(
        selected=selected,
        unhealthy=len(unhealthy),
        remediating=len(holders),
        recent_starts=tuple(i.slot_taken_at for i in mine if i.slot_taken_at is not None),
        breaker_open=breaker_open,
        breaker_changed_at=breaker_changed_at,
        pools=dict(pools or {}),
    )
