"""The decision engine: `decide(policy, node, history, counts, now) -> Decision`.

Pure and total over its inputs: no clock (`now` is an argument), no I/O, no Kubernetes. The
operator turns a `Decision` into API calls and status; tests feed plain values.

The rules, in the order they are applied:
1. Opt-out label: hands off, whatever else is true.
2. Open incident: continue its ladder one step at a time, escalate to a higher rung when
   repeats cross `escalation.occurrences` within the window, then return the node to service
   after `returnToService.healthyFor` of health (only what gpuheal itself cordoned/drained).
   Breaker, rate limit and cooldown never hold up an open incident and never block a return
   to service: blocking the healthy path is how clusters end up with nodes cordoned forever.
3. No incident: the first rule (in policy order) with a new trigger picks the ladder; repeats
   pick the rung; then the gates: paused, breaker (maxUnhealthy/minHealthy), concurrency cap,
   storm cooldown, rate limit, approval, dry-run. Alert-only rungs pass the safety gates.
Catalogue guards hold whatever the policy says: an XID whose entry is `AlertOnly` on first
sight (13/31/43...) only alerts until it repeats on the same GPU; `NoReplace` (94) never
replaces on first sight.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from gpuheal.api.meta import LabelSelector, format_duration, parse_duration, scaled_value
from gpuheal.api.remediationpolicy import (
    DISRUPTIVE_ACTIONS,
    Action,
    EscalationScope,
    RemediationPolicySpec,
    Rule,
    Safety,
    Step,
)
from gpuheal.policy.types import (
    REASON_ALERT_ONLY,
    REASON_APPROVAL_PENDING,
    REASON_BREAKER_OPEN,
    REASON_CONDITION_PENDING,
    REASON_DETECTED,
    REASON_DRY_RUN,
    REASON_ESCALATED,
    REASON_HEALTHY,
    REASON_HEALTHY_FOR_HYSTERESIS,
    REASON_HYSTERESIS_PENDING,
    REASON_MAX_UNHEALTHY,
    REASON_NEXT_STEP,
    REASON_NOTHING_OWNED,
    REASON_OPTED_OUT,
    REASON_PAUSED,
    REASON_RATE_LIMITED,
    REASON_REPLACED,
    REASON_RETURN_DISABLED,
    REASON_SOURCE_BLIND,
    REASON_STILL_UNHEALTHY,
    REASON_STORM_COOLDOWN,
    Act,
    Blocked,
    ClusterCounts,
    Decision,
    History,
    Idle,
    IncidentView,
    NodeView,
    Observation,
    Operation,
    Wait,
)
from gpuheal.xid.catalogue import lookup
from gpuheal.xid.types import FirstSight


@dataclasses.dataclass(frozen=True, slots=True)
class Trigger:
    """A rule that fires now, at which rung, and why."""

    rule_index: int
    rule: Rule
    rung: int
    steps: tuple[Step, ...]  # the rung's steps after the catalogue's first-sight guards
    count: int  # occurrences counted for escalation
    latest: dt.datetime
    xid: int | None
    gpu: str | None
    why: str


# --- safety arithmetic (also used by the operator for status) -------------------------


def allowed_unhealthy(safety: Safety, selected: int) -> int:
    """maxUnhealthy (rounded down, but at least 1 for a non-zero percent) or selected -
    minHealthy (rounded up), never below 0.

    The floor: "10%" of a 5-node group rounds down to 0, which would silently turn a policy
    that plainly means "heal, a few at a time" into one that never heals small groups.
    A count, "0%" or minHealthy say exactly what they mean and get no floor.
    """
    if safety.max_unhealthy is not None:
        allowed = scaled_value(safety.max_unhealthy, selected, round_up=False)
        if allowed == 0 and selected > 0 and _nonzero_percent(safety.max_unhealthy):
            allowed = 1
    elif safety.min_healthy is not None:
        allowed = selected - scaled_value(safety.min_healthy, selected, round_up=True)
    else:  # unreachable for validated policies; be safe rather than permissive
        allowed = 0
    return max(0, min(allowed, selected))


def _nonzero_percent(value: int | str) -> bool:
    return isinstance(value, str) and value.endswith("%") and int(value[:-1]) > 0


def breaker_open(safety: Safety, counts: ClusterCounts) -> bool:
    """Too many selected nodes unhealthy at once: likely a common cause, stop starting."""
    return counts.unhealthy > allowed_unhealthy(safety, counts.selected)


def select_policy(
    labels: dict[str, str], policies: Sequence[tuple[str, LabelSelector, int]]
) -> tuple[str | None, tuple[str, ...]]:
    """Which policy governs a node: (winner or None, names tied at the top if a conflict).

    Highest `priority` wins. A tie between matching policies means neither acts on the node
    and both report `Overlapping`: guessing which of two equally ranked policies a person
    meant is how the wrong ladder runs.
    """
    matching = [(name, prio) for name, selector, prio in policies if selector.matches(labels)]
    if not matching:
        return None, ()
    top = max(prio for _, prio in matching)
    best = sorted(name for name, prio in matching if prio == top)
    if len(best) > 1:
        return None, tuple(best)
    return best[0], ()


# --- triggers ----------------------------------------------------------------------------


def _rule_matches(rule: Rule, obs: Observation) -> bool:
    sig = rule.signals
    if obs.xid is not None:
        if obs.xid not in sig.xids and lookup(obs.xid).action_class not in sig.xid_classes:
            return False
        return not sig.recovery_actions or obs.recovery_action in sig.recovery_actions
    if obs.event_reason is not None:
        return any(
            e.reason == obs.event_reason
            and (e.message_contains is None or e.message_contains in obs.message)
            for e in sig.events
        )
    return False


def _count(
    rule: Rule,
    observations: Sequence[Observation],
    gpu: str | None,
    now: dt.datetime,
    *,
    per_gpu: bool,
) -> int:
    esc = rule.escalation_or_default()
    since = now - parse_duration(esc.window)
    return sum(
        1
        for o in observations
        if since <= o.time <= now and _rule_matches(rule, o) and (not per_gpu or o.gpu == gpu)
    )


def _guarded_steps(steps: Sequence[Step], xid: int | None, gpu_count: int) -> tuple[Step, ...]:
    """Apply the catalogue's first-sight guard to a rung's steps."""
    if xid is None or gpu_count > 1:
        return tuple(steps)
    first_sight = lookup(xid).first_sight
    if first_sight is FirstSight.ALERT_ONLY:
        return (Step(action=Action.ALERT),)
    if first_sight is FirstSight.NO_REPLACE:
        kept = tuple(s for s in steps if s.action is not Action.REPLACE)
        return kept or (Step(action=Action.ALERT),)
    return tuple(steps)


def _rung_for(rule: Rule, count: int) -> int:
    if rule.escalation is None:
        return 0
    return min(count // rule.escalation.occurrences, len(rule.ladder) - 1)


def find_trigger(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    now: dt.datetime,
    *,
    newer_than: dt.datetime | None,
) -> tuple[Trigger | None, dt.datetime | None]:
    """The first rule with a signal newer than `newer_than`; else when to look again."""
    pending: dt.datetime | None = None
    observations = [o for o in history.observations if o.time <= now]
    for index, rule in enumerate(policy.rules):
        fresh = [
            o
            for o in observations
            if (newer_than is None or o.time > newer_than) and _rule_matches(rule, o)
        ]
        cond_hit: tuple[dt.datetime, str] | None = None
        for cs in rule.signals.conditions:
            for c in node.conditions:
                if c.type != cs.type or c.status != cs.status.value:
                    continue
                due = c.last_transition_time + parse_duration(cs.for_)
                if newer_than is not None and c.last_transition_time <= newer_than:
                    continue  # the same bad spell was already handled
                if due <= now:
                    cond_hit = (due, f"condition {c.type}={c.status} held {cs.for_}")
                else:
                    pending = due if pending is None else min(pending, due)
        if not fresh and cond_hit is None:
            continue
        if fresh:
            latest = max(fresh, key=lambda o: o.time)
            esc = rule.escalation_or_default()
            per_gpu = esc.scope is EscalationScope.GPU
            count = _count(rule, observations, latest.gpu, now, per_gpu=per_gpu)
            gpu_count = _count(rule, observations, latest.gpu, now, per_gpu=True)
            rung = _rung_for(rule, count)
            steps = _guarded_steps(rule.ladder[rung].steps, latest.xid, gpu_count)
            what = f"XID {latest.xid}" if latest.xid is not None else f"{latest.event_reason}"
            where = f" on GPU {latest.gpu}" if latest.gpu else ""
            why = f"{what}{where} ({count} in {esc.window}) matched rule {rule.name}"
            return Trigger(
                index, rule, rung, steps, count, latest.time, latest.xid, latest.gpu, why
            ), pending
        assert cond_hit is not None
        due, why = cond_hit
        steps = tuple(rule.ladder[0].steps)
        return Trigger(index, rule, 0, steps, 1, due, None, None, why), pending
    return None, pending


# --- decide ------------------------------------------------------------------------------


def decide(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    counts: ClusterCounts,
    now: dt.datetime,
) -> Decision:
    """What to do next for `node` under `policy` (see module docstring for the rules)."""
    safety = policy.safety
    if safety.opt_out_label in node.labels:
        return Blocked(REASON_OPTED_OUT, f"node carries the opt-out label {safety.opt_out_label}")
    if history.incident is not None:
        return _continue_incident(policy, node, history, history.incident, now)
    if node.sources_readable_since is None:
        # Blind is not healthy and not unhealthy: nothing starts on missing data.
        return Idle(REASON_SOURCE_BLIND, "a signal source for this node cannot be read")
    trigger, pending = find_trigger(policy, node, history, now, newer_than=history.last_resolved_at)
    if trigger is None:
        if pending is not None:
            return Wait(
                pending, REASON_CONDITION_PENDING, "a watched condition has not held long enough"
            )
        return Idle(REASON_HEALTHY, "no signal matches a rule")
    return _start_incident(policy, trigger, counts, now)


def _act_for(trigger: Trigger, reason: str) -> Act:
    step = trigger.steps[0]
    return Act(
        operation=Operation.of(step.action),
        reason=reason,
        message=trigger.why,
        rule=trigger.rule.name,
        rung=trigger.rung,
        step_index=0,
        step=step,
    )


def _start_incident(
    policy: RemediationPolicySpec, trigger: Trigger, counts: ClusterCounts, now: dt.datetime
) -> Decision:
    safety = policy.safety
    act = _act_for(trigger, REASON_DETECTED)
    if safety.paused:
        return Blocked(REASON_PAUSED, "policy is paused", would=act)
    if any(s.action in DISRUPTIVE_ACTIONS for s in trigger.steps):
        gate = _safety_gate(safety, counts, now, act)
        if gate is not None:
            return gate
        if act.step is not None and act.step.action in safety.require_approval:
            return Blocked(REASON_APPROVAL_PENDING, f"{act.operation} needs approval", would=act)
    if safety.dry_run:
        return Blocked(REASON_DRY_RUN, f"dry run: would {act.operation} ({trigger.why})", would=act)
    return act


def _safety_gate(
    safety: Safety, counts: ClusterCounts, now: dt.datetime, act: Act
) -> Blocked | None:
    allowed = allowed_unhealthy(safety, counts.selected)
    if counts.unhealthy > allowed:
        return Blocked(
            REASON_BREAKER_OPEN,
            f"{counts.unhealthy} of {counts.selected} selected nodes unhealthy, "
            f"limit {allowed}: not starting new remediations",
            would=act,
        )
    if counts.remediating + 1 > allowed:
        return Blocked(
            REASON_MAX_UNHEALTHY,
            f"{counts.remediating} nodes already in remediation, limit {allowed}",
            would=act,
        )
    cooldown = parse_duration(safety.storm_cooldown)
    if counts.breaker_closed_at is not None and now < counts.breaker_closed_at + cooldown:
        until = counts.breaker_closed_at + cooldown
        return Blocked(
            REASON_STORM_COOLDOWN,
            f"breaker closed at {counts.breaker_closed_at.isoformat()}; cooling down "
            f"{safety.storm_cooldown}",
            retry_at=until,
            would=act,
        )
    if safety.rate_limit is not None:
        window = parse_duration(safety.rate_limit.window)
        recent = sorted(t for t in counts.recent_starts if now - window < t <= now)
        if len(recent) >= safety.rate_limit.remediations:
            retry = recent[len(recent) - safety.rate_limit.remediations] + window
            return Blocked(
                REASON_RATE_LIMITED,
                f"{len(recent)} remediations started in the last {safety.rate_limit.window}",
                retry_at=retry,
                would=act,
            )
    return None


def _continue_incident(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    incident: IncidentView,
    now: dt.datetime,
) -> Decision:
    safety = policy.safety
    if safety.paused:
        return Blocked(REASON_PAUSED, "policy is paused")
    act = _escalation(policy, node, history, incident, now) or _next_step(
        policy, history, incident, now
    )
    if act is not None:
        step = act.step
        needs_approval = set(safety.require_approval) - incident.approved
        if step is not None and step.action in needs_approval:
            return Blocked(REASON_APPROVAL_PENDING, f"{act.operation} needs approval", would=act)
        if safety.dry_run:
            return Blocked(REASON_DRY_RUN, f"dry run: would {act.operation}", would=act)
        return act
    return _after_ladder(policy, node, history, incident, now)


def _escalation(
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    incident: IncidentView,
    now: dt.datetime,
) -> Act | None:
    """A repeat since the incident opened that climbs above the current rung."""
    trigger, _ = find_trigger(policy, node, history, now, newer_than=incident.started_at)
    if trigger is None or trigger.rule.name != incident.rule or trigger.rung <= incident.rung:
        return None
    steps = [s for s in trigger.steps if s.action not in incident.done]
    if not steps:
        return None
    index = list(trigger.steps).index(steps[0])
    return Act(
        operation=Operation.of(steps[0].action),
        reason=REASON_ESCALATED,
        message=f"{trigger.why}: rung {incident.rung} -> {trigger.rung}",
        rule=trigger.rule.name,
        rung=trigger.rung,
        step_index=index,
        step=steps[0],
    )


def _incident_steps(
    history: History, incident: IncidentView, now: dt.datetime, policy: RemediationPolicySpec
) -> tuple[Step, ...]:
    rung = min(incident.rung, len(incident.ladder) - 1)
    steps = incident.ladder[rung].steps
    if incident.trigger_xid is None:
        return tuple(steps)
    rule = next((r for r in policy.rules if r.name == incident.rule), None)
    gpu_count = (
        _count(rule, history.observations, incident.trigger_gpu, now, per_gpu=True)
        if rule is not None
        else 1
    )
    return _guarded_steps(steps, incident.trigger_xid, gpu_count)


def _next_step(
    policy: RemediationPolicySpec, history: History, incident: IncidentView, now: dt.datetime
) -> Act | None:
    for index, step in enumerate(_incident_steps(history, incident, now, policy)):
        if step.action in incident.done:
            continue
        return Act(
            operation=Operation.of(step.action),
            reason=REASON_NEXT_STEP,
            message=f"rung {incident.rung} step {index}: {step.action}",
            rule=incident.rule,
            rung=incident.rung,
            step_index=index,
            step=step,
        )
    return None


def _after_ladder(  # noqa: PLR0911 - one exit per documented outcome reads best
    policy: RemediationPolicySpec,
    node: NodeView,
    history: History,
    incident: IncidentView,
    now: dt.datetime,
) -> Decision:
    """Every step of the rung is done: close, or return the node once it stayed healthy."""
    steps = _incident_steps(history, incident, now, policy)
    if any(s.action is Action.REPLACE for s in steps):
        return Act(Operation.CLOSE, REASON_REPLACED, "replaced; the node stays out of service")
    if not any(s.action in DISRUPTIVE_ACTIONS for s in steps):
        return Act(Operation.CLOSE, REASON_ALERT_ONLY, "alert raised; nothing to undo")
    rts = policy.return_to_service
    if not rts.enabled:
        return Idle(REASON_RETURN_DISABLED, "returnToService is disabled: a person decides")
    if node.sources_readable_since is None:
        return Blocked(REASON_SOURCE_BLIND, "a signal source is blind: cannot tell it is healthy")
    hysteresis = parse_duration(rts.healthy_for)
    unhealthy = _watched_conditions_bad(policy, node)
    if unhealthy:
        return Wait(now + hysteresis, REASON_STILL_UNHEALTHY, unhealthy)
    healthy_since = max(
        [
            incident.started_at,
            incident.last_step_at or incident.started_at,
            node.sources_readable_since,
            *(o.time for o in history.observations if o.time <= now),
            *_watched_recovery_times(policy, node),
        ]
    )
    if now - healthy_since < hysteresis:
        return Wait(
            healthy_since + hysteresis,
            REASON_HYSTERESIS_PENDING,
            f"healthy for {format_duration(now - healthy_since)} of {rts.healthy_for}",
        )
    uncordon = incident.cordoned_by_us
    resume = incident.slurm_drained_by_us and rts.resume_slurm
    if not uncordon and not resume:
        return Act(Operation.CLOSE, REASON_NOTHING_OWNED, "healthy; gpuheal owns nothing to undo")
    if policy.safety.dry_run:
        return Blocked(REASON_DRY_RUN, "dry run: would return the node to service")
    return Act(
        Operation.RETURN_TO_SERVICE,
        REASON_HEALTHY_FOR_HYSTERESIS,
        f"healthy for {rts.healthy_for}",
        rule=incident.rule,
        rung=incident.rung,
        uncordon=uncordon,
        resume_slurm=resume,
    )


def _watched_conditions_bad(policy: RemediationPolicySpec, node: NodeView) -> str:
    for rule in policy.rules:
        for cs in rule.signals.conditions:
            for c in node.conditions:
                if c.type == cs.type and c.status == cs.status.value:
                    return f"condition {c.type}={c.status} still holds"
    return ""


def _watched_recovery_times(policy: RemediationPolicySpec, node: NodeView) -> list[dt.datetime]:
    watched = {cs.type for rule in policy.rules for cs in rule.signals.conditions}
    return [c.last_transition_time for c in node.conditions if c.type in watched]
