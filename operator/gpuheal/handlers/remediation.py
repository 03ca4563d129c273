"""The incident driver: one asyncio task per active NodeRemediation, one step at a time.

Each pass reads the object fresh, asks `gpuheal.plan` where the incident stands and whether
a gate holds it, runs one idempotent executor from `gpuheal.adapters.steps`, and records
the result in status (a condition per step, the timeline, ownership) *before* moving on. A
restart therefore resumes at the first step not recorded as done, and that step's executor
sees the world as it left it (already cordoned by us, already drained by us, spare already
claimed by this incident) and repeats nothing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal import policy as engine
from gpuheal.adapters import steps
from gpuheal.adapters.kube import Conflict
from gpuheal.api.meta import APPROVE_ANNOTATION
from gpuheal.api.noderemediation import (
    BLOCKED,
    COMPLETED,
    CORDONED,
    DETECTED,
    FAILED,
    RETURNED,
    NodeRemediation,
)
from gpuheal.api.remediationpolicy import DISRUPTIVE_ACTIONS, Action, RemediationPolicy
from gpuheal.handlers.runtime import Runtime
from gpuheal.policy import types as reasons

log = logging.getLogger("gpuheal.remediation")

INITIAL_RUNG_ANNOTATION = "gpuheal.io/initial-rung"
_CONDITION_OF = {
    Action.ALERT: DETECTED,
    Action.CORDON: CORDONED,
    Action.SLURM_DRAIN: "SlurmDrained",
    Action.DRAIN: "Drained",
    Action.RESET: "Reset",
    Action.REBOOT: "Rebooted",
    Action.REPLACE: "ReplacementClaimed",
}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def ensure_driver(rt: Runtime, name: str) -> None:
    """Start the driver task for ``name`` unless one runs."""
    task = rt.drivers.get(name)
    if task is not None and not task.done():
        return
    rt.drivers[name] = asyncio.create_task(_drive(rt, name), name=f"drive:{name}")


async def _drive(rt: Runtime, name: str) -> None:
    attempt = 0
    while True:
        try:
            delay = await advance(rt, name, attempt)
        except asyncio.CancelledError:
            raise
        except Conflict:
            delay = 0.0  # someone (a new signal, a person) changed it: read again
        except Exception:
            attempt += 1
            delay = min(60.0, 2.0 ** min(attempt, 6))
            log.exception("incident %s: step raised; retrying in %.0fs", name, delay)
        else:
            if delay is None:
                release_slot(rt, name)
                return
            attempt = attempt + 1 if delay > 0 else 0
        await asyncio.sleep(delay)


def release_slot(rt: Runtime, name: str) -> None:
    for holders in rt.slots.values():
        holders.discard(name)


class _Recorder:
    """Accumulates one status patch for a NodeRemediation."""

    def __init__(self, body: dict[str, Any], now: dt.datetime) -> None:
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.conditions: list[dict[str, Any]] = list(self.status.get("conditions") or [])
        self.timeline: list[dict[str, Any]] = list(self.status.get("timeline") or [])
        self.generation = (body.get("metadata") or {}).get("generation")
        self.resource_version: str | None = (body.get("metadata") or {}).get("resourceVersion")
        self.now = now
        self.patch: dict[str, Any] = {}

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.conditions = inc.set_condition(
            self.conditions,
            type_=type_,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            observed_generation=self.generation,
        )
        self.patch["conditions"] = self.conditions

    def clear_blocked(self) -> None:
        if inc.condition_is(self.conditions, BLOCKED):
            self.condition(BLOCKED, "False", "NotBlocked", "")

    def event(self, step: str, message: str) -> None:
        self.timeline = [
            *self.timeline,
            {"time": inc.rfc3339_ms(_now()), "step": step, "message": message[:1024]},
        ][-200:]
        self.patch["timeline"] = self.timeline

    def set(self, **fields: Any) -> None:
        for key, value in fields.items():
            if key == "ownership":
                merged = {**(self.status.get("ownership") or {}), **value}
                self.status["ownership"] = merged
                self.patch["ownership"] = merged
            elif key == "requeuedJobs":
                known = {j.get("jobId") for j in self.status.get("requeuedJobs") or []}
                jobs = [
                    *(self.status.get("requeuedJobs") or []),
                    *(j for j in value if j.get("jobId") not in known),
                ]
                self.status["requeuedJobs"] = jobs
                self.patch["requeuedJobs"] = jobs
            else:
                self.status[key] = value
                self.patch[key] = value

    def since(self, type_: str) -> dt.datetime | None:
        c = next((c for c in self.conditions if c.get("type") == type_), None)
        return inc.parse_time(c.get("lastTransitionTime")) if c else None

    def reason(self, type_: str) -> str | None:
        c = next((c for c in self.conditions if c.get("type") == type_), None)
        return c.get("reason") if c else None


async def advance(rt: Runtime, name: str, attempt: int = 0) -> float | None:  # noqa: PLR0911, PLR0912, PLR0915
    """One pass over the incident. Returns seconds to sleep before the next pass (0: at once)
    or None when the incident is over (or gone)."""
    kube = rt.require_kube()
    body = await kube.get_custom(inc.NREM_PLURAL, name)
    if body is None:
        return None
    try:
        nrem = NodeRemediation.model_validate(body)
    except ValidationError as exc:
        log.error("incident %s does not parse, leaving it: %s", name, exc)
        return None
    now = _now()
    rec = _Recorder(body, now)
    if plan.completed(rec.conditions):
        return None
    spec = nrem.spec
    node = spec.node_name
    retry = rt.config.retry_interval
    policy = rt.policies.get(spec.policy_ref.name)
    view = rt.nodes.get(node)

    # Detected: the first record, and the rung the signal count reached when it opened.
    if not inc.condition_is(rec.conditions, DETECTED):
        first = spec.signals[0]
        what = f"XID {first.xid}" if first.xid else (first.condition_type or first.event_reason)
        rung = int(nrem.metadata.annotations.get(INITIAL_RUNG_ANNOTATION, "0") or 0)
        rung = max(0, min(rung, len(spec.ladder) - 1))
        rec.condition(
            DETECTED, "True", "SignalMatched", f"{what} on {node} matched rule {spec.rule}"
        )
        rec.set(rung=rung, nextStep=0)
        rec.event(
            DETECTED,
            f"{what}: rule {spec.rule}, rung {spec.ladder[rung].name}"
            + (" (dry run)" if spec.dry_run else ""),
        )
        await _write(rt, name, rec)
        return 0.0

    if policy is None:
        await _block(
            rt,
            name,
            body,
            rec,
            "PolicyNotFound",
            f"RemediationPolicy {spec.policy_ref.name} not found",
        )
        return retry

    decision = plan.decide_open(
        policy,
        nrem,
        rec.status,
        rec.conditions,
        view,
        list(rt.history.get(node, ())),
        now,
        blind=bool(rt.blind),
        approve_key=APPROVE_ANNOTATION,
    )
    if isinstance(decision, engine.Blocked) and decision.reason == reasons.REASON_DRY_RUN:
        would = decision.would
        if would is None or would.step is None:
            await _complete(
                rt, name, body, rec, "DryRun", "dry run: plan recorded, nothing changed"
            )
            return None
        act_rung, index = int(would.rung or 0), int(would.step_index or 0)
        label = f"{spec.ladder[act_rung].name}/{would.step.action.value}"
        cond = _CONDITION_OF[would.step.action]
        rec.condition(cond, "False", "DryRun", f"dry run: would {would.step.action.value} {node}")
        rec.event(label, f"dry run: would {would.step.action.value}")
        rec.set(rung=act_rung, nextStep=index + 1)
        await _write(rt, name, rec)
        rt.metrics.blocked.labels("DryRun").inc()
        return 0.0
    if isinstance(decision, engine.Blocked):
        message = decision.message
        if decision.reason == reasons.REASON_APPROVAL_PENDING and decision.would is not None:
            message += (
                f": a person approves with `kubectl annotate nrem {name} "
                f"{APPROVE_ANNOTATION}={decision.would.operation.value}`"
            )
        await _block(rt, name, body, rec, decision.reason, message)
        return retry
    if (
        not isinstance(decision, engine.Act)
        or decision.step is None
        or decision.operation in (engine.Operation.CLOSE, engine.Operation.RETURN_TO_SERVICE)
    ):
        return await _finish(rt, name, body, rec, nrem, decision, view)

    step = decision.step
    action = step.action
    act_rung, next_i = int(decision.rung or 0), int(decision.step_index or 0)
    label = f"{spec.ladder[act_rung].name}/{action.value}"
    if decision.reason == reasons.REASON_ESCALATED and act_rung != int(rec.status.get("rung", 0)):
        rec.set(rung=act_rung, nextStep=next_i)
        rec.event("Escalated", decision.message)
        await _write(rt, name, rec)
        return 0.0

    if action is Action.ALERT:
        await kube.post_event(
            _node_ref(node, view),
            reason=inc.EventReason.DETECTED,
            message=f"{name}: {spec.signals[-1].message or spec.rule}",
            type_="Warning",
        )
        rec.event(label, "alert raised")
        rec.set(rung=act_rung, nextStep=next_i + 1)
        await _write(rt, name, rec)
        return 0.0

    if action in DISRUPTIVE_ACTIONS:
        blocked = await _take_slot(rt, name, policy, now)
        if blocked is not None:
            await _block(rt, name, body, rec, blocked.gate.value, blocked.message)
            return retry

    started = time.monotonic()
    result = await _execute(rt, nrem, rec, action, step, now=now, attempt=attempt)
    rt.metrics.step_duration.labels(action.value).observe(time.monotonic() - started)
    rt.metrics.steps.labels(action.value, result.kind).inc()

    for type_, status, reason, message in result.extra_conditions:
        rec.condition(type_, status, reason, message)
    if result.kind == "done":
        rec.condition(result.condition, "True", result.reason, result.message)
        rec.clear_blocked()
        rec.set(**result.status, rung=act_rung, nextStep=next_i + 1)
        rec.event(label, result.message)
        await _write(rt, name, rec)
        detected_at = rec.since(DETECTED)
        if detected_at is not None:
            signal_at = spec.signals[0].observed_at
            rt.metrics.detection_to_step.labels(action.value).observe(
                max(0.0, (now - min(detected_at, signal_at)).total_seconds())
            )
        await kube.post_event(
            body,
            reason=inc.EventReason.STEP_DONE,
            message=f"{label}: {result.message}",
        )
        return 0.0
    if result.kind == "wait":
        rec.condition(result.condition, "False", result.reason, result.message)
        if result.reason in (
            "PodDisruptionBudget",
            "BridgeUnavailable",
            "NoSpareAvailable",
            "PoolNotFound",
            "HookUnavailable",
            "HookUnreachable",
            "WaitingForIdle",
        ):
            await _block(rt, name, body, rec, result.reason, result.message)
        else:
            await _write(rt, name, rec)
        return result.retry_after or retry
    # failed: stop; the node stays as it is (cordoned) and a person must look.
    rec.condition(result.condition, "False", result.reason, result.message)
    rec.condition(FAILED, "True", result.reason, result.message)
    rec.condition(COMPLETED, "True", "Failed", f"{label} failed: {result.message}")
    rec.event(label, f"failed: {result.message}")
    await _write(rt, name, rec)
    rt.metrics.incidents_completed.labels("failed").inc()
    await kube.post_event(
        body,
        reason=inc.EventReason.STEP_FAILED,
        message=f"{label}: {result.message}",
        type_="Warning",
    )
    return None


async def _execute(  # noqa: PLR0911
    rt: Runtime,
    nrem: NodeRemediation,
    rec: _Recorder,
    action: Action,
    step: Any,
    *,
    now: dt.datetime,
    attempt: int,
) -> steps.StepResult:
    kube = rt.require_kube()
    spec = nrem.spec
    name = nrem.metadata.name
    node = spec.node_name
    retry = rt.config.retry_interval
    xid = next((s.xid for s in reversed(spec.signals) if s.xid is not None), None)
    if action is Action.CORDON:
        return await steps.cordon(kube, node, name)
    if action is Action.SLURM_DRAIN:
        return await steps.slurm_drain(
            rt.slurm, node, name, xid, step.slurm_drain_options(), now=now, attempt=attempt
        )
    if action is Action.DRAIN:
        started = _started(rec, "Drained", now)
        result, counts = await steps.drain_pods(
            kube, node, step.drain_options(), started=started, now=now, retry_after=retry
        )
        for what, n in counts.items():
            if n:
                rt.metrics.evictions.labels(what).inc(n)
        return result
    if action in (Action.RESET, Action.REBOOT):
        opts = step.reset if action is Action.RESET else step.reboot
        cond = "Reset" if action is Action.RESET else "Rebooted"
        if action is Action.RESET and opts.when_idle:
            busy = await steps.busy_pods(kube, node)
            if busy:
                return steps.StepResult.wait(
                    cond, "WaitingForIdle",
                    f"reset when idle: {len(busy)} pod(s) still run on {node} "
                    f"({', '.join(busy[:3])})", retry,
                )  # fmt: skip
        return await steps.run_hook(
            kube,
            opts.hook,
            action=action.value,
            node=node,
            incident=name,
            xid=xid,
            started=_started(rec, cond, now),
            now=now,
            hook_timeout=opts.timeout,
            retry_after=retry,
        )
    if action is Action.REPLACE:
        pool_name = step.replace.reserve_pool_ref.name
        return await steps.replace(
            kube,
            rt.slurm,
            rt.pools.get(pool_name),
            pool_name,
            list(rt.nodes.values()),
            node=node,
            incident=name,
            retry_after=retry,
        )
    return steps.StepResult.failed(DETECTED, "UnknownAction", f"no executor for {action}")


def _started(rec: _Recorder, cond_type: str, now: dt.datetime) -> dt.datetime:
    """When this step first ran: its condition's transition to False (kept across restarts)."""
    c = next((c for c in rec.conditions if c.get("type") == cond_type), None)
    if c is not None and c.get("status") == "False":
        return inc.parse_time(c.get("lastTransitionTime")) or now
    return now


