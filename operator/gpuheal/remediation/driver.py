"""The incident driver: one asyncio task per open NodeRemediation, one step per pass.

A pass reads the object fresh, asks the engine (`gpuheal.policy.decide`) what comes next,
runs that one step's idempotent executor (`steps`), and records the result in status (a
condition per step, the timeline, ownership) *before* the next pass. A restart therefore
resumes at the first step not recorded as done, and that step's executor sees the world as
it left it (already cordoned by us, already drained by us, spare already claimed by this
incident) and repeats nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import random
import time
from functools import partial
from typing import Any

from pydantic import ValidationError

from gpuheal.adapters.kube import Conflict
from gpuheal.api.names import (
    APPROVE_ANNOTATION,
    GROUP,
    INITIAL_RUNG_ANNOTATION,
    NREM_PLURAL,
    POLICY_KIND,
    VERSION,
    WHY_ANNOTATION,
    EventReason,
    NremCondition,
    Reason,
)
from gpuheal.api.noderemediation import NodeRemediation, RepairRecord
from gpuheal.api.remediationpolicy import Action, NotifyEvent, RemediationPolicy, Step
from gpuheal.policy import choose_policy
from gpuheal.policy.domains import (
    PLACE_SETTLE,
    Announce,
    DomainIncident,
    announcement,
    place_settling,
)
from gpuheal.policy.inputs import (
    is_completed,
    node_view,
)
from gpuheal.policy.reading import domain_standings, judge
from gpuheal.policy.types import Act, Blocked, Decision, Idle, Move, Wait
from gpuheal.policy.vet import refusal
from gpuheal.remediation import historywriter as history
from gpuheal.remediation import steps
from gpuheal.remediation.record import Recorder
from gpuheal.remediation.state import Bookkeeping, Breaker, ClusterView, Ports, take_in

log = logging.getLogger("gpuheal.remediation")

# A step's own condition (an alert has none: Detected is the incident's, not the alert's).
CONDITION_OF = {
    Action.CORDON: NremCondition.CORDONED,
    Action.SLURM_DRAIN: NremCondition.SLURM_DRAINED,
    Action.CHECKPOINT: NremCondition.CHECKPOINTED,
    Action.QUARANTINE_DEVICE: NremCondition.DEVICE_QUARANTINED,
    Action.DRAIN: NremCondition.DRAINED,
    Action.RESET: NremCondition.RESET,
    Action.REBOOT: NremCondition.REBOOTED,
    Action.REPLACE: NremCondition.REPLACEMENT_CLAIMED,
    Action.RETIRE: NremCondition.RETIRED,
}
# The Event a done step posts: one reason per step.
EVENT_OF = {
    Action.CORDON: EventReason.CORDONED,
    Action.SLURM_DRAIN: EventReason.SLURM_DRAINED,
    Action.CHECKPOINT: EventReason.CHECKPOINTED,
    Action.QUARANTINE_DEVICE: EventReason.DEVICE_QUARANTINED,
    Action.DRAIN: EventReason.DRAINED,
    Action.RESET: EventReason.RESET,
    Action.REBOOT: EventReason.REBOOTED,
    Action.REPLACE: EventReason.REPLACEMENT_CLAIMED,
}
# ...and how an incident ended (Completed's reason -> the Event's).
ENDED_EVENT = {
    "Replaced": EventReason.REPLACED,
    "Returned": EventReason.RETURNED,
    "ReturnedToPool": EventReason.RETURNED_TO_POOL,
    "Retired": EventReason.RETIRED,
    "Failed": EventReason.STEP_FAILED,
    "Remediated": EventReason.REMEDIATED,
    "DryRun": EventReason.DRY_RUN_COMPLETED,
}
_PROGRESS = frozenset(CONDITION_OF.values()) | {NremCondition.DETECTED, NremCondition.JOBS_REQUEUED}
# Waits that hold the incident up for a reason a person may want to know (Blocked=True).
_BLOCKING_WAITS = frozenset(
    {
        Reason.POD_DISRUPTION_BUDGET,
        Reason.BRIDGE_UNAVAILABLE,
        Reason.SLURM_CLUSTER_UNKNOWN,
        Reason.NO_SPARE_AVAILABLE,
        Reason.POOL_NOT_FOUND,
        Reason.HOOK_UNAVAILABLE,
        Reason.HOOK_UNREACHABLE,
        Reason.WAITING_FOR_IDLE,
        Reason.WAITING_FOR_SLURM_JOBS,
    }
)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_driver(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, name: str, *, wake_up: bool = True
) -> None:
    """Start the driver task for ``name`` unless one runs; wake it if it sleeps (not for the
    driver's own status writes, which would make it spin)."""
    task = books.drivers.get(name)
    if task is not None and not task.done():
        if wake_up:
            wake(books, name)
        return
    books.wakeups[name] = asyncio.Event()
    books.drivers[name] = asyncio.create_task(
        _drive(ports, cluster, books, name), name=f"drive:{name}"
    )


def wake(books: Bookkeeping, name: str) -> None:
    """Look at the incident now rather than after its retry interval (a new signal)."""
    event = books.wakeups.get(name)
    if event is not None:
        event.set()


def stop_driver(cluster: ClusterView, books: Bookkeeping, name: str) -> None:
    task = books.drivers.pop(name, None)
    if task is not None:
        task.cancel()
    reservation = books.reservations.pop(name, None)
    if reservation is not None:
        reservation.cancel()
    books.wakeups.pop(name, None)
    cluster.release_slot(name)


async def _drive(ports: Ports, cluster: ClusterView, books: Bookkeeping, name: str) -> None:
    attempt = 0
    while True:
        try:
            delay = await advance(ports, cluster, books, name, attempt)
        except asyncio.CancelledError:
            raise
        except Conflict:
            cluster.latest.pop(name, None)
            delay = 0.0  # someone (a new signal, a person) changed it: read again
        except Exception:
            cluster.latest.pop(name, None)
            attempt += 1
            delay = min(60.0, 2.0 ** min(attempt, 6)) * random.uniform(0.5, 1.0)  # noqa: S311
            log.exception("incident %s: step raised; retrying in %.0fs", name, delay)
        else:
            if delay is None:
                cluster.release_slot(name)
                books.wakeups.pop(name, None)
                return
            attempt = attempt + 1 if delay > 0 else 0
        event = books.wakeups.get(name)
        if event is None or delay <= 0:
            await asyncio.sleep(delay)
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=delay)
        event.clear()


