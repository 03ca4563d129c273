"""Fault domains (`spec.domains`): the policy model, the grouping into domain incidents, the
engine's hold of a member's replacement past maxNodeActions, the per-domain breaker, who
announces the domain, and the reading model's standings (what operator and explain share)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.api import Action, RemediationPolicy
from gpuheal.api.domains import FaultDomain
from gpuheal.api.names import Reason
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.policy import decide
from gpuheal.policy.domains import (
    Announce,
    DomainStanding,
    allowed_in_domain,
    announcement,
    domain_breaker,
    domain_incidents,
    replacement_held,
)
from gpuheal.policy.reading import domain_standings, scan
from gpuheal.policy.types import Act, Blocked, History, IncidentSummary, NodeView
from tests.unit.test_policy_engine import CALM, NODE, SPEC, T0, incident_79, xid

RACK = "topology.kubernetes.io/rack"
SEC = dt.timedelta(seconds=1)
MIN = dt.timedelta(minutes=1)


def rack(**kw: Any) -> FaultDomain:
    return FaultDomain.model_validate({"key": RACK, "window": "5m", **kw})


def summary(node: str, at: dt.datetime, *, policy: str = "p", active: bool = True,
            name: str | None = None, **kw: Any) -> IncidentSummary:  # fmt: skip
    return IncidentSummary(
        name=name or f"nrem-{node}", node=node, policy=policy, active=active,
        holds_slot=kw.pop("holds_slot", False), first_signal_at=at, started_at=at + SEC, **kw,
    )  # fmt: skip


# --- the model -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"minNodes": 4, "maxNodeActions": 1}, "maxNodeActions must be at least minNodes - 1"),
        ({"window": "48h"}, "window must be at most 24h"),
        ({"window": "0s"}, "positive duration"),
        ({"minNodes": 1}, "greater than or equal to 2"),
        ({"key": "not a key"}, "label key"),
    ],
)
def test_a_bad_domain_is_refused_naming_its_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        FaultDomain.model_validate({"key": RACK, **fields})


def test_a_policy_names_each_domain_key_once_and_defaults_are_sensible() -> None:
    doc = SPEC.to_k8s()
    doc["domains"] = [{"key": RACK}, {"key": RACK, "window": "1m"}]
    with pytest.raises(ValidationError, match="each key at most once"):
        type(SPEC).model_validate(doc)
    doc["domains"] = [{"key": RACK}, {"key": "nvidia.com/gpu.clique", "maxUnhealthy": "50%"}]
    spec = type(SPEC).model_validate(doc)
    first = spec.domains[0]
    assert (first.window, first.min_nodes, first.max_node_actions, first.max_unhealthy) == (
        "10m", 2, 2, None,
    )  # fmt: skip


# --- grouping --------------------------------------------------------------------------------


def test_faults_within_the_window_of_the_first_are_one_domain_incident_in_fault_order() -> None:
    found = domain_incidents(
        "p",
        rack(minNodes=3, maxNodeActions=2),
        "r1",
        [
            summary("n3", T0 + 2 * MIN),
            summary("n1", T0),
            summary("n2", T0 + MIN),
            summary("n0", T0 + 2 * MIN),  # a tie: the node name orders it
            summary("n1", T0 + 3 * MIN, name="nrem-n1-again", active=True),  # same node: once
            summary("n5", T0 + 6 * MIN),  # past the window of the first: a group of its own
            summary("n9", T0, policy="other"),  # another policy's incident: not counted
        ],
    )
    assert len(found) == 2
    group, later = found
    assert [m.node for m in group.members] == ["n1", "n2", "n0", "n3"]
    assert group.formed
    assert group.active
    assert group.opened_at == T0
    assert (group.acting, group.held) == (("n1", "n2"), ("n0", "n3"))
    assert "nrem-n1-again" in group.incidents
    assert group.place("n0") == 2
    assert group.place("n5") is None
    assert "topology.kubernetes.io/rack=r1: 4 nodes faulted within 5m" in group.summary()
    assert "held for n0, n3" in group.summary()
    assert [m.node for m in later.members] == ["n5"]
    assert not later.formed


def test_a_closed_member_keeps_its_place_so_no_later_member_moves_up() -> None:
    """The first members' incidents close once replaced; the third is still held."""
    found = domain_incidents(
        "p",
        rack(maxNodeActions=2),
        "r1",
        [summary("a", T0, active=False), summary("b", T0 + SEC, active=False),
         summary("c", T0 + 2 * SEC)],
    )  # fmt: skip
    (group,) = found
    assert group.active
    assert group.held == ("c",)
    done = domain_incidents("p", rack(), "r1", [summary("a", T0, active=False),
                                               summary("b", T0 + SEC, active=False)])  # fmt: skip
    assert done[0].formed
    assert not done[0].active


