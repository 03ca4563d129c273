"""Pure planning for the operator: which policy and rule a signal falls under, which rung of
the ladder it reaches, the next step of an incident, and the safety gates before a step.

No I/O; the clock is an argument. This is the operator's glue over the API models; the
policy engine (`gpuheal.policy`) is the authority for decisions it covers, and this module
keeps to the same rules (documented on the models) for what the operator needs step by step.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuheal import policy as engine
from gpuheal.api.meta import parse_duration
from gpuheal.api.noderemediation import COMPLETED
from gpuheal.api.remediationpolicy import (
    Action,
    EscalationScope,
    RemediationPolicy,
    Rule,
    Step,
)
from gpuheal.incident import NodeView
from gpuheal.xid.catalogue import lookup
from gpuheal.xid.types import RecoveryAction


@dataclass(frozen=True, slots=True)
class Signal:
    """One observation, whatever its source."""

    source: str  # events | conditions | dcgm
    key: str  # dedupe key (Event uid/count, condition type/transition, dcgm series/value)
    time: dt.datetime
    xid: int | None = None
    gpu: str | None = None
    recovery_action: RecoveryAction | None = None
    condition_type: str | None = None
    condition_status: str | None = None
    event_reason: str | None = None
    event_uid: str | None = None
    message: str = ""


# ---- which policy, which rule ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PolicyChoice:
    policy: RemediationPolicy | None
    overlapping: tuple[str, ...] = ()  # names of tied policies (then `policy` is None)


def choose_policy(policies: Iterable[RemediationPolicy], labels: Mapping[str, str]) -> PolicyChoice:
    """The highest-priority policy selecting the node; a tie at the top means none acts
    (the model's documented rule), and the tied names are returned so it can be reported."""
    by_name = {p.metadata.name: p for p in policies}
    winner, tied = engine.select_policy(
        dict(labels),
        [(name, p.spec.node_selector, p.spec.priority) for name, p in by_name.items()],
    )
    return PolicyChoice(by_name[winner] if winner else None, tied)


def rule_matches(rule: Rule, signal: Signal) -> bool:
    sel = rule.signals
    if signal.xid is not None:
        if signal.xid in sel.xids or lookup(signal.xid).action_class in sel.xid_classes:
            if signal.xid == 154 and sel.recovery_actions:
                return signal.recovery_action in sel.recovery_actions
            return True
        return any(
            e.reason == signal.event_reason
            and (e.message_contains is None or e.message_contains in signal.message)
            for e in sel.events
        )
    if signal.condition_type is not None:
        return any(
            c.type == signal.condition_type and c.status.value == signal.condition_status
            for c in sel.conditions
        )
    if signal.event_reason is not None:
        return any(
            e.reason == signal.event_reason
            and (e.message_contains is None or e.message_contains in signal.message)
            for e in sel.events
        )
    return False


def match_rule(policy: RemediationPolicy, signal: Signal) -> Rule | None:
    """Rules are tried in order; the first rule the signal matches wins."""
    return next((r for r in policy.spec.rules if rule_matches(r, signal)), None)


def occurrences(rule: Rule, signal: Signal, history: Iterable[Signal], now: dt.datetime) -> int:
    """Matching signals within the escalation window (same GPU when scope is Gpu), this one
    included."""
    esc = rule.escalation_or_default()
    since = now - parse_duration(esc.window)
    keys = {signal.key}
    count = 1
    for old in history:
        if old.key in keys or old.time < since or not rule_matches(rule, old):
            continue
        if esc.scope is EscalationScope.GPU and signal.gpu and old.gpu and old.gpu != signal.gpu:
            continue
        keys.add(old.key)
        count += 1
    return count


def rung_for(rule: Rule, count: int) -> int:
    """Every `occurrences` matching signals climb one rung (1-2 of 3: rung 0; 3: rung 1)."""
    if len(rule.ladder) == 1:
        return 0
    occ = rule.escalation_or_default().occurrences
    return min(count // occ, len(rule.ladder) - 1)


def alert_only(rule: Rule, rung: int) -> bool:
    return all(s.action is Action.ALERT for s in rule.ladder[rung].steps)


def observation(signal: Signal) -> engine.Observation:
    return engine.Observation(
        time=signal.time,
        xid=signal.xid,
        gpu=signal.gpu,
        recovery_action=signal.recovery_action,
        event_reason=signal.event_reason,
        message=signal.message,
    )


def trigger_for(
    policy: RemediationPolicy,
    node: NodeView,
    signal: Signal,
    history: Sequence[Signal],
) -> engine.Trigger | None:
    """The policy engine's verdict on one new XID/Event signal: rule, rung (repeats counted
    over ``history`` in the rule's window) and the rung's steps after the catalogue's
    first-sight guards (94 never replaces on first sight; 13/31/43 only alert)."""
    keys = {signal.key}
    observations = [observation(signal)]
    for old in history:
        if old.key not in keys and old.condition_type is None:
            keys.add(old.key)
            observations.append(observation(old))
    view = engine.NodeView(name=node.name, labels=dict(node.labels))
    just_before = signal.time - dt.timedelta(microseconds=1)
    trigger, _ = engine.find_trigger(
        policy.spec, view, engine.History(observations=observations), signal.time,
        newer_than=just_before,
    )  # fmt: skip
    return trigger


# ---- where an incident stands ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Position:
    rung: int
    index: int
    step: Step | None  # None: every step of the rung is done


def position(ladder: Sequence[Any], rung: int, next_step: int) -> Position:
    """``ladder`` is the incident's list of Rungs."""
    rung = max(0, min(rung, len(ladder) - 1))
    steps = ladder[rung].steps
    return Position(rung, next_step, steps[next_step] if next_step < len(steps) else None)


def completed(conditions: Sequence[Mapping[str, Any]]) -> bool:
    return any(c.get("type") == COMPLETED and c.get("status") == "True" for c in conditions)


def rung_replaces(ladder: Sequence[Any], rung: int) -> bool:
    return any(s.action is Action.REPLACE for s in ladder[rung].steps)


# ---- safety gates ----------------------------------------------------------------------
class Gate(enum.StrEnum):
    PAUSED = "Paused"
    OPTED_OUT = "OptedOut"
    APPROVAL_PENDING = "ApprovalPending"
    CIRCUIT_BREAKER_OPEN = "CircuitBreakerOpen"
    RATE_LIMITED = "RateLimited"
    STORM_COOLDOWN = "StormCooldown"


@dataclass(frozen=True, slots=True)
class Blocked:
    gate: Gate
    message: str


def allowed_unhealthy(policy: RemediationPolicy, selected: int) -> int:
    """maxUnhealthy (rounded down) or selected - minHealthy (rounded up) as a node count."""
    return engine.allowed_unhealthy(policy.spec.safety, selected)


def approved(annotations: Mapping[str, str], action: Action, key: str) -> bool:
    value = annotations.get(key, "")
    return action.value in {v.strip() for v in value.split(",")} or value.strip() == "*"


def gate(
    policy: RemediationPolicy,
    action: Action,
    *,
    node: NodeView | None,
    incident_annotations: Mapping[str, str],
    approve_key: str,
) -> Blocked | None:
    """Gates that do not need cluster counts (those are checked where slots are taken)."""
    safety = policy.spec.safety
    if safety.paused:
        return Blocked(Gate.PAUSED, f"policy {policy.metadata.name} is paused")
    if node is not None and safety.opt_out_label in node.labels:
        return Blocked(
            Gate.OPTED_OUT, f"node {node.name} carries the opt-out label {safety.opt_out_label}"
        )
    if action in safety.require_approval and not approved(
        incident_annotations, action, approve_key
    ):
        return Blocked(
            Gate.APPROVAL_PENDING,
            f"{action.value} needs approval: annotate this NodeRemediation "
            f"{approve_key}={action.value}",
        )
    return None


def slot_gate(
    policy: RemediationPolicy,
    *,
    selected: int,
    taken: int,
    started_in_window: Sequence[dt.datetime],
    breaker_closed_at: dt.datetime | None,
    now: dt.datetime,
) -> Blocked | None:
    """May one more node of ``policy`` be taken out of service now?"""
    allowed = allowed_unhealthy(policy, selected)
    if taken >= allowed:
        return Blocked(
            Gate.CIRCUIT_BREAKER_OPEN,
            f"{taken} of {selected} selected nodes already out of service; the policy allows "
            f"{allowed} at once",
        )
    safety = policy.spec.safety
    if breaker_closed_at is not None:
        cooldown = parse_duration(safety.storm_cooldown)
        if now < breaker_closed_at + cooldown:
            return Blocked(
                Gate.STORM_COOLDOWN,
                f"storm cooldown until {(breaker_closed_at + cooldown).isoformat()}",
            )
    if safety.rate_limit is not None:
        window = parse_duration(safety.rate_limit.window)
        recent = [t for t in started_in_window if t >= now - window]
        if len(recent) >= safety.rate_limit.remediations:
            return Blocked(
                Gate.RATE_LIMITED,
                f"{len(recent)} remediations started in the last {safety.rate_limit.window}; "
                f"the limit is {safety.rate_limit.remediations}",
            )
    return None


# ---- health for return to service ------------------------------------------------------
def watched_conditions(policy: RemediationPolicy) -> list[tuple[str, str]]:
    return [(c.type, c.status.value) for r in policy.spec.rules for c in r.signals.conditions]


def unhealthy_reasons(policy: RemediationPolicy, node: NodeView) -> list[str]:
    """Why the node is not healthy now (empty: healthy). Ready must be True and no watched
    condition may hold its bad status."""
    out = []
    if not node.ready:
        out.append("Ready is not True")
    for type_, bad in watched_conditions(policy):
        cond = node.condition(type_)
        if cond is not None and cond.status == bad:
            out.append(f"{type_}={bad}")
    return out


def held_for(policy: RemediationPolicy, type_: str, status: str) -> dt.timedelta | None:
    """The shortest `for` of the policy's condition signals matching (type, status)."""
    fors = [
        parse_duration(c.for_)
        for r in policy.spec.rules
        for c in r.signals.conditions
        if c.type == type_ and c.status.value == status
    ]
    return min(fors) if fors else None
