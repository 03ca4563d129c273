"""What the operator keeps in memory, in three parts that kopf's memo holds together
(`Runtime`) and hands apart:

- `ClusterView`: what steps and decisions READ, the cluster as the operator has read it:
  compact views of Nodes, policies, pools and incidents, each node's recent signals and
  FaultHistory, the sources it cannot read now, and the indexes that make cluster counts
  cheap (which policy selects a node, which nodes gpuheal keeps out);
- `Ports`: what steps USE TO ACT: the Kubernetes client, the Slurm bridges (`slurm_for`),
  the Event outbox, the notifier, the metrics, the Lease;
- `Bookkeeping`: the operator's own work: driver tasks and their wake-ups, spares being
  claimed early, locks, timers, queued writes.

A function's signature says which of them it touches. The view is a cache of the cluster
(rebuilt by a LIST at start), the signal history included: what this process saw is also
written to the node's FaultHistory (and to the incident it belongs to), and read back from
there after a restart.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import datetime as dt
import logging
from collections import Counter, deque
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from gpuheal.adapters.events import EventOutbox
from gpuheal.adapters.kube import Kube
from gpuheal.adapters.notify import WebhookSender
from gpuheal.adapters.slurm import BridgeSlurm, UnknownCluster
from gpuheal.api.faulthistory import FaultHistory, HistoryEntry
from gpuheal.api.names import APPROVE_ANNOTATION
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import NotifyEvent, RemediationPolicy
from gpuheal.api.reservepool import RefillStatus, ReservePool
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import reading, select_policy
from gpuheal.policy.inputs import (
    KUBELET_CONDITIONS,
    breaker_from_incidents,
    breaker_state,
    incident_summary,
    kept_conditions,
)
from gpuheal.policy.reading import ClusterRead, NodeRecord, node_record
from gpuheal.policy.select import slurm_cluster
from gpuheal.policy.spares import Unavailable
from gpuheal.policy.types import (
    ClusterCounts,
    History,
    IncidentSummary,
    NodeView,
    Observation,
    PoolCounts,
)
from gpuheal.readiness import Readiness
from gpuheal.remediation.lease import Lease
from gpuheal.remediation.notify import (
    Notice,
    Notifier,
    Target,
    merge_targets,
    policy_targets,
)

HISTORY_PER_NODE = 256
MAX_SEEN_KEYS = 200_000
"""Dedupe keys kept at most (the oldest go first): a flood of distinct Events (10,000 a
minute, for hours) must not grow memory without bound; ~40 MiB at the bound."""


@dataclass
class Breaker:
    """A policy's breaker, as last decided (and written to its CircuitBreakerOpen condition,
    from which a restarted operator reads it back)."""

    open: bool = False
    changed_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A policy or pool the API server stored but the operator cannot read (a spec written
    before a rule was added, or with a newer CRD): ignored, and said so in its status."""

    generation: int | None
    why: str
    # its status as stored: the conditions to update Ready in, and what was last observed
    conditions: list[dict[str, Any]]
    observed_generation: int | None = None


@dataclass
class _Tally:
    """One policy's share of the incidents, kept as they change."""

    holders: set[str] = field(default_factory=set)  # open incidents holding a slot
    busy: Counter[str] = field(default_factory=Counter)  # node -> open slot-holding incidents
    open_nodes: Counter[str] = field(default_factory=Counter)  # node -> open incidents
    starts: list[dt.datetime] = field(default_factory=list)  # slot_taken_at, sorted


