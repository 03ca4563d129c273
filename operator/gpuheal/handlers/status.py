"""Status of RemediationPolicies and ReservePools, and the gauges that mirror it.

Computed from the in-memory views every few seconds; written only when it changed, so an
idle cluster sees no writes at all.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal.api.remediationpolicy import (
    CIRCUIT_BREAKER_OPEN,
    OVERLAPPING,
    PAUSED,
    READY,
    RemediationPolicy,
)
from gpuheal.api.reservepool import LOW, ReservePool
from gpuheal.handlers.remediation import selected_nodes, slot_holders
from gpuheal.handlers.runtime import Runtime

log = logging.getLogger("gpuheal.status")
INTERVAL = 3.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def policy_status(rt: Runtime, policy: RemediationPolicy, now: dt.datetime) -> dict[str, Any]:
    name = policy.metadata.name
    selected = selected_nodes(rt, policy)
    tied = sorted(
        v.name
        for v in rt.nodes.values()
        if name in plan.choose_policy(rt.policies.values(), v.labels).overlapping
    )
    unhealthy = sorted(v.name for v in selected if plan.unhealthy_reasons(policy, v))
    remediating = slot_holders(rt, name, selected)
    allowed = plan.allowed_unhealthy(policy, len(selected))
    open_ = rt.breaker_open.get(name, False)
    conds: list[dict[str, Any]] = [c.to_k8s() for c in policy.status.conditions]
    conds = inc.set_condition(
        conds,
        type_=CIRCUIT_BREAKER_OPEN,
        status="True" if open_ else "False",
        reason="TooManyUnhealthy" if open_ else "WithinLimits",
        message=f"{len(remediating)} of {len(selected)} nodes out of service; {allowed} allowed",
        now=now,
        observed_generation=policy.metadata.generation,
    )
    others = sorted(
        {
            other
            for v in tied[:50]
            for other in plan.choose_policy(rt.policies.values(), rt.nodes[v].labels).overlapping
        }
        - {name}
    )
    conds = inc.set_condition(
        conds,
        type_=OVERLAPPING,
        status="True" if tied else "False",
        reason="NodesInOtherPolicies" if tied else "NoOverlap",
        message=(
            f"{len(tied)} node(s) also selected by {', '.join(others)} at the same priority; "
            f"neither policy acts on them: {', '.join(tied[:10])}"
            if tied
            else ""
        ),
        now=now,
        observed_generation=policy.metadata.generation,
    )
    conds = inc.set_condition(
        conds,
        type_=PAUSED,
        status="True" if policy.spec.safety.paused else "False",
        reason="PausedBySpec" if policy.spec.safety.paused else "NotPaused",
        message="",
        now=now,
        observed_generation=policy.metadata.generation,
    )
    conds = inc.set_condition(
        conds,
        type_=READY,
        status="True",
        reason="Active",
        message="dry run: plans are recorded, nothing is changed"
        if policy.spec.safety.dry_run
        else "",
        now=now,
        observed_generation=policy.metadata.generation,
    )
    rt.metrics.breaker_open.labels(name).set(1 if open_ else 0)
    rt.metrics.unhealthy_nodes.labels(name).set(len(unhealthy))
    return {
        "observedGeneration": policy.metadata.generation,
        "selectedNodes": len(selected),
        "unhealthyNodes": len(unhealthy),
        "remediatingNodes": len(remediating),
        "allowedUnhealthy": allowed,
        "unhealthyNodeNames": unhealthy[:256],
        "conditions": conds,
    }


def pool_status(rt: Runtime, pool: ReservePool, now: dt.datetime) -> dict[str, Any]:
    name = pool.metadata.name
    members = [v for v in rt.nodes.values() if pool.spec.node_selector.matches(dict(v.labels))]
    claimed = [v for v in members if v.claimed_by]
    available = [v for v in members if not v.claimed_by and v.ready and v.cordoned_by is None]
    low = len(available) < pool.spec.min_available
    conds: list[dict[str, Any]] = [c.to_k8s() for c in pool.status.conditions]
    conds = inc.set_condition(
        conds,
        type_=LOW,
        status="True" if low else "False",
        reason=("NoSpares" if not available else "BelowMinAvailable") if low else "EnoughSpares",
        message=f"{len(available)} available, minAvailable {pool.spec.min_available}",
        now=now,
        observed_generation=pool.metadata.generation,
    )
    conds = inc.set_condition(
        conds,
        type_="Ready",
        status="True",
        reason="Active",
        message="",
        now=now,
        observed_generation=pool.metadata.generation,
    )
    for state, n in (
        ("available", len(available)),
        ("claimed", len(claimed)),
        ("total", len(members)),
    ):
        rt.metrics.pool_nodes.labels(name, state).set(n)
    return {
        "observedGeneration": pool.metadata.generation,
        "available": len(available),
        "claimed": len(claimed),
        "total": len(members),
        "claims": [
            {"node": v.name, "claimedBy": v.claimed_by, "claimedAt": inc.rfc3339(now)}
            for v in claimed
        ][:256],
        "conditions": conds,
    }


def _comparable(status: dict[str, Any]) -> Any:
    """Status without timestamps, to decide whether a write is needed."""
    out = {k: v for k, v in status.items() if k not in ("conditions", "claims")}
    out["conditions"] = sorted(
        (c["type"], c["status"], c["reason"], c["message"]) for c in status.get("conditions", [])
    )
    out["claims"] = sorted((c["node"], c["claimedBy"]) for c in status.get("claims", []))
    return out


async def report_once(rt: Runtime, last: dict[tuple[str, str], Any]) -> None:
    kube = rt.require_kube()
    now = _now()
    for plural, objects, build in (
        (inc.POLICY_PLURAL, rt.policies, policy_status),
        (inc.POOL_PLURAL, rt.pools, pool_status),
    ):
        for name, obj in list(objects.items()):
            status = build(rt, obj, now)
            key = (plural, name)
            current = _comparable(status)
            if last.get(key) == current:
                continue
            old = obj.status.to_k8s()
            if (
                key not in last
                and _comparable({**{"claims": [], "conditions": []}, **old}) == current
            ):
                last[key] = current
                continue
            if plural == inc.POOL_PLURAL:
                # keep claimedAt of known claims
                known = {c.get("node"): c.get("claimedAt") for c in old.get("claims", [])}
                for c in status["claims"]:
                    c["claimedAt"] = known.get(c["node"], c["claimedAt"])
            await kube.patch_custom_status(plural, name, status)
            last[key] = current


async def report_forever(rt: Runtime) -> None:
    last: dict[tuple[str, str], Any] = {}
    while True:
        try:
            # Keys older than the longest escalation window (default 24h) can go.
            rt.forget_before(_now() - dt.timedelta(hours=25))
            await report_once(rt, last)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("status report failed: %s", exc)
        await asyncio.sleep(INTERVAL)