async def advance(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, name: str, attempt: int = 0
) -> float | None:
    """One pass over the incident. Returns seconds to sleep before the next pass (0: at once)
    or None when the incident is over (or gone)."""
    nrem = cluster.latest.get(name) or await _read(ports, cluster, name)
    if nrem is None or is_completed(nrem):
        return None
    rec = Recorder(nrem, _now(), written=lambda body: _written(ports, cluster, body))
    _record_reserved(books, nrem, rec)
    if not rec.holds(NremCondition.DETECTED):
        why = await _vet(ports, cluster, nrem)
        if why is not None:
            await _refuse(ports, nrem, rec, why)
            return None
        # Recorded with this pass's step (one write, not two): the engine then sees the
        # opening rung; a crash before the write repeats an idempotent step, nothing more.
        books.unannounced[name] = (_record_detected(nrem, rec), rec.now)
        nrem = nrem.model_copy(update={"status": rec.status.model_copy(deep=True)})
    this = _Pass(ports, cluster, books, nrem, rec)
    opening = _opening(this)
    policy = cluster.policies.get(nrem.spec.policy_ref.name)
    if policy is None:
        pname = nrem.spec.policy_ref.name
        await _block(this, Reason.POLICY_NOT_FOUND, f"RemediationPolicy {pname} not found")
        return ports.config.retry_interval
    decision = await _decide(ports, cluster, nrem, policy, rec.now)
    delay = await _carry_out(this, decision, attempt)
    await rec.write(ports.require_kube())  # an early spare claim a path did not write yet
    _tell_opening(this, opening)  # told once the status says it
    _publish(ports, nrem, rec)
    waiting = books.unannounced.get(name)
    if delay is not None and waiting is not None:  # a pass when its opening is due
        delay = min(delay, max(0.05, (waiting[1] + PLACE_SETTLE - rec.now).total_seconds()))
    return delay


@dataclasses.dataclass(frozen=True, slots=True)
class _Pass:
    """One pass over one incident, as the driver's own helpers below share it: the ports it
    acts through, the cluster and books it reads and updates, the incident as this pass read
    it, and the record of this pass's changes to its status. (The steps it runs, `steps.*`,
    are given only the parts they touch.)"""

    ports: Ports
    cluster: ClusterView
    books: Bookkeeping
    nrem: NodeRemediation
    rec: Recorder


Opening = tuple[str, Announce, DomainIncident | None]


def _opening(this: _Pass, *, anyway: bool = False) -> Opening | None:
    """The incident's opening, to tell once this pass is written, when it is due: at once,
    or for a member of a fault domain once its place is settled (`domains.place_settling`);
    ``anyway``: now (the incident ends). Its domain, if any, goes in its timeline."""
    cluster, books, nrem, rec = this.cluster, this.books, this.nrem, this.rec
    name = nrem.metadata.name
    waiting = books.unannounced.get(name)
    if waiting is None:
        return None
    message, opened_at = waiting
    standings = domain_standings(
        cluster.reading(), nrem.spec.policy_ref.name, nrem.spec.node_name, name
    )
    if not anyway and place_settling(standings, opened_at, rec.now):
        return None
    del books.unannounced[name]
    how, group = announcement(standings, nrem.spec.node_name)
    if group is not None:
        place = (group.place(nrem.spec.node_name) or 0) + 1
        rec.event(Reason.DOMAIN_INCIDENT, f"member {place}: {group.summary()}")
    return message, how, group


