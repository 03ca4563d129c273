"""`gpuheal explain` concludes what the operator decides, on random clusters.

A random cluster (several policies that may tie, some with fault domains over the nodes'
rack labels, nodes under them or none, GPUs that moved
between nodes with their FaultHistory left behind, open and closed incidents of any policy,
some holding a slot or replaced by a spare, nodes gpuheal keeps cordoned, breakers open or
near their limit, blind sources) is given to both sides as each meets it: the operator's
caches (`Runtime`) are filled by the calls its watches make, explain gets the objects a
live read returns. For each node, the operator's own decision (the driver's `_decide` for
an open incident, the intake's for a new XID Event arriving now) must be explain's verdict.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.names import CORDONED_BY_ANNOTATION
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.cli.explain import explain_node
from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy import faultrecord as fh
from gpuheal.policy.engine import same_fault
from gpuheal.policy.inputs import event_observations, node_event, node_view
from gpuheal.policy.types import Decision, Observation
from gpuheal.remediation import driver, intake
from gpuheal.remediation.state import Runtime
from gpuheal.xid.identity import GPU_MAP_ANNOTATION
from tests.unit.test_policy_select import make_policy

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)
NODES = [f"n{i}" for i in range(5)]
PCIS = ["0000:3b:00", "0000:86:00"]
UUIDS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(4)]
INCIDENTS = [f"nrem-{i}" for i in range(6)]
POLICIES = ["p0", "p1", "p2"]
RACK = "topology.kubernetes.io/rack"
RACKS: list[dict[str, str]] = [{}, {RACK: "r1"}, {RACK: "r1"}, {RACK: "r2"}]


def ago(minutes: int) -> dt.datetime:
    return NOW - dt.timedelta(minutes=minutes)


def stamp(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class Outbox:
    """The Event outbox: what the operator posts is not what is compared here."""

    def post(self, *_: Any, **__: Any) -> None:
        return None


minutes = st.integers(1, 90)  # strictly before NOW; the rules count 1 h


@st.composite
def policies(draw: st.DrawFn) -> list[RemediationPolicy]:
    out = []
    for name in POLICIES[: draw(st.integers(1, 3))]:
        safety: dict[str, Any] = {"maxUnhealthy": draw(st.integers(1, 3))}
        safety["stormCooldown"] = draw(st.sampled_from(["0s", "30m"]))
        if draw(st.booleans()):
            safety["rateLimit"] = {"remediations": draw(st.integers(1, 2)), "window": "1h"}
        policy = make_policy(
            name,
            labels={"pool": draw(st.sampled_from(["a", "b"]))},
            priority=draw(st.integers(0, 1)),
            **safety,
        )
        if draw(st.booleans()):  # fault domains: nodes of one rack faulting together
            domain: dict[str, Any] = {
                "key": RACK,
                "window": draw(st.sampled_from(["5m", "2h", "2h"])),
                "maxNodeActions": draw(st.integers(1, 2)),
            }
            limit = draw(st.sampled_from([None, 1, "50%"]))
            if limit is not None:
                domain["maxUnhealthy"] = limit
            body = policy.to_k8s()
            body["spec"]["domains"] = [domain]
            policy = RemediationPolicy.model_validate(body)
        breaker = draw(st.sampled_from(["none", "open", "closed"]))
        if breaker != "none":
            condition = {
                "type": "CircuitBreakerOpen",
                "status": "True" if breaker == "open" else "False",
                "reason": "CircuitBreakerOpen" if breaker == "open" else "BreakerClosed",
                "message": "",
                "lastTransitionTime": stamp(ago(draw(minutes))),
            }
            body = policy.to_k8s()
            body["status"] = {"conditions": [condition]}
            policy = RemediationPolicy.model_validate(body)
        out.append(policy)
    return out


@st.composite
def nodes(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for name in NODES:
        uuids = draw(st.lists(st.sampled_from(UUIDS), min_size=1, max_size=2, unique=True))
        annotations = {GPU_MAP_ANNOTATION: json.dumps(dict(zip(PCIS, uuids, strict=False)))}
        keeper = draw(st.one_of(st.none(), st.sampled_from([*INCIDENTS, "nrem-gone"])))
        if keeper is not None:
            annotations[CORDONED_BY_ANNOTATION] = keeper
        out.append(
            {
                "metadata": {
                    "name": name,
                    "uid": f"uid-{name}",
                    "labels": {"pool": draw(st.sampled_from(["a", "b", "c"])),
                               **draw(st.sampled_from(RACKS))},
                    "annotations": annotations,
                },
                "spec": {"unschedulable": keeper is not None},
                "status": {"conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": stamp(ago(600))},
                ]},
            }
        )  # fmt: skip
    return out


RULE = make_policy().spec.rules[0]
LADDER = [r.to_k8s() for r in RULE.ladder]
# A rung that replaces, named as the rule's first (its timeline's requeue/cordon marks the
# cordon done): what a domain's hold of a member's replacement is about.
REPLACE_LADDER = [
    {"name": "requeue", "steps": [
        {"action": "cordon"},
        {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}},
    ]},
    *LADDER[1:],
]  # fmt: skip


@st.composite
def incidents(draw: st.DrawFn, policy_names: list[str]) -> list[NodeRemediation]:
    out = []
    rule = RULE
    for name in draw(st.lists(st.sampled_from(INCIDENTS), max_size=6, unique=True)):
        first = draw(minutes)
        # 79 too: the catalogue never replaces on a first 94 (a domain holds replacements)
        xid = draw(st.sampled_from([94, 79]))
        signals = [
            {"source": "Event", "observedAt": stamp(ago(first - i)), "xid": xid,
             "pciBusId": draw(st.sampled_from(PCIS)), "eventUid": f"{name}-e{i}"}
            for i in range(draw(st.integers(1, 3)))
            if first - i >= 1
        ]  # fmt: skip
        detected = stamp(ago(first) + dt.timedelta(seconds=1))
        conditions: list[dict[str, Any]] = [
            {"type": "Detected", "status": "True", "reason": "SignalMatched",
             "lastTransitionTime": detected},
        ]  # fmt: skip
        if draw(st.booleans()):
            ended = ago(draw(st.integers(1, first)))
            conditions.append({"type": "Completed", "status": "True", "reason": "Returned",
                               "lastTransitionTime": stamp(ended)})  # fmt: skip
        status: dict[str, Any] = {
            "rung": draw(st.integers(0, 1)),
            "conditions": conditions,
            "ownership": {"cordoned": draw(st.booleans())},
            "timeline": [{"time": detected, "step": "requeue/cordon"}] if draw(st.booleans())
            else [],
        }  # fmt: skip
        if draw(st.booleans()):
            status["slotTakenAt"] = detected
        if draw(st.booleans()):
            status["replacementNode"] = "spare-1"
        out.append(
            NodeRemediation.model_validate(
                {
                    "metadata": {"name": name, "creationTimestamp": detected,
                                 "resourceVersion": "1", "generation": 1},
                    "spec": {"nodeName": draw(st.sampled_from(NODES)),
                             "policyRef": {"name": draw(st.sampled_from(policy_names))},
                             "rule": rule.name, "signals": signals,
                             "ladder": draw(st.sampled_from([REPLACE_LADDER, LADDER])),
                             "dryRun": draw(st.booleans())},
                    "status": status,
                }
            )
        )  # fmt: skip
    return out


@st.composite
def histories(draw: st.DrawFn) -> list[FaultHistory]:
    """FaultHistory of some nodes: XIDs on GPUs by UUID, some of which sit in another node
    now (moved)."""
    out = []
    for node in draw(st.lists(st.sampled_from(NODES), max_size=4, unique=True)):
        entries = [
            fh.signal_entry(
                Observation(
                    time=ago(draw(minutes)), xid=94, gpu=draw(st.sampled_from(PCIS)),
                    gpu_uuid=draw(st.sampled_from(UUIDS)), event_uid=f"h-{node}-{i}",
                    source="events", reporter="event:-:xid-line",
                )
            )
            for i in range(draw(st.integers(1, 3)))
        ]  # fmt: skip
        status = fh.summarise(entries, previous=None, now=NOW, retention=dt.timedelta(days=30))
        out.append(
            FaultHistory.model_validate(
                {"metadata": {"name": node}, "spec": {"nodeName": node},
                 "status": status.to_k8s()}
            )
        )  # fmt: skip
    return out


def events(node: dict[str, Any], times: list[int], pcis: list[str]) -> list[dict[str, Any]]:
    """XID 94 Events the node agent posted (a trusted reporter)."""
    out = []
    name = node["metadata"]["name"]
    for i, (m, pci) in enumerate(zip(times, pcis, strict=True)):
        ev = xid_event(node, kernel_line(94, pci=pci))
        ev["metadata"]["uid"] = f"{name}-ev{i}"
        ev["metadata"]["name"] = f"{name}.ev{i}"
        ev["source"]["component"] = ev["reportingComponent"] = "gpuheal-agent"
        ev["lastTimestamp"] = stamp(NOW - dt.timedelta(minutes=m))
        out.append(ev)
    return out


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    pols = draw(policies())
    node_bodies = draw(nodes())
    world: dict[str, Any] = {
        "policies": pols,
        "nodes": node_bodies,
        "incidents": draw(incidents([p.metadata.name for p in pols])),
        "histories": draw(histories()),
        # blind now and then: a blind node decides little else
        "blind": draw(st.sampled_from([[], [], [], ["events"], ["nodes"]])),
        "blind_nodes": {"dcgm": set(draw(st.lists(st.sampled_from(NODES), max_size=1)))},
        "readable_since": draw(
            st.dictionaries(
                st.sampled_from(["events", *(f"dcgm/{n}" for n in NODES)]),
                minutes.map(ago),
                max_size=2,
            )
        ),
        "events": {},
    }
    for body in node_bodies:
        past = draw(st.lists(minutes, max_size=2))
        pcis = [draw(st.sampled_from(PCIS)) for _ in range(len(past) + 1)]
        world["events"][body["metadata"]["name"]] = events(body, [*past, 0], pcis)
    return world


def operator(world: dict[str, Any]) -> Runtime:
    """The operator's caches, filled as its watches fill them."""
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.ports.events = Outbox()  # type: ignore[assignment]
    for policy in world["policies"]:
        rt.view.set_policy(policy)  # objects.policy_changed
    for body in world["nodes"]:
        rt.view.set_node(node_view(body, rt.view.kept_conditions))  # objects.node_changed
    for nrem in world["incidents"]:
        rt.view.incident_seen(nrem)  # objects.incident_changed
    rt.view.breakers_from_incidents()  # startup, once the incidents are listed
    for history in world["histories"]:
        rt.view.set_fault_history(history.spec.node_name, history)  # objects.history_changed
    for source in world["blind"]:
        rt.view.set_blind(source)  # sources._blind
    for node in world["blind_nodes"]["dcgm"]:
        rt.view.set_blind("dcgm", node)  # sources.scrape_once
    rt.view.readable_since.update(world["readable_since"])  # sources.set_seeing, earlier
    return rt


