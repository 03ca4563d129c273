"""What Slurm says of a ReservePool's spares, and refill.

A spare an admin or another tool drained in Slurm (any reason but the pool's `reserveReason`)
or that Slurm set DOWN is never chosen nor resumed: `look_in_slurm` asks the bridge for the
state of the pool's unclaimed spares every `SLURM_LOOK_EVERY`, and the pool's status lists
them (`status.unavailable`) with who drained them and why. The bridge checks again, under
the node's lock, when promotion resumes a spare.

Refill: a ReservePool below minAvailable asks its provider for spares (the extension
point a site's provisioning system answers: Cluster API, a cloud, a BMC script).

`refill.provider: Webhook` POSTs ``{pool, available, minAvailable, wanted, nodeSelector,
since}`` with header ``Idempotency-Key: <pool>-<shortfall start>-<wanted>`` to
`refill.webhook.url`. Any 2xx means accepted: the provider brings nodes up carrying the
pool's labels and they count as spares once Ready. 4xx is recorded (Refused) and not asked
again for the same shortfall; 5xx, 429 or no answer are asked again after the interval.
The decision is `gpuheal.policy.spares.refill_due`; the last request is kept in the pool's
status (`status.refill`), so a restart does not ask twice.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import httpx

from gpuheal.adapters.slurm import SlurmError, SlurmNotFound, UnknownCluster
from gpuheal.api.meta import ConditionStatus, find_condition, parse_duration, scrub_url
from gpuheal.api.names import API_VERSION, POOL_KIND, EventReason, PoolCondition
from gpuheal.api.reservepool import RefillStatus, ReservePool
from gpuheal.policy.spares import REFUSED, RefillAsk, refill_due, slurm_unavailable
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.pools")
#: How often the pool's spares are looked at in Slurm (one bridge read per spare): an admin's
#: drain shows on the pool's status this much later at most; promotion never waits for it
#: (the bridge refuses to resume such a spare whenever it is tried).
SLURM_LOOK_EVERY = dt.timedelta(seconds=30)
SLURM_LOOK_TIMEOUT = 10.0


async def look_in_slurm(rt: Runtime, pool: ReservePool, now: dt.datetime) -> None:
    """Note which unclaimed spares of the pool Slurm keeps out for someone else (a drain
    whose reason is not the pool's reserveReason, or DOWN), at most every SLURM_LOOK_EVERY.
    A bridge that does not answer leaves the last look as it was."""
    slurm = pool.spec.promotion.slurm
    name = pool.metadata.name
    last = rt.slurm_looked_at.get(name)
    if slurm is None or (last is not None and now - last < SLURM_LOOK_EVERY):
        return
    rt.slurm_looked_at[name] = now
    spares = [
        v.name
        for v in rt.nodes.values()
        if pool.spec.node_selector.matches(dict(v.labels)) and not v.claimed_by
    ]

    async def look(node: str) -> None:
        try:
            bridge = rt.slurm_for(node)
            if bridge is None:
                return
            state = await bridge.node(node)
        except SlurmNotFound:
            rt.spares_out_in_slurm.pop(node, None)  # not a Slurm node: nothing keeps it out
            return
        except (SlurmError, UnknownCluster) as exc:
            log.debug("pool %s: %s not looked at in Slurm: %s", name, node, exc)
            return
        why = slurm_unavailable(state, slurm.reserve_reason)
        if why is None:
            rt.spares_out_in_slurm.pop(node, None)
        elif rt.spares_out_in_slurm.get(node) != why:
            log.info("pool %s: spare %s %s: %s", name, node, why.reason, why.message)
            rt.spares_out_in_slurm[node] = why

    try:
        await asyncio.wait_for(
            asyncio.gather(*(look(n) for n in spares)), timeout=SLURM_LOOK_TIMEOUT
        )
    except TimeoutError:
        log.warning("pool %s: the bridge did not answer for every spare in time", name)


async def refill(rt: Runtime, pool: ReservePool, available: int, now: dt.datetime) -> None:
    """Ask the pool's provider for spares when `refill_due` says so; remember the answer."""
    name = pool.metadata.name
    last = rt.refills.get(name) or pool.status.refill
    low = find_condition(pool.status.conditions, PoolCondition.LOW)
    low_since = low.last_transition_time if low and low.status is ConditionStatus.TRUE else None
    ask = refill_due(name, pool.spec, available, low_since=low_since, last=last, now=now)
    if ask is None:
        return
    result, message = await _post(pool, available, ask)
    rt.refills[name] = RefillStatus(
        requested_at=now, wanted=ask.wanted, since=ask.since, result=result, message=message
    )
    log.info("pool %s refill: asked for %d spare(s): %s %s", name, ask.wanted, result, message)
    rt.post_event(
        {"apiVersion": API_VERSION, "kind": POOL_KIND,
         "metadata": {"name": name, "uid": pool.metadata.uid}},
        reason=EventReason.REFILL_REQUESTED,
        message=f"asked the refill provider for {ask.wanted} spare(s): {result} {message}"[:1024],
        type_="Normal" if result == "Accepted" else "Warning",
    )  # fmt: skip


async def _post(pool: ReservePool, available: int, ask: RefillAsk) -> tuple[str, str]:
    webhook = pool.spec.refill.webhook
    assert webhook is not None  # refill_due asks only for a Webhook provider
    payload = {
        "pool": pool.metadata.name,
        "available": available,
        "minAvailable": pool.spec.min_available,
        "wanted": ask.wanted,
        "nodeSelector": {k: v for k, v in pool.spec.node_selector.to_k8s().items() if v},
        "since": ask.since.isoformat(),
    }
    try:
        async with httpx.AsyncClient(
            timeout=parse_duration(webhook.timeout).total_seconds()
        ) as http:
            resp = await http.post(webhook.url, json=payload, headers={"Idempotency-Key": ask.key})
    except httpx.HTTPError as exc:
        return "Unreachable", scrub_url(f"{type(exc).__name__}: {exc}", webhook.url)[:1024]
    text = resp.text[:900]
    if 200 <= resp.status_code <= 299:
        return "Accepted", f"{resp.status_code} {text}".strip()
    if resp.status_code >= 500 or resp.status_code == 429:
        return "Unavailable", f"{resp.status_code} {text}".strip()
    return REFUSED, f"{resp.status_code} {text}".strip()
