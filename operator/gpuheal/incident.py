"""Pure helpers for incidents: names, ownership marks, the compact node view, event dedupe
keys, which pods a drain evicts, and status bookkeeping. No I/O; the clock is an argument.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GROUP = "gpuheal.io"
VERSION = "v1alpha1"
NREM_PLURAL = "noderemediations"
POLICY_PLURAL = "remediationpolicies"
POOL_PLURAL = "reservepools"
NREM_KIND = "NodeRemediation"

# Ownership marks gpuheal writes (and the only ones it ever removes).
CORDONED_BY_ANNOTATION = "gpuheal.io/cordoned-by"  # value: the NodeRemediation's name
CORDONED_AT_ANNOTATION = "gpuheal.io/cordoned-at"
CLAIMED_BY_LABEL = "gpuheal.io/claimed-by"  # on a spare: the incident that claimed it
CLAIMED_AT_ANNOTATION = "gpuheal.io/claimed-at"
REPLACES_ANNOTATION = "gpuheal.io/replaces"  # on a promoted spare: the node it stands in for
NODE_LABEL = "gpuheal.io/node"  # on a NodeRemediation: the node's name (selectable)
TRIGGER_ANNOTATION = "gpuheal.io/trigger"  # on a NodeRemediation: the signal's dedupe key


class EventReason(enum.StrEnum):
    """Reasons of the Kubernetes Events gpuheal posts (constants, one CamelCase word)."""

    DETECTED = "DetectedUnhealthy"
    REMEDIATION_CREATED = "RemediationCreated"
    SIGNAL_ATTACHED = "SignalAttached"
    STEP_DONE = "RemediationStep"
    STEP_BLOCKED = "RemediationBlocked"
    STEP_FAILED = "RemediationStepFailed"
    BREAKER_OPEN = "CircuitBreakerOpen"
    RETURNED = "ReturnedToService"
    REPLACED = "Replaced"
    RETIRED = "Retired"
    SOURCE_BLIND = "SourceUnavailable"


# ---- names ---------------------------------------------------------------------------------
_DNS_BAD = re.compile(r"[^a-z0-9-]+")


def incident_name(node: str, trigger_key: str) -> str:
    """Deterministic NodeRemediation name for a signal: a replayed signal maps to the same
    name, so creating it twice is a 409, never a second incident."""
    digest = hashlib.sha256(f"{node}\0{trigger_key}".encode()).hexdigest()[:8]
    base = _DNS_BAD.sub("-", node.lower()).strip("-")[:49].strip("-") or "node"
    return f"nrem-{base}-{digest}"


# ---- the compact node view -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str
    reason: str
    since: dt.datetime | None  # lastTransitionTime


@dataclass(frozen=True, slots=True)
class NodeView:
    """What gpuheal keeps per Node (a few hundred bytes instead of a ~15-40 KiB body)."""

    name: str
    uid: str
    labels: Mapping[str, str]
    unschedulable: bool
    conditions: tuple[NodeCondition, ...] = ()
    cordoned_by: str | None = None
    claimed_by: str | None = None
    taints: tuple[str, ...] = ()

    def condition(self, type_: str) -> NodeCondition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def ready(self) -> bool:
        cond = self.condition("Ready")
        return cond is not None and cond.status == "True"


# Conditions every kubelet reports and that say nothing about GPUs; dropped from the view
# unless a policy names them (then `keep` carries them).
_KUBELET_CONDITIONS = frozenset({"MemoryPressure", "DiskPressure", "PIDPressure"})


def parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def node_view(body: Mapping[str, Any], keep: frozenset[str] = frozenset()) -> NodeView:
    """Reduce a Node body to the view. Total: a malformed body gives an empty-ish view."""
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
        if not isinstance(type_, str) or (type_ in _KUBELET_CONDITIONS and type_ not in keep):
            continue
        conds.append(
            NodeCondition(
                type=type_,
                status=str(c.get("status", "Unknown")),
                reason=str(c.get("reason") or ""),
                since=parse_time(c.get("lastTransitionTime")),
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
    )


# ---- events --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
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
    return NodeEvent(
        uid=str(meta.get("uid", "")),
        node=str(involved["name"]),
        reason=str(body.get("reason") or ""),
        message=str(body.get("message") or ""),
        count=int(count) if isinstance(count, int) else 1,
        last_seen=last,
        type=str(body.get("type") or "Normal"),
        component=str(source.get("component") or body.get("reportingComponent") or ""),
    )


# ---- drain ---------------------------------------------------------------------------------
class PodDisposition(enum.StrEnum):
    EVICT = "evict"
    DAEMONSET = "daemonset"  # recreated on the node at once; kubectl drain skips them too
    MIRROR = "mirror"  # static pod: the kubelet owns it, the API cannot evict it
    FINISHED = "finished"  # Succeeded/Failed: nothing running


def pod_disposition(pod: Mapping[str, Any]) -> PodDisposition:
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return PodDisposition.MIRROR
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return PodDisposition.DAEMONSET
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return PodDisposition.FINISHED
    return PodDisposition.EVICT


def pods_to_evict(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if pod_disposition(p) is PodDisposition.EVICT]


# ---- status bookkeeping --------------------------------------------------------------------
def rfc3339(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(ts: dt.datetime) -> str:
    """RFC 3339 with milliseconds (timelines: steps often take less than a second)."""
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    *,
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: dt.datetime,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """meta.SetStatusCondition on plain dicts: lastTransitionTime moves only on a change."""
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != status
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": rfc3339(now)
        if changed or previous is None
        else previous.get("lastTransitionTime", rfc3339(now)),
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return [*(dict(c) for c in conditions if c.get("type") != type_), cond]


def condition_is(conditions: Sequence[Mapping[str, Any]], type_: str, status: str = "True") -> bool:
    return any(c.get("type") == type_ and c.get("status") == status for c in conditions)


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    time: dt.datetime
    step: str
    message: str

    def to_k8s(self) -> dict[str, str]:
        return {"time": rfc3339(self.time), "step": self.step, "message": self.message}


def format_timeline(
    entries: Sequence[Mapping[str, Any]], *, start: dt.datetime | None = None
) -> list[str]:
    """Human-readable lines ``+12.3s  Cordoned  message`` relative to ``start``."""
    lines = []
    for e in entries:
        ts = parse_time(e.get("time"))
        offset = f"+{(ts - start).total_seconds():7.1f}s" if ts and start else e.get("time", "")
        lines.append(f"{offset}  {e.get('step', ''):<20} {e.get('message', '')}")
    return lines


@dataclass
class Counts:
    """Cluster counts the breaker reads: per policy, nodes selected and nodes taken out."""

    selected: int = 0
    unhealthy: int = 0
    remediating: set[str] = field(default_factory=set)