# --- the engine ----------------------------------------------------------------------------


def standing(nodes: list[str], *, max_node_actions: int = 1, out: int = 0,
             **domain: Any) -> DomainStanding:  # fmt: skip
    d = rack(**{"minNodes": 2, "maxNodeActions": max_node_actions, **domain})
    (group,) = domain_incidents(
        "p", d, "r1", [summary(n, T0 + i * SEC) for i, n in enumerate(nodes)]
    )
    return DomainStanding(d, "r1", group, nodes=8, out=out)


BEFORE_REPLACE = {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN}


def held_decision(domains: tuple[DomainStanding, ...], **kw: Any) -> object:
    incident = incident_79(BEFORE_REPLACE, rung=1, holds_slot=True, **kw)
    history = History(observations=[xid(79, T0)], incident=incident)
    return decide(SPEC, NODE, history, CALM, T0 + MIN, domains=domains)


def test_past_max_node_actions_a_members_replacement_is_held_and_says_why() -> None:
    # NODE (gpu-0) faulted third of three; the limit lets the first one act in full
    decision = held_decision((standing(["gpu-1", "gpu-2", "gpu-0"]),))
    assert isinstance(decision, Blocked), decision
    assert decision.reason == Reason.DOMAIN_REPLACEMENT_HELD
    assert decision.would is not None
    assert decision.would.operation is Action.REPLACE
    assert decision.message.startswith(
        "domain incident topology.kubernetes.io/rack=r1: gpu-0 is member 3 of 3 "
        "(gpu-1, gpu-2, gpu-0) within 5m, past maxNodeActions 1: its replacement is held"
    )


@pytest.mark.parametrize(
    ("nodes", "limit"),
    [
        (["gpu-0", "gpu-1", "gpu-2"], 1),  # the first member acts in full
        (["gpu-1", "gpu-0"], 2),  # within the limit
        (["gpu-0"], 1),  # one node alone is no domain incident
    ],
)
def test_within_the_limit_or_alone_the_replacement_goes_on(nodes: list[str], limit: int) -> None:
    decision = held_decision((standing(nodes, max_node_actions=limit),))
    assert isinstance(decision, Act), decision
    assert decision.operation is Action.REPLACE


def test_a_person_approving_the_replace_lifts_the_hold() -> None:
    approved = frozenset({Action.REPLACE})
    decision = held_decision((standing(["gpu-1", "gpu-0"]),), approved=approved)
    assert isinstance(decision, Act), decision
    assert decision.operation is Action.REPLACE


def test_a_held_member_still_cordons_drains_and_requeues_but_reserves_no_spare() -> None:
    domains = (standing(["gpu-1", "gpu-0"]),)
    history = History(observations=[xid(79, T0)], incident=incident_79(set(), rung=1))
    decision = decide(SPEC, NODE, history, CALM, T0 + MIN, domains=domains)
    assert isinstance(decision, Act), decision
    assert decision.operation is Action.CORDON
    assert decision.reserve is None  # without the domain: the spare is claimed now
    alone = decide(SPEC, NODE, history, CALM, T0 + MIN)
    assert isinstance(alone, Act)
    assert alone.reserve is not None
    assert replacement_held(domains, "gpu-1") is None
    assert replacement_held(domains, "gpu-0") is domains[0]


