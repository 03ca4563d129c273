"""Which: the policy that governs a node, the rule a signal falls under, the spare a
replacement takes, the pods a drain evicts, what keeps a node from counting as healthy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuheal.api.meta import LabelSelector, parse_duration
from gpuheal.api.remediationpolicy import RemediationPolicy, RemediationPolicySpec, Rule
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy.spares import Unavailable, spare_unavailable
from gpuheal.policy.types import NodeView, Observation
from gpuheal.xid.catalogue import lookup


def select_policy(
    labels: Mapping[str, str], policies: Iterable[tuple[str, LabelSelector, int]]
) -> tuple[str | None, tuple[str, ...]]:
    """Which policy governs a node: (winner or None, names tied at the top if a conflict).

    Highest `priority` wins. A tie between matching policies means neither acts on the node
    and both report `Overlapping`: guessing which of two equally ranked policies a person
    meant is how the wrong ladder runs.
    """
    plain = dict(labels)
    matching = [(name, prio) for name, selector, prio in policies if selector.matches(plain)]
    if not matching:
        return None, ()
    top = max(prio for _, prio in matching)
    best = sorted(name for name, prio in matching if prio == top)
    if len(best) > 1:
        return None, tuple(best)
    return best[0], ()


def choose_policy(
    policies: Iterable[RemediationPolicy], labels: Mapping[str, str]
) -> tuple[RemediationPolicy | None, tuple[str, ...]]:
    """`select_policy` over policy objects: (the winner or None, the tied names)."""
    by_name = {p.metadata.name: p for p in policies}
    winner, tied = select_policy(
        labels, ((name, p.spec.node_selector, p.spec.priority) for name, p in by_name.items())
    )
    return (by_name[winner] if winner else None), tied


def slurm_cluster(labels: Mapping[str, str], label: str, policy_choice: str | None) -> str | None:
    """Which Slurm cluster (so which bridge) a node belongs to: its ``label``, else its
    policy's ``slurmCluster``, else None (the operator's default bridge)."""
    return labels.get(label) or policy_choice or None


def rule_matches(rule: Rule, obs: Observation) -> bool:
    """Does the rule's signal selector take this observation?

    An XID matches by number or catalogue class (and, for 154, the driver's recovery action
    when the rule lists some); any Event matches the rule's Event reasons whether or not its
    message carried an XID; a condition matches by type and the status the rule waits for.
    """
    sig = rule.signals
    if obs.condition_type is not None:
        return any(
            c.type == obs.condition_type and c.status.value == obs.condition_status
            for c in sig.conditions
        )
    if obs.xid is not None and (
        obs.xid in sig.xids or lookup(obs.xid).action_class in sig.xid_classes
    ):
        if not sig.recovery_actions:
            return True
        if obs.recovery_action in sig.recovery_actions:
            return True
    return obs.event_reason is not None and any(
        e.reason == obs.event_reason
        and (e.message_contains is None or e.message_contains in obs.message)
        for e in sig.events
    )


def watched_conditions(policy: RemediationPolicySpec) -> list[tuple[str, str]]:
    """(type, bad status) of every node condition a rule of the policy waits for."""
    seen: dict[tuple[str, str], None] = {}
    for rule in policy.rules:
        for c in rule.signals.conditions:
            seen[(c.type, c.status.value)] = None
    return list(seen)


def held_for(rule: Rule, type_: str, status: str) -> float:
    """Seconds the rule wants the condition to hold (its shortest `for` for it)."""
    fors = [
        parse_duration(c.for_).total_seconds()
        for c in rule.signals.conditions
        if c.type == type_ and c.status.value == status
    ]
    return min(fors, default=0.0)


def unhealthy_reasons(policy: RemediationPolicySpec, node: NodeView) -> list[str]:
    """Why the node does not count as healthy now (empty: healthy). Ready must be True and
    no watched condition may hold its bad status."""
    out = [] if node.ready else ["Ready is not True"]
    for type_, bad in watched_conditions(policy):
        cond = node.condition(type_)
        if cond is not None and cond.status == bad:
            out.append(f"{type_}={bad}")
    return out


def spare_candidates(
    pool: ReservePool,
    nodes: Iterable[NodeView],
    broken: str,
    slurm: Mapping[str, Unavailable] | None = None,
) -> list[str]:
    """Unclaimed nodes of the pool that can be promoted (`spare_unavailable`), by name.
    ``slurm``: the spares Slurm keeps out for someone else (an admin's drain, DOWN)."""
    return sorted(
        n.name
        for n in nodes
        if n.name != broken
        and pool.spec.node_selector.matches(dict(n.labels))
        and n.claimed_by is None
        and spare_unavailable(n, slurm) is None
    )


def pod_is_evicted_by_drain(pod: Mapping[str, Any]) -> bool:
    """What `kubectl drain` evicts: not DaemonSet pods (recreated at once), not mirror pods
    (the kubelet owns them), not pods that finished."""
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pods_to_evict(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if pod_is_evicted_by_drain(p)]