def _tell_opening(this: _Pass, opening: Opening | None) -> None:
    if opening is None:
        return
    ports, cluster, nrem, rec = this.ports, this.cluster, this.nrem, this.rec
    message, how, group = opening
    if how is Announce.OWN:
        ports.announce(cluster, nrem, NotifyEvent.OPENED, "SignalMatched", message, rec.now)
    elif how is Announce.DOMAIN and group is not None:
        ports.announce(
            cluster, nrem, NotifyEvent.DOMAIN_OPENED, Reason.DOMAIN_INCIDENT,
            group.summary(), rec.now,
        )  # fmt: skip
    # Announce.FOLDED: a later member of a domain incident its notice told already


async def _read(ports: Ports, cluster: ClusterView, name: str) -> NodeRemediation | None:
    """The incident from the API server (after a 409, a failure, or a restart)."""
    body = await ports.require_kube().get_custom(NREM_PLURAL, name)
    if body is None:
        return None
    try:
        nrem = NodeRemediation.model_validate(body)
    except ValidationError as exc:
        log.error("incident %s does not parse, leaving it: %s", name, exc)
        return None
    take_in(ports, cluster, nrem)
    return nrem


def _written(ports: Ports, cluster: ClusterView, body: dict[str, Any]) -> None:
    """Our own status write, as stored: the next pass starts from it (no GET), and its echo
    in the watch is recognised and skipped."""
    take_in(ports, cluster, NodeRemediation.model_validate(body), ours=True)


def _publish(ports: Ports, nrem: NodeRemediation, rec: Recorder) -> None:
    """Per-incident gauges from its status: what it waits for, when it last moved on."""
    name, node = nrem.metadata.name, nrem.spec.node_name
    ports.metrics.incident_over(name, node)
    if rec.holds(NremCondition.COMPLETED):
        return
    if rec.holds(NremCondition.BLOCKED):
        reason = rec.reason(NremCondition.BLOCKED) or "Unknown"
        ports.metrics.incident_blocked.labels(name, node, reason).set(1)
    moved = [
        c.last_transition_time
        for c in rec.status.conditions
        if c.type in _PROGRESS and c.status.value == "True"
    ]
    if moved:
        ports.metrics.incident_progress.labels(name, node).set(max(moved).timestamp())


async def _decide(
    ports: Ports,
    cluster: ClusterView,
    nrem: NodeRemediation,
    policy: RemediationPolicy,
    now: dt.datetime,
) -> Decision:
    """The engine's answer for this incident, with the cluster's counts; a slot it takes
    and a breaker it opens or closes are taken under one lock, so a storm of incidents
    cannot take more slots than the policy allows."""
    name = nrem.metadata.name
    pname = policy.metadata.name
    async with cluster.slot_lock:
        # The inputs as `gpuheal explain` builds them (`policy.reading`), from our caches:
        # the incident's record, this process's signals and the node's FaultHistory (a
        # restart forgets none), the same GPUs' signals on other nodes, blind sources.
        judged = judge(cluster.reading(), nrem.spec.node_name, now, incident=nrem)
        decision: Decision = (
            judged[1]
            if judged is not None
            else Blocked(Reason.POLICY_NOT_FOUND, f"RemediationPolicy {pname} not found")
        )
        if isinstance(decision, Act) and decision.takes_slot:
            cluster.slots.setdefault(pname, set()).add(name)
        breaker = decision.breaker if isinstance(decision, Act | Blocked) else None
        if breaker is not None:
            cluster.breakers[pname] = Breaker(open=breaker, changed_at=now)
    if breaker is not None:
        await _breaker_changed(ports, policy, breaker, decision)
    return decision


async def _breaker_changed(
    ports: Ports, policy: RemediationPolicy, opened: bool, decision: Decision
) -> None:
    pname = policy.metadata.name
    ports.metrics.breaker_open.labels(pname).set(1 if opened else 0)
    if opened:
        ports.post_event(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": POLICY_KIND,
                "metadata": {"name": pname, "uid": policy.metadata.uid},
            },
            reason=EventReason.BREAKER_OPEN,
            message=decision.message if isinstance(decision, Blocked) else "breaker open",
            type_="Warning",
        )