async def _finish(  # noqa: PLR0911, PLR0917
    rt: Runtime,
    name: str,
    body: dict[str, Any],
    rec: _Recorder,
    nrem: NodeRemediation,
    decision: engine.Decision,
    view: inc.NodeView | None,
) -> float | None:
    """Every step of the rung is done; the engine says: close, return, or wait."""
    kube = rt.require_kube()
    spec = nrem.spec
    node = spec.node_name
    retry = rt.config.retry_interval
    if spec.dry_run:
        await _complete(rt, name, body, rec, "DryRun", "dry run: plan recorded, nothing changed")
        return None
    if isinstance(decision, engine.Act) and decision.operation is engine.Operation.CLOSE:
        if decision.reason == reasons.REASON_REPLACED:
            spare = rec.status.get("replacementNode")
            message = f"{node} replaced by {spare}; {node} stays cordoned for repair"
            await _complete(rt, name, body, rec, "Replaced", message)
            return None
        if decision.reason == reasons.REASON_NOTHING_OWNED:
            message = f"{node} healthy; gpuheal had cordoned/drained nothing to undo"
            rec.condition(RETURNED, "True", "NothingToUndo", message)
            await _complete(rt, name, body, rec, "Returned", message)
            return None
        await _complete(rt, name, body, rec, decision.reason, decision.message)
        return None
    if isinstance(decision, engine.Act):  # RETURN_TO_SERVICE
        messages = []
        if decision.uncordon:
            messages.append(await steps.uncordon(kube, node, name))
        else:
            messages.append(f"{node}: cordon was not gpuheal's, left as it is")
        if decision.resume_slurm:
            messages.append(await steps.slurm_resume(rt.slurm, node, name))
        message = "; ".join(messages)
        rec.condition(RETURNED, "True", "ReturnedToService", message)
        await _complete(rt, name, body, rec, "Returned", message)
        return None
    if isinstance(decision, engine.Idle) and decision.reason == reasons.REASON_RETURN_DISABLED:
        await _complete(rt, name, body, rec, "Remediated", decision.message)
        return None
    if isinstance(decision, engine.Wait):
        status = "Unknown" if decision.reason == reasons.REASON_HYSTERESIS_PENDING else "False"
        if rec.reason(RETURNED) != decision.reason:
            rec.condition(RETURNED, status, decision.reason, decision.message)
            rec.event(RETURNED, f"{decision.reason}: {decision.message}")
            await _write(rt, name, rec)
        return max(0.2, min(retry, (decision.until - rec.now).total_seconds()))
    rec.condition(RETURNED, "False", decision.reason, decision.message)
    await _write(rt, name, rec)
    return retry


