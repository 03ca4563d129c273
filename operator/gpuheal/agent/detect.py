"""Pure core of the agent: records -> findings -> Event series -> condition, and the state that
lets a restarted agent post nothing twice. No I/O; time comes in as an argument.

- A *finding* is one fault record: an XID (fallen-off-the-bus messages without an XID read as
  XID 79, once per fault), an NVSwitch SXid, or an NVML observation (see nvml.py).
- Identical findings (same reason, code, GPU; for XID 154 the same recovery action) within the
  repeat window are one *series*: one Event whose `count` is the number of records, so a storm
  of repeated lines is one Event being bumped, never a flood of Events.
- A series' Event name is derived from (stream, key, position of its first record), so after a
  restart without the state file the agent recomputes the same names: creating an Event that
  exists answers 409 and the agent reconciles counts instead of posting again.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuheal.xid.identity import GpuMap
from gpuheal.xid.parse import (
    SXID_EVENT_REASON,
    XID_CONDITION_TYPE,
    XID_EVENT_REASON,
    KernelLogScanner,
    parse_kernel_line,
)
from gpuheal.xid.types import FALLEN_OFF_BUS_XID, SxidEvent, XidEvent

from .records import Record

COMPONENT = "gpuheal-agent"
"""`source.component` / `reportingComponent` of the agent's Events (the operator ignores only
its own component, `gpuheal`)."""
STATE_VERSION = 1
MAX_SERIES = 512
MAX_MESSAGE = 1024
_START_RE = re.compile(r"(NVRM: |nvidia-nvswitch[0-9]{0,3}: )")


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    reason: str  # Event reason: GpuXid, NvSwitchSxid, or an NVML reason
    key: str  # identical findings share it: "xid/79/0000:3b:00"
    message: str  # the Event message: the driver's text, then the GPU identity line if known
    xid: int | None = None
    pci: str | None = None
    uuid: str | None = None
    time: dt.datetime | None = None
    position: int | None = None  # record position, for the Event name; None: use `time`


def with_identity(text: str, pci: str | None, uuid: str | None) -> str:
    """``text``, then the driver's own PCI -> UUID line where both are known: `parse_event`
    reads the UUID back from it."""
    return f"{text}\nNVRM: GPU at PCI:{pci}: {uuid}" if pci and uuid else text


def _from_driver_text(line: str) -> str:
    """Cut log prefixes (timestamps, host, `kernel:`) so the message starts at the driver."""
    m = _START_RE.search(line)
    return line[m.start() :].strip() if m else line.strip()


class Detector:
    """Kernel-log records in, findings out (one scanner for the whole stream)."""

    def __init__(self, known: Mapping[str, str] | None = None) -> None:
        self.scanner = KernelLogScanner()
        self._known = dict(known or {})  # PCI -> UUID from NVML or the node annotation
        self._recent: collections.deque[str] = collections.deque(maxlen=4)

    def learn(self, pairs: Mapping[str, str]) -> None:
        self._known.update(pairs)

    @property
    def gpu_map(self) -> GpuMap:
        """Everything known: NVML/annotation pairs, then the driver's own identity lines."""
        return GpuMap().learn(self._known.items()).learn(self.scanner.gpu_uuids.items())

    def feed(self, record: Record) -> list[Finding]:
        out: list[Finding] = []
        for line in record.text.splitlines() or [""]:
            found = self.scanner.feed(line)
            self._recent.append(_from_driver_text(line))
            if found is not None:
                out.append(self._finding(found, record))
        return out

    def _finding(self, ev: XidEvent | SxidEvent, record: Record) -> Finding:
        pci = ev.pci_bus_id
        when = record.time or ev.timestamp
        if isinstance(ev, SxidEvent):
            return Finding(
                reason=SXID_EVENT_REASON,
                key=f"sxid/{ev.sxid}/{pci}",
                message=self._recent[-1][:MAX_MESSAGE],
                pci=pci,
                time=when,
                position=record.position,
            )
        uuid = ev.gpu_uuid or self.gpu_map.uuid_of(pci)
        text = self._recent[-1]
        if ev.xid == FALLEN_OFF_BUS_XID and "Xid" not in text:
            text = self._fallen_off_text()
        message = with_identity(text, pci, uuid)
        key = f"xid/{ev.xid}/{pci}"
        if ev.recovery_action is not None:
            key += f"/{ev.recovery_action.value}"
        return Finding(
            reason=XID_EVENT_REASON,
            key=key,
            message=message[:MAX_MESSAGE],
            xid=ev.xid,
            pci=pci,
            uuid=uuid,
            time=when,
            position=record.position,
        )

    def _fallen_off_text(self) -> str:
        """The driver's multi-line message as printed (from its head line), or the one line."""
        lines = list(self._recent)
        for i in range(len(lines) - 1, -1, -1):
            if "NVRM: The NVIDIA GPU" in lines[i]:
                # Its own lines only: an XID line printed in between is another record.
                own = [line for line in lines[i:] if parse_kernel_line(line) is None]
                return "\n".join(own)
        return lines[-1]