def observed(rt: Runtime, body: dict[str, Any]) -> list[Observation]:
    """What sources.handle_event hands the intake for an Event."""
    ev = node_event(body)
    assert ev is not None
    view = rt.view.nodes[ev.node]
    return event_observations(ev, NOW, view.gpus)


def explained(world: dict[str, Any], node: str, events: list[dict[str, Any]]) -> Any:
    body = next(b for b in world["nodes"] if b["metadata"]["name"] == node)
    return explain_node(
        body,
        world["policies"],
        events,
        world["incidents"],
        now=NOW,
        max_signal_age=dt.timedelta(seconds=OperatorConfig().event_max_age),
        histories=world["histories"],
        nodes=world["nodes"],
        blind=world["blind"],
        blind_nodes=world["blind_nodes"],
        readable_since=world["readable_since"],
    )


def operator_decides(world: dict[str, Any], node: str) -> tuple[str, Decision] | None:
    """What the operator decides for the node now: for its open incident (the driver), else
    for the newest Event (the intake). None: the operator decides nothing (no policy
    governs the node, or the intake takes the Event for a duplicate)."""
    rt = operator(world)
    events = world["events"][node]
    if rt.view.policy_of(node) is not None:  # else intake._observe ignores them, unremembered
        for body in events[:-1]:  # the Events it saw earlier: in its memory of the node
            for obs in observed(rt, body):
                rt.view.remember(node, obs)
    active = rt.view.active_incident(node)
    if active is not None:
        nrem = rt.view.latest[active.name]
        policy = rt.view.policies[nrem.spec.policy_ref.name]
        return "incident", asyncio.run(driver._decide(rt.ports, rt.view, nrem, policy, NOW))
    if rt.view.policy_of(node) is None:
        return None
    (new,) = observed(rt, events[-1])
    earlier = tuple(rt.view.history.get(node, ()))
    rt.view.remember(node, new)
    if any(same_fault(o, new) for o in earlier) or rt.view.seen_in_history(node, new):
        return None  # intake._observe: a duplicate, nothing decided
    return new.what + " at " + new.time.isoformat(), intake.judge(
        rt.view, node, new, NOW, max_signal_age=dt.timedelta(seconds=rt.ports.config.event_max_age)
    )


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(clusters())
def test_explain_concludes_what_the_operator_decides(world: dict[str, Any]) -> None:
    for node in NODES:
        expected = operator_decides(world, node)
        if expected is None:
            continue
        about, decision = expected
        has_incident = about == "incident"
        events = world["events"][node][:-1] if has_incident else world["events"][node]
        lines, verdicts = explained(world, node, events)
        if has_incident:
            assert verdicts, lines
            assert verdicts[-1].about.startswith("incident"), lines
            found = verdicts[-1].decision
        else:
            found = next((v.decision for v in verdicts if v.about == about), None)
            assert found is not None, (about, lines)
        assert found == decision, "\n".join(lines)
