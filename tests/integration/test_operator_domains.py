"""Fault domains on the sandbox (`spec.domains`): four kwok nodes of one rack fault within the
window (XID 79 Events) and open one domain incident. No mocks: the real apiserver, kwok
nodes, the operator process, a webhook receiver on loopback and the `gpuheal status` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.nodes import RACK_LABEL
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    completed,
    condition,
    hold,
    policy,
    pool,
    wait_for,
    xid79_rule,
)
from tests.integration.test_operator_ecosystem import Receiver

pytestmark = pytest.mark.integration

CLAIMED_BY = "gpuheal.io/claimed-by"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def gpuheal_status(sandbox: Sandbox, *argv: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "gpuheal", "status", "--kubeconfig", str(sandbox.kubeconfig),
         *argv],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip


def test_four_nodes_of_one_rack_open_one_domain_incident_and_hold_replacement_past_the_limit(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    receiver: Receiver,
) -> None:
    """maxNodeActions 2: the first two nodes to fault are replaced (spares claimed), the two
    after them are cordoned and drained but their replacement is held (Blocked=True,
    DomainReplacementHeld), though two spares stay free; the receiver hears of the domain
    once; `gpuheal status` lists the domain and its members."""
    core = sandbox.core_v1()
    cid = case.case_id  # type: ignore[attr-defined]
    rack = f"rack-{cid}"
    nodes = case(4, "work", **{RACK_LABEL: rack})
    spares = case(4, "spare")  # enough for every node: only the domain holds them back
    objects.apply("reservepools", pool(f"spares-{cid}", f"{cid}-spare"))
    manifest = policy(f"p-{cid}", f"{cid}-work", [xid79_rule(f"spares-{cid}")], max_unhealthy=10)
    manifest["spec"]["domains"] = [{"key": RACK_LABEL, "window": "5m", "maxNodeActions": 2}]
    objects.apply("remediationpolicies", manifest)
    run_operator("--notify-webhooks", f"{receiver.url}/ops")

    for node in nodes:  # within seconds: well inside the 5m window
        simulate_xid(core, node, 79)
    incidents = wait_for(
        lambda: all(objects.incident(n) for n in nodes) and [objects.incident(n) for n in nodes],
        "an incident per node",
    )
    # members in the order of their faults (a tie in the Event's second: by node name)
    order = [
        o["spec"]["nodeName"]
        for o in sorted(
            incidents, key=lambda o: (o["spec"]["signals"][0]["observedAt"], o["spec"]["nodeName"])
        )
    ]
    acting, held = order[:2], order[2:]

    for node in acting:
        done = wait_for(
            lambda n=node: completed(o := objects.incident(n)) == "Replaced" and o,
            f"{node} replaced",
            timeout=90,
        )
        assert condition(done, "ReplacementClaimed")["status"] == "True"

    def blocked(node: str) -> dict[str, Any] | None:
        c = condition(objects.incident(node), "Blocked")
        return c if c and c["status"] == "True" and c["reason"] == "DomainReplacementHeld" else None

    for node in held:
        why = wait_for(lambda n=node: blocked(n), f"{node}'s replacement held")
        assert f"domain incident {RACK_LABEL}={rack}: {node} is member" in why["message"]
        assert "past maxNodeActions 2: its replacement is held" in why["message"]
        o = objects.incident(node)
        assert condition(o, "Cordoned")["status"] == "True"  # per-node actions went on
        assert condition(o, "Drained")["status"] == "True"
        assert condition(o, "ReplacementClaimed") is None or (
            condition(o, "ReplacementClaimed")["status"] != "True"
        )
        assert not completed(o)

    def claimed() -> list[str]:
        return [s for s in spares if objects.node(s).metadata.labels.get(CLAIMED_BY)]

    hold(lambda: len(claimed()) == 2 and all(blocked(n) for n in held), "held, spares free", 3)
    assert {
        objects.node(s).metadata.annotations.get("gpuheal.io/replaces") for s in claimed()
    } == set(acting)

    # One notice for the domain, from the member whose fault opened it; none for the
    # members after it, and none for a held replacement.
    def domain_notices() -> list[dict[str, Any]]:
        return [m for m in receiver.at("/ops") if m["event"] == "DomainOpened"]

    (notice,) = wait_for(lambda: domain_notices() or None, "the domain's notice")
    hold(lambda: len(domain_notices()) == 1, "and no second one", 2)
    assert notice["node"] == order[1]
    assert notice["reason"] == "DomainIncident"
    assert f"{RACK_LABEL}={rack}: " in notice["message"]
    ops = receiver.at("/ops")
    assert not [m for m in ops if m["reason"] == "DomainReplacementHeld"], ops
    assert [m["node"] for m in ops if m["event"] == "Opened"] == [order[0]], ops

    # `gpuheal status` shows the domain and its members, in the order they faulted (one run
    # of the CLI: ~14 s here at a load of 20).
    listing = json.loads(gpuheal_status(sandbox, "-o", "json"))
    (domain,) = [d for d in listing["domains"] if d["domain"] == f"{RACK_LABEL}={rack}"]
    assert domain["policy"] == f"p-{cid}"
    assert [m["node"] for m in domain["members"]] == order
    assert [m["replacement"] for m in domain["members"]] == ["runs", "runs", "held", "held"]
    # (the table's "Domain incidents:" section, from the same data: tests/unit)