def test_a_member_claims_its_spare_early_only_once_the_faults_before_it_are_on_record() -> None:
    """Acting (first of two) but its incident just opened: a member that faulted before it
    may not be an incident yet, so no early claim; two seconds on, the claim goes ahead."""
    domains = (standing(["gpu-0", "gpu-1"], max_node_actions=1),)
    history = History(observations=[xid(79, T0)], incident=incident_79(set(), rung=1))
    soon = decide(SPEC, NODE, history, CALM, T0 + SEC, domains=domains)
    assert isinstance(soon, Act), soon
    assert soon.operation is Action.CORDON  # the node's own steps are not delayed
    assert soon.reserve is None
    later = decide(SPEC, NODE, history, CALM, T0 + 2 * SEC, domains=domains)
    assert isinstance(later, Act)
    assert later.reserve is not None
    alone = decide(SPEC, NODE, history, CALM, T0 + SEC)  # no domain: claimed at once
    assert isinstance(alone, Act)
    assert alone.reserve is not None


def test_a_held_member_whose_spare_was_claimed_early_says_so() -> None:
    decision = held_decision((standing(["gpu-1", "gpu-0"]),), replaced_by="spare-3")
    assert isinstance(decision, Blocked), decision
    assert decision.reason == Reason.DOMAIN_REPLACEMENT_HELD
    assert decision.message.endswith(
        "; spare-3 was claimed for it before the faults ahead of it were on record, "
        "and stays claimed"
    )


def test_the_domain_breaker_holds_the_first_disruptive_step_only() -> None:
    full = (standing(["gpu-1", "gpu-0"], out=2, maxUnhealthy=2),)
    history = History(observations=[xid(79, T0)], incident=incident_79(set()))
    blocked = decide(SPEC, NODE, history, CALM, T0 + MIN, domains=full)
    assert isinstance(blocked, Blocked), blocked
    assert blocked.reason == Reason.DOMAIN_BREAKER_OPEN
    assert blocked.message == (
        "domain topology.kubernetes.io/rack=r1: 2 of its 8 nodes already out of service; "
        "its maxUnhealthy allows 2 at once"
    )
    room = (standing(["gpu-1", "gpu-0"], out=1, maxUnhealthy=2),)
    assert isinstance(decide(SPEC, NODE, history, CALM, T0 + MIN, domains=room), Act)
    # an incident that holds its slot already goes on (as under the policy's breaker)
    holding = History(observations=[xid(79, T0)],
                      incident=incident_79({Action.CORDON}, holds_slot=True))  # fmt: skip
    assert isinstance(decide(SPEC, NODE, holding, CALM, T0 + MIN, domains=full), Act)


@pytest.mark.parametrize(
    ("value", "nodes", "allowed"),
    [(2, 8, 2), ("25%", 8, 2), ("10%", 4, 1), ("0%", 4, 0), (5, 3, 3), (None, 8, None)],
)
def test_allowed_in_domain(value: int | str | None, nodes: int, allowed: int | None) -> None:
    assert allowed_in_domain(rack(maxUnhealthy=value), nodes) == allowed
    if allowed is None:
        assert domain_breaker((DomainStanding(rack(), "r1", None, nodes, 99),)) is None


# --- who tells people ----------------------------------------------------------------------


def test_the_member_whose_fault_opens_the_domain_announces_it_once() -> None:
    three = (standing(["a", "b", "c", "d"], max_node_actions=2, minNodes=3),)
    assert announcement(three, "a") == (Announce.OWN, None)  # before the domain opened
    assert announcement(three, "b") == (Announce.OWN, None)
    how, group = announcement(three, "c")  # its fault made it three
    assert how is Announce.DOMAIN
    assert group is three[0].incident
    assert announcement(three, "d")[0] is Announce.FOLDED  # told by c's notice
    assert announcement(three, "x") == (Announce.OWN, None)  # not a member
    alone = (DomainStanding(rack(), "r1", None, 8, 0),)
    assert announcement(alone, "a") == (Announce.OWN, None)


# --- the reading model (operator and explain) ----------------------------------------------


