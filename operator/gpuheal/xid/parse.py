"""Parsers for the places an XID shows up: kernel log lines, Kubernetes Events, dcgm-exporter.

Every public function here is total: any `str` in, a value or `None`/empty out, never an
exception. Real logs are truncated, interleaved, re-encoded and sometimes hostile; a parser
that raises takes the whole detection loop down with it.

Formats handled (see tests/unit/test_xid_parse.py for the sources of each sample):
- `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
- older drivers without `PCI:`: `NVRM: Xid (0000:03:00): 14, Channel 00000001`
- MIG attribution: `NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, pid=7194, ...`
- `pid='<unknown>', name=<unknown>`, `pid='N/A'`, no pid at all
- prefixes: dmesg `[ 1843.308145]`, `dmesg -T` `[Fri Aug 30 11:43:09 2024]`, ISO 8601
  (`journalctl -o short-iso`, `dmesg --time-format iso`), syslog `Aug 30 11:43:09 host
  kernel:`, `/dev/kmsg` `6,1234,5678901234,-;`
- XID 154 `GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`
- the multi-line `The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed in this system has /
  fallen off the bus and is not responding to commands.` (no XID printed) - `KernelLogScanner`
- the single-line `NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.` (no XID printed; the
  PCI domain may be missing) - reported as XID 79
- `/dev/kmsg` escapes: a multi-line driver message is one record whose newlines read `\x0a`
  (`unescape_kmsg`); `dmesg`/`journalctl -k` print its continuation lines indented
- NVSwitch `SXid` lines, recognised as such and never as XIDs (see `SXID_EVENT_REASON`)

Tested against the corpus of real driver lines in tests/data/xid_corpus.yaml (each with its
public source), look-alikes included.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping

from gpuheal.xid.types import (
    FALLEN_OFF_BUS_XID,
    RECOVERY_ACTION_CODES,
    RecoveryAction,
    SxidEvent,
    XidEvent,
)

MAX_LINE = 65536
"""Longer input is cut before matching: an XID line is short, a 10 MB "line" is an attack."""
MAX_XID = 65535

XID_EVENT_REASON = "GpuXid"
"""Event reason gpuheal's own producers (`gpuheal simulate xid`) use; the message is the
kernel log line verbatim, exactly what node-problem-detector's kernel monitor emits."""
XID_CONDITION_TYPE = "GpuXid"
SXID_EVENT_REASON = "NvSwitchSxid"
"""Event reason for NVSwitch SXid records (`gpuheal agent`, the shipped NPD config). An SXid is
a fault of the NVSwitch fabric, not of one GPU: `parse_event` never reads it as an XID, so the
operator sees it as a plain Warning Event that a policy rule matches by reason
(`signals.events: [{reason: NvSwitchSxid, messageContains: "Fatal"}]`)."""

_A = re.ASCII

