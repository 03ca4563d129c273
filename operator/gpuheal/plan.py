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
)
from gpuheal.incident import NodeView, parse_time
from gpuheal.policy.types import ALWAYS
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


def completed(conditions: Sequence[Mapping[str, Any]]) -> bool:
    return any(c.get("type") == COMPLETED and c.get("status") == "True" for c in conditions)


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


# ---- an open incident, step by step: the policy engine decides ---------------------------
def _done_actions(timeline: Sequence[Mapping[str, Any]]) -> tuple[frozenset[Action], Any]:
    """Actions recorded as done (timeline entries ``<rung>/<action>``) and when the last was."""
    done: set[Action] = set()
    last = None
    for entry in timeline:
        _, sep, action = str(entry.get("step", "")).partition("/")
        if sep and action in Action.__members__.values():
            done.add(Action(action))
            last = entry.get("time")
    return frozenset(done), last


def decide_open(  # noqa: PLR0917
    policy: RemediationPolicy,
    nrem: Any,
    status: Mapping[str, Any],
    conditions: Sequence[Mapping[str, Any]],
    node: NodeView | None,
    history: Sequence[Signal],
    now: dt.datetime,
    *,
    blind: bool,
    approve_key: str,
) -> engine.Decision:
    """`gpuheal.policy.decide` for an open NodeRemediation (``nrem``: the parsed model).

    The incident's own snapshot decides dry run (``spec.dryRun``), so editing the policy
    does not flip a running incident. Signals recorded on the incident count as history,
    so escalation survives a restart even after the Events expired."""
    spec = nrem.spec
    done, last = _done_actions(status.get("timeline") or [])
    detected = next((c for c in conditions if c.get("type") == "Detected"), None)
    started = parse_time(detected.get("lastTransitionTime")) if detected else None
    ownership = status.get("ownership") or {}
    approvals = {
        Action(v.strip())
        for v in (nrem.metadata.annotations.get(approve_key, "")).split(",")
        if v.strip() in Action.__members__.values()
    }
    first = spec.signals[0]
    incident = engine.IncidentView(
        rule=spec.rule,
        ladder=spec.ladder,
        rung=int(status.get("rung", 0)),
        started_at=started or now,
        done=done,
        last_step_at=parse_time(last),
        approved=frozenset(approvals),
        cordoned_by_us=bool(ownership.get("cordoned")),
        slurm_drained_by_us=bool(ownership.get("slurmDrained")),
        trigger_xid=first.xid,
        trigger_gpu=first.gpu_uuid or first.pci_bus_id,
    )
    seen = set()
    observations = []
    recorded = [
        engine.Observation(time=s.observed_at, xid=s.xid, gpu=s.gpu_uuid or s.pci_bus_id,
                           recovery_action=s.recovery_action, event_reason=s.event_reason,
                           message=s.message)
        for s in spec.signals if s.condition_type is None
    ]  # fmt: skip
    for obs in [*recorded, *(observation(s) for s in history if s.condition_type is None)]:
        key = (obs.time, obs.xid, obs.gpu, obs.event_reason)
        if key not in seen:
            seen.add(key)
            observations.append(obs)
    view = engine.NodeView(
        name=spec.node_name,
        labels=dict(node.labels) if node else {},
        conditions=[engine.NodeCondition(c.type, c.status, c.since or now) for c in node.conditions]
        if node
        else [],
        sources_readable_since=None if blind or node is None else ALWAYS,
    )
    safety = policy.spec.safety.model_copy(update={"dry_run": spec.dry_run})
    pspec = policy.spec.model_copy(update={"safety": safety})
    counts = engine.ClusterCounts(selected=0, unhealthy=0, remediating=0)
    return engine.decide(
        pspec, view, engine.History(observations=observations, incident=incident), counts, now
    )
