"""From a signal (Event, node condition, dcgm-exporter) to an incident, for all sources.

Dedupe, in order: the signal's key seen already in this process; an active incident on the
node (the signal is attached to it and may escalate it); the deterministic incident name
(a replayed signal maps to the name of the incident it started: the create is a 409).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal.api.noderemediation import SignalRecord, SignalSource
from gpuheal.api.remediationpolicy import Action
from gpuheal.handlers.remediation import INITIAL_RUNG_ANNOTATION
from gpuheal.handlers.runtime import IncidentView, Runtime

log = logging.getLogger("gpuheal.detect")

_SOURCE = {
    "events": SignalSource.EVENT,
    "conditions": SignalSource.CONDITION,
    "dcgm": SignalSource.DCGM_EXPORTER,
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def signal_record(signal: plan.Signal) -> dict[str, Any]:
    gpu = signal.gpu
    record = SignalRecord(
        source=_SOURCE.get(signal.source, SignalSource.MANUAL),
        observed_at=signal.time,
        xid=signal.xid,
        pci_bus_id=gpu if gpu and not gpu.startswith("GPU-") else None,
        gpu_uuid=gpu if gpu and gpu.startswith("GPU-") else None,
        recovery_action=signal.recovery_action,
        condition_type=signal.condition_type,
        event_reason=signal.event_reason,
        event_uid=signal.event_uid,
        message=signal.message[:1024],
    )
    return record.to_k8s()


async def node_view(rt: Runtime, node: str) -> inc.NodeView | None:
    view = rt.nodes.get(node)
    if view is None:
        body = await rt.require_kube().get_node(node)
        if body is None:
            return None
        view = inc.node_view(body)
        rt.nodes[node] = view
    return view


async def observe(rt: Runtime, node: str, signal: plan.Signal, *, stale: bool = False) -> str:
    """Handle one signal; returns what became of it (also counted in gpuheal_signals_total)."""
    result = await _observe(rt, node, signal, stale=stale)
    rt.metrics.signals.labels(signal.source, result).inc()
    if result not in ("duplicate", "ignored"):
        log.info(
            "signal %s on %s: %s",
            signal.key,
            node,
            result,
            extra={"node": node, "xid": signal.xid, "result": result},
        )
    return result


async def _observe(rt: Runtime, node: str, signal: plan.Signal, *, stale: bool) -> str:  # noqa: PLR0911, PLR0912
    if not rt.remember(node, signal):
        return "duplicate"
    if any(signal.key in i.trigger_keys for i in rt.incidents.values()):
        return "duplicate"  # the signal that opened an incident, seen again (relist, restart)
    if stale:
        return "stale"
    view = await node_view(rt, node)
    if view is None:
        return "ignored"
    choice = plan.choose_policy(rt.policies.values(), view.labels)
    policy = choice.policy
    if policy is None:
        return "ignored"
    history = list(rt.history.get(node, ()))
    if signal.condition_type is not None:
        rule = plan.match_rule(policy, signal)
        if rule is None:
            return "ignored"
        count, rung, steps = 1, 0, list(rule.ladder[0].steps)
    else:
        trigger = plan.trigger_for(policy, view, signal, history)
        if trigger is None:
            return "ignored"
        rule, count, rung, steps = trigger.rule, trigger.count, trigger.rung, list(trigger.steps)
    kube = rt.require_kube()
    node_ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": view.uid}}
    if policy.spec.safety.opt_out_label in view.labels:
        await kube.post_event(
            node_ref,
            reason=inc.EventReason.STEP_BLOCKED,
            type_="Warning",
            message=f"{_what(signal)} matched rule {rule.name}, but the node "
            f"opted out ({policy.spec.safety.opt_out_label})",
        )
        rt.metrics.blocked.labels("OptedOut").inc()
        return "blocked"
    async with rt.node_lock(node):
        active = rt.active_incident(node)
        if active is not None:
            await _attach(rt, active, signal, rung)
            return "attached"
        if all(s.action is Action.ALERT for s in steps):
            await kube.post_event(
                node_ref,
                reason=inc.EventReason.DETECTED,
                type_="Warning",
                message=f"{_what(signal)} (rule {rule.name}, occurrence {count}): alert only",
            )
            return "alerted"
        name = inc.incident_name(node, signal.key)
        body = {
            "apiVersion": f"{inc.GROUP}/{inc.VERSION}",
            "kind": inc.NREM_KIND,
            "metadata": {
                "name": name,
                "labels": {inc.NODE_LABEL: node[:63] if len(node) <= 63 else view.uid},
                "annotations": {
                    inc.TRIGGER_ANNOTATION: signal.key[:1000],
                    INITIAL_RUNG_ANNOTATION: str(rung),
                },
            },
            "spec": {
                "nodeName": node,
                "policyRef": {"name": policy.metadata.name},
                "rule": rule.name,
                "signals": [signal_record(signal)],
                # The rule's ladder, with the rung it opens at as the engine guarded it.
                "ladder": [
                    {**r.to_k8s(), "steps": [s.to_k8s() for s in steps]}
                    if i == rung
                    else r.to_k8s()
                    for i, r in enumerate(rule.ladder)
                ],
                "dryRun": policy.spec.safety.dry_run,
            },
        }
        created = await kube.create_custom(inc.NREM_PLURAL, body)
        if created is None:
            return "duplicate"
        rt.incidents[name] = IncidentView(
            name=name,
            node=node,
            policy=policy.metadata.name,
            active=True,
            holds_slot=False,
            trigger_keys=frozenset({signal.key}),
        )
    rt.metrics.incidents.labels(
        "xid" if signal.xid is not None else "condition", signal.source
    ).inc()
    await kube.post_event(
        node_ref,
        reason=inc.EventReason.REMEDIATION_CREATED,
        type_="Warning",
        message=f"{_what(signal)}: NodeRemediation {name} (rule {rule.name}, "
        f"rung {rule.ladder[rung].name})",
    )
    from gpuheal.handlers.remediation import ensure_driver

    ensure_driver(rt, name)
    return "incident"


async def _attach(rt: Runtime, active: IncidentView, signal: plan.Signal, rung: int) -> None:
    """Record the new signal on the running incident; climb to ``rung`` if it is higher."""
    kube = rt.require_kube()
    body = await kube.get_custom(inc.NREM_PLURAL, active.name)
    if body is None:
        return
    spec = body.get("spec") or {}
    signals = list(spec.get("signals") or [])
    if any(
        s.get("eventUid")
        and s.get("eventUid") == signal.event_uid
        and s.get("observedAt") == inc.rfc3339(signal.time)
        for s in signals
    ):
        return
    signals = [*signals, signal_record(signal)][-64:]
    await kube.patch_custom(inc.NREM_PLURAL, active.name, {"spec": {"signals": signals}})
    status = body.get("status") or {}
    if rung > int(status.get("rung", 0)) and rung < len(spec.get("ladder") or []):
        await kube.patch_custom_status(inc.NREM_PLURAL, active.name, {"rung": rung, "nextStep": 0})
    await kube.post_event(
        body,
        reason=inc.EventReason.SIGNAL_ATTACHED,
        message=f"{_what(signal)} attached"
        + (f"; escalated to rung {rung}" if rung > int(status.get("rung", 0)) else ""),
    )


def _what(signal: plan.Signal) -> str:
    if signal.xid is not None:
        return f"XID {signal.xid}" + (f" on GPU {signal.gpu}" if signal.gpu else "")
    if signal.condition_type:
        return f"condition {signal.condition_type}={signal.condition_status}"
    return f"event {signal.event_reason}"