# PCI id inside the parentheses: optional "PCI:", domain:bus:device, optional .function,
# optional MIG attribution. Bounded repetitions keep matching linear on hostile input.
_PCI = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
# The same with the domain optional (`NVRM: GPU 18:00.0: GPU has fallen off the bus.`).
_PCI_OPT = r"(?P<pci>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?" + _PCI + r"(?P<mig>(?: GPU-C?I:[0-9]{1,3}){0,2})\): "
    r"(?P<code>[0-9]{1,5})(?:,|\s|$)(?P<rest>.*)",
    _A,
)
_MIG_GI_RE = re.compile(r"GPU-I:([0-9]{1,3})", _A)
_MIG_CI_RE = re.compile(r"GPU-CI:([0-9]{1,3})", _A)
_PID_RE = re.compile(r"^\s*pid=(?:'(?P<q>[^']{0,32})'|(?P<raw>[^,\s]{0,32}))\s*(?:,|$)", _A)
_NAME_RE = re.compile(r"^\s*name=(?P<name>[^,]{0,256}?)\s*(?:,|$)", _A)
_RECOVERY_RE = re.compile(
    r"recovery action changed from 0x[0-9a-fA-F]{1,8}(?: \([^)]{0,64}\))? "
    r"to 0x(?P<code>[0-9a-fA-F]{1,8})(?: \((?P<text>[^)]{0,64})\))?",
    _A,
)
_RECOVERY_TEXT = {
    "none": RecoveryAction.NONE,
    "gpu reset required": RecoveryAction.GPU_RESET,
    "node reboot required": RecoveryAction.NODE_REBOOT,
    "drain p2p": RecoveryAction.DRAIN_P2P,
    "drain and reset": RecoveryAction.DRAIN_AND_RESET,
}
_SXID_RE = re.compile(
    r"SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): "
    r"(?P<code>[0-9]{1,6})(?:,\s*(?P<sev>Fatal|Non-fatal))?,?\s*(?P<rest>.*)",
    _A,
)
_GPU_MAP_RE = re.compile(
    r"NVRM: GPU at (?:PCI:)?" + _PCI + r": (?P<uuid>GPU-[0-9a-fA-F-]{8,64})", _A
)
# Head of the multi-line message; older drivers wrap after "installed in this".
_FALLEN_HEAD_RE = re.compile(
    r"NVRM: The NVIDIA GPU " + _PCI_OPT + r"(?: \(PCI ID: [0-9a-fA-F:]{9}\))?"
    r"(?: installed in this)?\s*$",
    _A,
)
_FALLEN_TAIL_RE = re.compile(
    r"NVRM: (?:system has )?fallen off the bus and is not responding to commands", _A
)
_FALLEN_ONELINE_RE = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU " + _PCI_OPT + r"(?::| \(PCI ID: [0-9a-fA-F:]{9}\))? "
    r"(?:GPU )?(?:installed in this system )?(?:has )?fallen off the bus",
    _A,
)
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})", _A)

# Timestamp prefixes.
_ISO_RE = re.compile(
    r"^\s*(?:[a-z]{2,8}\s*:\s*[a-z]{2,8}\s*:\s*)?(?P<ts>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?)",
    _A,
)
_CTIME_RE = re.compile(
    r"^\s*\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} "
    r"[0-9]{4})\]",
    _A,
)


def _cut(text: object) -> str:
    return text[:MAX_LINE] if isinstance(text, str) else ""


def normalize_pci(raw: str) -> str:
    """`00000000:3B:00.0` / `0000:3b:00` / `PCI:0000:3b:00` -> `0000:3b:00`.

    NVRM prints a 4-digit domain without function; dcgm-exporter an 8-digit domain with one.
    Repeat counting per GPU needs them to compare equal.
    """
    text = raw.strip().lower().removeprefix("pci:")
    text = text.split(".", 1)[0]
    parts = text.split(":")
    if len(parts) == 2:  # `18:00` as some messages print it: domain 0
        parts = ["0000", *parts]
    if len(parts) != 3:
        return text
    domain, bus, device = parts
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{device}"


