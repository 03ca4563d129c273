"""`gpuheal status` and `gpuheal explain` render from plain objects (no cluster), and what
`explain` says is what the operator's own code decides from the same objects."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry

from gpuheal.api.names import Reason
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.cli.explain import explain_node
from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal.cli.status import incident_state, status_table, step_durations
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import decide
from gpuheal.policy.explain import explain
from gpuheal.policy.inputs import (
    event_observation,
    incident_summary,
    node_event,
    node_view,
)
from gpuheal.policy.reading import scan
from gpuheal.policy.types import Act, History, Move
from gpuheal.remediation import driver
from gpuheal.remediation.state import Runtime
from tests.unit.test_policy_select import make_policy

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


NODE = {
    "metadata": {"name": "n1", "uid": "u", "labels": {"pool": "train"}},
    "status": {"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T00:00:00Z"},
        {"type": "GpuDegraded", "status": "True", "lastTransitionTime": "2026-11-22T06:00:05Z"},
    ]},
}  # fmt: skip


def xid_events(*minutes: int, code: int = 94) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(minutes):
        ev = xid_event({"metadata": {"name": "n1", "uid": "u"}}, kernel_line(code))
        ev["metadata"]["uid"] = f"e{i}"
        # the node agent's, the reporter the operator trusts by default
        ev["source"]["component"] = ev["reportingComponent"] = "gpuheal-agent"
        ev["lastTimestamp"] = f"2026-11-22T05:{m:02d}:00Z"
        out.append(ev)
    return out


def nrem(policy: RemediationPolicy, *, rung: int = 0, done: tuple[str, ...] = (),
         completed_at: str | None = None, signals: int = 1) -> NodeRemediation:  # fmt: skip
    rule = policy.spec.rules[0]
    conds: list[dict[str, Any]] = [{"type": "Detected", "status": "True", "reason": "SignalMatched",
                                    "lastTransitionTime": "2026-11-22T05:50:01Z"}]  # fmt: skip
    if completed_at:
        conds.append({"type": "Completed", "status": "True", "reason": "Returned",
                      "lastTransitionTime": completed_at})  # fmt: skip
    return NodeRemediation.model_validate(
        {
            "metadata": {"name": "nrem-n1-a", "creationTimestamp": "2026-11-22T05:50:01Z"},
            "spec": {
                "nodeName": "n1", "policyRef": {"name": policy.metadata.name}, "rule": rule.name,
                "signals": [{"source": "Event", "observedAt": f"2026-11-22T05:5{i}:00Z", "xid": 94,
                             "pciBusId": "0000:3b:00", "eventUid": f"e{i}"}
                            for i in range(signals)],
                "ladder": [r.to_k8s() for r in rule.ladder],
            },
            "status": {"rung": rung, "conditions": conds, "ownership": {"cordoned": True},
                       "timeline": [{"time": "2026-11-22T05:50:02Z", "step": f"x/{a}"}
                                    for a in done]},
        }
    )  # fmt: skip


def test_explain_judges_each_signal_then_the_node_now() -> None:
    policy = make_policy()
    lines, _ = explain_node(NODE, [policy], xid_events(50, 51, 52), [], now=NOW)
    text = "\n".join(lines)
    assert lines[0] == "node n1: Ready"
    assert "policy p (priority 0) selects it" in text
    assert "condition GpuDegraded (acts on True): True since 2026-11-22 06:00:05+00:00" in text
    assert "XID 94 on GPU 0000:3b:00 at 2026-11-22T05:50:00+00:00: opens an incident " in text
    assert "(rule ecc, rung 0): XID 94 on GPU 0000:3b:00 (1 in 1h) matched rule ecc" in text
    assert "(rule ecc, rung 1): XID 94 on GPU 0000:3b:00 (3 in 1h) matched rule ecc" in text
    # no incident on record: the engine would open one for the worst of them (the 3rd XID
    # climbs to rung 1; GpuDegraded has held only 5 s of its 5 m)
    assert "now: opens an incident (rule ecc, rung 1)" in text
    other, _ = explain_node({"metadata": {"name": "x", "labels": {}}}, [make_policy()], [], [],
                         now=NOW)  # fmt: skip
    assert "no RemediationPolicy selects this node" in other[-1]


def test_explain_counts_untrusted_events_for_nothing_and_names_them_first() -> None:
    """As the operator (policy.trust): an Event from a reporter not trusted is no signal."""
    policy = make_policy()
    forged = xid_events(50)
    forged[0]["source"]["component"] = forged[0]["reportingComponent"] = "kernel-monitor"
    lines, _ = explain_node(NODE, [policy], forged, [], now=NOW)
    assert lines[0].startswith(
        "untrusted: XID 94 on GPU 0000:3b:00: Event e0 from reporter 'kernel-monitor', "
        "not a trusted one"
    )
    assert "now: opens an incident" not in "\n".join(lines)
    trusting, _ = explain_node(
        NODE, [policy], forged, [], now=NOW, trusted={"gpuheal-agent", "kernel-monitor"}
    )
    assert "now: opens an incident (rule ecc, rung 0)" in "\n".join(trusting)


def test_explain_puts_signals_during_an_incident_on_it_and_asks_for_its_next_move() -> None:
    policy = make_policy()
    closed = nrem(policy, done=("cordon",), completed_at="2026-11-22T05:55:00Z")
    lines, _ = explain_node(NODE, [policy], xid_events(50, 51, 57), [closed], now=NOW)
    text = "\n".join(lines)
    assert "at 2026-11-22T05:51:00+00:00: recorded on incident nrem-n1-a" in text
    # after the incident ended, a new XID opens a new one; the earlier ones still count
    assert "at 2026-11-22T05:57:00+00:00: opens an incident (rule ecc, rung 1)" in text
    assert "incident nrem-n1-a (closed, rule ecc)" in text
    open_ = nrem(policy, done=("cordon",))
    now_line, _ = explain_node(NODE, [policy], [], [open_], now=NOW)
    # its rung is done; GpuDegraded still holds, so it does not return the node yet
    assert any(
        line.startswith("incident (rule ecc, rung 0): waits (NodeStillUnhealthy, 10m)")
        for line in now_line
    ), now_line


def _operator_decision(policy: RemediationPolicy, incident: NodeRemediation) -> Any:
    """The operator's own code path for an open incident: the driver's `_decide`."""
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.view.set_policy(policy)
    rt.view.set_node(node_view(NODE))
    rt.view.incidents[incident.metadata.name] = incident_summary(incident)
    return asyncio.run(driver._decide(rt.ports, rt.view, incident, policy, NOW))


def test_explain_says_what_the_operator_decides_even_for_a_two_rung_rule_without_escalation() -> (
    None
):
    """The case where two copies of the rules once disagreed: a rule with two rungs and no
    `escalation` block climbed in `gpuheal explain` but never in the operator."""
    policy = make_policy()
    rule = policy.spec.rules[0].model_copy(update={"escalation": None})  # CEL forbids; copies
    spec = policy.spec.model_copy(update={"rules": [rule, *policy.spec.rules[1:]]})
    policy = policy.model_copy(update={"spec": spec})
    incident = nrem(policy, done=("cordon",), signals=3)  # three XID 94 on one GPU: climbs
    operator = _operator_decision(policy, incident)
    assert isinstance(operator, Act)
    assert (operator.operation, operator.rung) == (Move.ESCALATE, 1)
    _, verdicts = explain_node(NODE, [policy], [], [incident], now=NOW)
    assert verdicts[-1].decision == operator
    # ...and each signal as the intake judged it when it arrived
    events = [e for e in (node_event(b) for b in xid_events(40, 41, 42)) if e is not None]
    observations = [event_observation(e, NOW) for e in events]
    read = scan([node_view(NODE)], [policy], [], signals={"n1": observations})  # type: ignore[dict-item]
    _, verdicts = explain(read, "n1", incident=None, episodes=[], now=NOW)
    for i, verdict in enumerate(verdicts[:3]):
        obs = observations[i]
        assert obs is not None
        intake = decide(spec, node_view(NODE), History(observations=observations[:i]),  # type: ignore[arg-type]
                        _counts(), obs.time, new=obs)  # fmt: skip
        assert verdict.decision == intake
    third = verdicts[2].decision
    assert isinstance(third, Act)
    assert third.rung == 1
    assert verdicts[-1].decision.reason != Reason.STALE  # type: ignore[union-attr]


def _counts() -> Any:
    from gpuheal.policy.types import ClusterCounts

    return ClusterCounts(0, 0, 0)


def test_explain_sees_a_kubelet_pressure_condition_a_policy_names() -> None:
    rule = {
        "name": "memory",
        "signals": {"conditions": [{"type": "MemoryPressure", "status": "True"}]},
        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
    }
    node = {
        "metadata": {"name": "n1", "uid": "u", "labels": {"pool": "train"}},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T00:00:00Z"},
            {"type": "MemoryPressure", "status": "True", "reason": "KubeletHasInsufficientMemory",
             "lastTransitionTime": "2026-11-22T06:00:00Z"},
        ]},
    }  # fmt: skip
    lines, _ = explain_node(node, [make_policy(rules=[rule])], [], [], now=NOW)
    text = "\n".join(lines)
    assert "condition MemoryPressure (acts on True): True since" in text, text
    assert "now: opens an incident (rule memory, rung 0)" in text, text
