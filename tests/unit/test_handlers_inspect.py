"""`gpuheal status` and `gpuheal explain` render from plain objects (no cluster)."""

from __future__ import annotations

import datetime as dt

from gpuheal.inspect import explain_node, incident_state, status_table, step_durations
from gpuheal.simulate import kernel_line, xid_event
from tests.unit.test_handlers_plan import make_policy

NOW = dt.datetime(2026, 11, 22, 6, 0, 10, tzinfo=dt.UTC)
TIMELINE = [
    {"time": "2026-11-22T06:00:00.000Z", "step": "Detected", "message": "XID 94"},
    {"time": "2026-11-22T06:00:00.025Z", "step": "requeue/cordon", "message": "cordoned"},
    {"time": "2026-11-22T06:00:00.900Z", "step": "Completed", "message": "Returned"},
]
NREM = {
    "metadata": {"name": "nrem-n1-1", "creationTimestamp": "2026-11-22T06:00:00Z"},
    "spec": {"nodeName": "n1", "rule": "ecc", "signals": [{"xid": 94}]},
    "status": {"rung": 0, "timeline": TIMELINE, "conditions": [
        {"type": "Completed", "status": "True", "reason": "Returned"}]},
}  # fmt: skip


def test_step_durations_and_state() -> None:
    got = [(s, round(a, 3), round(d, 3)) for s, a, d in step_durations(TIMELINE)]
    assert got == [
        ("Detected", 0.0, 0.0),
        ("requeue/cordon", 0.025, 0.025),
        ("Completed", 0.9, 0.875),
    ]
    assert incident_state(NREM) == "Returned"
    blocked = {"status": {"conditions": [
        {"type": "Blocked", "status": "True", "reason": "CircuitBreakerOpen"}]}}  # fmt: skip
    assert incident_state(blocked) == "Blocked:CircuitBreakerOpen"


def test_status_table() -> None:
    table = status_table([NREM], now=NOW, wide=True)
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "NODE", "RULE", "XID", "RUNG", "STATE", "REPLACEMENT",
                              "TOOK", "AGE"]  # fmt: skip
    assert row.split() == ["nrem-n1-1", "n1", "ecc", "94", "0", "Returned", "-", "0.90s", "10s"]
    assert "+   0.025s (  0.025s)  requeue/cordon" in table


def test_explain_walks_policy_conditions_xids_and_incidents() -> None:
    node = {"metadata": {"name": "n1", "uid": "u", "labels": {"pool": "train"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"},
                                      {"type": "GpuDegraded", "status": "True",
                                       "lastTransitionTime": "2026-11-22T06:00:05Z"}]}}  # fmt: skip
    events = []
    for i in range(3):
        ev = xid_event({"metadata": {"name": "n1", "uid": "u"}}, kernel_line(94))
        ev["metadata"]["uid"] = f"e{i}"
        ev["lastTimestamp"] = f"2026-11-22T05:5{i}:00Z"
        events.append(ev)
    lines = explain_node(node, [make_policy()], events, [NREM], now=NOW)
    text = "\n".join(lines)
    assert lines[0] == "node n1: Ready"
    assert "policy p (priority 0) selects it" in text
    assert "condition GpuDegraded=True held 0:00:05: waits for 0:05:00" in text
    assert "occurrence 1 within 1h -> rung requeue" in text
    assert "occurrence 3 within 1h -> rung reset (cordon, reset)" in text
    assert "incident nrem-n1-1: Returned" in text
    other = explain_node({"metadata": {"name": "x", "labels": {}}}, [make_policy()], [], [],
                         now=NOW)  # fmt: skip
    assert "no RemediationPolicy selects this node" in other[-1]