def unescape_kmsg(text: str) -> str:
    """Undo `/dev/kmsg` escaping: a record prints its inner newlines (and any byte below 0x20,
    above 0x7e, or a backslash) as `\\xNN`. node-problem-detector passes them on as is."""
    if "\\x" not in text:
        return text
    return _KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def parse_timestamp(line: str) -> dt.datetime | None:
    """Wall-clock time from a log prefix, or None (monotonic `[ 123.4]`, syslog w/o year).

    `dmesg -T` prints local time; nodes run in UTC in practice, so it is read as UTC.
    """
    text = _cut(line)
    m = _ISO_RE.match(text)
    if m:
        raw = m.group("ts").replace(",", ".")
        # Python < 3.11 quirks aside, fromisoformat wants at most 6 fractional digits.
        raw = re.sub(r"(\.[0-9]{6})[0-9]+", r"\1", raw)
        if raw.endswith("Z"):
            raw = raw[:-1] + "+00:00"
        elif re.search(r"[+-][0-9]{4}$", raw):
            raw = raw[:-2] + ":" + raw[-2:]
        try:
            ts = dt.datetime.fromisoformat(raw)
        except ValueError:
            return None
        return ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)
    m = _CTIME_RE.match(text)
    if m:
        try:
            ts = dt.datetime.strptime(" ".join(m.group("ts").split()), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            return None
        return ts.replace(tzinfo=dt.UTC)
    return None


def _recovery_action(rest: str) -> RecoveryAction | None:
    m = _RECOVERY_RE.search(rest)
    if not m:
        return None
    action = RECOVERY_ACTION_CODES.get(int(m.group("code"), 16))
    if action is None and m.group("text"):
        action = _RECOVERY_TEXT.get(m.group("text").strip().lower())
    return action


def _search(line: str, token: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
    """`pattern` in the (bounded) line, tried only when the cheap `token` is there."""
    text = _cut(line)
    return pattern.search(text) if token in text else None


def parse_kernel_line(line: str) -> XidEvent | None:
    """One kernel log line -> XidEvent, or None if the line is not an NVRM Xid line.

    Stable entry point (other tools rely on it). Multi-line messages need
    `KernelLogScanner`; SXid lines return None here (see `parse_sxid_line`).
    """
    m = _search(line, "Xid", _XID_RE)
    if m is None:
        return None
    text = m.string
    code = int(m.group("code"))
    if code > MAX_XID:
        return None
    rest = m.group("rest")
    pid: int | None = None
    process: str | None = None
    pm = _PID_RE.match(rest)
    if pm:
        value = pm.group("q") if pm.group("q") is not None else pm.group("raw")
        pid = int(value) if value and value.isascii() and value.isdigit() else None
        rest = rest[pm.end() :]
        nm = _NAME_RE.match(rest)
        if nm:
            name = nm.group("name").strip()
            process = None if name in {"", "<unknown>", "N/A"} else name
            rest = rest[nm.end() :]
    mig = m.group("mig")
    gi = _MIG_GI_RE.search(mig)
    ci = _MIG_CI_RE.search(mig)
    return XidEvent(
        xid=code,
        pci_bus_id=normalize_pci(m.group("pci")),
        pid=pid,
        process=process,
        message=rest.strip(),
        timestamp=parse_timestamp(text),
        recovery_action=_recovery_action(rest) if code == 154 else None,
        gpu_instance=int(gi.group(1)) if gi else None,
        compute_instance=int(ci.group(1)) if ci else None,
    )


def parse_sxid_line(line: str) -> SxidEvent | None:
    """NVSwitch `SXid` line -> SxidEvent (an NVSwitch fault, not a GPU XID)."""
    m = _search(line, "SXid", _SXID_RE)
    if m is None:
        return None
    return SxidEvent(
        sxid=int(m.group("code")),
        pci_bus_id=normalize_pci(m.group("pci")),
        severity=m.group("sev"),
        message=m.group("rest").strip(),
        timestamp=parse_timestamp(m.string),
    )


@dataclasses.dataclass
class KernelLogScanner:
    """Stateful scanner for a stream of kernel log lines.

    Adds what single lines cannot give: the GPU UUID (from `NVRM: GPU at PCI:...: GPU-...`
    lines printed before the first XID), the multi-line "fallen off the bus" message that
    carries no XID (reported as XID 79), and de-duplication of that message against a real
    XID 79 for the same GPU printed next to it (within `dedupe_lines`, either order; the
    fallen-off message repeated after it counts once too). Two XID 79 lines are two records:
    a consumer that counts repeats (the agent) sees both.
    """

    dedupe_lines: int = 20
    _uuids: dict[str, str] = dataclasses.field(default_factory=dict)
    _pending_fallen: tuple[str, int, str] | None = None  # (pci, line number, head line)
    # pci -> (line number, "xid" | "fallen" | "paired"): the last report of a fall off the bus
    _recent_79: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    _lineno: int = 0

    def learn_identity(self, line: str) -> bool:
        """Record the GPU UUID of a `NVRM: GPU at PCI:...: GPU-...` line; True if it was one."""
        text = _cut(line)
        m = _GPU_MAP_RE.search(text) if "GPU at" in text else None
        if m is None:
            return False
        if len(self._uuids) < 4096:  # bounded: a log cannot grow our memory
            self._uuids[normalize_pci(m.group("pci"))] = m.group("uuid")
        return True

    @property
    def gpu_uuids(self) -> dict[str, str]:
        """PCI address -> UUID, as learnt from the driver's identity lines so far."""
        return dict(self._uuids)

    def feed_record(self, text: str) -> list[XidEvent | SxidEvent]:
        """One kernel log record (a `/dev/kmsg` message, maybe several lines with `\\x0a`
        escapes): everything it completed, in order."""
        out: list[XidEvent | SxidEvent] = []
        for line in unescape_kmsg(_cut(text)).splitlines():
            found = self.feed(line)
            if found is not None:
                out.append(found)
        return out

    def feed(self, line: str) -> XidEvent | SxidEvent | None:
        """Consume one line; return what it completed, if anything. Never raises."""
        text = _cut(line)
        self._lineno += 1
        if "NVRM" not in text:
            return parse_sxid_line(text) if "SXid" in text else None
        if self.learn_identity(text):
            return None
        event = parse_kernel_line(text)
        if event is not None:
            if event.pci_bus_id and event.pci_bus_id in self._uuids:
                event = dataclasses.replace(event, gpu_uuid=self._uuids[event.pci_bus_id])
            pci = event.pci_bus_id
            if event.xid == FALLEN_OFF_BUS_XID and pci and self._paired(pci, "xid", {"fallen"}):
                return None
            return event
        return self._fallen_off(text)

    def _paired(self, pci: str, kind: str, partners: set[str]) -> bool:
        """True if this report of a fall off the bus belongs to a recent one (same fault);
        else it is remembered as a new one. The fallen-off message repeated after its pair
        stays the same fault; an XID 79 line after a pair is a new report."""
        seen = self._recent_79.get(pci)
        recent = seen is not None and self._lineno - seen[0] <= self.dedupe_lines
        if seen is not None and recent and seen[1] in partners:
            paired = "paired" if {kind, seen[1]} == {"xid", "fallen"} else seen[1]
            self._recent_79[pci] = (self._lineno, paired)
            return True
        self._recent_79[pci] = (self._lineno, kind)
        return False

    def _fallen_off(self, text: str) -> XidEvent | None:
        head = _FALLEN_HEAD_RE.search(text)
        if head:
            self._pending_fallen = (normalize_pci(head.group("pci")), self._lineno, text.strip())
            return None
        one = _FALLEN_ONELINE_RE.search(text)
        pci: str | None = None
        if one:
            pci = normalize_pci(one.group("pci"))
        elif _FALLEN_TAIL_RE.search(text) and self._pending_fallen is not None:
            pending_pci, at, _ = self._pending_fallen
            if self._lineno - at <= 3:  # the three lines are printed together
                pci = pending_pci
            self._pending_fallen = None
        if pci is None or self._paired(pci, "fallen", {"xid", "fallen", "paired"}):
            return None
        return XidEvent(
            xid=FALLEN_OFF_BUS_XID,
            pci_bus_id=pci,
            gpu_uuid=self._uuids.get(pci),
            message="GPU has fallen off the bus (reported without an XID)",
            timestamp=parse_timestamp(text),
        )


def parse_kernel_text(text: str) -> list[XidEvent | SxidEvent]:
    """All XID/SXid events in a block of kernel log text (several lines)."""
    scanner = KernelLogScanner()
    out: list[XidEvent | SxidEvent] = []
    for line in _cut(text).splitlines():
        found = scanner.feed(line)
        if found is not None:
            out.append(found)
    return out


# --- Kubernetes Events -----------------------------------------------------------------

# Loose forms seen in Event messages written by other tools ("XID 79", "Xid=79",
# "xid error 79 on GPU 0"); trusted only when the reason already says the Event is about an
# XID, so "Xid" in an unrelated message is never read as one.
_LOOSE_XID_RE = re.compile(
    r"(?<![A-Za-z])xid(?:\s+error)?\s*(?:[:=#]\s*|\s+)(?P<code>[0-9]{1,5})(?![0-9])",
    _A | re.IGNORECASE,
)
_LOOSE_PCI_RE = re.compile(r"(?:PCI:|pci_bus_id=|pci=)\s*['\"]?" + _PCI, _A | re.IGNORECASE)
_LOOSE_UUID_RE = re.compile(r"\b(?P<uuid>GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})")


def parse_event_all(reason: str, message: str) -> list[XidEvent]:
    """Every XID in a Kubernetes Event's message (one per GPU line), or [].

    Accepted:
    1. any Event whose message contains kernel XID lines, or the fallen-off-the-bus message
       without an XID (single- or multi-line, `\\x0a` escapes as node-problem-detector copies
       them from `/dev/kmsg`); node-problem-detector's kernel monitor copies the matched lines
       into the message, `gpuheal agent` and `gpuheal simulate xid` (reason `GpuXid`) too;
    2. Events whose reason mentions "xid" (e.g. `GpuXid`, `NVIDIAXid`, `XidError`) and whose
       message names the code loosely (`XID 79`, `xid=79`).
    A driver identity line in the message (`NVRM: GPU at PCI:0000:3b:00: GPU-...`, which
    `gpuheal agent` adds when it knows the UUID) fills `gpu_uuid` of the XIDs on that GPU.
    SXid lines are never XIDs (see `parse_sxid_event`).
    """
    msg = unescape_kmsg(_cut(message))
    why = _cut(reason)[:256]
    lines = msg.splitlines() or [msg]
    scanner = KernelLogScanner()
    for line in lines:
        scanner.learn_identity(line)
    found = [e for e in map(scanner.feed, lines) if isinstance(e, XidEvent)]
    if found:
        return found
    if any(parse_sxid_line(line) is not None for line in lines):
        return []
    if "xid" not in why.lower():
        return []
    m = _LOOSE_XID_RE.search(msg)
    if m is None:
        return []
    code = int(m.group("code"))
    if code > MAX_XID:
        return []
    pci = _LOOSE_PCI_RE.search(msg)
    uuid = _LOOSE_UUID_RE.search(msg)
    return [
        XidEvent(
            xid=code,
            pci_bus_id=normalize_pci(pci.group("pci")) if pci else None,
            gpu_uuid=uuid.group("uuid") if uuid else None,
            message=msg.strip()[:1024],
            recovery_action=_recovery_action(msg) if code == 154 else None,
        )
    ]


def parse_event(reason: str, message: str) -> XidEvent | None:
    """A Kubernetes Event's reason and message -> its (first) XidEvent, or None.

    Stable entry point of the operator's Event intake; `parse_event_all` gives every GPU of a
    message that names several.
    """
    found = parse_event_all(reason, message)
    return found[0] if found else None


def parse_sxid_event(reason: str, message: str) -> SxidEvent | None:
    """The NVSwitch SXid in an Event's message (reason `NvSwitchSxid` or any other), or None."""
    del reason  # the line itself is unambiguous
    for line in unescape_kmsg(_cut(message)).splitlines():
        sxid = parse_sxid_line(line)
        if sxid is not None:
            return sxid
    return None


def format_kernel_line(
    xid: int, pci_bus_id: str, message: str, *, pid: int | None = None, process: str | None = None
) -> str:
    """The line the driver would print; `gpuheal simulate xid` puts it in its Event message."""
    who = (
        f"pid={pid}, name={process or '<unknown>'}"
        if pid is not None
        else "pid='<unknown>', name=<unknown>"
    )
    return f"NVRM: Xid (PCI:{normalize_pci(pci_bus_id)}): {xid}, {who}, {message}"


# --- dcgm-exporter ---------------------------------------------------------------------

DCGM_XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
"""Gauge holding the *last* XID per GPU; never resets, repeats of the same XID are invisible."""
DCGM_XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
"""Windowed count per GPU and `xid` label; rises are new XIDs (the better input)."""

_METRIC_RE = re.compile(
    r"^(?P<name>DCGM_FI_DEV_XID_ERRORS|DCGM_EXP_XID_ERRORS_COUNT)"
    r"(?:\{(?P<labels>[^}]{0,4096})\})?\s+(?P<value>[-+0-9.eE]{1,32}|NaN|[+-]Inf)"
    r"(?:\s+[0-9]{1,20})?\s*$",
    _A,
)
_LABEL_RE = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]{0,64})="(?P<v>(?:[^"\\]|\\.){0,512})"', _A)