def _record_detected(nrem: NodeRemediation, rec: Recorder) -> str:
    """The first record: Detected, and the rung the engine opened the incident at."""
    spec = nrem.spec
    first = spec.signals[0]
    what = (
        f"XID {first.xid}"
        if first.xid
        else (first.condition_type or first.event_reason or f"a {first.source.value} signal")
    )
    raw = nrem.metadata.annotations.get(INITIAL_RUNG_ANNOTATION, "0")
    rung = max(0, min(int(raw) if raw.isdecimal() else 0, len(spec.ladder) - 1))
    why = nrem.metadata.annotations.get(WHY_ANNOTATION, "")[:256]
    rec.condition(
        NremCondition.DETECTED,
        "True",
        "SignalMatched",
        f"{what} on {spec.node_name} matched rule {spec.rule}" + (f": {why}" if why else ""),
    )
    rec.set(rung=rung, next_step=0, why=why)
    opened = f"{what}: rule {spec.rule}, rung {spec.ladder[rung].name}" + (
        " (dry run)" if spec.dry_run else ""
    )
    rec.event(NremCondition.DETECTED, opened)
    return opened


async def _vet(ports: Ports, cluster: ClusterView, nrem: NodeRemediation) -> str | None:
    """Could gpuheal have opened this incident (`policy.vet`)? None: yes (and it is marked
    started); else why not, for a person who made one by hand."""
    node, pname = nrem.spec.node_name, nrem.spec.policy_ref.name
    view = cluster.nodes.get(node)
    if view is None:  # not in the views (yet, at start-up; or no such Node): ask
        body = await ports.require_kube().get_node(node)
        view = node_view(body, cluster.kept_conditions) if body is not None else None
    governing = choose_policy(cluster.policies.values(), view.labels)[0] if view else None
    why = refusal(
        nrem.metadata.name,
        nrem.spec,
        cluster.policies.get(pname),
        governing.metadata.name if governing else None,
        cluster.incidents.values(),
    )
    if why is None:
        # Marked before any await: an incident on the same node looked at next sees this one.
        mine = cluster.incidents.get(nrem.metadata.name)
        if mine is not None:
            cluster.incidents[nrem.metadata.name] = dataclasses.replace(mine, started=True)
    return why


async def _refuse(ports: Ports, nrem: NodeRemediation, rec: Recorder, why: str) -> None:
    """An incident gpuheal could not have opened (`policy.vet`): completed at once, with why,
    and nothing done to the node."""
    message = f"not driven: {why}"
    log.warning("incident %s refused: %s", nrem.metadata.name, why)
    rec.condition(NremCondition.COMPLETED, "True", Reason.REFUSED, message)
    rec.event(NremCondition.COMPLETED, f"{Reason.REFUSED}: {message}")
    await rec.write(ports.require_kube())
    ports.metrics.incidents_completed.labels("refused").inc()
    ports.post_event(nrem.to_k8s(), reason=EventReason.REFUSED, message=message, type_="Warning")


async def _carry_out(this: _Pass, decision: Decision, attempt: int) -> float | None:  # noqa: PLR0911
    ports, nrem, rec = this.ports, this.nrem, this.rec
    retry = ports.config.retry_interval
    if isinstance(decision, Blocked) and decision.reason == Reason.DRY_RUN:
        return await _record_would(this, decision)
    if isinstance(decision, Blocked):
        message = decision.message
        if decision.reason == Reason.APPROVAL_PENDING and decision.would is not None:
            message += (
                f": a person approves with `kubectl annotate nrem {nrem.metadata.name} "
                f"{APPROVE_ANNOTATION}={decision.would.operation.value}`"
            )
        await _block(this, decision.reason, message)
        if decision.retry_at is not None:
            return max(0.2, min(retry, (decision.retry_at - rec.now).total_seconds()))
        return retry
    if isinstance(decision, Act) and decision.operation is Move.ESCALATE:
        rung = int(decision.rung or 0)
        rec.set(rung=rung, next_step=0, why=decision.message[:256])
        rec.event("Escalated", decision.message)
        await rec.write(ports.require_kube())
        history.escalated(this.books, nrem, rung, decision.message)
        return 0.0
    if isinstance(decision, Act) and decision.operation is Move.VERIFY:
        return await _verify(this, decision)
    if isinstance(decision, Act) and decision.step is not None:
        if decision.reserve is not None:
            _reserve_spare(ports, this.cluster, this.books, nrem, decision.reserve)
        return await _run_step(this, decision, attempt)
    if nrem.spec.dry_run:
        await _complete(this, "DryRun", "dry run: plan recorded, nothing changed")
        return None
    return await _finish(this, decision)


