"""From what the API server returns to what the engine reads: Node bodies to compact views,
Events to observations, NodeRemediations to incident views. Pure and total (a malformed body
gives an empty-ish value, never an exception); the operator and `gpuheal explain` both read
the cluster's objects here, and `policy.reading` puts them together into the engine's inputs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from gpuheal.api.meta import ConditionStatus, find_condition, parse_time
from gpuheal.api.names import (
    CLAIMED_BY_LABEL,
    CORDONED_BY_ANNOTATION,
    TRIGGER_ANNOTATION,
    NremCondition,
    PolicyCondition,
    Reason,
)
from gpuheal.api.noderemediation import NodeRemediation, SignalRecord, SignalSource
from gpuheal.api.remediationpolicy import Action, RemediationPolicy, RemediationPolicySpec
from gpuheal.policy.select import watched_conditions
from gpuheal.policy.types import (
    ALWAYS,
    IncidentSummary,
    IncidentView,
    NodeCondition,
    NodeView,
    Observation,
    VerificationState,
)
from gpuheal.xid.identity import GPU_MAP_ANNOTATION, GpuMap, normalize_uuid, parse_gpu_map
from gpuheal.xid.parse import parse_event_all

# Conditions every kubelet reports and that say nothing about GPUs: at 5,000 nodes they are
# most of a view's conditions, so they are dropped unless a policy's rule names them (then
# `kept_conditions` says so and `keep` carries them).
KUBELET_CONDITIONS = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure"})


def kept_conditions(policies: Iterable[RemediationPolicySpec]) -> frozenset[str]:
    """The kubelet conditions that some policy's rule waits for: what `node_view` must keep
    for those rules to fire (the operator and `gpuheal explain` both ask here)."""
    return frozenset(
        type_
        for spec in policies
        for type_, _ in watched_conditions(spec)
        if type_ in KUBELET_CONDITIONS
    )


def node_view(body: Mapping[str, Any], keep: frozenset[str] = frozenset()) -> NodeView:
    """Reduce a Node body to the view. Total: a malformed body gives an empty-ish view.
    ``keep``: the kubelet conditions to keep (`kept_conditions`); the others are dropped."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    # Interned: thousands of nodes share the same label keys and mostly the same values.
    labels = {sys.intern(str(k)): sys.intern(str(v)) for k, v in (meta.get("labels") or {}).items()}
    conds = []
    for c in status.get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        type_ = c.get("type")
        if not isinstance(type_, str) or (type_ in KUBELET_CONDITIONS and type_ not in keep):
            continue
        conds.append(
            NodeCondition(
                type=sys.intern(type_),
                status=sys.intern(str(c.get("status", "Unknown"))),
                last_transition_time=parse_time(c.get("lastTransitionTime")),
                reason=str(c.get("reason") or ""),
            )
        )
    return NodeView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        labels=labels,
        unschedulable=bool(spec.get("unschedulable")),
        conditions=tuple(conds),
        cordoned_by=annotations.get(CORDONED_BY_ANNOTATION),
        claimed_by=labels.get(CLAIMED_BY_LABEL),
        taints=tuple(
            str(t["key"])
            for t in spec.get("taints") or []
            if isinstance(t, Mapping) and t.get("key")
        ),
        gpus=parse_gpu_map(annotations.get(GPU_MAP_ANNOTATION))
        if GPU_MAP_ANNOTATION in annotations
        else GpuMap(),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class NodeEvent:
    """The fields of a core/v1 Event about a Node that gpuheal reads."""

    uid: str
    node: str
    reason: str
    message: str
    count: int
    last_seen: dt.datetime | None
    type: str = "Warning"
    component: str = ""
    # Every name the Event gives its reporter (source.component, reportingComponent), each
    # once: free text the creator chose, which `policy.trust` judges.
    reporters: tuple[str, ...] = ()
    namespace: str = ""
    name: str = ""
    # involvedObject.uid: the Node the Event is about, or "" (the kubelet and
    # node-problem-detector write the node's name there: no uid, see `about_uid`)
    node_uid: str = ""

    @property
    def about_uid(self) -> str | None:
        """The Node uid the Event names, or None when it names none: the kubelet and
        node-problem-detector put the node's *name* in ``involvedObject.uid`` (they do not
        read the Node), which says nothing about which Node object it was."""
        return self.node_uid if self.node_uid and self.node_uid != self.node else None

    @property
    def dedupe_key(self) -> str:
        """uid + count: the same Event object seen again (relist, restart) has the same key;
        the producer bumping ``count`` for a repeat gives a new one."""
        return f"event/{self.uid}/{self.count}"


