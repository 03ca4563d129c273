"""Status of RemediationPolicies and ReservePools, and the gauges that mirror it.

Computed from the in-memory views every few seconds; written only when it changed, so an
idle cluster sees no writes at all.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from pydantic import ValidationError

from gpuheal.api.meta import (
    MAX_MESSAGE,
    Condition,
    ConditionStatus,
    find_condition,
    set_condition,
)
from gpuheal.api.names import (
    API_VERSION,
    POLICY_PLURAL,
    POOL_KIND,
    POOL_PLURAL,
    EventReason,
    PolicyCondition,
    PoolCondition,
    Reason,
)
from gpuheal.api.remediationpolicy import RemediationPolicy, RemediationPolicyStatus
from gpuheal.api.reservepool import (
    Claim,
    ReservePool,
    ReservePoolStatus,
    UnavailableSpare,
    deprecations,
)
from gpuheal.policy import allowed_unhealthy, unhealthy_reasons
from gpuheal.policy.safety import breaker_closes
from gpuheal.policy.spares import spare_unavailable
from gpuheal.policy.warnings import policy_warnings
from gpuheal.remediation import poolupkeep
from gpuheal.remediation.state import Bookkeeping, Breaker, ClusterView, Ports, Unparsed

log = logging.getLogger("gpuheal.report")
INTERVAL = 3.0
HISTORY_KEEP = dt.timedelta(hours=25)  # in memory; older signals come from the FaultHistory objects


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _Conditions:
    def __init__(self, conditions: list[Condition], generation: int | None, now: dt.datetime):
        self.items = conditions
        self.generation = generation
        self.now = now

    def set(self, type_: str, true: bool, reason: str, message: str = "", *,
            at: dt.datetime | None = None) -> None:  # fmt: skip
        self.items = set_condition(
            self.items,
            type_=type_,
            status=ConditionStatus.TRUE if true else ConditionStatus.FALSE,
            reason=reason,
            message=message,
            now=at or self.now,
            observed_generation=self.generation,
        )


def policy_status(
    ports: Ports, cluster: ClusterView, policy: RemediationPolicy, now: dt.datetime
) -> RemediationPolicyStatus:
    name = policy.metadata.name
    selected = cluster.selected_nodes(name)
    tied = sorted(n for n, names in cluster.tied.items() if name in names)
    unhealthy = sorted(v.name for v in selected if unhealthy_reasons(policy.spec, v))
    counts = cluster.counts(name)
    allowed = allowed_unhealthy(policy.spec.safety, len(selected))
    breaker = cluster.breakers.get(name, Breaker())
    conds = _Conditions(list(policy.status.conditions), policy.metadata.generation, now)
    conds.set(
        PolicyCondition.CIRCUIT_BREAKER_OPEN,
        breaker.open,
        Reason.TOO_MANY_UNHEALTHY
        if breaker.open
        else (Reason.BREAKER_CLOSED if breaker.changed_at else Reason.WITHIN_LIMITS),
        f"{counts.remediating} of {len(selected)} nodes out of service; {allowed} allowed",
        at=breaker.changed_at,
    )
    others = sorted({o for n in tied[:50] for o in cluster.tied.get(n, ())} - {name})
    conds.set(
        PolicyCondition.OVERLAPPING,
        bool(tied),
        Reason.NODES_IN_OTHER_POLICIES if tied else Reason.NO_OVERLAP,
        f"{len(tied)} node(s) also selected by {', '.join(others)} at the same priority; "
        f"neither policy acts on them: {', '.join(tied[:10])}"
        if tied
        else "",
    )
    paused = policy.spec.safety.paused
    conds.set(
        PolicyCondition.PAUSED, paused, Reason.PAUSED_BY_SPEC if paused else Reason.NOT_PAUSED
    )
    unreadable = [n for plural, n in cluster.unparsed if plural == POOL_PLURAL]
    matched = (  # only worth the scan when the policy governs nothing
        None
        if selected
        else sum(policy.spec.node_selector.matches(dict(v.labels)) for v in cluster.nodes.values())
    )
    warnings = policy_warnings(
        policy.spec, cluster.pools, len(selected), unreadable=unreadable, matched=matched
    )
    conds.set(
        PolicyCondition.WARNINGS,
        bool(warnings),
        Reason.POLICY_WARNINGS if warnings else Reason.NO_WARNINGS,
        "; ".join(warnings)[:MAX_MESSAGE],
    )
    conds.set(
        PolicyCondition.READY,
        True,
        Reason.ACTIVE,
        "dry run: plans are recorded, nothing is changed" if policy.spec.safety.dry_run else "",
    )
    ports.metrics.breaker_open.labels(name).set(1 if breaker.open else 0)
    ports.metrics.unhealthy_nodes.labels(name).set(len(unhealthy))
    return RemediationPolicyStatus(
        observed_generation=policy.metadata.generation,
        selected_nodes=len(selected),
        unhealthy_nodes=len(unhealthy),
        remediating_nodes=counts.remediating,
        allowed_unhealthy=allowed,
        unhealthy_node_names=unhealthy[:256],
        conditions=conds.items,
    )


def pool_status(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, pool: ReservePool, now: dt.datetime
) -> ReservePoolStatus:
    name = pool.metadata.name
    members = [v for v in cluster.nodes.values() if pool.spec.node_selector.matches(dict(v.labels))]
    claimed = [v for v in members if v.claimed_by]
    out = {
        v.name: why
        for v in members
        if not v.claimed_by
        and (why := spare_unavailable(v, cluster.spares_out_in_slurm)) is not None
    }
    available = [v for v in members if not v.claimed_by and v.name not in out]
    low = len(available) < pool.spec.min_available
    conds = _Conditions(list(pool.status.conditions), pool.metadata.generation, now)
    conds.set(
        PoolCondition.LOW,
        low,
        (Reason.NO_SPARES if not available else Reason.BELOW_MIN_AVAILABLE)
        if low
        else Reason.ENOUGH_SPARES,
        f"{len(available)} available, minAvailable {pool.spec.min_available}"
        + (f", {len(out)} unavailable ({', '.join(sorted(out))[:200]})" if out else ""),
    )
    warnings = deprecations(pool.spec)
    conds.set(
        PoolCondition.WARNINGS,
        bool(warnings),
        Reason.DEPRECATED_FIELDS if warnings else Reason.NO_WARNINGS,
        "; ".join(warnings)[:MAX_MESSAGE],
    )
    conds.set(PoolCondition.READY, True, Reason.ACTIVE)
    for state, n in (
        ("available", len(available)),
        ("claimed", len(claimed)),
        ("total", len(members)),
    ):
        ports.metrics.pool_nodes.labels(name, state).set(n)
    ports.metrics.pool_min_available.labels(name).set(pool.spec.min_available)
    known = {c.node: c.claimed_at for c in pool.status.claims}
    return ReservePoolStatus(
        refill=books.refills.get(name) or pool.status.refill,
        observed_generation=pool.metadata.generation,
        available=len(available),
        claimed=len(claimed),
        total=len(members),
        claims=[
            Claim(node=v.name, claimed_by=v.claimed_by or "", claimed_at=known.get(v.name, now))
            for v in claimed
        ][:256],
        unavailable=[
            UnavailableSpare(node=n, reason=why.reason, message=why.message[:512])
            for n, why in sorted(out.items())
        ][:256],
        conditions=conds.items,
    )


def unparsed_status(item: Unparsed, now: dt.datetime) -> dict[str, Any]:
    """Status of a policy or pool the operator ignores: Ready=False, InvalidSpec, why. Its
    other fields stay as last written (a merge patch), its other conditions too."""
    kept: list[Condition] = []
    for raw in item.conditions:
        try:
            kept.append(Condition.model_validate(raw))
        except ValidationError:
            continue  # not ours to mend; Ready is what matters here
    conds = _Conditions(kept, item.generation, now)
    conds.set(
        PolicyCondition.READY,
        False,
        Reason.INVALID_SPEC,
        f"ignored: this operator cannot read the spec: {item.why}"[:MAX_MESSAGE],
    )
    return {
        "observedGeneration": item.generation,
        "conditions": [c.to_k8s() for c in conds.items],
    }


def _comparable(status: dict[str, Any]) -> Any:
    """Status without timestamps, to decide whether a write is needed."""
    out = {k: v for k, v in status.items() if k not in ("conditions", "claims")}
    out["conditions"] = sorted(
        (c.get("type"), c.get("status"), c.get("reason"), c.get("message", ""))
        for c in status.get("conditions", [])
    )
    out["claims"] = sorted((c["node"], c["claimedBy"]) for c in status.get("claims", []))
    out["refill"] = (status.get("refill") or {}).get("requestedAt")
    return out


async def look_at_breakers(cluster: ClusterView, now: dt.datetime) -> list[str]:
    """Close each open breaker that has a free slot again (`breaker_closes`), under the lock
    admissions take; the policies whose breaker closed. The storm cooldown counts from now."""
    closed = []
    for name, policy in list(cluster.policies.items()):
        async with cluster.slot_lock:
            if breaker_closes(policy.spec.safety, cluster.counts(name)):
                cluster.breakers[name] = Breaker(open=False, changed_at=now)
                closed.append(name)
    for name in closed:
        log.info("RemediationPolicy %s: circuit breaker closed, a slot is free", name)
    return closed


async def report_once(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, last: dict[tuple[str, str], Any]
) -> None:
    kube = ports.require_kube()
    now = _now()
    await look_at_breakers(cluster, now)
    for pool in list(cluster.pools.values()):
        await poolupkeep.look_in_slurm(ports, cluster, books, pool, now)
    available = cluster.pool_counts()
    for name, pool in list(cluster.pools.items()):
        if name in available:
            await poolupkeep.refill(ports, books, pool, available[name].available, now)
    work: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
        *(
            (POLICY_PLURAL, n, p.status.to_k8s(), policy_status(ports, cluster, p, now).to_k8s())
            for n, p in cluster.policies.items()
        ),
        *(
            (POOL_PLURAL, n, p.status.to_k8s(), pool_status(ports, cluster, books, p, now).to_k8s())
            for n, p in cluster.pools.items()
        ),
        *(
            (
                plural,
                n,
                {"observedGeneration": u.observed_generation, "conditions": u.conditions},
                unparsed_status(u, now),
            )
            for (plural, n), u in cluster.unparsed.items()
        ),
    ]
    for plural, name, old, wire in work:
        key = (plural, name)
        current = _comparable(wire)
        if last.get(key) == current:
            continue
        if key not in last and _comparable(old) == current:
            last[key] = current  # as written before a restart: nothing to do
            continue
        await kube.patch_custom_status(plural, name, wire)
        last[key] = current
        if plural == POOL_PLURAL:
            _warn_deprecated(ports, cluster, name, old, wire)


def _warn_deprecated(
    ports: Ports, cluster: ClusterView, name: str, old: dict[str, Any], new: dict[str, Any]
) -> None:
    """A Warning Event on the pool when its status starts to say it sets deprecated fields
    (or says it differently): `kubectl describe rsvp` shows what to do instead."""

    def said(status: dict[str, Any]) -> str | None:
        c = find_condition(
            [Condition.model_validate(c) for c in status.get("conditions") or []],
            PoolCondition.WARNINGS,
        )
        return c.message if c and c.status is ConditionStatus.TRUE else None

    message = said(new)
    pool = cluster.pools.get(name)
    if message is None or message == said(old) or pool is None:
        return
    log.warning("ReservePool %s: %s", name, message)
    ports.post_event(
        {"apiVersion": API_VERSION, "kind": POOL_KIND,
         "metadata": {"name": name, "uid": pool.metadata.uid}},
        reason=EventReason.DEPRECATED_FIELDS,
        message=message,
        type_="Warning",
    )  # fmt: skip


async def report_forever(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    last: dict[tuple[str, str], Any] = {}
    while True:
        try:
            cluster.forget_before(_now() - HISTORY_KEEP)
            books.forget_before(_now() - HISTORY_KEEP)
            await report_once(ports, cluster, books, last)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("status report failed: %s", exc)
        await asyncio.sleep(INTERVAL)