@dataclasses.dataclass(frozen=True, slots=True)
class DcgmSample:
    metric: str
    gpu: str  # dcgm "gpu" label (index), "" if absent
    uuid: str | None
    pci_bus_id: str | None
    xid_label: int | None  # only on DCGM_EXP_XID_ERRORS_COUNT
    value: float
    hostname: str | None = None  # the exporter's "Hostname" label: the node it says it reads

    @property
    def key(self) -> tuple[str, str, int | None]:
        """Identity of a time series for diffing scrapes."""
        return (self.metric, self.uuid or self.pci_bus_id or self.gpu, self.xid_label)


def parse_dcgm_metrics(text: str) -> list[DcgmSample]:
    """XID samples from dcgm-exporter's Prometheus text; other metrics and garbage skipped."""
    out: list[DcgmSample] = []
    for line in _cut_block(text).splitlines():
        if not line.startswith("DCGM_"):
            continue
        m = _METRIC_RE.match(line[:MAX_LINE])
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        labels = {
            lm.group("k"): lm.group("v") for lm in _LABEL_RE.finditer(m.group("labels") or "")
        }
        xid_label = labels.get("xid", "")
        pci = labels.get("pci_bus_id")
        out.append(
            DcgmSample(
                metric=m.group("name"),
                gpu=labels.get("gpu", ""),
                uuid=labels.get("UUID") or None,
                pci_bus_id=normalize_pci(pci) if pci else None,
                xid_label=int(xid_label) if xid_label.isascii() and xid_label.isdigit() else None,
                value=value,
                hostname=labels.get("Hostname"),
            )
        )
    return out


