"""Hostile cluster input against the real operator process on the sandbox (issue 16 part 4):
forged XID Events on nodes gpuheal does not manage, an Event flood on one node, Nodes with
malformed labels and annotations, NodeRemediations written by a person.

Each test prints a `RESULT` line with what it measured (docs/reliability.md keeps the table).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client

from gpuheal.cli.simulate import kernel_line, simulate_condition, simulate_xid, xid_event
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    condition,
    cordon_only_rule,
    hold,
    node_events,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration

CORDONED_BY = "gpuheal.io/cordoned-by"
FLOOD = 10_000


def _rss_mib(op: OperatorProcess) -> float:
    assert op.proc is not None
    with open(f"/proc/{op.proc.pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _ours(events: list[Any]) -> list[Any]:
    """Events gpuheal posted (its component), not the test's."""
    return [e for e in events if (e.source and e.source.component == "gpuheal")]


def _post(core: client.CoreV1Api, node: str, message: str, uid: str | None = None) -> None:
    body = xid_event({"metadata": {"name": node, "uid": uid or node}}, message)
    core.create_namespaced_event("default", body)


def _signals(op: OperatorProcess, result: str) -> float:
    return op.metrics().get(f'gpuheal_signals_total{{result="{result}",source="events"}}', 0.0)


@pytest.fixture
def drop_events(sandbox: Sandbox) -> Any:
    """``drop_events(node)``: the test's Events about ``node`` are deleted afterwards (a flood
    left behind would be listed by every later operator start)."""
    core = sandbox.core_v1()
    nodes: list[str] = []
    yield nodes.append
    for node in nodes:
        core.delete_collection_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}"
        )


def _no_traceback(op: OperatorProcess) -> None:
    assert op.proc is not None
    assert op.proc.poll() is None, "operator exited"
    assert "Traceback" not in op.log(), op.log()[-4000:]


def test_forged_xid_events_on_nodes_gpuheal_does_not_manage_change_nothing(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    drop_events: Callable[[str], None],
) -> None:
    core = sandbox.core_v1()
    (managed,) = case(1)
    (unmanaged,) = case(1, "outside")
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"  # no such Node
    for name in (managed, unmanaged, ghost):
        drop_events(name)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(79)]))
    op = run_operator()
    forged = 100
    for i in range(forged // 2):
        line = kernel_line(79, pci=f"0000:{i % 256:02x}:00")
        _post(core, unmanaged, line)
        _post(core, ghost, line)
    # Then a real one on the managed node: once it has opened an incident, the Events before
    # it have been read (one watch, in order).
    simulate_xid(core, managed, 79)
    wait_for(lambda: objects.incident(managed), "the managed node's incident")
    wait_for(lambda: _signals(op, "ignored") >= forged, "the forged Events read and ignored")

    assert objects.incident(unmanaged) is None
    assert objects.incident(ghost) is None
    node = objects.node(unmanaged)
    assert not node.spec.unschedulable
    assert CORDONED_BY not in (node.metadata.annotations or {})
    assert _ours(node_events(core, unmanaged)) == []
    assert _ours(node_events(core, ghost)) == []
    _no_traceback(op)
    ignored = _signals(op, "ignored")
    print(
        f"RESULT forged: {forged} forged XID Events on an unmanaged and a missing node; "
        f"ignored={ignored:.0f}, incidents=0, cordons=0, Events of ours=0"
    )


def test_an_event_flood_on_one_node_opens_one_incident_in_bounded_memory(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    drop_events: Callable[[str], None],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    drop_events(node)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(79)]))
    # The chart's Lease (15 s): the flood keeps the machine busy, and with the harness's 3 s
    # the process lost its Lease and exited in the middle of it at load 15.
    op = run_operator("--lease-duration", "15")
    time.sleep(3)  # settle after start-up
    rss_before = _rss_mib(op)
    uid = core.read_node(node).metadata.uid
    lines = [kernel_line(79, pci=f"0000:{i % 256:02x}:00", pid=i) for i in range(FLOOD)]
    api = sandbox.api_client()
    api.configuration.connection_pool_maxsize = 16
    writer = client.CoreV1Api(api)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=12) as pool:
        list(pool.map(lambda line: _post(writer, node, line, uid), lines))
    posted_in = time.monotonic() - started

    def read() -> float:
        m = op.metrics()
        return sum(v for k, v in m.items() if k.startswith("gpuheal_signals_total{") and
                   'source="events"' in k)  # fmt: skip

    wait_for(lambda: read() >= FLOOD, f"the operator to read {FLOOD} Events", 240, every=0.5)
    read_in = time.monotonic() - started
    time.sleep(2)
    rss_after = _rss_mib(op)
    incidents = objects.incidents(node)
    assert len(incidents) == 1, [i["metadata"]["name"] for i in incidents]
    nrem = objects.get("noderemediations", incidents[0]["metadata"]["name"])
    assert nrem is not None
    ours_node = _ours(node_events(core, node))
    ours_nrem = _ours(node_events(core, nrem["metadata"]["name"], "NodeRemediation"))
    writes = nrem["metadata"]["generation"]
    _no_traceback(op)
    signals = {k: v for k, v in op.metrics().items() if "signals_total" in k}
    print(
        f"RESULT flood: {FLOOD} XID Events posted in {posted_in:.1f} s, all read by "
        f"{read_in:.1f} s; incidents=1; spec writes (generation)={writes}; Events of ours: "
        f"node {len(ours_node)}, incident {len(ours_nrem)}; RSS {rss_before:.1f} -> "
        f"{rss_after:.1f} MiB; signals {json.dumps(signals)}"
    )
    # Our own Events do not multiply with the flood (a burst of 25, then one per 10 s).
    assert len(ours_node) <= 50, len(ours_node)
    assert len(ours_nrem) <= 50, len(ours_nrem)
    # One spec write per second at most, not one per signal.
    assert writes <= read_in + 10, writes
    assert rss_after - rss_before < 64, (rss_before, rss_after)
    assert objects.node(node).spec.unschedulable  # and the fault itself was acted on