def nrem(name: str, node: str, at: dt.datetime, *, policy: str = "p") -> NodeRemediation:
    rule = next(r for r in SPEC.rules if r.name == "fell-off-bus")
    return NodeRemediation.model_validate({
        "metadata": {"name": name, "creationTimestamp": at.isoformat()},
        "spec": {"nodeName": node, "policyRef": {"name": policy}, "rule": rule.name,
                 "signals": [{"source": "Event", "observedAt": at.isoformat(), "xid": 79}],
                 "ladder": [r.to_k8s() for r in rule.ladder]},
    })  # fmt: skip


def test_standings_come_from_the_nodes_labels_and_the_policys_incidents() -> None:
    body = SPEC.to_k8s()
    body["nodeSelector"] = {"matchLabels": {"pool": "a"}}
    body["domains"] = [{"key": RACK, "window": "5m", "maxNodeActions": 1, "maxUnhealthy": 3}]
    policy = RemediationPolicy.model_validate({"metadata": {"name": "p"}, "spec": body})
    views = [
        NodeView(name=f"n{i}", labels={"pool": "a", **({RACK: "r1"} if i < 4 else {})})
        for i in range(6)
    ]
    incidents = [nrem(f"nrem-n{i}", f"n{i}", T0 + i * SEC) for i in (0, 1, 2, 4)]
    incidents.append(nrem("nrem-n3-q", "n3", T0, policy="q"))  # another policy's: no member
    read = scan(views, [policy], incidents)
    (s,) = domain_standings(read, "p", "n2", "nrem-n2")
    assert s.incident is not None
    assert [m.node for m in s.incident.members] == ["n0", "n1", "n2"]
    assert (s.name, s.nodes, s.out) == (f"{RACK}=r1", 4, 0)
    assert replacement_held((s,), "n2") is s
    assert domain_standings(read, "p", "n4", "nrem-n4") == ()  # no rack label: no domain
    # the engine's inputs carry them, for the operator's driver and explain alike
    from gpuheal.policy.reading import engine_inputs

    inputs = engine_inputs(read, "n2", T0 + MIN, incident=incidents[2])
    assert inputs is not None
    assert inputs.domains == (s,)
    none = dataclasses.replace(read, incidents_on={})
    (empty,) = domain_standings(none, "p", "n2", "nrem-n2")
    assert empty.incident is None


def test_explain_agrees_with_the_operator_on_a_held_member() -> None:
    """The random clusters of the explain == operator property reach a held member rarely
    (the catalogue never replaces on a first XID 94); here one for sure (XID 79): two nodes
    of rack r1 faulted a minute apart, the first acts in full, the second's replace is
    held, and explain says so as the operator decides it."""
    from tests.unit import test_reading_explain_equals_operator as same
    from tests.unit.test_policy_select import make_policy

    body = make_policy("p", labels={"pool": "a"}, maxUnhealthy=3).to_k8s()
    body["spec"]["domains"] = [{"key": RACK, "maxNodeActions": 1}]
    policy = RemediationPolicy.model_validate(body)
    nodes = [
        {"metadata": {"name": n, "uid": f"uid-{n}", "labels": {"pool": "a", RACK: "r1"}},
         "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True",
                                                "lastTransitionTime": same.stamp(same.ago(600))}]}}
        for n in same.NODES
    ]  # fmt: skip

    def incident(name: str, node: str, minutes: int) -> NodeRemediation:
        at = same.stamp(same.ago(minutes))
        return NodeRemediation.model_validate({
            "metadata": {"name": name, "creationTimestamp": at, "resourceVersion": "1",
                         "generation": 1},
            "spec": {"nodeName": node, "policyRef": {"name": "p"}, "rule": same.RULE.name,
                     "signals": [{"source": "Event", "observedAt": at, "xid": 79,
                                  "pciBusId": same.PCIS[0], "eventUid": f"{name}-e"}],
                     "ladder": same.REPLACE_LADDER},
            "status": {"conditions": [{"type": "Detected", "status": "True",
                                       "reason": "SignalMatched", "lastTransitionTime": at}],
                       "timeline": [{"time": at, "step": "requeue/cordon"}],
                       "slotTakenAt": at},
        })  # fmt: skip

    world: dict[str, Any] = {
        "policies": [policy],
        "nodes": nodes,
        "incidents": [incident("nrem-a", "n0", 10), incident("nrem-b", "n1", 9)],
        "histories": [],
        "blind": [],
        "blind_nodes": {"dcgm": set()},
        "readable_since": {},
        "events": {b["metadata"]["name"]: same.events(b, [0], same.PCIS[:1]) for b in nodes},
    }
    decided = {}
    for node in ("n0", "n1"):
        expected = same.operator_decides(world, node)
        assert expected is not None
        assert expected[0] == "incident"
        lines, verdicts = same.explained(world, node, world["events"][node][:-1])
        assert verdicts[-1].decision == expected[1], "\n".join(lines)
        decided[node] = expected[1]
    assert isinstance(decided["n0"], Act)
    assert decided["n0"].operation is Action.REPLACE
    held = decided["n1"]
    assert isinstance(held, Blocked), held
    assert held.reason == Reason.DOMAIN_REPLACEMENT_HELD
    assert "n1 is member 2 of 2 (n0, n1)" in held.message


