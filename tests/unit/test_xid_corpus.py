"""Every reader of kernel-log text against the corpus of real driver lines (tests/data/
xid_corpus.yaml, each with its public source): the kernel-log scanner, the operator's Event
parser, `gpuheal agent`'s detector (and the Events it would post), and the shipped
node-problem-detector config, emulated the way NPD matches (a regex that must end at the end of
its line buffer, message = the lines it spans). Positives must give exactly the expected XIDs on
the expected GPUs; look-alikes must give nothing."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.agent import records as rec
from gpuheal.agent.detect import Detector
from gpuheal.xid import (
    SXID_EVENT_REASON,
    XID_EVENT_REASON,
    SxidEvent,
    XidEvent,
    parse_event,
    parse_event_all,
    parse_kernel_text,
    parse_sxid_event,
)

REPO = Path(__file__).resolve().parents[2]
CORPUS: list[dict[str, Any]] = yaml.safe_load((REPO / "tests/data/xid_corpus.yaml").read_text())[
    "entries"
]
NPD = json.loads((REPO / "deploy/node-problem-detector/gpuheal-kernel-monitor.json").read_text())
FORMS = {"dmesg", "dmesg-T", "dmesg-x", "journalctl", "syslog", "kmsg", "plain"}

POSITIVE = [e for e in CORPUS if e["expect"]]
NEGATIVE = [e for e in CORPUS if not e["expect"]]
XID_ENTRIES = [e for e in CORPUS if any("xid" in x for x in e["expect"])]
SXID_ENTRIES = [e for e in CORPUS if any("sxid" in x for x in e["expect"])]


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


def test_corpus_is_well_formed() -> None:
    ids = _ids(CORPUS)
    assert len(ids) == len(set(ids))
    assert len(POSITIVE) >= 20
    assert len(NEGATIVE) >= 8
    for entry in CORPUS:
        assert entry["source"].startswith("https://"), entry["id"]
        assert entry["form"] in FORMS, entry["id"]
        assert entry["text"].strip(), entry["id"]


def _expected(entry: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [("sxid", x["sxid"], x["pci"]) if "sxid" in x else ("xid", x["xid"], x["pci"])
            for x in entry["expect"]]  # fmt: skip


def _got(found: list[XidEvent | SxidEvent]) -> list[tuple[str, int, str | None]]:
    return [("sxid", f.sxid, f.pci_bus_id) if isinstance(f, SxidEvent) else
            ("xid", f.xid, f.pci_bus_id) for f in found]  # fmt: skip


def _text_of(entry: dict[str, Any]) -> str:
    if entry["form"] != "kmsg":
        return str(entry["text"])
    records = [rec.parse_kmsg_record(line) for line in entry["text"].splitlines()]
    return "\n".join(r.text for r in records if r is not None)


@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_scanner(entry: dict[str, Any]) -> None:
    found = parse_kernel_text(_text_of(entry))
    assert _got(found) == _expected(entry)
    for want, got in zip(entry["expect"], found, strict=True):
        if "uuid" in want:
            assert isinstance(got, XidEvent)
            assert got.gpu_uuid == want["uuid"]
        if "recovery" in want:
            assert isinstance(got, XidEvent)
            assert got.recovery_action is not None
            assert got.recovery_action.value == want["recovery"]
        if "gi" in want or "ci" in want:
            assert isinstance(got, XidEvent)
            assert (got.gpu_instance, got.compute_instance) == (want.get("gi"), want.get("ci"))
        if "severity" in want:
            assert isinstance(got, SxidEvent)
            assert got.severity == want["severity"]
        if "time" in want:
            assert got.timestamp == dt.datetime.fromisoformat(want["time"])


@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_event_parser(entry: dict[str, Any]) -> None:
    """The operator's Event intake over a message holding the entry's text (NPD copies the
    matched lines into the message; /dev/kmsg escapes kept as NPD passes them on)."""
    message = entry["text"] if entry["form"] != "kmsg" else entry["text"].split(";", 1)[1]
    xids = [x for x in _expected(entry) if x[0] == "xid"]
    got = parse_event_all(XID_EVENT_REASON if xids else "KernelOops", message)
    assert [("xid", e.xid, e.pci_bus_id) for e in got] == xids
    sxids = [x for x in _expected(entry) if x[0] == "sxid"]
    sxid = parse_sxid_event(SXID_EVENT_REASON, message)
    assert (sxid is not None) == bool(sxids)
    if sxid is not None:
        assert ("sxid", sxid.sxid, sxid.pci_bus_id) == sxids[0]
        assert parse_event(SXID_EVENT_REASON, message) is None  # an SXid is never an XID


def _records(entry: dict[str, Any]) -> list[rec.Record]:
    if entry["form"] == "kmsg":
        out = [rec.parse_kmsg_record(line) for line in entry["text"].splitlines()]
    else:
        out = [rec.text_record(i, line) for i, line in enumerate(entry["text"].splitlines(), 1)]
    return [r for r in out if r is not None]


@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_agent_detector_and_its_event_messages(entry: dict[str, Any]) -> None:
    """The agent finds the expected faults, and the message it would post reads back (through
    the operator's parser) as the same XID on the same GPU, UUID included when known."""
    detector = Detector()
    findings = [f for r in _records(entry) for f in detector.feed(r)]
    got = [("sxid" if f.xid is None else "xid", f.xid, f.pci) for f in findings]
    want = [(k, None if k == "sxid" else code, pci) for k, code, pci in _expected(entry)]
    assert got == want
    for finding, expect in zip(findings, entry["expect"], strict=True):
        if finding.xid is None:
            assert finding.reason == SXID_EVENT_REASON
            sxid = parse_sxid_event(finding.reason, finding.message)
            assert sxid is not None
            assert (sxid.sxid, sxid.pci_bus_id) == (
                expect["sxid"],
                expect["pci"],
            )
            continue
        assert finding.reason == XID_EVENT_REASON
        back = parse_event(finding.reason, finding.message)
        assert back is not None, finding.message
        assert (back.xid, back.pci_bus_id) == (expect["xid"], expect["pci"])
        assert back.gpu_uuid == expect.get("uuid")


# --- node-problem-detector -----------------------------------------------------------------

_PREFIX = re.compile(
    r"^(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \S+ kernel: |kernel: |"
    r"[a-z]+\s*:[a-z]+\s*: \S+ |\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d \d{4}\] )?"
    r"(?:\[\s*[0-9.]+\] )?"
)


def npd_messages(entry: dict[str, Any]) -> list[str]:
    """What NPD's kmsg plugin hands the monitor: one message per kernel record, prefixes gone,
    a multi-line record's newlines as the literal `\\x0a` that /dev/kmsg prints."""
    if entry["form"] == "kmsg":
        return [line.split(";", 1)[1] for line in entry["text"].splitlines()]
    out: list[str] = []
    for line in entry["text"].splitlines():
        continuation = line[:1].isspace() and entry["form"] in {"dmesg", "journalctl"}
        if continuation and out:
            out[-1] += "\\x0a" + line.strip()
        else:
            out.append(_PREFIX.sub("", line, count=1).strip())
    return out


def npd_events(messages: list[str], config: dict[str, Any] = NPD) -> list[tuple[str, str]]:
    """NPD's log monitor: each new line, every rule's `pattern + \\z` against the buffer of the
    last `bufferSize` lines joined by newlines; the Event message is the lines it spans."""
    buffer: list[str] = []
    events: list[tuple[str, str]] = []
    for msg in messages:
        buffer = [*buffer, msg][-config["bufferSize"] :]
        joined = "\n".join(buffer)
        for rule in config["rules"]:
            if rule["type"] != "temporary":
                continue
            m = re.search(f"(?:{rule['pattern']})\\Z", joined)
            if m:
                first = joined.count("\n", 0, m.start())
                events.append((rule["reason"], "\n".join(joined.split("\n")[first:])))
    return events


def test_npd_config_shape() -> None:
    assert NPD["plugin"] == "kmsg"
    assert NPD["logPath"] == "/dev/kmsg"
    assert {c["type"] for c in NPD["conditions"]} == {"GpuXid"}
    for rule in NPD["rules"]:
        re.compile(rule["pattern"])  # RE2-compatible subset, checked here by Python's re
        assert "(?" not in rule["pattern"]  # no lookarounds or inline flags (RE2 lacks some)
        if rule["type"] == "permanent":
            assert rule["condition"] == "GpuXid"


@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_npd_config_over_the_corpus(entry: dict[str, Any]) -> None:
    events = npd_events(npd_messages(entry))
    xids = {x for x in _expected(entry) if x[0] == "xid"}
    sxids = [x for x in _expected(entry) if x[0] == "sxid"]
    got_xids = set()
    for reason, message in events:
        if reason == XID_EVENT_REASON:
            parsed = parse_event(reason, message)
            assert parsed is not None, message
            got_xids.add(("xid", parsed.xid, parsed.pci_bus_id))
        else:
            assert reason == SXID_EVENT_REASON
            sxid = parse_sxid_event(reason, message)
            assert sxid is not None
    assert got_xids == xids
    assert sum(r == SXID_EVENT_REASON for r, _ in events) == len(sxids)
    if not entry["expect"]:
        assert events == []