class Incidents(MutableMapping[str, IncidentSummary]):
    """Every incident's summary by name, with the indexes a decision reads: the open incident
    of a node, the signals incidents recorded (dedupe), when a node's last incident ended,
    and per policy the slots held, the open nodes and when slots were taken. A change costs
    a few set operations; nothing here walks every incident (they accumulate: closed
    NodeRemediations are kept)."""

    def __init__(self) -> None:
        self._items: dict[str, IncidentSummary] = {}
        self._open_on: dict[str, set[str]] = {}  # node -> open incident names
        self._keys: Counter[str] = Counter()  # trigger keys of every incident
        # (node, signal identity): an identity has no node (a condition's is its type and
        # second), and two nodes' conditions turning in the same second are two signals
        self._recorded: Counter[tuple[str, tuple[object, ...]]] = Counter()
        self._ended: dict[str, dict[str, dt.datetime]] = {}  # node -> {name: completed_at}
        self._tallies: dict[str, _Tally] = {}
        self._replaced: Counter[str] = Counter()  # incidents that brought in a spare
        self._on: dict[str, dict[str, IncidentSummary]] = {}  # node -> {name: every incident}
        self.open_count = 0

    def __getitem__(self, name: str) -> IncidentSummary:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setitem__(self, name: str, summary: IncidentSummary) -> None:
        old = self._items.get(name)
        if old == summary:
            return
        if old is not None:
            self._index(old, -1)
        self._items[name] = summary
        self._index(summary, +1)

    def __delitem__(self, name: str) -> None:
        self._index(self._items.pop(name), -1)

    def _index(self, i: IncidentSummary, sign: int) -> None:
        tally = self._tallies.setdefault(i.policy, _Tally())
        _keyed(self._on, i, sign)
        _bump(self._keys, i.trigger_keys, sign)
        _bump(self._recorded, ((i.node, r) for r in i.recorded), sign)
        if i.active:
            self.open_count += sign
            _member(self._open_on, i.node, i.name, sign)
            _bump(tally.open_nodes, (i.node,), sign)
            if i.holds_slot and sign > 0:
                tally.holders.add(i.name)
            elif i.holds_slot:
                tally.holders.discard(i.name)
            if i.holds_slot:
                _bump(tally.busy, (i.node,), sign)
        if i.replacement:
            _bump(self._replaced, (i.name,), sign)
        if i.completed_at is not None:
            ended = self._ended.setdefault(i.node, {})
            if sign > 0:
                ended[i.name] = i.completed_at
            elif ended.pop(i.name, None) is not None and not ended:
                del self._ended[i.node]
        if i.slot_taken_at is not None:
            if sign > 0:
                bisect.insort(tally.starts, i.slot_taken_at)
            else:
                at = bisect.bisect_left(tally.starts, i.slot_taken_at)
                if at < len(tally.starts) and tally.starts[at] == i.slot_taken_at:
                    del tally.starts[at]

    # ---- reads --------------------------------------------------------------------------
    def open_on(self, node: str) -> IncidentSummary | None:
        names = self._open_on.get(node)
        return self._items[min(names)] if names else None

    def recorded(self, key: str, node: str, identity: tuple[object, ...]) -> bool:
        """Did an incident open on this signal key, or record this signal of this node?"""
        return key in self._keys or (node, identity) in self._recorded

    def replaced(self, name: str) -> bool:
        """Did this incident bring in a spare (its node then holds no slot)?"""
        return name in self._replaced

    def last_resolved(self, node: str) -> dt.datetime | None:
        return max(self._ended.get(node, {}).values(), default=None)

    def tally(self, policy: str) -> _Tally:
        return self._tallies.get(policy) or _Tally()

    # the indexes as they are, for `Runtime.reading` (read-only by convention)
    @property
    def tallies(self) -> dict[str, _Tally]:
        return self._tallies

    @property
    def ended(self) -> dict[str, dict[str, dt.datetime]]:
        return self._ended

    @property
    def replacements(self) -> Counter[str]:
        return self._replaced

    @property
    def on_nodes(self) -> Mapping[str, Collection[IncidentSummary]]:
        """node -> its incidents, open and closed (fault domains: `policy.domains`)."""
        return _Values(self._on)


class _Values(Mapping[str, Collection[IncidentSummary]]):
    """A read-only view of node -> {name: summary} as node -> summaries (no copy)."""

    def __init__(self, on: dict[str, dict[str, IncidentSummary]]) -> None:
        self._on = on

    def __getitem__(self, node: str) -> Collection[IncidentSummary]:
        return self._on[node].values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._on)

    def __len__(self) -> int:
        return len(self._on)


