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
from gpuheal.policy import condition_observations, reading
from gpuheal.policy.engine import same_fault
from gpuheal.policy.inputs import signal_record
from gpuheal.policy.snapshot import snapshot_rung
from gpuheal.policy.types import (
    Act,
    Blocked,
    Decision,
    Idle,
    IncidentSummary,
    Move,
    NodeView,
    Observation,
    Trigger,
    Wait,
)
from gpuheal.remediation import historywriter as history
from gpuheal.remediation.driver import ensure_driver
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports, take_in

log = logging.getLogger("gpuheal.intake")
RETRIES = 6  # a signal whose handling fails is tried again after 1, 2, 4 ... 32 s


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def submit(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, node: str, obs: Observation
) -> None:
    """Hand a signal over and return at once, unless ``--signal-concurrency`` signals are in
    hand already (then wait for a free place: a burst slows the watch down, it does not pile
    up tasks). Signals of different nodes run side by side; one node's run one at a time in
    the order they came (`observe` takes the node's lock, and asyncio locks are FIFO)."""
    await books.intake_slots.acquire()
    try:
        _spawn_observe(ports, cluster, books, node, obs, slot=True)
    except BaseException:
        books.intake_slots.release()
        raise


async def observe(  # noqa: PLR0917
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    node: str,
    obs: Observation,
    attempt: int = 0,
) -> str:
    """Handle one signal; returns what became of it (also counted in gpuheal_signals_total).
    The node's signals are handled one at a time. A signal whose handling failed (the API
    server refused the incident's create, say) is forgotten and handled again later, with
    backoff, up to `RETRIES` times; then it is logged as an error, never dropped silently."""
    async with books.node_lock(node):
        try:
            result = await _observe(ports, cluster, books, node, obs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cluster.forget(node, obs)
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
                    2**attempt,
                    lambda: _spawn_observe(ports, cluster, books, node, obs, attempt=attempt + 1),
                )
    ports.metrics.signals.labels(obs.source, result).inc()
    if result not in ("duplicate", "pending", "retry", "failed") and node in cluster.nodes:
        history.signal(
            cluster, books, node, obs, result
        )  # never a FaultHistory for a made-up node name
    if result not in ("duplicate", "ignored", "pending", "retry", "failed"):
        log.info(
            "signal %s on %s: %s",
            obs.key,
            node,
            result,
            extra={"node": node, "xid": obs.xid, "result": result},
        )
    return result


async def _observe(  # noqa: PLR0911
    ports: Ports, cluster: ClusterView, books: Bookkeeping, node: str, obs: Observation
) -> str:
    view = cluster.nodes.get(node)
    policy = cluster.policy_of(node)
    if view is None or policy is None:
        # A node no policy governs, or no Node at all (an Event may name any node): nothing is
        # recorded and nothing is asked of the API server, whatever the signal says.
        return "ignored"
    earlier = tuple(cluster.history.get(node, ()))
    if not cluster.remember(node, obs):
        return "duplicate"
    if any(same_fault(o, obs) for o in earlier):
        return "duplicate"  # another reporter of a fault seen already (NPD's two Events, dcgm)
    if cluster.incidents.recorded(obs.key, node, obs.identity):
        return "duplicate"  # a signal an incident recorded, seen again (relist, restart)
    if cluster.seen_in_history(node, obs):
        return "duplicate"  # in the node's FaultHistory: handled before a restart
    active = cluster.active_incident(node)
    if active is not None:
        return "attached" if await _attach(ports, cluster, books, active, obs) else "coalesced"
    decision = judge(
        cluster, node, obs, _now(), max_signal_age=dt.timedelta(seconds=ports.config.event_max_age)
    )
    if isinstance(decision, Wait):  # a condition not held long enough: look again then
        cluster.forget(node, obs)
        _look_again(ports, cluster, books, node, obs, decision.until)
        return "pending"
    if isinstance(decision, Act) and decision.trigger is not None:
        if decision.operation is Action.ALERT:
            _post(ports, view, EventReason.DETECTED, decision.message)
            return "alerted"
        if decision.operation is Move.OPEN:
            return await _open(ports, cluster, books, policy, view, decision.trigger)
    if isinstance(decision, Blocked):
        _post(ports, view, EventReason.STEP_BLOCKED, f"{obs.what}: {decision.message}")
        ports.metrics.blocked.labels(decision.reason).inc()
        return "blocked"
    return "stale" if decision.reason == Reason.STALE else "ignored"


def judge(
    cluster: ClusterView,
    node: str,
    obs: Observation,
    now: dt.datetime,
    *,
    max_signal_age: dt.timedelta,
) -> Decision:
    """The engine's answer for a new signal on a node without an open incident, from the
    inputs `gpuheal explain` builds the same way (`policy.reading`) out of our caches."""
    judged = reading.judge(cluster.reading(), node, now, new=obs, max_signal_age=max_signal_age)
    if judged is None:  # no policy governs the node (any more)
        return Idle(Reason.NO_POLICY, f"no RemediationPolicy governs {node}")
    return judged[1]