def test_nodes_with_malformed_labels_and_annotations(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    garbage, person_cordoned, forged_only = case(3)
    cid = case.case_id  # type: ignore[attr-defined]
    rules = [
        cordon_only_rule(79),
        {
            "name": "degraded",
            "signals": {"conditions": [{"type": "GpuDegraded", "status": "True", "for": "0s"}]},
            "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
        },
    ]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", rules))
    op = run_operator()
    prefix = ".".join(["a" * 63] * 3) + ".io"  # a 194-character DNS prefix
    core.patch_node(
        garbage,
        {
            "metadata": {
                "annotations": {"gpuheal.io/gpus": "[" * 60_000, "gpuheal.io/other": "{" * 1000},
                "labels": {f"{prefix}/{'n' * 63}": "v" * 63, f"k{'x' * 62}": ""},
            }
        },
    )
    forged_mark = {"metadata": {"annotations": {CORDONED_BY: "nrem-forged"}}}
    core.patch_node(person_cordoned, {"spec": {"unschedulable": True}, **forged_mark})
    core.patch_node(forged_only, forged_mark)
    # The node watch survived the garbage: a condition set now is still seen (the watch gets
    # the garbage first, and again with the condition: no pause needed in between).
    simulate_condition(
        core, garbage, type_="GpuDegraded", status="True", reason="Test", message="degraded"
    )
    inc = wait_for(lambda: objects.incident(garbage), "incident from a condition on the node")
    wait_for(lambda: objects.node(garbage).spec.unschedulable, "garbage node cordoned")
    assert objects.node(garbage).metadata.annotations[CORDONED_BY] == inc["metadata"]["name"]

    # A cordon a person made, under a forged mark, stays theirs.
    simulate_xid(core, person_cordoned, 79)
    got = wait_for(
        lambda: (i := objects.incident(person_cordoned)) and condition(i, "Cordoned") and i,
        "Cordoned recorded",
    )
    cordoned = condition(got, "Cordoned")
    assert cordoned is not None
    assert cordoned["reason"] == "AlreadyCordonedByOther", cordoned
    assert got["status"]["ownership"]["cordoned"] is False
    assert objects.node(person_cordoned).metadata.annotations[CORDONED_BY] == "nrem-forged"

    # A mark on a node nobody cordoned is just overwritten by gpuheal's own cordon.
    simulate_xid(core, forged_only, 79)
    mine = wait_for(
        lambda: (i := objects.incident(forged_only)) and condition(i, "Cordoned") and i,
        "Cordoned recorded",
    )
    assert mine["status"]["ownership"]["cordoned"] is True
    assert objects.node(forged_only).metadata.annotations[CORDONED_BY] == mine["metadata"]["name"]
    _no_traceback(op)
    print("RESULT malformed: 60 KB nested gpuheal.io/gpus, 317-character label key, forged "
          "cordoned-by on 2 nodes; node watch kept going, incidents=3, a person's cordon kept "
          "as theirs (ownership.cordoned=false), crashes=0")  # fmt: skip


def _nrem(name: str, node: str, pname: str, rule: str, ladder: list[dict[str, Any]],
          **annotations: str) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "NodeRemediation",
        "metadata": {
            "name": name,
            "labels": {"gpuheal.io/node": node},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "policyRef": {"name": pname},
            "rule": rule,
            "signals": [{"source": "Manual", "observedAt": "2026-01-01T00:00:00Z"}],
            "ladder": ladder,
        },
    }


