"""The operator's incremental indexes say what a full scan says.

`Runtime.counts()` hands `policy.cluster_counts()` (the one place that counts the breaker's
slots) the per-policy tallies it keeps as incidents and nodes change; `gpuheal explain`
hands it tallies scanned from every incident and every kept-out node (`safety.tally`). Any
sequence of changes must leave the two equal, and the other indexes (open incident of a
node, recorded signals, last resolved) equal to their scans.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import admit, cluster_counts
from gpuheal.policy.inputs import last_resolved
from gpuheal.policy.safety import tally
from gpuheal.policy.types import IncidentSummary, NodeView
from gpuheal.remediation.report import look_at_breakers
from gpuheal.remediation.state import Breaker, Runtime
from tests.unit.test_policy_select import make_policy

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)
NODES = [f"n{i}" for i in range(6)]
NAMES = [f"i{i}" for i in range(8)]


def MINUTES_AGO(m: int) -> dt.datetime:
    return NOW - dt.timedelta(minutes=m)


summaries = st.builds(
    IncidentSummary,
    name=st.sampled_from(NAMES),
    node=st.sampled_from(NODES),
    policy=st.sampled_from(["p", "q"]),
    active=st.booleans(),
    holds_slot=st.booleans(),
    trigger_keys=st.frozensets(st.sampled_from(["k1", "k2", "k3"]), max_size=2),
    recorded=st.frozensets(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2)), max_size=2),
    slot_taken_at=st.one_of(st.none(), st.integers(0, 120).map(MINUTES_AGO)),
    completed_at=st.one_of(st.none(), st.integers(0, 120).map(MINUTES_AGO)),
    replacement=st.one_of(st.none(), st.just("spare-1")),
)  # fmt: skip
node_changes = st.tuples(
    st.sampled_from(NODES),
    st.sampled_from(["p", "q", "none"]),  # the label that picks the node's policy
    st.one_of(st.none(), st.sampled_from(NAMES)),  # the incident that keeps it cordoned
)
changes = st.lists(
    st.one_of(
        st.tuples(st.just("put"), summaries),
        st.tuples(st.just("drop"), st.sampled_from(NAMES)),
        st.tuples(st.just("node"), node_changes),
        st.tuples(st.just("gone"), st.sampled_from(NODES)),
        st.tuples(st.just("slot"), st.tuples(st.sampled_from(["p", "q"]), st.sampled_from(NAMES))),
    ),
    max_size=40,
)


def runtime() -> Runtime:
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rate = {"rateLimit": {"remediations": 3, "window": "1h"}}
    rt.view.set_policy(make_policy("p", labels={"pool": "p"}, **rate))
    rt.view.set_policy(make_policy("q", labels={"pool": "q"}))
    return rt


def apply(rt: Runtime, change: tuple[str, object]) -> None:
    kind, arg = change
    if kind == "put":
        assert isinstance(arg, IncidentSummary)
        rt.view.incidents[arg.name] = arg
    elif kind == "drop":
        rt.view.incidents.pop(str(arg), None)
    elif kind == "node":
        node, pool, keeper = arg  # type: ignore[misc]
        rt.view.set_node(
            NodeView(
                name=node,
                labels={"pool": pool},
                unschedulable=keeper is not None,
                cordoned_by=keeper,
            )
        )
    elif kind == "gone":
        rt.view.drop_node(str(arg))
    else:
        policy, name = arg  # type: ignore[misc]
        rt.view.slots.setdefault(policy, set()).add(name)


def scanned(rt: Runtime, policy: str) -> object:
    kept = [
        rt.view.nodes[n]
        for n in rt.view.kept_out
        if n in rt.view.nodes and rt.view.assignment.get(n) == policy
    ]
    breaker = rt.view.breakers[policy]
    incidents = list(rt.view.incidents.values())
    return cluster_counts(
        rt.view.selected[policy],
        tally(policy, incidents),
        {n.name: n.kept_out_by for n in kept if n.kept_out_by},
        replaced={i.name for i in incidents if i.replacement},
        local_slots=rt.view.slots.get(policy, ()),
        breaker_open=breaker.open,
        breaker_changed_at=breaker.changed_at,
    )


@settings(max_examples=300, deadline=None)
@given(changes)
def test_incremental_counts_equal_a_full_scan(steps: list[tuple[str, object]]) -> None:
    rt = runtime()
    for change in steps:
        apply(rt, change)
        for policy in ("p", "q"):
            full = scanned(rt, policy)
            fast = rt.view.counts(policy)
            assert fast.__class__ is full.__class__
            assert (fast.selected, fast.unhealthy, fast.remediating) == (
                full.selected,  # type: ignore[attr-defined]
                full.unhealthy,  # type: ignore[attr-defined]
                full.remediating,  # type: ignore[attr-defined]
            )
            assert sorted(fast.recent_starts) == sorted(full.recent_starts)  # type: ignore[attr-defined]
            # with `now`, only the rate-limit window's starts: the gate decides the same
            windowed = rt.view.counts(policy, NOW)
            safety = rt.view.policies[policy].spec.safety
            assert admit(safety, windowed, NOW) == admit(safety, full, NOW)  # type: ignore[arg-type]
    values = list(rt.view.incidents.values())
    for node in NODES:
        open_ = {i.name for i in values if i.node == node and i.active}
        found = rt.view.active_incident(node)
        assert (found.name if found else None) == (min(open_) if open_ else None)
        assert rt.view.incidents.last_resolved(node) == last_resolved(values, node)
    for key in ("k1", "k2", "k3"):
        for identity in (("a", 0), ("b", 2)):
            for node in NODES:
                expected = any(
                    key in i.trigger_keys or (i.node == node and identity in i.recorded)
                    for i in values
                )
                assert rt.view.incidents.recorded(key, node, identity) == expected
    assert rt.view.incidents.open_count == sum(1 for i in values if i.active)


def test_views_keep_the_kubelet_conditions_the_policies_name_and_no_more() -> None:
    from gpuheal.policy.inputs import node_view

    rule = {
        "name": "memory",
        "signals": {"conditions": [{"type": "MemoryPressure", "status": "True"}]},
        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
    }
    body = {
        "metadata": {"name": "n1", "labels": {"pool": "m"}},
        "status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "MemoryPressure", "status": "True"},
            {"type": "DiskPressure", "status": "False"},
        ]},
    }  # fmt: skip
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.view.set_policy(make_policy("q", labels={"pool": "q"}))
    assert rt.view.kept_conditions == frozenset()
    rt.view.set_node(node_view(body, rt.view.kept_conditions))
    assert not rt.view.relist_nodes.is_set()
    # A policy names MemoryPressure: the views dropped it, so the Node watch must list again.
    rt.view.set_policy(make_policy("m", labels={"pool": "m"}, rules=[rule]))
    assert rt.view.kept_conditions == {"MemoryPressure"}
    assert rt.view.relist_nodes.is_set()
    rt.view.relist_nodes.clear()
    rt.view.set_node(node_view(body, rt.view.kept_conditions))
    assert [c.type for c in rt.view.nodes["n1"].conditions] == ["Ready", "MemoryPressure"]
    # The same policy again (a status write): nothing to list.
    rt.view.set_policy(make_policy("m", labels={"pool": "m"}, rules=[rule]))
    assert not rt.view.relist_nodes.is_set()
    # No policy names it any more: dropped from the views at once, no relist.
    rt.view.drop_policy("m")
    assert rt.view.kept_conditions == frozenset()
    assert not rt.view.relist_nodes.is_set()
    assert [c.type for c in rt.view.nodes["n1"].conditions] == ["Ready"]


def test_a_policy_that_lost_its_status_gets_its_breaker_back_from_its_held_incidents() -> None:
    from gpuheal.api.meta import Condition, ConditionStatus
    from gpuheal.api.noderemediation import NodeRemediation

    def incident(name: str, policy: str, blocked_at: str, *, done: bool = False) -> NodeRemediation:
        conds = [{"type": "Blocked", "status": "True", "reason": "CircuitBreakerOpen",
                  "lastTransitionTime": blocked_at}]  # fmt: skip
        if done:
            conds.append({"type": "Completed", "status": "True", "reason": "Returned",
                          "lastTransitionTime": blocked_at})  # fmt: skip
        return NodeRemediation.model_validate({
            "metadata": {"name": name, "creationTimestamp": "2026-11-22T05:00:00Z"},
            "spec": {"nodeName": name, "policyRef": {"name": policy}, "rule": "ecc",
                     "signals": [{"source": "Event", "observedAt": "2026-11-22T05:00:00Z",
                                  "xid": 94}],
                     "ladder": [{"name": "r", "steps": [{"action": "cordon"}]}]},
            "status": {"conditions": conds},
        })  # fmt: skip

    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.view.set_policy(make_policy("p", labels={"pool": "p"}))  # re-created: an empty status
    said = make_policy("q", labels={"pool": "q"})
    said.status.conditions = [
        Condition(type="CircuitBreakerOpen", status=ConditionStatus.FALSE,
                  reason="BreakerClosed", last_transition_time=MINUTES_AGO(1))
    ]  # fmt: skip
    rt.view.set_policy(said)
    for n in (
        incident("a", "p", "2026-11-22T05:02:00Z"),
        incident("b", "p", "2026-11-22T05:01:00Z"),
        incident("c", "p", "2026-11-22T04:00:00Z", done=True),  # closed: says nothing now
        incident("d", "q", "2026-11-22T05:00:00Z"),  # q's status says closed: trusted
    ):
        rt.view.incident_seen(n)
    assert rt.view.breakers_from_incidents() == ["p"]
    assert rt.view.breakers["p"].open
    assert rt.view.breakers["p"].changed_at == dt.datetime(2026, 11, 22, 5, 1, tzinfo=dt.UTC)
    assert not rt.view.breakers["q"].open
    assert rt.view.breakers_from_incidents() == []  # once


def test_an_open_breaker_closes_at_the_operators_look_once_a_slot_is_free() -> None:
    """No incident is left waiting to look (a person deleted them, say): the operator's own
    look between incidents closes the breaker, dated then, so the storm cooldown counts from
    the storm's end rather than from the next fault, and the status says it is closed."""
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.view.set_policy(make_policy("p", labels={"pool": "p"}, maxUnhealthy=1))
    for n in NODES:
        rt.view.set_node(NodeView(name=n, labels={"pool": "p"}))
    opened = MINUTES_AGO(90)
    rt.view.breakers["p"] = Breaker(open=True, changed_at=opened)
    holder = IncidentSummary(name="i0", node="n0", policy="p", active=True, holds_slot=True)
    rt.view.incidents["i0"] = holder
    assert asyncio.run(look_at_breakers(rt.view, NOW)) == []  # the one slot is still taken
    assert rt.view.breakers["p"] == Breaker(open=True, changed_at=opened)
    rt.view.incidents.pop("i0")
    assert asyncio.run(look_at_breakers(rt.view, NOW)) == ["p"]
    assert rt.view.breakers["p"] == Breaker(open=False, changed_at=NOW)
    assert asyncio.run(look_at_breakers(rt.view, NOW + dt.timedelta(minutes=1))) == []
    assert rt.view.breakers["p"].changed_at == NOW  # closed once, dated once