async def _open(  # noqa: PLR0917
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    policy: RemediationPolicy,
    view: NodeView,
    trigger: Trigger,
) -> str:
    """Record the incident; its driver takes it from there."""
    signal = trigger.signal
    name = incident_name(view.name, signal.key)
    # The rule's ladder, with the rung it opens at as the engine guarded it; webhook URLs
    # kept as scheme and host (`policy.snapshot`: the step reads them from the policy).
    ladder = [
        snapshot_rung(Rung(name=r.name, steps=list(trigger.steps)) if i == trigger.rung else r)
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
    created = await ports.require_kube().create_custom(NREM_PLURAL, _wire(nrem))
    crashpoints.at("nrem-create", "after")
    if created is None:
        return "duplicate"
    take_in(ports, cluster, NodeRemediation.model_validate(created), ours=True)
    ports.metrics.incidents.labels(
        "xid" if signal.xid is not None else "condition", signal.source or "manual"
    ).inc()
    ensure_driver(ports, cluster, books, name)
    history.opened(books, view.name, name, rule=trigger.rule.name, rung=trigger.rung,
        why=trigger.repeat or trigger.why,
    )  # fmt: skip
    _post(
        ports,
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


async def _attach(
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    active: IncidentSummary,
    obs: Observation,
) -> bool:
    """Record the new signal on the open incident and wake its driver: the engine decides
    there whether it climbs a rung (it reads the node's history in memory too, so it need not
    wait for the write). A flood of signals (10,000 Events in a minute) costs one write per
    second, not one per signal: False when this one waits for the next write."""
    name = active.name
    ensure_driver(ports, cluster, books, name)
    queued = books.attach_pending.get(name)
    if queued is not None:  # a write is due: it takes this one too
        queued.append(obs)
        del queued[:-MAX_SIGNALS]
        return False
    now = _now()
    last = books.attached_at.get(name)
    if last is not None and now - last < ATTACH_EVERY:
        books.attach_pending[name] = [obs]
        delay = (last + ATTACH_EVERY - now).total_seconds()
        asyncio.get_running_loop().call_later(
            delay, lambda: _spawn(books, f"attach:{name}", _flush(ports, cluster, books, name))
        )
        return False
    books.attached_at[name] = now
    return await _record(ports, cluster, books, name, [obs])


async def _flush(ports: Ports, cluster: ClusterView, books: Bookkeeping, name: str) -> None:
    """The due write: every signal that waited for it, in one."""
    batch = books.attach_pending.pop(name, [])
    books.attached_at[name] = _now()
    try:
        await _record(ports, cluster, books, name, batch)
    except Exception as exc:  # the signals stay in memory; the next signal writes again
        log.warning("recording %d signal(s) on %s failed: %s", len(batch), name, exc)


async def _record(
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    name: str,
    observations: list[Observation],
) -> bool:
    """One write of `observations` to the incident's `spec.signals` (those not there yet)."""
    kube = ports.require_kube()
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
    take_in(ports, cluster, NodeRemediation.model_validate(patched), ours=True)
    ensure_driver(ports, cluster, books, name)
    what = observations[-1].what
    message = f"{what} attached" + (f" (and {len(records) - 1} more)" if len(records) > 1 else "")
    ports.post_event(body, reason=EventReason.SIGNAL_ATTACHED, message=message)
    return True


def _post(ports: Ports, view: NodeView, reason: EventReason, message: str) -> None:
    ports.post_event(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": view.name, "uid": view.uid}},
        reason=reason,
        message=message,
        type_="Warning",
    )


# ---- node conditions -------------------------------------------------------------------
def check_conditions(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, view: NodeView
) -> None:
    """Every watched condition the node holds in its bad status becomes a signal (once per
    bad spell: the key carries its lastTransitionTime). No I/O while the node is healthy."""
    policy = cluster.policy_of(view.name)
    if policy is None:
        return
    for obs in condition_observations(policy.spec, view):
        if obs.key not in cluster.seen_keys and obs.key not in books.condition_timers:
            _spawn_observe(ports, cluster, books, view.name, obs)


def _spawn_observe(
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    node: str,
    obs: Observation,
    *,
    slot: bool = False,
    attempt: int = 0,
) -> None:
    """`observe` as a task of its own (kept in ``books.tasks`` so that stop() cancels it);
    ``slot``: it holds one of `submit`'s places, given back when it ends."""
    task = asyncio.create_task(
        observe(ports, cluster, books, node, obs, attempt), name=f"observe:{obs.key}"
    )
    _track(books, task, slot=slot)


def _spawn(books: Bookkeeping, name: str, coro: Coroutine[Any, Any, Any]) -> None:
    _track(books, asyncio.create_task(coro, name=name))


def _track(books: Bookkeeping, task: asyncio.Task[Any], *, slot: bool = False) -> None:
    books.tasks.append(task)

    def done(task: asyncio.Task[str]) -> None:
        books.tasks.remove(task)
        if slot:
            books.intake_slots.release()

    task.add_done_callback(done)


def _look_again(  # noqa: PLR0917
    ports: Ports,
    cluster: ClusterView,
    books: Bookkeeping,
    node: str,
    obs: Observation,
    at: dt.datetime,
) -> None:
    if obs.key in books.condition_timers:
        return
    loop = asyncio.get_running_loop()

    def fire() -> None:
        books.condition_timers.pop(obs.key, None)
        _spawn_observe(ports, cluster, books, node, obs)

    delay = max(0.05, (at - _now()).total_seconds() + 0.05)
    books.condition_timers[obs.key] = loop.call_later(delay, fire)