async def _record_would(this: _Pass, decision: Blocked) -> float | None:
    """Dry run: record what the step would do (a timeline entry, its condition False)."""
    ports, nrem, rec = this.ports, this.nrem, this.rec
    would = decision.would
    if would is None or would.step is None:
        await _complete(this, "DryRun", "dry run: plan recorded, nothing changed")
        return None
    action = would.step.action
    rung, index = int(would.rung or 0), int(would.step_index or 0)
    label = f"{nrem.spec.ladder[rung].name}/{action.value}"
    if action in CONDITION_OF:  # an alert has no condition of its own to mark
        rec.condition(
            CONDITION_OF[action],
            "False",
            "DryRun",
            f"dry run: would {action.value} {nrem.spec.node_name}",
        )
    # Recorded like a done step so the dry run walks the whole ladder; its condition stays
    # False (DryRun), so nothing claims the step happened.
    rec.event(label, f"dry run: would {action.value}")
    rec.set(rung=rung, next_step=index + 1)
    await rec.write(ports.require_kube())
    ports.metrics.blocked.labels("DryRun").inc()
    return 0.0


async def _run_step(this: _Pass, decision: Act, attempt: int) -> float | None:
    ports, cluster, nrem, rec = this.ports, this.cluster, this.nrem, this.rec
    kube = ports.require_kube()
    spec = nrem.spec
    name = nrem.metadata.name
    assert decision.step is not None
    action = decision.step.action
    rung, index = int(decision.rung or 0), int(decision.step_index or 0)
    label = f"{spec.ladder[rung].name}/{action.value}"
    if decision.takes_slot and rec.status.slot_taken_at is None:
        rec.set(slot_taken_at=rec.now)
    if action is Action.ALERT:
        ports.post_event(
            _node_ref(cluster, spec.node_name),
            reason=EventReason.DETECTED,
            message=f"{name}: {spec.signals[-1].message or spec.rule}",
            type_="Warning",
        )
        rec.event(label, "alert raised")
        rec.set(rung=rung, next_step=index + 1)
        await rec.write(kube)
        return 0.0
    started = time.monotonic()
    if action is Action.REPLACE:  # one claim at a time per incident: the early one first
        reservation = this.books.reservations.get(name)
        if reservation is not None:
            await asyncio.wait([reservation])
    result = await steps.execute(ports, cluster, nrem, rec, decision.step, attempt=attempt)
    ports.metrics.step_duration.labels(action.value).observe(time.monotonic() - started)
    ports.metrics.steps.labels(action.value, result.kind).inc()
    for type_, status, reason, message in result.extra_conditions:
        rec.condition(type_, status, reason, message)
    if result.moves_on:
        await _moved_on(this, result, action=action, label=label, at=(rung, index))
        return 0.0
    if result.kind == "wait":
        rec.merge(result.status)  # e.g. a reset/reboot asked for (status.repair)
        rec.condition(result.condition, "False", result.reason, result.message)
        if result.reason in _BLOCKING_WAITS:
            await _block(this, result.reason, result.message)
        else:
            await rec.write(kube)
        return result.retry_after or ports.config.retry_interval
    if action in (Action.RESET, Action.REBOOT):
        # Not verified (or refused): recorded on this rung; the engine climbs the ladder.
        return await _repair_failed(this, result, label=label, rung=rung)
    # failed: stop; the node stays as it is (cordoned) and a person must look, at what the
    # step did before it failed too (e.g. the DeviceTaintRule written before Slurm refused).
    rec.merge(result.status)
    history.step(this.books, nrem, action.value, rung, f"failed: {result.message}")
    rec.condition(result.condition, "False", result.reason, result.message)
    rec.condition(NremCondition.FAILED, "True", result.reason, result.message)
    rec.condition(NremCondition.COMPLETED, "True", "Failed", f"{label} failed: {result.message}")
    rec.event(label, f"failed: {result.message}")
    await rec.write(kube)
    ports.announce(
        cluster, nrem, NotifyEvent.FAILED, result.reason, f"{label}: {result.message}", rec.now
    )
    ports.metrics.incidents_completed.labels("failed").inc()
    _post_step_failed(ports, nrem, label, result.message)
    return None


def _post_step_failed(ports: Ports, nrem: NodeRemediation, label: str, message: str) -> None:
    """The Warning Event of a failed step (a terminal failure or a repair on this rung)."""
    ports.post_event(
        nrem.to_k8s(),
        reason=EventReason.STEP_FAILED,
        message=f"{label}: {message}",
        type_="Warning",
    )


async def _moved_on(
    this: _Pass, result: steps.StepResult, *, action: Action, label: str, at: tuple[int, int]
) -> None:
    """A step done, or skipped (its condition False with the reason: it did nothing): on
    record, and the incident goes to its next step."""
    ports, nrem, rec = this.ports, this.nrem, this.rec
    status = "True" if result.kind == "done" else "False"
    rec.condition(result.condition, status, result.reason, result.message, at=result.at)
    rec.clear_blocked()
    rec.merge(result.status)
    rung, index = at
    rec.set(rung=rung, next_step=index + 1)
    rec.event(label, result.message, at=result.at)
    await rec.write(ports.require_kube())
    # A skipped step is on the node's record as such: a Noop reset is no repair.
    said = result.message if result.kind == "done" else f"skipped: {result.message}"
    history.step(this.books, nrem, action.value, rung, said)
    _observe_latency(ports, nrem, rec, action)
    reason = EVENT_OF[action] if result.kind == "done" else EventReason.STEP_SKIPPED
    ports.post_event(nrem.to_k8s(), reason=reason, message=f"{label}: {result.message}")


