"""What the operator keeps in memory (kopf's memo holds one `Runtime`): the clients, compact
views of Nodes, policies, pools and incidents, each node's recent signals, and the indexes
that make cluster counts cheap (which policy selects a node, which nodes gpuheal keeps out).

Everything here is a cache of the cluster (rebuilt by a LIST at start), the signal history
included: what this process saw is also written to the node's FaultHistory (and to the
incident it belongs to), and read back from there after a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from gpuheal.adapters.kube import Kube
from gpuheal.adapters.lease import Lease
from gpuheal.adapters.notify import WebhookSender
from gpuheal.adapters.slurm import BridgeSlurm, UnknownCluster
from gpuheal.api.faulthistory import FaultHistory, HistoryEntry
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import RefillStatus, ReservePool
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import cluster_counts, select_policy
from gpuheal.policy import history as fault_history
from gpuheal.policy.inputs import breaker_state, last_resolved, merge_observations
from gpuheal.policy.select import slurm_cluster
from gpuheal.policy.types import (
    ALWAYS,
    ClusterCounts,
    History,
    IncidentSummary,
    NodeView,
    Observation,
    PoolCounts,
)
from gpuheal.remediation.notify import Notifier, Target

HISTORY_PER_NODE = 256
GLOBAL_SOURCES = frozenset({"nodes", "events", "conditions"})
"""Sources that cover every node: blind, they hold back every node. A dcgm-exporter pod
covers its own node only."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the operator keeps of a node's FaultHistory object."""

    observations: tuple[Observation, ...] = ()
    identities: frozenset[tuple[object, ...]] = frozenset()
    last_outcome_at: dt.datetime | None = None
    uuids: frozenset[str] = frozenset()


def node_record(history: FaultHistory) -> NodeRecord:
    obs = tuple(fault_history.observations(history))
    return NodeRecord(
        observations=obs,
        identities=frozenset(o.identity for o in obs),
        last_outcome_at=fault_history.last_outcome_at(history),
        uuids=frozenset(o.gpu_uuid for o in obs if o.gpu_uuid),
    )


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
    # per-node sources (dcgm): source -> nodes it cannot read now; source(/node) -> since when
    # it reads again (blind time is not healthy time); nodes a dcgm-exporter pod covers.
    blind_nodes: dict[str, set[str]] = field(default_factory=dict)
    readable_since: dict[str, dt.datetime] = field(default_factory=dict)
    dcgm_nodes: set[str] = field(default_factory=set)
    # the nodes' FaultHistory objects, as read (watch) or written; UUID -> nodes with it
    fault_history: dict[str, NodeRecord] = field(default_factory=dict)
    gpu_nodes: dict[str, set[str]] = field(default_factory=dict)
    history_queue: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    refills: dict[str, RefillStatus] = field(default_factory=dict)  # pool -> last request
    history_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
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

    def pool_counts(self) -> dict[str, PoolCounts]:
        """Each ReservePool's available spares (ready, unclaimed, not kept out by gpuheal)
        and its minAvailable."""
        out = {}
        for name, pool in self.pools.items():
            available = sum(
                1
                for v in self.nodes.values()
                if pool.spec.node_selector.matches(dict(v.labels))
                and not v.claimed_by
                and v.ready
                and v.cordoned_by is None
            )
            out[name] = PoolCounts(available=available, min_available=pool.spec.min_available)
        return out

    def counts(self, policy: str) -> ClusterCounts:
        """The policy's cluster counts now (incidents, nodes kept out, local slots, pools)."""
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
            pools=self.pool_counts() if self.pools else None,
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

    # ---- fault history (the FaultHistory objects) ---------------------------------------
    def set_fault_history(self, node: str, history: FaultHistory | None) -> None:
        old = self.fault_history.pop(node, None)
        for uuid in old.uuids if old else ():
            self.gpu_nodes.get(uuid, set()).discard(node)
        if history is None:
            return
        record = node_record(history)
        self.fault_history[node] = record
        for uuid in record.uuids:
            self.gpu_nodes.setdefault(uuid, set()).add(node)

    def seen_in_history(self, node: str, obs: Observation) -> bool:
        """The node's FaultHistory has this signal: it was handled before (a restart)."""
        record = self.fault_history.get(node)
        return record is not None and obs.identity in record.identities

    def node_history(self, node: str, *, extra: tuple[Observation, ...] = ()) -> History:
        """Everything the engine may count for the node: this process's signals, the
        node's FaultHistory, and `extra` (an open incident's record), each signal once;
        and the same GPUs' signals on other nodes (a GPU that moved keeps its record)."""
        record = self.fault_history.get(node, NodeRecord())
        observations = merge_observations(self.history.get(node, ()), record.observations, extra)
        resolved = [last_resolved(self.incidents.values(), node), record.last_outcome_at]
        uuids = {o.gpu_uuid for o in observations if o.gpu_uuid}
        elsewhere = [
            o
            for uuid in uuids
            for other in self.gpu_nodes.get(uuid, ())
            if other != node and other in self.fault_history
            for o in self.fault_history[other].observations
            if o.gpu_uuid == uuid
        ]
        return History(
            observations=observations,
            last_resolved_at=max((t for t in resolved if t is not None), default=None),
            elsewhere=elsewhere,
        )

    # ---- sources ---------------------------------------------------------------------------
    def set_blind(self, source: str, node: str | None = None) -> None:
        """`source` cannot be read now (for `node` only, or for every node it covers)."""
        if node is None:
            self.blind.add(source)
        else:
            self.blind_nodes.setdefault(source, set()).add(node)

    def set_seeing(self, source: str, now: dt.datetime, node: str | None = None) -> None:
        """`source` reads again (for `node`): healthy time for the nodes it covers starts now."""
        if node is None:
            if source in self.blind:
                self.blind.discard(source)
                self.readable_since[source] = now
            return
        blind = self.blind_nodes.get(source, set())
        if node in blind:
            blind.discard(node)
            self.readable_since[f"{source}/{node}"] = now

    def engine_view(self, view: NodeView) -> NodeView:
        """The node as the engine sees it: blind when a source that covers it cannot be read
        (a global source, or a per-node one such as its dcgm-exporter pod); otherwise
        readable since the last time one of them came back."""
        if self.blind or any(view.name in nodes for nodes in self.blind_nodes.values()):
            return dataclasses.replace(view, sources_readable_since=None)
        since = [
            t
            for key, t in self.readable_since.items()
            if key in GLOBAL_SOURCES or key.endswith(f"/{view.name}")
        ]
        return dataclasses.replace(view, sources_readable_since=max(since, default=ALWAYS))

    def node_lock(self, node: str) -> asyncio.Lock:
        return self.node_locks.setdefault(node, asyncio.Lock())


def breaker_from_status(policy: RemediationPolicy) -> Breaker:
    """The breaker as the policy's status last said it (restart-proof storm cooldown)."""
    is_open, changed_at = breaker_state(policy)
    return Breaker(open=is_open, changed_at=changed_at)
