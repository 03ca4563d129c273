"""A node's fault history (the FaultHistory object) as pure functions: what to record for a
signal, a step or an outcome; how a record is trimmed to its retention and summarised per
GPU; how it reads back as the engine's observations; and which nodes and GPUs are repeat
offenders in a window (`gpuheal history`). No I/O: the operator's writer and the CLI call
these with `now`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gpuheal.api.faulthistory import (
    MAX_ENTRIES,
    MAX_ENTRY_MESSAGE,
    MAX_GPUS,
    EntryKind,
    FaultHistory,
    FaultHistoryStatus,
    GpuRecord,
    HistoryEntry,
)
from gpuheal.api.meta import Condition, ConditionStatus, format_duration, set_condition
from gpuheal.policy.engine import human_window
from gpuheal.policy.types import Observation

REPEAT_OFFENDER = "RepeatOffender"
DEFAULT_RETENTION = dt.timedelta(days=30)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ENTRY_MESSAGE else text[: MAX_ENTRY_MESSAGE - 3] + "..."


def _uuid(gpu: str | None) -> str | None:
    return gpu if gpu and gpu.startswith(("GPU-", "MIG-")) else None


def _uuid_of(obs: Observation) -> str | None:
    return obs.gpu_uuid or _uuid(obs.gpu)


def signal_entry(obs: Observation, *, incident: str | None = None) -> HistoryEntry:
    """How a signal is recorded (its identity survives the round trip: `observations`)."""
    return HistoryEntry(
        time=obs.time,
        kind=EntryKind.SIGNAL,
        incident=incident,
        source=(obs.source or None) and obs.source[:32],
        xid=obs.xid,
        gpu=obs.gpu[:64] if obs.gpu else None,
        recovery_action=obs.recovery_action,
        event_reason=obs.event_reason[:128] if obs.event_reason else None,
        event_uid=obs.event_uid[:64] if obs.event_uid else None,
        condition_type=obs.condition_type,
        condition_status=obs.condition_status,
        key=obs.key[:256] if obs.key else None,
        gpu_uuid=_uuid_of(obs),
        reporter=obs.reporter[:128] or None,
        message=_short(obs.message),
    )


def event_entry(
    kind: EntryKind,
    time: dt.datetime,
    incident: str,
    *,
    message: str = "",
    rule: str | None = None,
    rung: int | None = None,
    action: str | None = None,
    outcome: str | None = None,
) -> HistoryEntry:
    """An Incident, Action or Outcome entry."""
    return HistoryEntry(
        time=time,
        kind=kind,
        incident=incident,
        rule=rule,
        rung=rung,
        action=action,
        outcome=outcome,
        message=_short(message),
    )


def _identity(e: HistoryEntry) -> tuple[object, ...]:
    return (e.time, e.kind, e.incident, e.xid, e.gpu, e.event_uid, e.condition_type,
            e.action, e.outcome, e.rung)  # fmt: skip


def merge(
    current: Sequence[HistoryEntry],
    new: Iterable[HistoryEntry],
    *,
    now: dt.datetime,
    retention: dt.timedelta,
) -> list[HistoryEntry]:
    """Entries of both, each once, oldest first, none older than `retention`, at most
    MAX_ENTRIES (the oldest go first)."""
    since = now - retention
    seen: dict[tuple[object, ...], HistoryEntry] = {}
    for e in [*current, *new]:
        if e.time >= since:
            seen.setdefault(_identity(e), e)
    ordered = sorted(seen.values(), key=lambda e: e.time)
    return ordered[-MAX_ENTRIES:]


def _gpu_records(
    entries: Sequence[HistoryEntry], known: Mapping[str, GpuRecord], pci_of: Mapping[str, str]
) -> list[GpuRecord]:
    """One record per GPU key of the node (its PCI address, as repeat counting keys it),
    named by its UUID where one is known."""
    faults: dict[str, list[HistoryEntry]] = {}
    for e in entries:
        if e.kind is EntryKind.SIGNAL and e.gpu:
            faults.setdefault(e.gpu, []).append(e)
    records = []
    for gpu, mine in faults.items():
        xids = list(dict.fromkeys(e.xid for e in reversed(mine) if e.xid is not None))
        uuid = next((e.gpu_uuid for e in reversed(mine) if e.gpu_uuid), None) or _uuid(gpu)
        old = known.get(uuid or gpu) or known.get(gpu)
        pci = None if _uuid(gpu) else gpu
        records.append(
            GpuRecord(
                id=uuid or gpu,
                uuid=uuid or (old.uuid if old else None),
                serial=old.serial if old else None,
                pci_bus_id=pci or (pci_of.get(uuid) if uuid else None),
                faults=len(mine),
                first_fault_at=mine[0].time,
                last_fault_at=mine[-1].time,
                last_xid=mine[-1].xid,
                xids=xids[:16],
            )
        )
    records.sort(key=lambda r: (-r.faults, r.id))
    return records[:MAX_GPUS]


def summarise(
    entries: Sequence[HistoryEntry],
    *,
    previous: FaultHistoryStatus | None,
    now: dt.datetime,
    retention: dt.timedelta,
    pci_of: Mapping[str, str] | None = None,
) -> FaultHistoryStatus:
    """The status for these entries: counts, one record per GPU, the worst GPU, a summary
    line and the RepeatOffender condition. `pci_of`: UUID -> PCI address (the node's GPU
    map), so a GPU known only by its UUID also shows its slot."""
    known = {g.id: g for g in (previous.gpus if previous else [])}
    gpus = _gpu_records(entries, known, pci_of or {})
    signals = [e for e in entries if e.kind is EntryKind.SIGNAL]
    incidents = {e.incident for e in entries if e.kind is EntryKind.INCIDENT and e.incident}
    outcomes = [e for e in entries if e.kind is EntryKind.OUTCOME]
    worst = gpus[0] if gpus else None
    window = human_window(format_duration(retention))
    if worst is not None and worst.faults > 1:
        xids = ", ".join(f"XID {x}" for x in worst.xids[:3]) or "faults"
        summary = f"{worst.faults} x {xids} on {worst.id} in {window}"
    elif signals:
        summary = f"{len(signals)} fault signal(s) in {window}"
    else:
        summary = f"no fault in {window}"
    conditions: list[Condition] = list(previous.conditions) if previous else []
    offender = worst is not None and worst.faults > 1
    conditions = set_condition(
        conditions,
        type_=REPEAT_OFFENDER,
        status=ConditionStatus.TRUE if offender else ConditionStatus.FALSE,
        reason="RepeatedFaults" if offender else "NoRepeats",
        message=summary if offender else "",
        now=now,
    )
    return FaultHistoryStatus(
        retention=format_duration(retention),
        faults=len(signals),
        incidents=len(incidents),
        last_fault_at=signals[-1].time if signals else None,
        last_outcome=outcomes[-1].outcome if outcomes else None,
        worst_gpu=worst.id if worst else None,
        worst_gpu_faults=worst.faults if worst else 0,
        summary=_short(summary),
        gpus=gpus,
        entries=list(entries),
        conditions=conditions,
    )


def observations(history: FaultHistory) -> list[Observation]:
    """The signals of a FaultHistory as the engine's observations (same identity as when
    they were first seen, so nothing is counted twice)."""
    return [
        Observation(
            time=e.time,
            xid=e.xid,
            gpu=e.gpu,
            recovery_action=e.recovery_action,
            event_reason=e.event_reason,
            condition_type=e.condition_type,
            condition_status=e.condition_status,
            message=e.message,
            source="history",
            key=e.key or "",
            event_uid=e.event_uid,
            reporter=e.reporter or "",
            gpu_uuid=e.gpu_uuid,
        )
        for e in history.status.entries
        if e.kind is EntryKind.SIGNAL
    ]


def last_outcome_at(history: FaultHistory) -> dt.datetime | None:
    """When the node's last incident ended, as its history says."""
    times = [e.time for e in history.status.entries if e.kind is EntryKind.OUTCOME]
    return max(times, default=None)