def _reserve_spare(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, nrem: NodeRemediation, step: Step
) -> None:
    """Claim the spare of the rung's replace step now, beside the current step (the engine's
    `reserve`): claim, promotion and Slurm resume, as the replace step does them, so that
    the requeued job finds the spare ready. Idempotent (the claim is a label naming the
    incident, written under the spare's resourceVersion: never two incidents on one spare,
    and a restart finds its own claim); recorded by the next pass (`_record_reserved`)."""
    name = nrem.metadata.name
    if nrem.status.replacement_node is not None or name in books.reservations:
        return
    assert step.replace is not None
    pool = step.replace.reserve_pool_ref.name

    async def claim() -> steps.StepResult:
        result = await steps.replace(
            ports.require_kube(),
            partial(ports.slurm_for, cluster),
            cluster.pools.get(pool),
            pool,
            list(cluster.nodes.values()),
            cluster.spares_out_in_slurm,
            node=nrem.spec.node_name,
            incident=name,
            retry_after=ports.config.retry_interval,
        )
        # Only a claimed spare wakes the driver (its pass records it). A claim that failed
        # or waits (the bridge refused, no spare) waits for the driver's next pass, on its
        # backoff: waking it made the pass fail the Slurm drain at once and start the claim
        # again, each failure waking the next (hundreds of bridge calls a second).
        if result.kind == "done":
            wake(books, name)
        return result

    books.reservations[name] = asyncio.create_task(claim(), name=f"reserve:{name}")


def _record_reserved(books: Bookkeeping, nrem: NodeRemediation, rec: Recorder) -> None:
    """Put a finished early claim on record (written with this pass): the replacement node
    and the ReplacementClaimed condition. The replace step itself runs later and finds it."""
    name = nrem.metadata.name
    task = books.reservations.get(name)
    if task is None or not task.done():
        return
    del books.reservations[name]
    if task.cancelled():
        return
    if task.exception() is not None:
        log.warning("incident %s: early spare claim failed: %s", name, task.exception())
        return
    result: steps.StepResult = task.result()
    if result.kind != "done" or rec.status.replacement_node is not None:
        log.info("incident %s: no spare claimed early (%s); the replace step will look again",
                 name, result.message)  # fmt: skip
        return
    rec.merge(result.status)
    rec.condition(NremCondition.REPLACEMENT_CLAIMED, "True", result.reason,
                  f"claimed ahead of the replace step: {result.message}")  # fmt: skip
    rec.event("spareClaimed", result.message)


def _observe_latency(ports: Ports, nrem: NodeRemediation, rec: Recorder, action: Action) -> None:
    detected_at = rec.since(NremCondition.DETECTED)
    if detected_at is not None:
        signal_at = nrem.spec.signals[0].observed_at
        ports.metrics.detection_to_step.labels(action.value).observe(
            max(0.0, (rec.now - min(detected_at, signal_at)).total_seconds())
        )