@dataclasses.dataclass
class Series:
    """One Event: identical findings within the repeat window."""

    name: str
    key: str
    reason: str
    message: str
    first: dt.datetime
    last: dt.datetime
    count: int = 1
    posted: int = 0  # the count the API server has (0: not created yet)
    xid: int | None = None
    pci: str | None = None
    uuid: str | None = None

    @property
    def dirty(self) -> bool:
        return self.count != self.posted

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["first"] = self.first.isoformat()
        out["last"] = self.last.isoformat()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Series:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["first"] = dt.datetime.fromisoformat(str(data["first"]))
        kwargs["last"] = dt.datetime.fromisoformat(str(data["last"]))
        return cls(**kwargs)


def event_name(node: str, stream: str, finding: Finding, first: dt.datetime) -> str:
    """Deterministic per (stream, key, first record): a restart recomputes the same name."""
    where = str(finding.position) if finding.position is not None else first.isoformat()
    digest = hashlib.sha256(f"{stream}/{finding.key}/{where}".encode()).hexdigest()[:12]
    kind = f"xid{finding.xid}" if finding.xid is not None else finding.reason.lower()
    return f"{node[:200]}.{kind[:32]}.{digest}"


class Aggregator:
    """Findings -> series. `window`: how long after its last record a series still takes
    identical findings (afterwards the next one starts a new Event)."""

    def __init__(self, node: str, stream: str, window: dt.timedelta) -> None:
        self.node = node
        self.stream = stream
        self.window = window
        self.series: dict[str, Series] = {}  # by name
        self._open: dict[str, str] = {}  # key -> name of the series that takes repeats

    def add(self, finding: Finding, now: dt.datetime) -> Series:
        when = finding.time or now
        name = self._open.get(finding.key)
        current = self.series.get(name) if name else None
        if current is not None and abs(when - current.last) <= self.window:
            current.count += 1
            current.last = max(current.last, when)
            return current
        series = Series(
            name=event_name(self.node, self.stream, finding, when),
            key=finding.key,
            reason=finding.reason,
            message=finding.message,
            first=when,
            last=when,
            xid=finding.xid,
            pci=finding.pci,
            uuid=finding.uuid,
        )
        existing = self.series.get(series.name)
        if existing is not None:  # the same first record again (replay): nothing new
            return existing
        self.series[series.name] = series
        self._open[finding.key] = series.name
        self._prune(now)
        return series

    def refine(self, finding: Finding) -> None:
        """The open series of this finding's key takes its message (and UUID), if the series
        was not posted yet: the kernel log's text says more than NVML's event."""
        name = self._open.get(finding.key)
        current = self.series.get(name) if name else None
        if current is not None and current.posted == 0:
            current.message = finding.message
            current.uuid = current.uuid or finding.uuid

    def dirty(self) -> list[Series]:
        return sorted((s for s in self.series.values() if s.dirty), key=lambda s: s.first)

    def _prune(self, now: dt.datetime) -> None:
        if len(self.series) <= MAX_SERIES:
            return
        closed = sorted(
            (s for s in self.series.values() if not s.dirty and self._open.get(s.key) != s.name),
            key=lambda s: s.last,
        )
        for s in closed[: len(self.series) - MAX_SERIES]:
            del self.series[s.name]
        del now

    def restore(self, series: Iterable[Series]) -> None:
        for s in sorted(series, key=lambda s: s.first):
            self.series[s.name] = s
            self._open[s.key] = s.name