def _bump(counter: Counter[Any], items: Iterable[Any], sign: int) -> None:
    for item in items:
        counter[item] += sign
        if counter[item] <= 0:
            del counter[item]


def _keyed(on: dict[str, dict[str, IncidentSummary]], i: IncidentSummary, sign: int) -> None:
    by_name = on.setdefault(i.node, {})
    if sign > 0:
        by_name[i.name] = i
    elif by_name.pop(i.name, None) is not None and not by_name:
        del on[i.node]


def _member(sets: dict[str, set[str]], key: str, item: str, sign: int) -> None:
    if sign > 0:
        sets.setdefault(key, set()).add(item)
        return
    members = sets.get(key, set())
    members.discard(item)
    if not members:
        sets.pop(key, None)


@dataclass
class ClusterView:
    """The cluster as the operator has read it: what steps and decisions READ.

    Kept current by the watches (`sources`, `objects`) and by the answers to the operator's
    own writes; beside the objects themselves, the indexes that make a decision's inputs
    cheap (which policy governs a node, which nodes gpuheal keeps out, per-policy tallies)
    and what this process has claimed but no object records yet (`slots`, `breakers`), which
    the counts must include. Nothing here does I/O."""

    nodes: dict[str, NodeView] = field(default_factory=dict)
    # The kubelet conditions some policy's rule names: the node views keep them (the others
    # are dropped to keep 5,000 views small). When a policy names a new one, the views lack
    # it: `relist_nodes` asks the Node watch to list again and rebuild them.
    kept_conditions: frozenset[str] = frozenset()
    relist_nodes: asyncio.Event = field(default_factory=asyncio.Event)
    policies: dict[str, RemediationPolicy] = field(default_factory=dict)
    pools: dict[str, ReservePool] = field(default_factory=dict)
    unparsed: dict[tuple[str, str], Unparsed] = field(default_factory=dict)  # (plural, name)
    incidents: Incidents = field(default_factory=Incidents)
    incident_marks: dict[str, tuple[int | None, str | None]] = field(default_factory=dict)
    # The newest NodeRemediation known per open incident (our own writes' answers and the
    # watch): a driver pass starts from it instead of a GET. A stale one costs a 409 and a
    # GET (every status write carries the resourceVersion it read), never a wrong write.
    latest: dict[str, NodeRemediation] = field(default_factory=dict)
    # node -> the policy that governs it (None: none, or a tie), and the tied names if a tie
    assignment: dict[str, str | None] = field(default_factory=dict)
    tied: dict[str, tuple[str, ...]] = field(default_factory=dict)
    selected: Counter[str] = field(default_factory=Counter)
    kept_out: set[str] = field(default_factory=set)  # nodes gpuheal keeps cordoned
    # policy -> {node it governs that gpuheal keeps cordoned: the incident whose cordon it is}
    kept_out_of: dict[str, dict[str, str]] = field(default_factory=dict)
    history: dict[str, deque[Observation]] = field(default_factory=dict)
    seen_keys: dict[str, dt.datetime] = field(default_factory=dict)
    # maxUnhealthy slots taken by incidents of this process, not yet recorded on them; the
    # lock makes a decision's read of the counts and its slot (or breaker) one step.
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
    # spares Slurm keeps out for someone else (an admin's drain, DOWN): node -> why, as the
    # bridge said at the last look (pools.look_in_slurm) or at a refused promotion
    spares_out_in_slurm: dict[str, Unavailable] = field(default_factory=dict)

    # ---- views --------------------------------------------------------------------------
    def set_node(self, view: NodeView) -> None:
        old = self.nodes.get(view.name)
        self.nodes[view.name] = view
        if old is None or old.labels != view.labels:
            self._assign(view)
        else:
            self._keep_out(view.name, view.kept_out_by)

    def drop_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self._keep_out(name, None)
        self.tied.pop(name, None)
        previous = self.assignment.pop(name, None)
        if previous is not None:
            self.selected[previous] -= 1

    def _keep_out(self, node: str, by: str | None) -> None:
        """Index a node gpuheal keeps cordoned (``by``: the incident) under its policy."""
        for kept in self.kept_out_of.values():
            kept.pop(node, None)
        if by is None:
            self.kept_out.discard(node)
            return
        self.kept_out.add(node)
        policy = self.assignment.get(node)
        if policy is not None:
            self.kept_out_of.setdefault(policy, {})[node] = by

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
        self._keep_conditions()

    def breakers_from_incidents(self) -> list[str]:
        """After the incidents are listed: the breaker of a policy whose status lost it (a
        policy re-created) as its open incidents recorded it. Returns the policies rebuilt."""
        rebuilt = []
        for name, policy in self.policies.items():
            found = breaker_from_incidents(policy, self.latest.values())
            if found is not None and not self.breakers.get(name, Breaker()).open:
                self.breakers[name] = Breaker(open=found[0], changed_at=found[1])
                rebuilt.append(name)
        return rebuilt

    def drop_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is not None:
            self.reassign()
            self._keep_conditions()

    def _keep_conditions(self) -> None:
        """Keep in the node views the kubelet conditions the policies name now: one more
        asks for a relist (the views dropped it); one fewer is dropped from them at once."""
        keep = kept_conditions(p.spec for p in self.policies.values())
        if keep == self.kept_conditions:
            return
        grown = bool(keep - self.kept_conditions)
        self.kept_conditions = keep
        if grown:
            self.relist_nodes.set()
            return
        for name, view in self.nodes.items():
            conds = tuple(
                c for c in view.conditions if c.type not in KUBELET_CONDITIONS or c.type in keep
            )
            if len(conds) != len(view.conditions):
                self.nodes[name] = dataclasses.replace(view, conditions=conds)

    def reassign(self) -> None:
        """Which policy governs each node, after the set of policies changed (rare)."""
        self.assignment.clear()
        self.tied.clear()
        self.selected.clear()
        self.kept_out_of.clear()
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
        self._keep_out(view.name, view.kept_out_by)

    def policy_of(self, node: str) -> RemediationPolicy | None:
        name = self.assignment.get(node)
        return self.policies.get(name) if name is not None else None

    def selected_nodes(self, policy: str) -> list[NodeView]:
        return [v for n, v in self.nodes.items() if self.assignment.get(n) == policy]

    # ---- incidents ----------------------------------------------------------------------
    def active_incident(self, node: str) -> IncidentSummary | None:
        return self.incidents.open_on(node)

    def pool_counts(self) -> dict[str, PoolCounts]:
        return reading.pool_counts(self.pools, self.nodes.values(), self.spares_out_in_slurm)

    def counts(self, policy: str, now: dt.datetime | None = None) -> ClusterCounts:
        """The policy's cluster counts now (`reading.policy_counts`, from the indexes kept
        as incidents and nodes change); with ``now``, only the slot starts its rate limit
        reads then."""
        return reading.policy_counts(self.reading(), policy, now)

    def reading(self) -> ClusterRead:
        """What this process read of the cluster, as every decision reads it (the caches
        and indexes themselves, not copies): `policy.reading` builds the engine's inputs
        from it, as `gpuheal explain` does from its own read."""
        return ClusterRead(
            nodes=self.nodes,
            policies=self.policies,
            governs=self.assignment,
            selected=self.selected,
            tallies=self.incidents.tallies,
            kept_out=self.kept_out_of,
            replaced=self.incidents.replacements,
            ended=self.incidents.ended,
            local_slots=self.slots,
            breakers=self.breakers,
            signals=self.history,
            histories=self.fault_history,
            gpu_nodes=self.gpu_nodes,
            blind=self.blind,
            blind_nodes=self.blind_nodes,
            readable_since=self.readable_since,
            pools=self.pools,
            spares_out_in_slurm=self.spares_out_in_slurm,
            incidents_on=self.incidents.on_nodes,
        )

    def incident_seen(self, nrem: NodeRemediation, *, ours: bool = False) -> bool:
        """Take in an incident's newest state: our own write's answer (``ours``), the watch,
        or a GET. Keeps its summary (counts), its body (the driver's next pass) and gives
        back a local slot once the incident records it. Returns whether someone else changed
        what wakes a sleeping driver (a new generation: a signal attached; an approval).
        A watch event older than what we hold (our own write's answer came first) or the
        echo of our own write changes nothing."""
        name = nrem.metadata.name
        held = self.latest.get(name)
        held_rv = held.metadata.resource_version if held is not None else None
        if held is not None and not ours and not _newer(nrem.metadata.resource_version, held_rv):
            return False
        summary = incident_summary(nrem)
        self.incidents[name] = summary
        if summary.active:
            self.latest[name] = nrem
        else:
            self.latest.pop(name, None)
        if summary.holds_slot or not summary.active:
            self.release_slot(name)  # recorded on the incident now (or over)
        mark = (nrem.metadata.generation, nrem.metadata.annotations.get(APPROVE_ANNOTATION))
        changed = self.incident_marks.get(name) != mark
        self.incident_marks[name] = mark
        return changed and not ours

    def incident_gone(self, name: str) -> None:
        self.incidents.pop(name, None)
        self.incident_marks.pop(name, None)
        self.latest.pop(name, None)

    def release_slot(self, incident: str) -> None:
        for holders in self.slots.values():
            holders.discard(incident)

    # ---- signals ------------------------------------------------------------------------
    def remember(self, node: str, obs: Observation) -> bool:
        """Add to the node's history; False if this signal was seen already."""
        if obs.key in self.seen_keys:
            return False
        self.seen_keys[obs.key] = obs.time
        if len(self.seen_keys) > MAX_SEEN_KEYS:
            del self.seen_keys[next(iter(self.seen_keys))]  # insertion order: the oldest
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
        """Everything the engine may count for the node (`reading.node_history`)."""
        return reading.node_history(self.reading(), node, extra=extra)

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


