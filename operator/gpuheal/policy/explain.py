"""Why gpuheal does what it does with one node, in words: every line is the engine's own
answer, asked through `reading.judge` with inputs built as the operator builds them, so
`gpuheal explain` cannot describe an operator that does something else."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from gpuheal.api.meta import format_duration
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import Action
from gpuheal.policy import types as t
from gpuheal.policy.reading import ClusterRead, judge
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
    read: ClusterRead,
    node: str,
    *,
    incident: NodeRemediation | None,
    episodes: Sequence[t.IncidentSummary],
    now: dt.datetime,
    max_signal_age: dt.timedelta | None = None,
) -> tuple[list[str], list[Verdict]]:
    """Lines for a person, and the verdicts behind them (what tests compare with what the
    operator decides). Every answer comes from `reading.judge`, the operator's own way to
    the engine, with ``read`` (one read of the cluster) where the operator has its caches.

    Every signal is judged as the intake judged it when it arrived (the node's signals
    before it as history, and its incidents that had ended by then); a signal that arrived
    during an incident was recorded on it. Then the node as it stands now: the open
    ``incident``'s next move, or whether anything would open one. ``episodes`` are the
    node's incidents, open and closed.
    """
    view = read.nodes.get(node) or t.NodeView(name=node)
    lines = [
        f"node {view.name}: {'Ready' if view.ready else 'NOT Ready'}"
        + (", cordoned" if view.unschedulable else "")
        + (
            f" (by gpuheal incident {view.cordoned_by})"
            if view.cordoned_by
            else " (not by gpuheal)"
            if view.unschedulable
            else ""
        )
    ]
    current = judge(read, node, now, incident=incident)
    if current is None:
        _, tied = choose_policy(list(read.policies.values()), view.labels)
        lines.append(
            f"policies {', '.join(tied)} tie at the top priority: none acts on this node "
            "(Overlapping)"
            if tied
            else "no RemediationPolicy selects this node: gpuheal does nothing here"
            if incident is None
            else f"RemediationPolicy {incident.spec.policy_ref.name} of incident "
            f"{incident.metadata.name} not found"
        )
        return lines, []
    inputs, decision = current
    policy = inputs.policy
    spec = policy.spec
    governed = read.governs.get(node) == policy.metadata.name
    lines.append(
        f"policy {policy.metadata.name} (priority {spec.priority}) "
        + ("selects it" if governed else "governs its open incident to its end")
        + (" [PAUSED]" if spec.safety.paused else "")
        + (" [DRY RUN]" if spec.safety.dry_run else "")
    )
    if inputs.node.sources_readable_since is None:
        lines.append(
            "a signal source for this node cannot be read (blind): nothing starts or ends "
            "on missing data"
        )
    for type_, bad in watched_conditions(spec):
        cond = view.condition(type_)
        state = "absent" if cond is None else f"{cond.status} since {cond.last_transition_time}"
        lines.append(f"condition {type_} (acts on {bad}): {state}")
    verdicts: list[Verdict] = []
    for obs in inputs.history.observations:
        about = f"{obs.what} at {obs.time.isoformat()}"
        during = next((e for e in episodes if _within(e, obs.time)), None)
        if during is not None:
            lines.append(f"{about}: recorded on incident {during.name}")
            continue
        then = judge(read, node, obs.time, new=obs, before=obs, max_signal_age=max_signal_age)
        if then is None:  # the intake asks under the policy that governs the node: none now
            lines.append(f"{about}: no RemediationPolicy selects the node now")
            continue
        verdicts.append(Verdict(about, then[1]))
        lines.append(f"{about}: {describe(then[1], obs.time)}")
    seen = inputs.history.incident
    now_verdict = Verdict(
        f"incident (rule {seen.rule}, rung {seen.rung})" if seen else "now", decision
    )
    verdicts.append(now_verdict)
    lines.append(f"{now_verdict.about}: {describe(decision, now)}")
    counts = inputs.counts
    if counts.breaker_open:
        lines.append(
            f"circuit breaker OPEN for {policy.metadata.name}: {counts.remediating} of "
            f"{counts.selected} selected nodes out of service"
        )
    return lines, verdicts


def _within(episode: t.IncidentSummary, at: dt.datetime) -> bool:
    started = episode.started_at
    return (
        started is not None
        and started < at
        and (episode.completed_at is None or at <= episode.completed_at)
    )