@dataclasses.dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


def xid_condition(series: Iterable[Series], type_: str = XID_CONDITION_TYPE) -> Condition:
    """`GpuXid`: True with reason `Xid<N>` (the latest XID) while the stream (this boot) has had
    an XID; False `NoXid` otherwise. SXid and NVML findings do not set it."""
    xids = [s for s in series if s.xid is not None and s.reason == XID_EVENT_REASON]
    if not xids:
        return Condition(type_, "False", "NoXid", "no NVIDIA XID in the kernel log since boot")
    latest = xids[0]
    for s in xids[1:]:  # the most recent; on a tie the one found last
        if (s.last, s.first) >= (latest.last, latest.first):
            latest = s
    total = sum(s.count for s in xids)
    head = latest.message.splitlines()[0] if latest.message else f"XID {latest.xid}"
    return Condition(type_, "True", f"Xid{latest.xid}", f"{head} ({total} XID records)")


@dataclasses.dataclass
class AgentState:
    """What survives a restart (the state file): the stream, how far it was read, the series
    (with the counts the API server has), the condition and GPU map last written."""

    node: str
    stream: str
    cursor: int = 0
    series: list[Series] = dataclasses.field(default_factory=list)
    condition: Condition | None = None
    gpus: dict[str, str] = dataclasses.field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "node": self.node,
                "stream": self.stream,
                "cursor": self.cursor,
                "series": [s.to_json() for s in self.series],
                "condition": dataclasses.asdict(self.condition) if self.condition else None,
                "gpus": self.gpus,
            },
            sort_keys=True,
        )

    @classmethod
    def loads(cls, text: str) -> AgentState | None:
        """None when unreadable or from another version (the agent then dedupes through the
        Events already posted)."""
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                return None
            cond = data.get("condition")
            return cls(
                node=str(data["node"]),
                stream=str(data["stream"]),
                cursor=int(data["cursor"]),
                series=[Series.from_json(s) for s in data.get("series", [])],
                condition=Condition(**cond) if cond else None,
                gpus={str(k): str(v) for k, v in (data.get("gpus") or {}).items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class SourcePairing:
    """One fault heard twice, once in the kernel log and once from NVML, is one finding.

    Each source reports every occurrence of an XID once, close together in time; an occurrence
    from one source is the other's when it names the same XID and GPU and arrives within
    `window` of it and that one was not already paired. Times are the agent's own clock when
    it read each (a kernel record's printed time and NVML's delivery differ in origin).
    """

    def __init__(self, window: dt.timedelta) -> None:
        self.window = window
        self._unpaired: dict[tuple[str, str], collections.deque[dt.datetime]] = {}

    @staticmethod
    def pair_key(finding: Finding) -> str | None:
        """XIDs on a known GPU pair; anything else (SXid, NVML health edges) stands alone."""
        if finding.xid is None or finding.reason != XID_EVENT_REASON or finding.pci is None:
            return None
        return f"{finding.xid}/{finding.pci}"

    def admit(self, source: str, finding: Finding, now: dt.datetime) -> bool:
        """True: a new occurrence (aggregate it); False: the other source's, already counted."""
        key = self.pair_key(finding)
        if key is None:
            return True
        for (src, k), times in self._unpaired.items():
            if k != key or src == source:
                continue
            while times and now - times[0] > self.window:
                times.popleft()
            if times:
                times.popleft()
                return False
        mine = self._unpaired.setdefault((source, key), collections.deque(maxlen=MAX_SERIES))
        mine.append(now)
        self._prune(now)
        return True

    def _prune(self, now: dt.datetime) -> None:
        for pair in [p for p, t in self._unpaired.items() if not t or now - t[-1] > self.window]:
            del self._unpaired[pair]
