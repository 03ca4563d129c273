"""What the operator keeps in memory (kopf's memo holds one `Runtime`): the clients, compact
views of Nodes, policies, pools and incidents, each node's recent signals, and the indexes
that make cluster counts cheap (which policy selects a node, which nodes gpuheal keeps out).

Everything here is a cache of the cluster (rebuilt by a LIST at start) except the signal
history, which is also recorded on each incident it belongs to.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from gpuheal.adapters.kube import Kube
from gpuheal.adapters.lease import Lease
from gpuheal.adapters.notify import WebhookSender
from gpuheal.adapters.slurm import BridgeSlurm, UnknownCluster
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import cluster_counts, select_policy
from gpuheal.policy.inputs import breaker_state, last_resolved, readable_view
from gpuheal.policy.select import slurm_cluster
from gpuheal.policy.types import ClusterCounts, History, IncidentSummary, NodeView, Observation
from gpuheal.remediation.notify import Notifier, Target

HISTORY_PER_NODE = 256


@dataclass
class Breaker:
    """A policy's breaker, as last decided (and written to its CircuitBreakerOpen condition,
    from which a restarted operator reads it back)."""

    open: bool = False
    changed_at: dt.datetime | None = None


@dataclass
class Runtime:
    config: OperatorConfig
    metrics: Metrics
    kube: Kube | None = None
    lease: Lease | None = None
    slurm: BridgeSlurm | None = None  # the default cluster's bridge (--bridge-url)
    bridges: dict[str, BridgeSlurm] = field(default_factory=dict)  # every cluster's, by name
    notifier: Notifier | None = None
    notify_sender: WebhookSender | None = None
    notify_targets: list[Target] = field(default_factory=list)  # --notify-webhooks
    nodes: dict[str, NodeView] = field(default_factory=dict)
    policies: dict[str, RemediationPolicy] = field(default_factory=dict)
    pools: dict[str, ReservePool] = field(default_factory=dict)
    incidents: dict[str, IncidentSummary] = field(default_factory=dict)
    incident_marks: dict[str, tuple[int | None, str | None]] = field(default_factory=dict)
    # node -> the policy that governs it (None: none, or a tie), and the tied names if a tie
    assignment: dict[str, str | None] = field(default_factory=dict)
    tied: dict[str, tuple[str, ...]] = field(default_factory=dict)
    selected: Counter[str] = field(default_factory=Counter)
    kept_out: set[str] = field(default_factory=set)  # nodes gpuheal keeps cordoned
    history: dict[str, deque[Observation]] = field(default_factory=dict)
    seen_keys: dict[str, dt.datetime] = field(default_factory=dict)
    drivers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    wakeups: dict[str, asyncio.Event] = field(default_factory=dict)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    # maxUnhealthy slots taken by incidents of this process, not yet recorded on them.
    slots: dict[str, set[str]] = field(default_factory=dict)
    slot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    breakers: dict[str, Breaker] = field(default_factory=dict)
    blind: set[str] = field(default_factory=set)  # sources that cannot be read right now
    node_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    condition_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    metrics_served: bool = False

    def require_kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not set up (startup did not run)")
        return self.kube

    def slurm_for(self, node: str) -> BridgeSlurm | None:
        """The bridge of the node's Slurm cluster (its label, else its policy's
        ``slurmCluster``, else the default bridge); None: no Slurm here. Raises
        `UnknownCluster` when the node names a cluster without a bridge."""
        view = self.nodes.get(node)
        policy = self.policy_of(node)
        name = slurm_cluster(
            view.labels if view is not None else {},
            self.config.slurm_cluster_label,
            policy.spec.slurm_cluster if policy is not None else None,
        )
        if name is None:
            return self.slurm
        bridge = self.bridges.get(name)
        if bridge is None:
            known = ", ".join(sorted(self.bridges)) or "none"
            raise UnknownCluster(
                f"{node} is in Slurm cluster {name!r}, which has no bridge (known: {known})"
            )
        return bridge

    # ---- views --------------------------------------------------------------------------
    def set_node(self, view: NodeView) -> None:
        old = self.nodes.get(view.name)
        self.nodes[view.name] = view
        if view.kept_out_by:
            self.kept_out.add(view.name)
        else:
            self.kept_out.discard(view.name)
        if old is None or old.labels != view.labels:
            self._assign(view)

    def drop_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.kept_out.discard(name)
        self.tied.pop(name, None)
        previous = self.assignment.pop(name, None)
        if previous is not None:
            self.selected[previous] -= 1

    def set_policy(self, policy: RemediationPolicy) -> None:
        name = policy.metadata.name
        if name not in self.breakers:
            self.breakers[name] = breaker_from_status(policy)
        old = self.policies.get(name)
        self.policies[name] = policy
        if old is None or (old.spec.node_selector, old.spec.priority) != (
            policy.spec.node_selector,
            policy.spec.priority,
        ):
            self.reassign()

    def drop_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is not None:
            self.reassign()

    def reassign(self) -> None:
        """Which policy governs each node, after the set of policies changed (rare)."""
        self.assignment.clear()
        self.tied.clear()
        self.selected.clear()
        for view in self.nodes.values():
            self._assign(view)

    def _assign(self, view: NodeView) -> None:
        previous = self.assignment.get(view.name)
        winner, tied = select_policy(
            view.labels,
            ((n, p.spec.node_selector, p.spec.priority) for n, p in self.policies.items()),
        )
        if previous is not None:
            self.selected[previous] -= 1
        if winner is not None:
            self.selected[winner] += 1
        self.assignment[view.name] = winner
        if tied:
            self.tied[view.name] = tied
        else:
            self.tied.pop(view.name, None)

    def policy_of(self, node: str) -> RemediationPolicy | None:
        name = self.assignment.get(node)
        return self.policies.get(name) if name is not None else None

    def selected_nodes(self, policy: str) -> list[NodeView]:
        return [v for n, v in self.nodes.items() if self.assignment.get(n) == policy]

    # ---- incidents ----------------------------------------------------------------------
    def active_incident(self, node: str) -> IncidentSummary | None:
        return next((i for i in self.incidents.values() if i.node == node and i.active), None)

    def counts(self, policy: str) -> ClusterCounts:
        """The policy's cluster counts now (incidents, nodes kept out, local slots)."""
        breaker = self.breakers.get(policy, Breaker())
        kept_out = [
            self.nodes[n]
            for n in self.kept_out
            if n in self.nodes and self.assignment.get(n) == policy
        ]
        return cluster_counts(
            policy,
            self.selected[policy],
            self.incidents.values(),
            kept_out,
            local_slots=self.slots.get(policy, ()),
            breaker_open=breaker.open,
            breaker_changed_at=breaker.changed_at,
        )

    def release_slot(self, incident: str) -> None:
        for holders in self.slots.values():
            holders.discard(incident)

    # ---- signals ------------------------------------------------------------------------
    def remember(self, node: str, obs: Observation) -> bool:
        """Add to the node's history; False if this signal was seen already."""
        if obs.key in self.seen_keys:
            return False
        self.seen_keys[obs.key] = obs.time
        self.history.setdefault(node, deque(maxlen=HISTORY_PER_NODE)).append(obs)
        return True

    def forget(self, node: str, obs: Observation) -> None:
        """Undo `remember` (a condition that must be looked at again later)."""
        self.seen_keys.pop(obs.key, None)
        kept = self.history.get(node)
        if kept is not None and obs in kept:
            kept.remove(obs)

    def forget_before(self, cutoff: dt.datetime) -> None:
        """Drop dedupe keys and history older than ``cutoff`` (bounded memory)."""
        for key in [k for k, t in self.seen_keys.items() if t < cutoff]:
            del self.seen_keys[key]
        for node in list(self.history):
            kept = deque((s for s in self.history[node] if s.time >= cutoff), HISTORY_PER_NODE)
            if kept:
                self.history[node] = kept
            else:
                del self.history[node]

    def node_history(self, node: str, *, extra: tuple[Observation, ...] = ()) -> History:
        return History(
            observations=(*self.history.get(node, ()), *extra),
            last_resolved_at=last_resolved(self.incidents.values(), node),
        )

    def engine_view(self, view: NodeView) -> NodeView:
        """The node as the engine sees it: with whether its sources are readable now."""
        return readable_view(view, blind=bool(self.blind))

    def node_lock(self, node: str) -> asyncio.Lock:
        return self.node_locks.setdefault(node, asyncio.Lock())


def breaker_from_status(policy: RemediationPolicy) -> Breaker:
    """The breaker as the policy's status last said it (restart-proof storm cooldown)."""
    is_open, changed_at = breaker_state(policy)
    return Breaker(open=is_open, changed_at=changed_at)