async def _complete(  # noqa: PLR0917
    rt: Runtime, name: str, body: dict[str, Any], rec: _Recorder, reason: str, message: str
) -> None:
    rec.clear_blocked()
    rec.condition(COMPLETED, "True", reason, message)
    rec.event(COMPLETED, f"{reason}: {message}")
    await _write(rt, name, rec)
    rt.metrics.incidents_completed.labels(reason.lower()).inc()
    event_reason = {
        "Replaced": inc.EventReason.REPLACED,
        "Returned": inc.EventReason.RETURNED,
    }.get(reason, inc.EventReason.STEP_DONE)
    await rt.require_kube().post_event(body, reason=event_reason, message=message)


async def _block(  # noqa: PLR0917
    rt: Runtime, name: str, body: dict[str, Any], rec: _Recorder, reason: str, message: str
) -> None:
    """Say why in status (Blocked=True) and, when the reason changes, as an Event."""
    changed = not inc.condition_is(rec.conditions, BLOCKED) or rec.reason(BLOCKED) != reason
    rec.condition(BLOCKED, "True", reason, message)
    if changed:
        rec.event(BLOCKED, f"{reason}: {message}")
        rt.metrics.blocked.labels(reason).inc()
        await rt.require_kube().post_event(
            body,
            reason=inc.EventReason.STEP_BLOCKED,
            message=f"{reason}: {message}",
            type_="Warning",
        )
    await _write(rt, name, rec)