def node_event(body: Mapping[str, Any]) -> NodeEvent | None:
    """Read an Event body (core/v1, as listed or watched); None unless it is about a Node."""
    involved = body.get("involvedObject") or {}
    if involved.get("kind") != "Node" or not involved.get("name"):
        return None
    meta = body.get("metadata") or {}
    series = body.get("series") or {}
    count = series.get("count") or body.get("count") or 1
    last = (
        parse_time(series.get("lastObservedTime"))
        or parse_time(body.get("lastTimestamp"))
        or parse_time(body.get("eventTime"))
        or parse_time(meta.get("creationTimestamp"))
    )
    source = body.get("source") or {}
    claimed = (source.get("component"), body.get("reportingComponent"))
    return NodeEvent(
        uid=str(meta.get("uid", "")),
        node=str(involved["name"]),
        reason=str(body.get("reason") or ""),
        message=str(body.get("message") or ""),
        count=int(count) if isinstance(count, int) else 1,
        last_seen=last,
        type=str(body.get("type") or "Normal"),
        component=str(source.get("component") or body.get("reportingComponent") or ""),
        reporters=tuple(dict.fromkeys(str(c) for c in claimed if c)),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        node_uid=str(involved.get("uid") or ""),
    )


_XID_TOKEN = re.compile(r"\bXid\b")


def reporter_of(source: str, event_reason: str | None, message: str) -> str:
    """Who reported a signal, for telling one fault reported twice (node-problem-detector's
    XID 79 line and its "fallen off the bus" message; an Event and dcgm-exporter) from the
    same fault reported again by the same reporter (a real repeat)."""
    if source in ("dcgm", SignalSource.DCGM_EXPORTER):
        return "dcgm"
    if source in ("conditions", SignalSource.CONDITION):
        return "condition"
    form = "xid-line" if _XID_TOKEN.search(message) else "text"
    return f"event:{event_reason or '-'}:{form}"


def event_observations(
    ev: NodeEvent, seen_at: dt.datetime, gpus: GpuMap | None = None
) -> list[Observation]:
    """An Event about a Node as observations: one per XID the parser reads (a message may
    name several GPUs), each GPU under its canonical key (`GpuMap.key`: the PCI address,
    whichever way the source named it); else one plain Warning Event (policies may match it
    by reason). Normal Events say nothing."""
    found = parse_event_all(ev.reason, ev.message)
    if not found and ev.type != "Warning":
        return []
    known = (gpus or GpuMap()).learn((x.pci_bus_id, x.gpu_uuid) for x in found)
    base = Observation(
        time=ev.last_seen or seen_at,
        event_reason=ev.reason,
        message=ev.message[:1024],
        source="events",
        key=ev.dedupe_key,
        event_uid=ev.uid,
        reporter=reporter_of("events", ev.reason, ev.message),
    )
    if not found:
        return [base]
    return [
        dataclasses.replace(
            base,
            xid=x.xid,
            gpu=known.key(x.pci_bus_id, x.gpu_uuid),
            gpu_uuid=(normalize_uuid(x.gpu_uuid) if x.gpu_uuid else None)
            or known.uuid_of(x.pci_bus_id),
            recovery_action=x.recovery_action,
            key=ev.dedupe_key if i == 0 else f"{ev.dedupe_key}/{i}",
        )
        for i, x in enumerate(found)
    ]


def event_observation(
    ev: NodeEvent, seen_at: dt.datetime, gpus: GpuMap | None = None
) -> Observation | None:
    """The first of `event_observations` (one GPU), or None."""
    found = event_observations(ev, seen_at, gpus)
    return found[0] if found else None


_SOURCE = {
    "events": SignalSource.EVENT,
    "conditions": SignalSource.CONDITION,
    "dcgm": SignalSource.DCGM_EXPORTER,
}


def signal_record(obs: Observation) -> SignalRecord:
    """How an observation is recorded on a NodeRemediation (spec.signals)."""
    gpu = obs.gpu
    return SignalRecord(
        source=_SOURCE.get(obs.source, SignalSource.MANUAL),
        observed_at=obs.time,
        xid=obs.xid,
        pci_bus_id=gpu if gpu and not gpu.startswith(("GPU-", "MIG-")) else None,
        gpu_uuid=obs.gpu_uuid or (gpu if gpu and gpu.startswith(("GPU-", "MIG-")) else None),
        recovery_action=obs.recovery_action,
        condition_type=obs.condition_type,
        condition_status=obs.condition_status,
        event_reason=obs.event_reason,
        event_uid=obs.event_uid,
        message=obs.message[:1024],
    )


