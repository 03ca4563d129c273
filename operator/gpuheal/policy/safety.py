"""The safety arithmetic: how many nodes a policy may take out at once, the breaker with
its storm cooldown, the rate limit, and the cluster counts they read."""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import itertools
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from typing import Protocol

from gpuheal.api.meta import parse_duration, scaled_value
from gpuheal.api.names import Reason
from gpuheal.api.remediationpolicy import Safety
from gpuheal.policy.types import ClusterCounts, IncidentSummary, PoolCounts


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


def breaker_closes(safety: Safety, counts: ClusterCounts) -> bool:
    """Does a look now close the open breaker? Yes once a slot is free. An incident's
    admission looks, and so does the operator between incidents (`report`): with no incident
    left waiting (deleted, opted out, its node gone), a storm long over would otherwise keep
    the breaker open, and the policy's status saying so, until the next fault, whose own look
    would then start the storm cooldown and hold it back."""
    return counts.breaker_open and counts.remediating < allowed_unhealthy(safety, counts.selected)


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
    closes = False if breaker_closes(safety, counts) else None
    closed_at = now if closes is False else counts.breaker_changed_at
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


class Tally(Protocol):
    """One policy's share of the incidents, as `cluster_counts` reads it: kept up to date as
    incidents change by the operator (`remediation.state.Incidents`), or scanned from a list
    of incidents once (`tally`)."""

    @property
    def holders(self) -> Collection[str]: ...  # open incidents that hold a slot

    @property
    def busy(self) -> Container[str]: ...  # nodes with an open slot-holding incident

    @property
    def open_nodes(self) -> Collection[str]: ...  # nodes with an open incident

    @property
    def starts(self) -> Sequence[dt.datetime]: ...  # when its incidents took slots, sorted


@dataclasses.dataclass(frozen=True, slots=True)
class ScannedTally:
    """A `Tally` from one scan of the incidents (`tally`)."""

    holders: frozenset[str] = frozenset()
    busy: frozenset[str] = frozenset()
    open_nodes: frozenset[str] = frozenset()
    starts: tuple[dt.datetime, ...] = ()


def tally(policy: str, incidents: Iterable[IncidentSummary]) -> ScannedTally:
    """`policy`'s share of every incident, in one scan."""
    mine = [i for i in incidents if i.policy == policy]
    return ScannedTally(
        holders=frozenset(i.name for i in mine if i.active and i.holds_slot),
        busy=frozenset(i.node for i in mine if i.active and i.holds_slot),
        open_nodes=frozenset(i.node for i in mine if i.active),
        starts=tuple(sorted(i.slot_taken_at for i in mine if i.slot_taken_at is not None)),
    )


def starts_since(safety: Safety, now: dt.datetime) -> dt.datetime:
    """The oldest slot start the rate limit reads at ``now`` (all that `admit` looks at)."""
    window = safety.rate_limit.window if safety.rate_limit else None
    return now - parse_duration(window) if window else now


def cluster_counts(
    selected: int,
    held: Tally,
    kept_out: Mapping[str, str],
    *,
    replaced: Container[str] = frozenset(),
    local_slots: Iterable[str] = (),
    breaker_open: bool = False,
    breaker_changed_at: dt.datetime | None = None,
    pools: Mapping[str, PoolCounts] | None = None,
    since: dt.datetime | None = None,
) -> ClusterCounts:
    """A policy's counts: the one place that says which nodes hold its breaker's slots. The
    operator passes the tallies it keeps as incidents change, `gpuheal explain` those it
    scanned (`tally`) from one read of the cluster.

    ``selected``: the nodes the policy governs; ``held``: its share of the incidents;
    ``kept_out``: its nodes gpuheal keeps cordoned, each with the incident its mark names;
    ``replaced``: incidents that brought in a spare; ``local_slots``: slots its incidents of
    this process took a moment ago, not visible on them yet; ``since``: keep only the slot
    starts from then on (`starts_since`: what the rate limit reads), else all.

    A slot is held by an open incident that took a disruptive step, by a node gpuheal still
    keeps cordoned after its incident closed (return to service turned off, a failed step),
    and by a local slot. Counting open incidents alone let a storm cordon far more nodes
    than the policy allows, one closed incident at a time.

    A node whose incident brought in a spare (`replacement`) holds no slot from then on,
    while it waits for repair or is being repaired: the spare restored the capacity the
    limit protects (NodeHealthCheck counts the same way: a node whose remediation is done
    no longer counts as unhealthy). Without this, 12 replaced nodes waiting for repair on a
    125-node pool with maxUnhealthy 10% would stop all new healing.
    """
    # A node counts once: its mark may name an earlier (or made-up) incident while an open
    # one holds its slot.
    marks = (by for node, by in kept_out.items() if node not in held.busy)
    holders = {h for h in itertools.chain(held.holders, marks, local_slots) if h not in replaced}
    unhealthy = len(held.open_nodes) + sum(1 for n in kept_out if n not in held.open_nodes)
    starts = tuple(held.starts)
    if since is not None:
        starts = starts[bisect.bisect_right(starts, since) :]
    return ClusterCounts(
        selected=selected,
        unhealthy=unhealthy,
        remediating=len(holders),
        recent_starts=starts,
        breaker_open=breaker_open,
        breaker_changed_at=breaker_changed_at,
        pools=dict(pools or {}),
    )