@dataclass
class Ports:
    """What steps USE TO ACT: the Kubernetes client, the Slurm bridges, the Event outbox, the
    notifier, the metrics and the Lease, with the flags that configure them. Set up by
    `service.start`; nothing here remembers the cluster."""

    config: OperatorConfig
    metrics: Metrics
    kube: Kube | None = None
    lease: Lease | None = None
    slurm: BridgeSlurm | None = None  # the default cluster's bridge (--bridge-url)
    bridges: dict[str, BridgeSlurm] = field(default_factory=dict)  # every cluster's, by name
    notifier: Notifier | None = None
    notify_sender: WebhookSender | None = None
    notify_targets: list[Target] = field(default_factory=list)  # --notify-webhooks
    events: EventOutbox | None = None
    # What stands in the way (a bridge refusing the token, a forbidden list): /readyz says it
    readiness: Readiness = field(
        default_factory=lambda: Readiness(logging.getLogger("gpuheal.readiness"))
    )

    def require_kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not set up (startup did not run)")
        return self.kube

    def slurm_for(self, cluster: ClusterView, node: str) -> BridgeSlurm | None:
        """The bridge of the node's Slurm cluster (its label in ``cluster``, else its
        policy's ``slurmCluster``, else the default bridge); None: no Slurm here. Raises
        `UnknownCluster` when the node names a cluster without a bridge."""
        view = cluster.nodes.get(node)
        policy = cluster.policy_of(node)
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

    def post_event(
        self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Queue a Kubernetes Event (posted in the background: never on a step's path)."""
        if self.events is None:
            raise RuntimeError("the Event outbox is not set up (startup did not run)")
        self.events.post(involved, reason=reason, message=message, type_=type_)

    def announce(  # noqa: PLR0917
        self,
        cluster: ClusterView,
        nrem: NodeRemediation,
        event: NotifyEvent,
        reason: str,
        message: str,
        now: dt.datetime,
    ) -> None:
        """Tell the incident's receivers (the operator's, and its policy's in ``cluster``)
        about a transition that status now records. Returns at once (`notify.Notifier` sends
        in the background)."""
        if self.notifier is None:
            return
        spec = nrem.spec
        policy = cluster.policies.get(spec.policy_ref.name)
        targets = merge_targets(
            self.notify_targets,
            policy_targets(policy.spec.notifications if policy else None, self.config.namespace),
        )
        if not targets:
            return
        xid = next((s.xid for s in reversed(spec.signals) if s.xid is not None), None)
        notice = Notice(
            event=event,
            incident=nrem.metadata.name,
            node=spec.node_name,
            policy=spec.policy_ref.name,
            rule=spec.rule,
            reason=reason,
            message=message,
            time=now,
            xid=xid,
            dry_run=spec.dry_run,
        )
        self.notifier.notify(notice, targets)


@dataclass
class Bookkeeping:
    """The operator's own work in progress, none of it the cluster's: its tasks (drivers,
    early spare claims, signals in hand), what wakes them, locks and timers, and the writes
    and requests it has queued or made."""

    intake_slots: asyncio.Semaphore  # see intake.submit: --signal-concurrency places
    drivers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    wakeups: dict[str, asyncio.Event] = field(default_factory=dict)
    # incident -> its spare being claimed ahead of the replace step (driver._reserve_spare)
    reservations: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    # incident -> its opening (message, when) not told yet: a domain member's place, which
    # says how it is told, is final only after `domains.PLACE_SETTLE` (driver._opening)
    unannounced: dict[str, tuple[str, dt.datetime]] = field(default_factory=dict)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    node_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    condition_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    attached_at: dict[str, dt.datetime] = field(default_factory=dict)  # incident -> last record
    attach_pending: dict[str, list[Observation]] = field(default_factory=dict)  # its next write
    history_queue: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    history_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    refills: dict[str, RefillStatus] = field(default_factory=dict)  # pool -> last request
    slurm_looked_at: dict[str, dt.datetime] = field(default_factory=dict)  # pool -> last look
    # node -> when an untrusted Event about it was last reported (one Warning per 10 min)
    untrusted_warned: dict[str, dt.datetime] = field(default_factory=dict)
    metrics_served: bool = False

    def node_lock(self, node: str) -> asyncio.Lock:
        return self.node_locks.setdefault(node, asyncio.Lock())

    def forget_before(self, cutoff: dt.datetime) -> None:
        """Drop the record times of incidents older than ``cutoff`` (bounded memory)."""
        for name in [n for n, t in self.attached_at.items() if t < cutoff]:
            del self.attached_at[name]


class Runtime:
    """What kopf's memo holds: the three parts, handed apart by the handlers and
    `service.start`. Nothing below them receives the whole."""

    __slots__ = ("books", "ports", "view")

    def __init__(self, config: OperatorConfig, metrics: Metrics) -> None:
        self.view = ClusterView()
        self.ports = Ports(config=config, metrics=metrics)
        self.books = Bookkeeping(intake_slots=asyncio.Semaphore(config.signal_concurrency))


def take_in(
    ports: Ports, cluster: ClusterView, nrem: NodeRemediation, *, ours: bool = False
) -> bool:
    """`ClusterView.incident_seen`, and the open-incident gauge kept with it."""
    changed = cluster.incident_seen(nrem, ours=ours)
    ports.metrics.active_incidents.set(cluster.incidents.open_count)
    return changed


def _newer(rv: str | None, than: str | None) -> bool:
    """Is resourceVersion ``rv`` newer than ``than``? Opaque strings to the API; etcd's are
    integers, compared as such when both are (else: assume newer, the safe side)."""
    if rv is None or than is None or not (rv.isdigit() and than.isdigit()):
        return rv != than
    return int(rv) > int(than)


def breaker_from_status(policy: RemediationPolicy) -> Breaker:
    """The breaker as the policy's status last said it (restart-proof storm cooldown)."""
    is_open, changed_at = breaker_state(policy)
    return Breaker(open=is_open, changed_at=changed_at)