async def _finish(this: _Pass, decision: Decision) -> float | None:  # noqa: PLR0911
    """Every step of the rung is done; the engine says: close, return, or wait."""
    ports, cluster, nrem, rec = this.ports, this.cluster, this.nrem, this.rec
    node = nrem.spec.node_name
    retry = ports.config.retry_interval
    if isinstance(decision, Act) and decision.unchecked is not None:
        # Nothing verified the node: said so, never Verified=True.
        rec.condition(NremCondition.VERIFIED, "Unknown", Reason.NO_CHECK, decision.unchecked)
    if isinstance(decision, Act) and decision.operation is Move.CLOSE:
        if decision.reason in (Reason.VERIFICATION_FAILED, Reason.REPAIR_FAILED):
            rec.condition(NremCondition.FAILED, "True", decision.reason, decision.message)
            await _complete(this, "Failed", decision.message, failed=_cause(rec, decision.reason))
            return None
        if decision.reason == Reason.RETIRED:
            await _complete(this, "Retired", f"{node} retired: {rec.status.why}")
            return None
        if decision.reason == Reason.REPLACED:
            spare = rec.status.replacement_node
            message = f"{node} replaced by {spare}; {node} stays cordoned for repair"
            await _complete(this, "Replaced", message)
            return None
        if decision.reason == Reason.NOTHING_OWNED:
            # Nothing returned: what keeps the node out (if anything) is someone else's.
            message = f"{node} healthy; gpuheal had cordoned/drained nothing to undo"
            rec.condition(NremCondition.RETURNED, "False", "NothingToUndo", message)
            await _complete(this, "NothingToUndo", message)
            return None
        await _complete(this, decision.reason, decision.message)
        return None
    if isinstance(decision, Act) and decision.operation is Move.RETURN_TO_SERVICE:
        if decision.to_pool is not None:
            result = await steps.return_to_pool(ports, cluster, nrem, decision, decision.to_pool)
        else:
            result = await steps.return_to_service(ports, cluster, nrem, decision, now=rec.now)
        return await _returned(this, result, decision.to_pool)
    if isinstance(decision, Idle) and decision.reason == Reason.RETURN_DISABLED:
        await _complete(this, "Remediated", decision.message)
        return None
    if isinstance(decision, Wait):
        status = "Unknown" if decision.reason == Reason.HYSTERESIS_PENDING else "False"
        if rec.reason(NremCondition.RETURNED) != decision.reason:
            rec.condition(NremCondition.RETURNED, status, decision.reason, decision.message)
            rec.event(NremCondition.RETURNED, f"{decision.reason}: {decision.message}")
            await rec.write(ports.require_kube())
        return max(0.2, min(retry, (decision.until - rec.now).total_seconds()))
    rec.condition(NremCondition.RETURNED, "False", decision.reason, decision.message)
    await rec.write(ports.require_kube())
    return retry


# Completed's reason for a return that happened (Returned=True with this reason).
_RETURN_OUTCOME = {
    "ReturnedToService": "Returned",
    "ReturnedToPool": "ReturnedToPool",
    "ReturnedInKubernetesOnly": "ReturnedInKubernetesOnly",
}


async def _returned(this: _Pass, result: steps.StepResult, pool: str | None) -> float | None:
    """Record the return to service as it happened. Done: Returned=True and the incident
    completes as returned. Wait (the bridge cannot be reached or is missing for a node
    gpuheal drained): Returned=False, Blocked with why, tried again. Skipped (the Slurm
    resume was refused, Slurm no longer knows the node): Returned=False with the reason and
    the incident completes `Remediated`, repaired but not back in Slurm service."""
    nrem, rec = this.nrem, this.rec
    if result.kind == "wait":
        rec.condition(NremCondition.RETURNED, "False", result.reason, result.message)
        await _block(this, result.reason, result.message)
        return result.retry_after or this.ports.config.retry_interval
    rec.merge(result.status)  # e.g. the device quarantine lifted (or kept, and why)
    if result.kind == "done":
        rec.condition(NremCondition.RETURNED, "True", result.reason, result.message)
        to_pool = result.reason == "ReturnedToPool"
        rec.set(returned_to=f"ReservePool/{pool}" if to_pool else "Service")
        await _complete(this, _RETURN_OUTCOME[result.reason], result.message)
        return None
    rec.condition(NremCondition.RETURNED, "False", result.reason, result.message)
    message = f"{nrem.spec.node_name} repaired, not back in Slurm service: {result.message}"
    if result.reason == "DeviceStillQuarantined":
        message = f"{nrem.spec.node_name} in service, one GPU still out: {result.message}"
    await _complete(this, "Remediated", message)
    return None


async def _complete(this: _Pass, reason: str, message: str, failed: str | None = None) -> None:
    """Close the incident. `failed`: it ended in failure, for this cause; people hear
    "failed (cause)", as for a step that failed outright, not "completed"."""
    ports, cluster, books, nrem, rec = this.ports, this.cluster, this.books, this.nrem, this.rec
    waiting = books.unannounced.get(nrem.metadata.name)
    if waiting is not None:  # opened and ending within PLACE_SETTLE: told first, settled
        await asyncio.sleep(max(0.0, (waiting[1] + PLACE_SETTLE - _now()).total_seconds()))
    opening = _opening(this, anyway=True)
    rec.clear_blocked()
    rec.condition(NremCondition.COMPLETED, "True", reason, message)
    rec.event(NremCondition.COMPLETED, f"{reason}: {message}")
    await rec.write(ports.require_kube())
    _tell_opening(this, opening)
    if failed is None:
        ports.announce(cluster, nrem, NotifyEvent.COMPLETED, reason, message, rec.now)
    else:
        ports.announce(cluster, nrem, NotifyEvent.FAILED, failed, message, rec.now)
    history.outcome(books, nrem, reason, message)
    await history.write_now(ports, cluster, books, nrem.spec.node_name)
    ports.metrics.incidents_completed.labels(reason.lower()).inc()
    event_reason = ENDED_EVENT.get(reason, EventReason.COMPLETED)
    ports.post_event(nrem.to_k8s(), reason=event_reason, message=message)