def recorded_observations(nrem: NodeRemediation) -> list[Observation]:
    """The signals recorded on an incident, as observations: repeat counting survives a
    restart even after the Events expired."""
    return [
        Observation(
            time=s.observed_at,
            xid=s.xid,
            gpu=s.pci_bus_id or s.gpu_uuid,  # the canonical key: PCI when known (GpuMap.key)
            gpu_uuid=s.gpu_uuid,
            recovery_action=s.recovery_action,
            event_reason=s.event_reason,
            condition_type=s.condition_type,
            condition_status=s.condition_status
            or (ConditionStatus.TRUE.value if s.condition_type else None),
            message=s.message,
            source="record",
            event_uid=s.event_uid,
            reporter=reporter_of(s.source, s.event_reason, s.message),
        )
        for s in nrem.spec.signals
    ]


#: Repairs a later rung repeats when it names them again (a reboot after a reset that did not
#: hold is a new reboot); every other action is done once per incident (one cordon, one drain).
_PER_RUNG = frozenset({Action.RESET, Action.REBOOT})


def done_actions(
    nrem: NodeRemediation, rung_name: str | None = None
) -> tuple[frozenset[Action], dt.datetime | None]:
    """Actions recorded as done (timeline entries ``<rung>/<action>`` without a "would") and
    when the last one was. With ``rung_name``, a reset or reboot counts only when that rung
    did it."""
    done: set[Action] = set()
    last = None
    for entry in nrem.status.timeline:
        rung, sep, action = entry.step.partition("/")
        if sep and action in Action.__members__.values():
            if rung_name is not None and Action(action) in _PER_RUNG and rung != rung_name:
                continue
            done.add(Action(action))
            last = entry.time
    return frozenset(done), last


_REPAIR_CONDITION = {Action.RESET: NremCondition.RESET, Action.REBOOT: NremCondition.REBOOTED}


def skipped_repairs(nrem: NodeRemediation, done: Iterable[Action]) -> frozenset[Action]:
    """Resets and reboots the incident moved past without repairing anything (a ``Noop``
    hook): their condition is not True, so nothing counts them as a repair."""
    skipped = set()
    for action in done:
        condition = _REPAIR_CONDITION.get(action)
        if condition is None:
            continue
        found = find_condition(nrem.status.conditions, condition)
        if found is None or found.status is not ConditionStatus.TRUE:
            skipped.add(action)
    return frozenset(skipped)


def approvals(nrem: NodeRemediation, annotation: str) -> frozenset[Action]:
    """Actions a person approved with the annotation (comma-separated action names)."""
    raw = nrem.metadata.annotations.get(annotation, "")
    return frozenset(
        Action(v.strip()) for v in raw.split(",") if v.strip() in Action.__members__.values()
    )


def is_completed(nrem: NodeRemediation) -> bool:
    done = find_condition(nrem.status.conditions, NremCondition.COMPLETED)
    return done is not None and done.status is ConditionStatus.TRUE


def started_at(nrem: NodeRemediation) -> dt.datetime:
    """When the incident opened: its Detected condition, else when it was created."""
    detected = find_condition(nrem.status.conditions, NremCondition.DETECTED)
    if detected is not None:
        return detected.last_transition_time
    return nrem.metadata.creation_timestamp or nrem.spec.signals[0].observed_at


def incident_view(nrem: NodeRemediation, *, approve_annotation: str) -> IncidentView:
    """The engine's view of an open incident, from the object alone (restart-proof)."""
    spec = nrem.spec
    status = nrem.status
    rung = min(status.rung, len(spec.ladder) - 1)
    done, last = done_actions(nrem, spec.ladder[rung].name)
    started = started_at(nrem)
    first = spec.signals[0]
    repair = status.repair
    repair_failed = (
        (repair.message or f"{repair.action} failed")
        if repair is not None and repair.rung == rung and repair.failed_at is not None
        else None
    )
    run = status.verification
    verification = (
        VerificationState(
            started_at=run.started_at,
            passed_at=run.passed_at,
            failed_at=run.failed_at,
            message=run.message,
        )
        if run is not None and run.rung == rung
        else None
    )
    return IncidentView(
        name=nrem.metadata.name,
        rule=spec.rule,
        ladder=spec.ladder,
        rung=rung,
        started_at=started,
        done=done,
        repairs_skipped=skipped_repairs(nrem, done),
        last_step_at=last,
        approved=approvals(nrem, approve_annotation),
        cordoned_by_us=nrem.status.ownership.cordoned,
        quarantined_device=_held_rule(nrem),
        slurm_drained_by_us=nrem.status.ownership.slurm_drained,
        trigger_xid=first.xid,
        trigger_gpu=first.pci_bus_id or first.gpu_uuid,
        trigger_gpu_uuid=first.gpu_uuid,
        holds_slot=nrem.status.slot_taken_at is not None,
        dry_run=spec.dry_run,
        replaced_by=status.replacement_node,
        repair_failed=repair_failed,
        verification=verification,
    )