async def _write(rt: Runtime, name: str, rec: _Recorder) -> None:
    if rec.patch:
        updated = await rt.require_kube().patch_custom_status(
            inc.NREM_PLURAL, name, rec.patch, resource_version=rec.resource_version
        )
        rec.resource_version = (updated.get("metadata") or {}).get("resourceVersion")
        rec.patch = {}


def _node_ref(node: str, view: inc.NodeView | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "uid": view.uid if view else None},
    }


# ---- maxUnhealthy slots ------------------------------------------------------------------
def selected_nodes(rt: Runtime, policy: RemediationPolicy) -> list[inc.NodeView]:
    chosen = []
    for view in rt.nodes.values():
        choice = plan.choose_policy(rt.policies.values(), view.labels)
        if choice.policy is not None and choice.policy.metadata.name == policy.metadata.name:
            chosen.append(view)
    return chosen


def slot_holders(rt: Runtime, policy_name: str, selected: Sequence[inc.NodeView]) -> set[str]:
    """Incidents that count against maxUnhealthy: open ones holding a slot, and those whose
    node gpuheal still keeps cordoned after the incident closed (a replaced node waiting for
    repair, or return to service turned off). Counting open incidents alone let a storm
    cordon far more nodes than the policy allows, one closed incident at a time."""
    held = {
        i.name
        for i in rt.incidents.values()
        if i.policy == policy_name and i.active and i.holds_slot
    }
    kept_out = {v.cordoned_by for v in selected if v.unschedulable and v.cordoned_by}
    return held | kept_out | rt.slots.setdefault(policy_name, set())


