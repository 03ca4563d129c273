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
from collections.abc import Coroutine
from typing import Any

from gpuheal import crashpoints
from gpuheal.api.meta import ObjectMeta, ObjectRef
from gpuheal.api.names import (
    INITIAL_RUNG_ANNOTATION,
    NODE_LABEL,
    NREM_PLURAL,
    TRIGGER_ANNOTATION,
    WHY_ANNOTATION,
    EventReason,
    Reason,
    incident_name,
)
from gpuheal.api.noderemediation import NodeRemediation, NodeRemediationSpec
from gpuheal.api.remediationpolicy import Action, RemediationPolicy, Rung
from gpuheal.policy import condition_observations, decide
from gpuheal.policy.engine import same_fault
from gpuheal.policy.inputs import signal_record
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
from gpuheal.remediation import historywriter as history
from gpuheal.remediation.driver import ensure_driver
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.intake")
RETRIES = 6  # a signal whose handling fails is tried again after 1, 2, 4 ... 32 s


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def submit(rt: Runtime, node: str, obs: Observation) -> None:
    """Hand a signal over and return at once, unless ``--signal-concurrency`` signals are in
    hand already (then wait for a free place: a burst slows the watch down, it does not pile
    up tasks). Signals of different nodes run side by side; one node's run one at a time in
    the order they came (`observe` takes the node's lock, and asyncio locks are FIFO)."""
    await rt.intake_slots.acquire()
    try:
        _spawn_observe(rt, node, obs, slot=True)
    except BaseException:
        rt.intake_slots.release()
        raise