def test_gpuheal_status_lists_the_open_domain_incidents_and_their_members() -> None:
    """`gpuheal status` groups what it read as the operator does: the members in fault
    order, those past maxNodeActions marked held; a domain with every member closed, a node
    without the label and another policy's incident are not listed."""
    from gpuheal.cli.status import domains_of, render

    body = SPEC.to_k8s()
    body["domains"] = [{"key": RACK, "window": "5m", "maxNodeActions": 1}]
    policy = {"metadata": {"name": "p"}, "spec": body}
    plain = {"metadata": {"name": "q"}, "spec": SPEC.to_k8s()}
    racks = {"n0": "r1", "n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2"}
    nodes = [{"metadata": {"name": n, "labels": {RACK: r}}} for n, r in racks.items()]
    nodes.append({"metadata": {"name": "n9"}})

    def closed(name: str, node: str) -> dict[str, Any]:
        body = nrem(name, node, T0).to_k8s()
        done = {"type": "Completed", "status": "True", "reason": "Replaced", "message": "",
                "lastTransitionTime": T0.isoformat()}  # fmt: skip
        body["status"] = {"conditions": [done]}
        return body

    items = [
        nrem("nrem-n1", "n1", T0).to_k8s(),
        nrem("nrem-n0", "n0", T0 + SEC).to_k8s(),
        nrem("nrem-n2", "n2", T0 + 2 * SEC).to_k8s(),
        closed("nrem-n3", "n3"),  # r2: every member closed, over
        closed("nrem-n4", "n4"),
        nrem("nrem-n9", "n9", T0).to_k8s(),  # no rack label
        nrem("nrem-q", "n2", T0, policy="q").to_k8s(),
    ]
    groups = domains_of([policy, plain], nodes, items)
    assert [g.name for g in groups] == [f"{RACK}=r1"]
    assert [m.node for m in groups[0].members] == ["n1", "n0", "n2"]
    assert domains_of([policy], nodes, items, node="n3") == []
    now = T0 + 2 * MIN
    table = render(items, "table", now=now, domains=groups)
    assert "\nDomain incidents:\n" in table
    assert table.splitlines()[-1].split() == [f"{RACK}=r1", "p", "3", "2m", "n1,", "n0*,", "n2*"]
    listed = json.loads(render(items, "json", now=now, domains=groups))
    (domain,) = listed["domains"]
    assert (domain["domain"], domain["policy"], domain["maxNodeActions"]) == (f"{RACK}=r1", "p", 1)
    assert [(m["node"], m["incident"], m["replacement"]) for m in domain["members"]] == [
        ("n1", "nrem-n1", "runs"), ("n0", "nrem-n0", "held"), ("n2", "nrem-n2", "held"),
    ]  # fmt: skip
    assert "domains" not in json.loads(render(items, "json", now=now))  # none: as before