async def _take_slot(
    rt: Runtime, name: str, policy: RemediationPolicy, now: dt.datetime
) -> plan.Blocked | None:
    """Count this incident against maxUnhealthy before its first disruptive step.

    One lock for the whole process: the count and the take are one atomic step, so a storm
    of signals cannot take more slots than the policy allows.
    """
    pname = policy.metadata.name
    async with rt.slot_lock:
        selected = selected_nodes(rt, policy)
        holders = slot_holders(rt, pname, selected)
        if name in holders:
            return None
        started = [
            i.started for i in rt.incidents.values() if i.policy == pname and i.started is not None
        ]
        blocked = plan.slot_gate(
            policy,
            selected=len(selected),
            taken=len(holders),
            started_in_window=started,
            breaker_closed_at=rt.breaker_closed_at.get(pname),
            now=now,
        )
        if blocked is not None:
            if blocked.gate is plan.Gate.CIRCUIT_BREAKER_OPEN:
                if not rt.breaker_open.get(pname):
                    await rt.require_kube().post_event(
                        {
                            "apiVersion": f"{inc.GROUP}/{inc.VERSION}",
                            "kind": "RemediationPolicy",
                            "metadata": {"name": pname, "uid": policy.metadata.uid},
                        },
                        reason=inc.EventReason.BREAKER_OPEN,
                        message=blocked.message,
                        type_="Warning",
                    )
                rt.breaker_open[pname] = True
                rt.metrics.breaker_open.labels(pname).set(1)
            return blocked
        if rt.breaker_open.pop(pname, False):
            rt.metrics.breaker_open.labels(pname).set(0)
            rt.breaker_closed_at[pname] = now
            cooldown = plan.slot_gate(
                policy,
                selected=len(selected),
                taken=len(holders),
                started_in_window=started,
                breaker_closed_at=now,
                now=now,
            )
            if cooldown is not None:
                return cooldown
        rt.slots.setdefault(pname, set()).add(name)
        return None