async def observe(rt: Runtime, node: str, obs: Observation, attempt: int = 0) -> str:
    """Handle one signal; returns what became of it (also counted in gpuheal_signals_total).
    The node's signals are handled one at a time. A signal whose handling failed (the API
    server refused the incident's create, say) is forgotten and handled again later, with
    backoff, up to `RETRIES` times; then it is logged as an error, never dropped silently."""
    async with rt.node_lock(node):
        try:
            result = await _observe(rt, node, obs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            rt.forget(node, obs)
            result = "retry" if attempt < RETRIES else "failed"
            log.error(
                "signal %s on %s: %s: %s%s",
                obs.key,
                node,
                type(exc).__name__,
                exc,
                f"; again in {2**attempt} s" if result == "retry" else "; giving up",
                extra={"node": node, "xid": obs.xid, "result": result},
            )
            if result == "retry":
                asyncio.get_running_loop().call_later(
                    2**attempt, lambda: _spawn_observe(rt, node, obs, attempt=attempt + 1)
                )
    rt.metrics.signals.labels(obs.source, result).inc()
    if result not in ("duplicate", "pending", "retry", "failed") and node in rt.nodes:
        history.signal(rt, node, obs, result)  # never a FaultHistory for a made-up node name
    if result not in ("duplicate", "ignored", "pending", "retry", "failed"):
        log.info(
            "signal %s on %s: %s",
            obs.key,
            node,
            result,
            extra={"node": node, "xid": obs.xid, "result": result},
        )
    return result


async def _observe(rt: Runtime, node: str, obs: Observation) -> str:  # noqa: PLR0911
    view = rt.nodes.get(node)
    policy = rt.policy_of(node)
    if view is None or policy is None:
        # A node no policy governs, or no Node at all (an Event may name any node): nothing is
        # recorded and nothing is asked of the API server, whatever the signal says.
        return "ignored"
    earlier = tuple(rt.history.get(node, ()))
    if not rt.remember(node, obs):
        return "duplicate"
    if any(same_fault(o, obs) for o in earlier):
        return "duplicate"  # another reporter of a fault seen already (NPD's two Events, dcgm)
    if rt.incidents.recorded(obs.key, node, obs.identity):
        return "duplicate"  # a signal an incident recorded, seen again (relist, restart)
    if rt.seen_in_history(node, obs):
        return "duplicate"  # in the node's FaultHistory: handled before a restart
    active = rt.active_incident(node)
    if active is not None:
        return "attached" if await _attach(rt, active, obs) else "coalesced"
    now = _now()
    decision = decide(
        policy.spec,
        rt.engine_view(view),
        rt.node_history(node),
        rt.counts(policy.metadata.name, now),
        now,
        new=obs,
        max_signal_age=dt.timedelta(seconds=rt.config.event_max_age),
    )
    if isinstance(decision, Wait):  # a condition not held long enough: look again then
        rt.forget(node, obs)
        _look_again(rt, node, obs, decision.until)
        return "pending"
    if isinstance(decision, Act) and decision.trigger is not None:
        if decision.operation is Action.ALERT:
            _post(rt, view, EventReason.DETECTED, decision.message)
            return "alerted"
        if decision.operation is Move.OPEN:
            return await _open(rt, policy, view, decision.trigger)
    if isinstance(decision, Blocked):
        _post(rt, view, EventReason.STEP_BLOCKED, f"{obs.what}: {decision.message}")
        rt.metrics.blocked.labels(decision.reason).inc()
        return "blocked"
    return "stale" if decision.reason == Reason.STALE else "ignored"


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
                WHY_ANNOTATION: (trigger.repeat or trigger.why)[:256],
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
    crashpoints.at("nrem-create", "before")
    created = await rt.require_kube().create_custom(NREM_PLURAL, _wire(nrem))
    crashpoints.at("nrem-create", "after")
    if created is None:
        return "duplicate"
    rt.incident_seen(NodeRemediation.model_validate(created), ours=True)
    rt.metrics.incidents.labels(
        "xid" if signal.xid is not None else "condition", signal.source or "manual"
    ).inc()
    ensure_driver(rt, name)
    history.opened(
        rt, view.name, name, rule=trigger.rule.name, rung=trigger.rung,
        why=trigger.repeat or trigger.why,
    )  # fmt: skip
    _post(
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


ATTACH_EVERY = dt.timedelta(seconds=1)
"""An incident is written at most once a second: the signals of a burst are recorded together
(the object keeps the last 64), with one `SignalAttached` Event."""
MAX_SIGNALS = 64


async def _attach(rt: Runtime, active: IncidentSummary, obs: Observation) -> bool:
    """Record the new signal on the open incident and wake its driver: the engine decides
    there whether it climbs a rung (it reads the node's history in memory too, so it need not
    wait for the write). A flood of signals (10,000 Events in a minute) costs one write per
    second, not one per signal: False when this one waits for the next write."""
    name = active.name
    ensure_driver(rt, name)
    queued = rt.attach_pending.get(name)
    if queued is not None:  # a write is due: it takes this one too
        queued.append(obs)
        del queued[:-MAX_SIGNALS]
        return False
    now = _now()
    last = rt.attached_at.get(name)
    if last is not None and now - last < ATTACH_EVERY:
        rt.attach_pending[name] = [obs]
        delay = (last + ATTACH_EVERY - now).total_seconds()
        asyncio.get_running_loop().call_later(
            delay, lambda: _spawn(rt, f"attach:{name}", _flush(rt, name))
        )
        return False
    rt.attached_at[name] = now
    return await _record(rt, name, [obs])


async def _flush(rt: Runtime, name: str) -> None:
    """The due write: every signal that waited for it, in one."""
    batch = rt.attach_pending.pop(name, [])
    rt.attached_at[name] = _now()
    try:
        await _record(rt, name, batch)
    except Exception as exc:  # the signals stay in memory; the next signal writes again
        log.warning("recording %d signal(s) on %s failed: %s", len(batch), name, exc)


async def _record(rt: Runtime, name: str, observations: list[Observation]) -> bool:
    """One write of `observations` to the incident's `spec.signals` (those not there yet)."""
    kube = rt.require_kube()
    body = await kube.get_custom(NREM_PLURAL, name)
    if body is None:
        return False
    nrem = NodeRemediation.model_validate(body)
    seen = {(s.observed_at, s.xid, s.event_uid, s.condition_type) for s in nrem.spec.signals}
    records = []
    for obs in observations:
        record = signal_record(obs)
        key = (record.observed_at, record.xid, record.event_uid, record.condition_type)
        if key not in seen:
            seen.add(key)
            records.append(record)
    if not records:
        return False
    signals = [*nrem.spec.signals, *records][-MAX_SIGNALS:]
    patched = await kube.patch_custom(
        NREM_PLURAL, name, {"spec": {"signals": [s.to_k8s() for s in signals]}}
    )
    rt.incident_seen(NodeRemediation.model_validate(patched), ours=True)
    ensure_driver(rt, name)
    what = observations[-1].what
    message = f"{what} attached" + (f" (and {len(records) - 1} more)" if len(records) > 1 else "")
    rt.post_event(body, reason=EventReason.SIGNAL_ATTACHED, message=message)
    return True


def _post(rt: Runtime, view: NodeView, reason: EventReason, message: str) -> None:
    rt.post_event(
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


def _spawn_observe(
    rt: Runtime, node: str, obs: Observation, *, slot: bool = False, attempt: int = 0
) -> None:
    """`observe` as a task of its own (kept in ``rt.tasks`` so that stop() cancels it);
    ``slot``: it holds one of `submit`'s places, given back when it ends."""
    task = asyncio.create_task(observe(rt, node, obs, attempt), name=f"observe:{obs.key}")
    _track(rt, task, slot=slot)


def _spawn(rt: Runtime, name: str, coro: Coroutine[Any, Any, Any]) -> None:
    _track(rt, asyncio.create_task(coro, name=name))


def _track(rt: Runtime, task: asyncio.Task[Any], *, slot: bool = False) -> None:
    rt.tasks.append(task)

    def done(task: asyncio.Task[str]) -> None:
        rt.tasks.remove(task)
        if slot:
            rt.intake_slots.release()

    task.add_done_callback(done)


def _look_again(rt: Runtime, node: str, obs: Observation, at: dt.datetime) -> None:
    if obs.key in rt.condition_timers:
        return
    loop = asyncio.get_running_loop()

    def fire() -> None:
        rt.condition_timers.pop(obs.key, None)
        _spawn_observe(rt, node, obs)

    delay = max(0.05, (at - _now()).total_seconds() + 0.05)
    rt.condition_timers[obs.key] = loop.call_later(delay, fire)
