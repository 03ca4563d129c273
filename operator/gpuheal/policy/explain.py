"""Why gpuheal does what it does with one node, in words: every line is the engine's own
answer (`decide`), asked with the same inputs the operator builds, so `gpuheal explain`
cannot describe an operator that does something else."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from gpuheal.api.meta import format_duration
from gpuheal.api.remediationpolicy import Action, RemediationPolicy
from gpuheal.policy import types as t
from gpuheal.policy.engine import decide
from gpuheal.policy.select import choose_policy, watched_conditions


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The engine's answer to one question about the node, and the question in words."""

    about: str
    decision: t.Decision


def describe(decision: t.Decision, now: dt.datetime) -> str:
    """One decision as a short phrase."""
    if isinstance(decision, t.Act):
        what = {
            t.Move.OPEN: "opens an incident",
            t.Move.ESCALATE: f"climbs to rung {decision.rung}",
            t.Move.CLOSE: "closes the incident",
            t.Move.RETURN_TO_SERVICE: (
                f"returns the node to ReservePool {decision.to_pool}"
                if decision.to_pool
                else "returns the node to service"
            ),
            t.Move.VERIFY: "runs the policy's check before any return",
            Action.ALERT: "raises an alert",
        }.get(decision.operation, f"runs {decision.operation.value}")
        where = (
            f" (rule {decision.rule}, rung {decision.rung})"
            if decision.rule is not None and decision.operation is not t.Move.CLOSE
            else ""
        )
        spare = (
            "; claims its spare now, beside it"
            if decision.reserve is not None and decision.reserve.replace is not None
            else ""
        )
        return f"{what}{where}: {decision.message}{spare}"
    if isinstance(decision, t.Blocked):
        would = f"; would {decision.would.operation.value}" if decision.would else ""
        retry = (
            f"; looks again in {format_duration(decision.retry_at - now)}"
            if decision.retry_at is not None and decision.retry_at > now
            else ""
        )
        return f"blocked ({decision.reason}): {decision.message}{would}{retry}"
    if isinstance(decision, t.Wait):
        left = format_duration(decision.until - now) if decision.until > now else "now"
        return f"waits ({decision.reason}, {left}): {decision.message}"
    assert isinstance(decision, t.Idle)
    return f"nothing to do ({decision.reason}): {decision.message}"


def explain(
    node: t.NodeView,
    policies: Sequence[RemediationPolicy],
    observations: Sequence[t.Observation],
    *,
    incident: t.IncidentView | None,
    episodes: Sequence[t.IncidentSummary],
    counts: Mapping[str, t.ClusterCounts],
    now: dt.datetime,
    max_signal_age: dt.timedelta | None = None,
) -> tuple[list[str], list[Verdict]]:
    """Lines for a person, and the verdicts behind them (what tests compare with `decide`).

    Every signal is judged as the operator judged it when it arrived (with the signals
    before it as history, and the node's incidents that had ended by then); a signal that
    arrived during an incident was recorded on it. Then the node as it stands now: the open
    incident's next move, or whether anything would open one. `episodes` are the node's
    incidents, open and closed.
    """
    lines = [
        f"node {node.name}: {'Ready' if node.ready else 'NOT Ready'}"
        + (", cordoned" if node.unschedulable else "")
        + (
            f" (by gpuheal incident {node.cordoned_by})"
            if node.cordoned_by
            else " (not by gpuheal)"
            if node.unschedulable
            else ""
        )
    ]
    policy, tied = choose_policy(policies, node.labels)
    if policy is None:
        lines.append(
            f"policies {', '.join(tied)} tie at the top priority: none acts on this node "
            "(Overlapping)"
            if tied
            else "no RemediationPolicy selects this node: gpuheal does nothing here"
        )
        return lines, []
    spec = policy.spec
    lines.append(
        f"policy {policy.metadata.name} (priority {spec.priority}) selects it"
        + (" [PAUSED]" if spec.safety.paused else "")
        + (" [DRY RUN]" if spec.safety.dry_run else "")
    )
    for type_, bad in watched_conditions(spec):
        cond = node.condition(type_)
        state = "absent" if cond is None else f"{cond.status} since {cond.last_transition_time}"
        lines.append(f"condition {type_} (acts on {bad}): {state}")
    policy_counts = counts.get(policy.metadata.name, t.ClusterCounts(0, 0, 0))
    verdicts: list[Verdict] = []
    ordered = sorted(observations, key=lambda o: o.time)
    for i, obs in enumerate(ordered):
        about = f"{obs.what} at {obs.time.isoformat()}"
        during = next((e for e in episodes if _within(e, obs.time)), None)
        if during is not None:
            lines.append(f"{about}: recorded on incident {during.name}")
            continue
        before = t.History(observations=ordered[:i], last_resolved_at=_resolved(episodes, obs.time))
        decision = decide(
            spec, node, before, policy_counts, obs.time, new=obs, max_signal_age=max_signal_age
        )
        verdicts.append(Verdict(about, decision))
        lines.append(f"{about}: {describe(decision, obs.time)}")
    history = t.History(
        observations=ordered, incident=incident, last_resolved_at=_resolved(episodes, now)
    )
    current = Verdict(
        f"incident (rule {incident.rule}, rung {incident.rung})" if incident else "now",
        decide(spec, node, history, policy_counts, now),
    )
    verdicts.append(current)
    lines.append(f"{current.about}: {describe(current.decision, now)}")
    if policy_counts.breaker_open:
        lines.append(
            f"circuit breaker OPEN for {policy.metadata.name}: {policy_counts.remediating} of "
            f"{policy_counts.selected} selected nodes out of service"
        )
    return lines, verdicts


def _within(episode: t.IncidentSummary, at: dt.datetime) -> bool:
    started = episode.started_at
    return (
        started is not None
        and started < at
        and (episode.completed_at is None or at <= episode.completed_at)
    )


def _resolved(episodes: Sequence[t.IncidentSummary], before: dt.datetime) -> dt.datetime | None:
    ends = [e.completed_at for e in episodes if e.completed_at and e.completed_at < before]
    return max(ends, default=None)
