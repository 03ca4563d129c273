"""The engine's inputs for one node, from what was read of the cluster.

`ClusterRead` is a plain description of what was read: node views, policies, incidents (as
the indexes a decision reads), the nodes' FaultHistory, signals seen, and which sources are
blind. The operator fills it from its caches (`Runtime.reading`), without copying them;
`gpuheal explain` from one live read of the API (`scan`). `engine_inputs` builds the
engine's inputs from it (the policy that governs the node, its view, its History with the
signals its GPUs left on other nodes, and its policy's ClusterCounts), and `judge` asks the
engine: every caller of `decide` comes through here, so explain cannot build the inputs of
a different operator.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Collection, Container, Iterable, Mapping
from typing import Protocol

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.names import APPROVE_ANNOTATION
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy import faultrecord as fault_history
from gpuheal.policy.domains import DomainStanding, domain_incidents
from gpuheal.policy.engine import decide
from gpuheal.policy.inputs import (
    breaker_from_incidents,
    breaker_state,
    incident_summary,
    incident_view,
    is_completed,
    merge_observations,
    recorded_observations,
)
from gpuheal.policy.safety import ScannedTally, Tally, cluster_counts, starts_since, tally
from gpuheal.policy.select import select_policy
from gpuheal.policy.spares import Unavailable, spare_unavailable
from gpuheal.policy.types import (
    ALWAYS,
    ClusterCounts,
    Decision,
    History,
    IncidentSummary,
    NodeView,
    Observation,
    PoolCounts,
)

GLOBAL_SOURCES = frozenset({"nodes", "events", "conditions"})
"""Sources that cover every node: blind, they hold back every node. A dcgm-exporter pod
covers its own node only (`ClusterRead.blind_nodes`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRecord:
    """What a decision reads of a node's FaultHistory object."""

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


class BreakerState(Protocol):
    """A policy's breaker as last decided."""

    @property
    def open(self) -> bool: ...

    @property
    def changed_at(self) -> dt.datetime | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerRead:
    """A breaker as read from the cluster (the policy's status, else its incidents)."""

    open: bool = False
    changed_at: dt.datetime | None = None


_EMPTY_TALLY = ScannedTally()


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterRead:
    """What was read of the cluster, as a decision needs it. Every field is a mapping or a
    collection, so the operator hands over its caches and indexes as they are (no copy, no
    walk over every incident); `scan` builds the same from lists of objects."""

    nodes: Mapping[str, NodeView]
    policies: Mapping[str, RemediationPolicy]
    governs: Mapping[str, str | None]  # node -> the policy that governs it (None: none, a tie)
    selected: Mapping[str, int]  # policy -> how many nodes it governs
    tallies: Mapping[str, Tally]  # policy -> its share of the incidents (`safety.Tally`)
    kept_out: Mapping[str, Mapping[str, str]]  # policy -> {its node gpuheal keeps out: incident}
    replaced: Container[str]  # incidents that brought in a spare
    ended: Mapping[str, Mapping[str, dt.datetime]]  # node -> {closed incident: when it ended}
    local_slots: Mapping[str, Collection[str]] = dataclasses.field(default_factory=dict)
    breakers: Mapping[str, BreakerState] = dataclasses.field(default_factory=dict)
    # node -> the signals seen about it (the operator's memory of them; explain: its Events)
    signals: Mapping[str, Iterable[Observation]] = dataclasses.field(default_factory=dict)
    histories: Mapping[str, NodeRecord] = dataclasses.field(default_factory=dict)  # by node
    gpu_nodes: Mapping[str, Collection[str]] = dataclasses.field(default_factory=dict)  # UUID ->
    # Sources that cannot be read now: global ones (`GLOBAL_SOURCES`), per-node ones (source ->
    # nodes); and since when each came back (source, or source/node): blind time is not
    # healthy time.
    blind: Collection[str] = ()
    blind_nodes: Mapping[str, Collection[str]] = dataclasses.field(default_factory=dict)
    readable_since: Mapping[str, dt.datetime] = dataclasses.field(default_factory=dict)
    pools: Mapping[str, ReservePool] = dataclasses.field(default_factory=dict)
    spares_out_in_slurm: Mapping[str, Unavailable] = dataclasses.field(default_factory=dict)
    # node -> its incidents, open and closed (the fault domains' members: `policy.domains`)
    incidents_on: Mapping[str, Collection[IncidentSummary]] = dataclasses.field(
        default_factory=dict
    )


@dataclasses.dataclass(frozen=True, slots=True)
class EngineInputs:
    """What `decide` is asked with, for one node."""

    policy: RemediationPolicy
    node: NodeView
    history: History
    counts: ClusterCounts
    domains: tuple[DomainStanding, ...] = ()


def pool_counts(
    pools: Mapping[str, ReservePool],
    nodes: Iterable[NodeView],
    out_in_slurm: Mapping[str, Unavailable],
) -> dict[str, PoolCounts]:
    """Each ReservePool's available spares (unclaimed, `spare_unavailable` says none of
    ready, uncordoned, not kept out in Slurm by someone else) and its minAvailable."""
    views = list(nodes)
    out = {}
    for name, pool in pools.items():
        available = sum(
            1
            for v in views
            if pool.spec.node_selector.matches(dict(v.labels))
            and not v.claimed_by
            and spare_unavailable(v, out_in_slurm) is None
        )
        out[name] = PoolCounts(available=available, min_available=pool.spec.min_available)
    return out


def policy_counts(read: ClusterRead, policy: str, now: dt.datetime | None = None) -> ClusterCounts:
    """The policy's cluster counts (`safety.cluster_counts`); with ``now``, only the slot
    starts its rate limit reads then."""
    breaker = read.breakers.get(policy) or BreakerRead()
    found = read.policies.get(policy)
    return cluster_counts(
        read.selected.get(policy, 0),
        read.tallies.get(policy) or _EMPTY_TALLY,
        read.kept_out.get(policy) or {},
        replaced=read.replaced,
        local_slots=read.local_slots.get(policy, ()),
        breaker_open=breaker.open,
        breaker_changed_at=breaker.changed_at,
        pools=pool_counts(read.pools, read.nodes.values(), read.spares_out_in_slurm),
        since=starts_since(found.spec.safety, now) if now is not None and found else None,
    )


def domain_standings(
    read: ClusterRead, policy: str, node: str, incident: str
) -> tuple[DomainStanding, ...]:
    """The node's place in each of ``policy``'s fault domains it is in (a label it carries):
    the group of incidents its ``incident`` belongs to (`domains.domain_incidents`) and how
    many of the domain's nodes are out of service under the policy (the domain breaker's
    count). Walks the nodes once per domain, only for a policy that names domains."""
    found = read.policies.get(policy)
    view = read.nodes.get(node)
    if found is None or view is None or not found.spec.domains:
        return ()
    kept_out = read.kept_out.get(policy) or {}
    local = read.local_slots.get(policy, ())
    out = []
    for domain in found.spec.domains:
        value = view.labels.get(domain.key)
        if value is None:
            continue
        peers = [n for n, v in read.nodes.items() if v.labels.get(domain.key) == value]
        summaries = [s for n in peers for s in read.incidents_on.get(n, ())]
        groups = domain_incidents(policy, domain, value, summaries)
        group = next((g for g in groups if incident in g.incidents), None)
        holding = {
            s.node
            for s in summaries
            if s.policy == policy
            and s.active
            and (s.holds_slot or s.name in local)
            and s.name not in read.replaced
        } | {n for n in peers if n in kept_out and kept_out[n] not in read.replaced}
        governed = sum(1 for n in peers if read.governs.get(n) == policy)
        out.append(DomainStanding(domain, value, group, governed, len(holding)))
    return tuple(out)


def engine_view(read: ClusterRead, node: str) -> NodeView:
    """The node as the engine sees it: a Node not read (deleted, not listed yet) is blind,
    so nothing returns it; blind when a source that covers it cannot be read (a global
    source, or a per-node one such as its dcgm-exporter pod); otherwise readable since the
    last time one of them came back."""
    view = read.nodes.get(node)
    if view is None:
        return NodeView(name=node, sources_readable_since=None)
    if read.blind or any(node in nodes for nodes in read.blind_nodes.values()):
        return dataclasses.replace(view, sources_readable_since=None)
    since = [
        t
        for key, t in read.readable_since.items()
        if key in GLOBAL_SOURCES or key.endswith(f"/{node}")
    ]
    return dataclasses.replace(view, sources_readable_since=max(since, default=ALWAYS))


def node_history(
    read: ClusterRead,
    node: str,
    *,
    extra: Iterable[Observation] = (),
    before: Observation | None = None,
) -> History:
    """Everything the engine may count for the node: the signals seen about it, the node's
    FaultHistory, and `extra` (an open incident's record), each signal once; and the same
    GPUs' signals on other nodes (a GPU that moved keeps its record). ``before``: only what
    was known when that signal arrived (its predecessors; incidents ended before it)."""
    record = read.histories.get(node) or NodeRecord()
    observations = merge_observations(read.signals.get(node, ()), record.observations, extra)
    resolved = [*read.ended.get(node, {}).values(), record.last_outcome_at]
    cutoff = before.time if before is not None else None
    if before is not None:
        at = next((i for i, o in enumerate(observations) if o.identity == before.identity), None)
        if at is None:
            observations = [o for o in observations if o.time < before.time]
        else:
            observations = observations[:at]
    # The GPUs of the signal that arrives too (a replayed one is not among its predecessors).
    known = [*observations, before] if before is not None else observations
    uuids = sorted({o.gpu_uuid for o in known if o.gpu_uuid})
    elsewhere = [
        o
        for uuid in uuids
        for other in sorted(read.gpu_nodes.get(uuid, ()))
        if other != node and other in read.histories
        for o in read.histories[other].observations
        if o.gpu_uuid == uuid and (cutoff is None or o.time < cutoff)
    ]
    return History(
        observations=observations,
        last_resolved_at=max(
            (t for t in resolved if t is not None and (cutoff is None or t < cutoff)),
            default=None,
        ),
        elsewhere=elsewhere,
    )


def engine_inputs(
    read: ClusterRead,
    node: str,
    now: dt.datetime,
    *,
    incident: NodeRemediation | None = None,
    before: Observation | None = None,
) -> EngineInputs | None:
    """The engine's inputs for ``node``: under the policy its open ``incident`` names (the
    one that opened it governs it to its end), else the policy that governs the node now.
    None: no such policy. ``before``: the node's past as a signal found it when it arrived
    (what `gpuheal explain` replays); the sources are as read now (when they were blind
    before is not recorded)."""
    name = incident.spec.policy_ref.name if incident is not None else read.governs.get(node)
    policy = read.policies.get(name) if name is not None else None
    if policy is None:
        return None
    known = node_history(
        read,
        node,
        extra=recorded_observations(incident) if incident is not None else (),
        before=before,
    )
    view = engine_view(read, node)
    if incident is not None:
        seen = incident_view(incident, approve_annotation=APPROVE_ANNOTATION)
        if seen.name in read.local_slots.get(policy.metadata.name, ()):
            seen = dataclasses.replace(seen, holds_slot=True)  # taken, not recorded yet
        known = dataclasses.replace(known, incident=seen)
    domains = (
        domain_standings(read, policy.metadata.name, node, incident.metadata.name)
        if incident is not None
        else ()
    )
    return EngineInputs(
        policy, view, known, policy_counts(read, policy.metadata.name, now), domains
    )


def judge(
    read: ClusterRead,
    node: str,
    now: dt.datetime,
    *,
    incident: NodeRemediation | None = None,
    new: Observation | None = None,
    before: Observation | None = None,
    max_signal_age: dt.timedelta | None = None,
) -> tuple[EngineInputs, Decision] | None:
    """The engine's answer for ``node`` now (`engine_inputs`, then `decide`): for its open
    ``incident``, or for a ``new`` signal (the intake), or for every fresh signal (explain).
    None: no policy to ask under."""
    inputs = engine_inputs(read, node, now, incident=incident, before=before)
    if inputs is None:
        return None
    decision = decide(
        inputs.policy.spec,
        inputs.node,
        inputs.history,
        inputs.counts,
        now,
        new=new,
        max_signal_age=max_signal_age,
        domains=inputs.domains,
    )
    return inputs, decision


def scan(
    nodes: Iterable[NodeView],
    policies: Iterable[RemediationPolicy],
    incidents: Iterable[NodeRemediation],
    *,
    histories: Iterable[FaultHistory] = (),
    signals: Mapping[str, Iterable[Observation]] | None = None,
    pools: Iterable[ReservePool] = (),
    blind: Collection[str] = (),
    blind_nodes: Mapping[str, Collection[str]] | None = None,
    readable_since: Mapping[str, dt.datetime] | None = None,
) -> ClusterRead:
    """A `ClusterRead` from lists of objects (one live read of the API): the indexes the
    operator keeps as objects change, built in one pass. The breaker is the policy's status,
    else what its open incidents recorded, as a starting operator reads it."""
    views = {v.name: v for v in nodes}
    by_name = {p.metadata.name: p for p in policies}
    governs: dict[str, str | None] = {}
    for view in views.values():
        winner, _ = select_policy(
            view.labels,
            ((n, p.spec.node_selector, p.spec.priority) for n, p in by_name.items()),
        )
        governs[view.name] = winner
    kept_out: dict[str, dict[str, str]] = {}
    for view in views.values():
        policy = governs[view.name]
        if view.kept_out_by is not None and policy is not None:
            kept_out.setdefault(policy, {})[view.name] = view.kept_out_by
    objects = list(incidents)
    summaries = [incident_summary(n) for n in objects]
    ended: dict[str, dict[str, dt.datetime]] = {}
    incidents_on: dict[str, list[IncidentSummary]] = {}
    for s in summaries:
        incidents_on.setdefault(s.node, []).append(s)
        if s.completed_at is not None:
            ended.setdefault(s.node, {})[s.name] = s.completed_at
    breakers = {}
    still_open = [n for n in objects if not is_completed(n)]
    for name, held in by_name.items():
        is_open, changed_at = breaker_state(held)
        found = breaker_from_incidents(held, still_open)
        if found is not None and not is_open:
            is_open, changed_at = found
        breakers[name] = BreakerRead(is_open, changed_at)
    records = {h.spec.node_name: node_record(h) for h in histories}
    gpu_nodes: dict[str, set[str]] = {}
    for node, record in records.items():
        for uuid in record.uuids:
            gpu_nodes.setdefault(uuid, set()).add(node)
    return ClusterRead(
        nodes=views,
        policies=by_name,
        governs=governs,
        selected=Counter(p for p in governs.values() if p is not None),
        tallies={name: tally(name, summaries) for name in by_name},
        kept_out=kept_out,
        replaced=frozenset(s.name for s in summaries if s.replacement),
        ended=ended,
        breakers=breakers,
        signals=signals or {},
        histories=records,
        gpu_nodes=gpu_nodes,
        blind=blind,
        blind_nodes=blind_nodes or {},
        readable_since=readable_since or {},
        pools={p.metadata.name: p for p in pools},
        incidents_on=incidents_on,
    )


def open_incident(incidents: Iterable[NodeRemediation], node: str) -> NodeRemediation | None:
    """The node's open incident, as the operator picks it when several are open (the first
    by name)."""
    found = sorted(
        (n for n in incidents if n.spec.node_name == node and not is_completed(n)),
        key=lambda n: n.metadata.name,
    )
    return found[0] if found else None


def summaries_of(incidents: Iterable[NodeRemediation], node: str) -> list[IncidentSummary]:
    """The node's incidents, open and closed, as summaries."""
    return [incident_summary(n) for n in incidents if n.spec.node_name == node]