def _cut_block(text: object) -> str:
    # A scrape is many lines; bound the total (16 MiB) rather than each line.
    return text[: 16 * 1024 * 1024] if isinstance(text, str) else ""


def _is_xid(value: float) -> bool:
    return value.is_integer() and 0 < value <= MAX_XID


def dcgm_xid_events(
    previous: Mapping[tuple[str, str, int | None], float] | None,
    samples: Iterable[DcgmSample],
    now: dt.datetime,
) -> tuple[list[XidEvent], dict[tuple[str, str, int | None], float]]:
    """Turn two consecutive scrapes into XID observations.

    - `DCGM_EXP_XID_ERRORS_COUNT{xid=...}` rising: one event (the count is windowed, so it
      may also fall; a fall is not an event);
    - `DCGM_FI_DEV_XID_ERRORS` changing to a non-zero value: one event for the new value.
      A repeat of the same XID does not change the gauge: that is the gauge's limit.
    With `previous=None` (first scrape after start) the scrape only sets the baseline:
    old XIDs already handled must not start new incidents after a restart.
    Returns (events, state to pass as `previous` next time).
    """
    state: dict[tuple[str, str, int | None], float] = {}
    from_count: list[tuple[DcgmSample, int]] = []
    from_gauge: list[tuple[DcgmSample, int]] = []
    for s in samples:
        state[s.key] = s.value
        if previous is None:
            continue
        before = previous.get(s.key)
        if s.metric == DCGM_XID_COUNT and s.xid_label is not None:
            if s.value > (before if before is not None else 0.0):
                from_count.append((s, s.xid_label))
        elif s.metric == DCGM_XID_GAUGE and s.value != before and _is_xid(s.value):
            from_gauge.append((s, int(s.value)))
    # Both metrics report the same XID when both are exported: the counter wins.
    counted = {(s.key[1], xid) for s, xid in from_count}
    chosen = from_count + [(s, x) for s, x in from_gauge if (s.key[1], x) not in counted]
    events = [
        XidEvent(
            xid=xid,
            pci_bus_id=s.pci_bus_id,
            gpu_uuid=s.uuid,
            message=f"{s.metric} (gpu {s.gpu or '?'}) reported XID {xid}",
            timestamp=now,
        )
        for s, xid in chosen
    ]
    return events, state