def _cause(rec: Recorder, reason: str) -> str:
    """The most specific reason a closing failure has: the failed reset/reboot's own
    (e.g. HookRefused, NotVerified) or the check's, else the engine's."""
    if reason == Reason.REPAIR_FAILED and rec.status.repair is not None:
        step = {"reset": NremCondition.RESET, "reboot": NremCondition.REBOOTED}
        condition = step.get(rec.status.repair.action)
        if condition is not None and rec.reason(condition):
            return rec.reason(condition) or reason
    if reason == Reason.VERIFICATION_FAILED and rec.reason(NremCondition.VERIFIED):
        return rec.reason(NremCondition.VERIFIED) or reason
    return reason


async def _block(this: _Pass, reason: str, message: str) -> None:
    """Say why in status (Blocked=True) and, when the reason changes, as an Event and a
    notification (sent once the status says it)."""
    ports, nrem, rec = this.ports, this.nrem, this.rec
    changed = not rec.holds(NremCondition.BLOCKED) or rec.reason(NremCondition.BLOCKED) != reason
    rec.condition(NremCondition.BLOCKED, "True", reason, message)
    if changed:
        rec.event(NremCondition.BLOCKED, f"{reason}: {message}")
        ports.metrics.blocked.labels(reason).inc()
        ports.post_event(
            nrem.to_k8s(),
            reason=EventReason.STEP_BLOCKED,
            message=f"{reason}: {message}",
            type_="Warning",
        )
    await rec.write(ports.require_kube())
    # A held replacement is the domain's news, told once by its DomainOpened notice.
    if changed and reason != Reason.DOMAIN_REPLACEMENT_HELD:
        event = (
            NotifyEvent.APPROVAL_PENDING
            if reason == Reason.APPROVAL_PENDING
            else NotifyEvent.BLOCKED
        )
        ports.announce(this.cluster, nrem, event, reason, message, rec.now)


async def _repair_failed(this: _Pass, result: steps.StepResult, *, label: str, rung: int) -> float:
    """A reset or reboot that failed or could not be verified: record it on this rung
    (status.repair.failedAt); the next pass climbs the ladder (the engine's decision)."""
    ports, nrem, rec = this.ports, this.nrem, this.rec
    rec.merge(result.status)
    repair = rec.status.repair
    if repair is None or repair.rung != rung:
        repair = RepairRecord(
            action=label.rpartition("/")[2], rung=rung, via="Unknown", requested_at=rec.now
        )
    rec.set(
        repair=repair.model_copy(update={"failed_at": rec.now, "message": result.message[:1024]})
    )
    rec.condition(result.condition, "False", result.reason, result.message)
    rec.event(label, f"failed: {result.message}")
    await rec.write(ports.require_kube())
    history.step(this.books, nrem, label.rpartition("/")[2], rung, f"failed: {result.message}")
    _post_step_failed(ports, nrem, label, result.message)
    return 0.0


async def _verify(this: _Pass, decision: Act) -> float:
    """Run (or look at) the policy's check; a verdict is recorded (Verified, status.
    verification) and the engine decides on the next pass: healthyFor, or climb."""
    ports, nrem, rec = this.ports, this.nrem, this.rec
    policy = this.cluster.policies[nrem.spec.policy_ref.name]
    check = policy.spec.return_to_service.check
    result = await steps.verify(ports, nrem, rec, check, restart=decision.restart)
    rec.merge(result.status)
    run = rec.status.verification
    rung = int(decision.rung or 0)
    if result.kind == "wait":
        rec.condition(NremCondition.VERIFIED, "Unknown", result.reason, result.message)
        if decision.restart:
            rec.event("Verify", result.message)
        await rec.write(ports.require_kube())
        return result.retry_after or ports.config.retry_interval
    passed = result.kind == "done"
    if run is not None:
        stamp = {"passed_at": rec.now} if passed else {"failed_at": rec.now}
        rec.set(verification=run.model_copy(update={**stamp, "message": result.message[:1024]}))
    rec.condition(NremCondition.VERIFIED, "True" if passed else "False", result.reason,
                  result.message)  # fmt: skip
    rec.event("Verify", f"{'passed' if passed else 'failed'}: {result.message}")
    await rec.write(ports.require_kube())
    history.step(
        this.books, nrem, "check", rung, f"{'passed' if passed else 'failed'}: {result.message}"
    )
    if not passed:
        ports.post_event(
            nrem.to_k8s(),
            reason=EventReason.VERIFICATION_FAILED,
            message=result.message,
            type_="Warning",
        )
    return 0.0


def _node_ref(cluster: ClusterView, node: str) -> dict[str, Any]:
    view = cluster.nodes.get(node)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "uid": view.uid if view else None},
    }
