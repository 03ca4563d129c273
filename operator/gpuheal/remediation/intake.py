"""From a signal (an Event, a node condition, a dcgm-exporter XID) to an incident.

In order: a signal seen already in this process is a duplicate; a node with an open incident
gets the signal recorded on that incident (its driver then asks the engine whether it climbs
a rung); otherwise the engine decides (open, alert, wait, or nothing) and this module does
what it says. The incident's name is derived from the signal, so a replayed signal maps to
the incident it started and creating it again is a 409, never a second incident.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from gpuheal.api.meta import ObjectMeta, ObjectRef
from gpuheal.api.names import (
    INITIAL_RUNG_ANNOTATION,
    NODE_LABEL,
    NREM_PLURAL,
    TRIGGER_ANNOTATION,
    EventReason,
    Reason,
    incident_name,
)
from gpuheal.api.noderemediation import NodeRemediation, NodeRemediationSpec
from gpuheal.api.remediationpolicy import Action, RemediationPolicy, Rung
from gpuheal.policy import condition_observations, decide
from gpuheal.policy.engine import same_fault
from gpuheal.policy.inputs import node_view, signal_record
from gpuheal.policy.types import (
    Act,
    Blocked,
    IncidentSummary,
    Move,
    NodeView,
    Observation,
    Trigger,
    Wait,
)
from gpuheal.remediation.driver import ensure_driver
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.intake")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def observe(rt: Runtime, node: str, obs: Observation) -> str:
    """Handle one signal; returns what became of it (also counted in gpuheal_signals_total)."""
    result = await _observe(rt, node, obs)
    rt.metrics.signals.labels(obs.source, result).inc()
    if result not in ("duplicate", "ignored", "pending"):
        log.info(
            "signal %s on %s: %s",
            obs.key,
            node,
            result,
            extra={"node": node, "xid": obs.xid, "result": result},
        )
    return result


async def _observe(rt: Runtime, node: str, obs: Observation) -> str:  # noqa: PLR0911
    earlier = tuple(rt.history.get(node, ()))
    if not rt.remember(node, obs):
        return "duplicate"
    if any(same_fault(o, obs) for o in earlier):
        return "duplicate"  # another reporter of a fault seen already (NPD's two Events, dcgm)
    if any(obs.key in i.trigger_keys or obs.identity in i.recorded for i in rt.incidents.values()):
        return "duplicate"  # a signal an incident recorded, seen again (relist, restart)
    view = await _node_view(rt, node)
    policy = rt.policy_of(node)
    if view is None or policy is None:
        return "ignored"
    async with rt.node_lock(node):
        active = rt.active_incident(node)
        if active is not None:
            await _attach(rt, active, obs)
            return "attached"
        decision = decide(
            policy.spec,
            rt.engine_view(view),
            rt.node_history(node),
            rt.counts(policy.metadata.name),
            _now(),
            new=obs,
            max_signal_age=dt.timedelta(seconds=rt.config.event_max_age),
        )
        if isinstance(decision, Wait):  # a condition not held long enough: look again then
            rt.forget(node, obs)
            _look_again(rt, node, obs, decision.until)
            return "pending"
        if isinstance(decision, Act) and decision.trigger is not None:
            if decision.operation is Action.ALERT:
                await _post(rt, view, EventReason.DETECTED, decision.message)
                return "alerted"
            if decision.operation is Move.OPEN:
                return await _open(rt, policy, view, decision.trigger)
        if isinstance(decision, Blocked):
            await _post(rt, view, EventReason.STEP_BLOCKED, f"{obs.what}: {decision.message}")
            rt.metrics.blocked.labels(decision.reason).inc()
            return "blocked"
        return "stale" if decision.reason == Reason.STALE else "ignored"


async def _node_view(rt: Runtime, node: str) -> NodeView | None:
    view = rt.nodes.get(node)
    if view is None:
        body = await rt.require_kube().get_node(node)
        if body is None:
            return None
        view = node_view(body)
        rt.set_node(view)
    return view


async def _open(rt: Runtime, policy: RemediationPolicy, view: NodeView, trigger: Trigger) -> str:
    """Record the incident; its driver takes it from there."""
    signal = trigger.signal
    name = incident_name(view.name, signal.key)
    # The rule's ladder, with the rung it opens at as the engine guarded it.
    ladder = [
        Rung(name=r.name, steps=list(trigger.steps)) if i == trigger.rung else r
        for i, r in enumerate(trigger.rule.ladder)
    ]
    nrem = NodeRemediation(
        metadata=ObjectMeta(
            name=name,
            labels={NODE_LABEL: view.name if len(view.name) <= 63 else view.uid},
            annotations={
                TRIGGER_ANNOTATION: signal.key[:1000],
                INITIAL_RUNG_ANNOTATION: str(trigger.rung),
            },
        ),
        spec=NodeRemediationSpec(
            node_name=view.name,
            policy_ref=ObjectRef(name=policy.metadata.name),
            rule=trigger.rule.name,
            signals=[signal_record(signal)],
            ladder=ladder,
            dry_run=policy.spec.safety.dry_run,
        ),
    )
    created = await rt.require_kube().create_custom(NREM_PLURAL, _wire(nrem))
    if created is None:
        return "duplicate"
    rt.incidents[name] = IncidentSummary(
        name=name,
        node=view.name,
        policy=policy.metadata.name,
        active=True,
        holds_slot=False,
        trigger_keys=frozenset({signal.key}),
    )
    rt.metrics.incidents.labels(
        "xid" if signal.xid is not None else "condition", signal.source or "manual"
    ).inc()
    ensure_driver(rt, name)
    await _post(
        rt,
        view,
        EventReason.REMEDIATION_CREATED,
        f"{signal.what}: NodeRemediation {name} (rule {trigger.rule.name}, "
        f"rung {trigger.rule.ladder[trigger.rung].name})",
    )
    return "incident"


def _wire(nrem: NodeRemediation) -> dict[str, Any]:
    body = nrem.to_k8s()
    body.pop("status", None)  # the status subresource ignores it on create anyway
    meta = body["metadata"]
    body["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if meta.get(k)}
    return body


async def _attach(rt: Runtime, active: IncidentSummary, obs: Observation) -> None:
    """Record the new signal on the open incident and wake its driver: the engine decides
    there whether it climbs a rung."""
    kube = rt.require_kube()
    body = await kube.get_custom(NREM_PLURAL, active.name)
    if body is None:
        return
    nrem = NodeRemediation.model_validate(body)
    record = signal_record(obs)
    if any(
        (s.observed_at, s.xid, s.event_uid, s.condition_type)
        == (record.observed_at, record.xid, record.event_uid, record.condition_type)
        for s in nrem.spec.signals
    ):
        return
    signals = [*nrem.spec.signals, record][-64:]
    await kube.patch_custom(
        NREM_PLURAL,
        active.name,
        {"spec": {"signals": [s.to_k8s() for s in signals]}},
    )
    ensure_driver(rt, active.name)
    await kube.post_event(body, reason=EventReason.SIGNAL_ATTACHED, message=f"{obs.what} attached")


async def _post(rt: Runtime, view: NodeView, reason: EventReason, message: str) -> None:
    await rt.require_kube().post_event(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": view.name, "uid": view.uid}},
        reason=reason,
        message=message,
        type_="Warning",
    )


# ---- node conditions -------------------------------------------------------------------
def check_conditions(rt: Runtime, view: NodeView) -> None:
    """Every watched condition the node holds in its bad status becomes a signal (once per
    bad spell: the key carries its lastTransitionTime). No I/O while the node is healthy."""
    policy = rt.policy_of(view.name)
    if policy is None:
        return
    for obs in condition_observations(policy.spec, view):
        if obs.key not in rt.seen_keys and obs.key not in rt.condition_timers:
            _spawn_observe(rt, view.name, obs)


def _spawn_observe(rt: Runtime, node: str, obs: Observation) -> None:
    task = asyncio.create_task(observe(rt, node, obs), name=f"observe:{obs.key}")
    rt.tasks.append(task)
    task.add_done_callback(rt.tasks.remove)


def _look_again(rt: Runtime, node: str, obs: Observation, at: dt.datetime) -> None:
    if obs.key in rt.condition_timers:
        return
    loop = asyncio.get_running_loop()

    def fire() -> None:
        rt.condition_timers.pop(obs.key, None)
        _spawn_observe(rt, node, obs)

    delay = max(0.05, (at - _now()).total_seconds() + 0.05)
    rt.condition_timers[obs.key] = loop.call_later(delay, fire)