# ---- repeat offenders (`gpuheal history`) ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Offender:
    """A node or a GPU with its faults in a window."""

    node: str
    gpu: str | None  # None: the node as a whole
    faults: int
    xids: Counter[int]
    incidents: int
    last_fault: dt.datetime | None
    last_outcome: str | None
    pci_bus_id: str | None = None


def offenders(
    histories: Iterable[FaultHistory], *, since: dt.datetime, by_gpu: bool
) -> list[Offender]:
    """Nodes (or GPUs) with faults since `since`, most faults first. A GPU that moved is
    listed under each node it failed on, with its own count there; its UUID joins them."""
    rows: list[Offender] = []
    for fh in histories:
        node = fh.spec.node_name
        recent = [e for e in fh.status.entries if e.time >= since]
        signals = [e for e in recent if e.kind is EntryKind.SIGNAL]
        outcomes = [e.outcome for e in recent if e.kind is EntryKind.OUTCOME and e.outcome]
        incidents = len({e.incident for e in recent if e.kind is EntryKind.INCIDENT})
        if not signals:
            continue
        if not by_gpu:
            rows.append(
                Offender(
                    node=node,
                    gpu=None,
                    faults=len(signals),
                    xids=Counter(e.xid for e in signals if e.xid is not None),
                    incidents=incidents,
                    last_fault=signals[-1].time,
                    last_outcome=outcomes[-1] if outcomes else None,
                )
            )
            continue
        named = {g.pci_bus_id: g.id for g in fh.status.gpus if g.pci_bus_id}
        per_gpu: dict[str, list[HistoryEntry]] = {}
        for e in signals:
            if e.gpu:
                per_gpu.setdefault(e.gpu, []).append(e)
        for gpu, mine in per_gpu.items():
            uuid = next((e.gpu_uuid for e in reversed(mine) if e.gpu_uuid), None)
            rows.append(
                Offender(
                    node=node,
                    gpu=uuid or named.get(gpu) or gpu,
                    faults=len(mine),
                    xids=Counter(e.xid for e in mine if e.xid is not None),
                    incidents=len({e.incident for e in mine if e.incident}),
                    last_fault=mine[-1].time,
                    last_outcome=outcomes[-1] if outcomes else None,
                    pci_bus_id=None if _uuid(gpu) else gpu,
                )
            )
    rows.sort(key=lambda r: (-r.faults, r.node, r.gpu or ""))
    return rows