def test_noderemediations_written_by_a_person(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    w1, w2 = case(2)
    (outside,) = case(1, "outside")
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    rule = cordon_only_rule(79)
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [rule]))
    op = run_operator()
    ladder = rule["ladder"]
    job_hook = [{"name": "cordon", "steps": [{"action": "reboot", "reboot": {"hook": {
        "type": "Job", "job": {"namespace": "kube-system", "template": {"template": {
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "x", "image": "example.invalid/x"}]}}}}}}}]}]  # fmt: skip
    refused = {
        f"h-{cid}-outside": _nrem(f"h-{cid}-outside", outside, pname, rule["name"], ladder),
        f"h-{cid}-nopolicy": _nrem(f"h-{cid}-nopolicy", w1, "no-such-policy", "r", ladder),
        f"h-{cid}-norule": _nrem(f"h-{cid}-norule", w1, pname, "made-up", ladder),
        f"h-{cid}-ladder": _nrem(f"h-{cid}-ladder", w1, pname, rule["name"], job_hook),
    }
    for body in refused.values():
        objects.apply("noderemediations", body)
    driven = f"h-{cid}-driven"
    objects.apply("noderemediations", _nrem(driven, w1, pname, rule["name"], ladder))
    wait_for(lambda: objects.node(w1).spec.unschedulable, "the valid one drives: w1 cordoned")
    second = f"h-{cid}-second"
    objects.apply("noderemediations", _nrem(second, w1, pname, rule["name"], ladder))
    refused[second] = {}
    garbage = f"h-{cid}-garbage-rung"
    objects.apply("noderemediations", _nrem(garbage, w2, pname, rule["name"], ladder,
                                            **{"gpuheal.io/initial-rung": "abc"}))  # fmt: skip
    wait_for(lambda: objects.node(w2).spec.unschedulable, "a garbage initial-rung: rung 0")

    for name in refused:
        done = wait_for(
            lambda name=name: (c := condition(objects.get("noderemediations", name),
                                              "Completed")) and c["status"] == "True" and c,
            f"{name} refused",
        )  # fmt: skip
        assert done["reason"] == "Refused", (name, done)
        reasons = {e.reason for e in node_events(core, name, "NodeRemediation")}
        assert "RemediationRefused" in reasons, (name, reasons)
    assert objects.node(w1).metadata.annotations[CORDONED_BY] == driven
    hold(lambda: not objects.node(outside).spec.unschedulable, "outside node untouched", 2)
    batch = client.BatchV1Api(sandbox.api_client())
    assert not [j for j in batch.list_namespaced_job("kube-system").items
                if j.metadata.name.startswith(f"h-{cid}")]  # fmt: skip
    _no_traceback(op)
    print(f"RESULT by-hand: {len(refused)} NodeRemediations refused (node not selected, no "
          "policy, no rule, a ladder not the rule's, a second one on a node), 2 driven; "
          "nodes touched only by the 2, Jobs created 0, crashes=0")  # fmt: skip
