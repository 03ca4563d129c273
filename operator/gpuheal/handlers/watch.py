"""Compact views (Nodes, policies, pools, incidents) and node-condition detection.

gpuheal's own objects come through kopf ``on.event`` handlers (they never write kopf
bookkeeping). Nodes come through a watch of our own (`sources.watch_nodes`): paginated LIST,
then a watch with bookmarks, so at most one page of full Node bodies is ever in memory;
kopf's Node LIST is one un-paginated GET of every body. A Node event costs one dict
reduction (`incident.node_view`) and a few comparisons, and no API call while nothing is
wrong.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import kopf
from pydantic import ValidationError

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal.api.noderemediation import COMPLETED, CORDONED, NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.handlers import detect
from gpuheal.handlers.remediation import ensure_driver
from gpuheal.handlers.runtime import IncidentView, Runtime

log = logging.getLogger("gpuheal.watch")


def _rt(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- Nodes -----------------------------------------------------------------------------
def node_changed(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    """A Node was listed, added, modified or deleted (see `sources.watch_nodes`)."""
    name = (body.get("metadata") or {}).get("name")
    if not name:
        return
    if type_ == "DELETED":
        rt.nodes.pop(name, None)
        rt.metrics.nodes_watched.set(len(rt.nodes))
        return
    view = inc.node_view(body)
    rt.nodes[name] = view
    rt.metrics.nodes_watched.set(len(rt.nodes))
    if "conditions" in rt.config.sources:
        check_conditions(rt, view)


def check_conditions(rt: Runtime, view: inc.NodeView, now: dt.datetime | None = None) -> None:
    """Start a signal for each watched condition held for its `for`; schedule a second look
    for one held shorter. No I/O unless a condition is bad."""
    choice = plan.choose_policy(rt.policies.values(), view.labels)
    policy = choice.policy
    if policy is None:
        return
    now = now or _now()
    for type_, bad in plan.watched_conditions(policy):
        cond = view.condition(type_)
        if cond is None or cond.status != bad:
            continue
        need = plan.held_for(policy, type_, bad) or dt.timedelta(0)
        since = cond.since or now
        key = f"condition/{view.name}/{type_}={bad}/{inc.rfc3339(since)}"
        if key in rt.seen_keys:
            continue
        if now - since >= need:
            signal = plan.Signal(
                source="conditions",
                key=key,
                time=since,
                condition_type=type_,
                condition_status=bad,
                message=f"{type_}={bad} ({cond.reason}) since {inc.rfc3339(since)}",
            )
            rt.tasks.append(asyncio.create_task(detect.observe(rt, view.name, signal)))
        else:
            _recheck_later(rt, view.name, type_, (since + need - now).total_seconds())


def _recheck_later(rt: Runtime, node: str, type_: str, delay: float) -> None:
    key = (node, type_)
    if key in rt.condition_timers:
        return
    loop = asyncio.get_running_loop()

    def fire() -> None:
        rt.condition_timers.pop(key, None)
        view = rt.nodes.get(node)
        if view is not None:
            check_conditions(rt, view)

    rt.condition_timers[key] = loop.call_later(max(0.05, delay + 0.05), fire)


# ---- gpuheal objects -------------------------------------------------------------------
@kopf.on.event("gpuheal.io", "v1alpha1", "remediationpolicies")
async def policy_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    rt = _rt(memo)
    set_policy(rt, type, dict(body))


def set_policy(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.policies.pop(name, None)
        return
    try:
        rt.policies[name] = RemediationPolicy.model_validate(body)
    except ValidationError as exc:
        log.error("RemediationPolicy %s does not parse; ignoring it: %s", name, exc)
        rt.policies.pop(name, None)
        return
    if "conditions" in rt.config.sources:
        for view in list(rt.nodes.values()):
            check_conditions(rt, view)


@kopf.on.event("gpuheal.io", "v1alpha1", "reservepools")
async def pool_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    set_pool(_rt(memo), type, dict(body))


def set_pool(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.pools.pop(name, None)
        return
    try:
        rt.pools[name] = ReservePool.model_validate(body)
    except ValidationError as exc:
        log.error("ReservePool %s does not parse; ignoring it: %s", name, exc)


@kopf.on.event("gpuheal.io", "v1alpha1", "noderemediations")
async def incident_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    rt = _rt(memo)
    if set_incident(rt, type, dict(body)):
        ensure_driver(rt, body["metadata"]["name"])


def set_incident(rt: Runtime, type_: str | None, body: dict[str, Any]) -> bool:
    """Update the incident view; True if the incident is active (needs a driver)."""
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.incidents.pop(name, None)
        task = rt.drivers.pop(name, None)
        if task is not None:
            task.cancel()
        for holders in rt.slots.values():
            holders.discard(name)
        return False
    try:
        nrem = NodeRemediation.model_validate(body)
    except ValidationError as exc:
        log.error("NodeRemediation %s does not parse; ignoring it: %s", name, exc)
        return False
    done = any(c.type == COMPLETED and c.status.value == "True" for c in nrem.status.conditions)
    cordoned = next((c for c in nrem.status.conditions if c.type == CORDONED), None)
    holds = (
        not done
        and not nrem.spec.dry_run
        and cordoned is not None
        and cordoned.status.value == "True"
    )
    keys = {nrem.metadata.annotations.get(inc.TRIGGER_ANNOTATION, "")} - {""}
    rt.incidents[name] = IncidentView(
        name=name,
        node=nrem.spec.node_name,
        policy=nrem.spec.policy_ref.name,
        active=not done,
        holds_slot=holds,
        trigger_keys=frozenset(keys),
        replacement=nrem.status.replacement_node,
        started=cordoned.last_transition_time if cordoned is not None else None,
    )
    rt.metrics.active_incidents.set(sum(1 for i in rt.incidents.values() if i.active))
    return not done