def incident_summary(nrem: NodeRemediation) -> IncidentSummary:
    """What the operator keeps of every NodeRemediation for cluster counts."""
    done = find_condition(nrem.status.conditions, NremCondition.COMPLETED)
    completed = done is not None and done.status is ConditionStatus.TRUE
    keys = {nrem.metadata.annotations.get(TRIGGER_ANNOTATION, "")} - {""}
    return IncidentSummary(
        name=nrem.metadata.name,
        node=nrem.spec.node_name,
        policy=nrem.spec.policy_ref.name,
        active=not completed,
        holds_slot=not completed
        and not nrem.spec.dry_run
        and nrem.status.slot_taken_at is not None,
        trigger_keys=frozenset(keys),
        recorded=frozenset(o.identity for o in recorded_observations(nrem)),
        replacement=nrem.status.replacement_node,
        slot_taken_at=nrem.status.slot_taken_at,
        started_at=started_at(nrem),
        completed_at=done.last_transition_time if done is not None and completed else None,
        started=find_condition(nrem.status.conditions, NremCondition.DETECTED) is not None,
        first_signal_at=nrem.spec.signals[0].observed_at,
    )


def last_resolved(incidents: Iterable[IncidentSummary], node: str) -> dt.datetime | None:
    """When the node's most recent closed incident ended."""
    times = [i.completed_at for i in incidents if i.node == node and i.completed_at is not None]
    return max(times, default=None)


def merge_observations(*groups: Iterable[Observation]) -> list[Observation]:
    """All observations, each signal once, oldest first."""
    seen: dict[tuple[object, ...], Observation] = {}
    for group in groups:
        for o in group:
            seen.setdefault(o.identity, o)
    return sorted(seen.values(), key=lambda o: o.time)


def readable_view(view: NodeView, blind: bool) -> NodeView:
    """The view with its sources' state: blind now, or readable (as far as we know) always."""
    return dataclasses.replace(view, sources_readable_since=None if blind else ALWAYS)


def breaker_state(policy: RemediationPolicy) -> tuple[bool, dt.datetime | None]:
    """(open, last transition) of the policy's breaker as its status says: what a restarted
    operator (or the CLI) starts from, so a storm cooldown survives a restart."""
    cond = find_condition(policy.status.conditions, PolicyCondition.CIRCUIT_BREAKER_OPEN)
    if cond is None:
        return False, None
    if cond.status is ConditionStatus.TRUE:
        return True, cond.last_transition_time
    closed = cond.reason == Reason.BREAKER_CLOSED
    return False, cond.last_transition_time if closed else None


def breaker_from_incidents(
    policy: RemediationPolicy, incidents: Iterable[NodeRemediation]
) -> tuple[bool, dt.datetime | None] | None:
    """The breaker from what the incidents recorded, for a policy whose status says nothing
    of it (re-created, its status wiped): open since the earliest open incident of the policy
    it holds back (Blocked=True, CircuitBreakerOpen), so the storm cooldown still follows when
    it closes. None: the status says (trust it), or no incident tells."""
    if find_condition(policy.status.conditions, PolicyCondition.CIRCUIT_BREAKER_OPEN):
        return None
    held = [
        c.last_transition_time
        for n in incidents
        if n.spec.policy_ref.name == policy.metadata.name and not is_completed(n)
        for c in n.status.conditions
        if c.type == NremCondition.BLOCKED
        and c.status is ConditionStatus.TRUE
        and c.reason == Reason.BREAKER_OPEN
    ]
    return (True, min(held)) if held else None


def _held_rule(nrem: NodeRemediation) -> str | None:
    """The DeviceTaintRule this incident wrote and has not lifted yet."""
    held = nrem.status.quarantined_device
    return held.rule if held is not None and held.released_at is None else None
