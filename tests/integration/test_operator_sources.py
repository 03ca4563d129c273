"""Detection with two sources on: one XID reported by a Node Event (naming the GPU by PCI
address, as the agent and node-problem-detector do) and by dcgm-exporter (naming it by UUID
and PCI address) is one observation, so a first XID 79 stays on the first rung.

The exporter is a local HTTP server serving dcgm-exporter's text format (the real exporter
needs a GPU); its pod is a real Pod on a kwok GPU node with hostNetwork, so kwok gives it the
node's address (127.0.0.1) and the operator scrapes it exactly as it would in a cluster.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    dump,
    hold,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration

UUID = "GPU-8f6c1d2e-1111-2222-3333-444455556666"


def exporter_text(count: int) -> str:
    labels = f'gpu="0",UUID="{UUID}",pci_bus_id="00000000:3B:00.0",Hostname="n"'
    return (
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
        f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {79 if count else 0}\n"
        f'DCGM_EXP_XID_ERRORS_COUNT{{{labels},xid="79"}} {count}\n'
    )


class _Exporter(BaseHTTPRequestHandler):
    text: ClassVar[str] = exporter_text(0)
    scrapes: ClassVar[int] = 0

    def do_GET(self) -> None:
        type(self).scrapes += 1
        body = type(self).text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    _Exporter.text, _Exporter.scrapes = exporter_text(0), 0
    server = HTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


def test_an_xid_from_an_event_and_from_dcgm_exporter_is_one_observation(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    exporter: int,
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "escalation": {"occurrences": 2, "window": "24h", "scope": "Node"},
        "ladder": [
            {"name": "cordon", "steps": [{"action": "cordon"}]},
            {"name": "replace-rung", "steps": [{"action": "cordon"}, {"action": "drain"}]},
        ],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    selector = f"app=dcgm-{cid}"
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"dcgm-{cid}", "labels": {"app": f"dcgm-{cid}"}},
            "spec": {
                "nodeName": node,
                "hostNetwork": True,
                "containers": [{"name": "exporter", "image": "example.invalid/dcgm:1"}],
            },
        },
    )
    try:
        pod = wait_for(
            lambda: (
                (p := core.read_namespaced_pod(f"dcgm-{cid}", "default")).status.pod_ip
                and p.status.phase == "Running"
                and p
            ),
            "exporter pod Running with an IP",
        )
        assert pod.status.pod_ip == "127.0.0.1"  # kwok: hostNetwork pods get the node's IP
        run_operator(
            "--sources", "events,dcgm",
            "--dcgm-selector", selector,
            "--dcgm-namespace", "default",
            "--dcgm-port", str(exporter),
            "--dcgm-interval", "0.5",
        )  # fmt: skip
        wait_for(lambda: _Exporter.scrapes >= 2, "the exporter scraped (baseline)")
        simulate_xid(core, node, 79, pci="0000:3b:00")  # the kernel line, by PCI address
        _Exporter.text = exporter_text(1)  # dcgm-exporter counts the same XID, by UUID
        scraped = _Exporter.scrapes
        wait_for(lambda: _Exporter.scrapes >= scraped + 3, "dcgm scraped after the XID")
        nrem = wait_for(lambda: objects.incident(node), "incident")
        hold(lambda: len(objects.incidents(node)) == 1, "one incident", 2)
        nrem = objects.get("noderemediations", nrem["metadata"]["name"])
        assert len(nrem["spec"]["signals"]) == 1, dump(nrem["spec"]["signals"])
        assert nrem["status"]["rung"] == 0, dump(nrem["status"])  # a first XID 79: rung 0
        assert nrem["spec"]["signals"][0]["pciBusId"] == "0000:3b:00"
    finally:
        core.delete_namespaced_pod(f"dcgm-{cid}", "default", grace_period_seconds=0)


def test_a_kubelet_memory_pressure_rule_fires_added_before_or_after_the_condition(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """A rule on MemoryPressure (a condition the node views drop unless a policy names it):
    the policy arrives after the operator listed the nodes and after the condition was set
    (the views are rebuilt), and a second node's condition arrives after the policy, turned
    in the same second as the first's (a rack short of memory: two signals, not one)."""
    core = sandbox.core_v1()
    early, late = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    for node in (early, late):  # kwok must not rewrite the conditions the test sets
        core.patch_node(node, {"metadata": {"annotations": {"gpuheal.io/sandbox-frozen": "1"}}})
    since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def pressure(node: str) -> None:
        # What the kubelet's eviction manager posts: a strategic-merge patch of nodes/status.
        core.patch_node_status(
            node,
            {"status": {"conditions": [{
                "type": "MemoryPressure", "status": "True",
                "reason": "KubeletHasInsufficientMemory",
                "message": "kubelet has insufficient memory available",
                "lastHeartbeatTime": since, "lastTransitionTime": since,
            }]}},
        )  # fmt: skip

    run_operator()
    pressure(early)
    rule = {
        "name": "memory",
        "signals": {"conditions": [{"type": "MemoryPressure", "status": "True"}]},
        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    nrem = wait_for(lambda: objects.incident(early), "incident on the node already under pressure")
    assert nrem["spec"]["signals"][0]["conditionType"] == "MemoryPressure", dump(nrem["spec"])
    wait_for(lambda: objects.node(early).spec.unschedulable, "cordoned")
    assert objects.incident(late) is None
    pressure(late)
    nrem = wait_for(lambda: objects.incident(late), "incident on the node put under pressure")
    assert nrem["spec"]["signals"][0]["conditionType"] == "MemoryPressure", dump(nrem["spec"])
    wait_for(lambda: objects.node(late).spec.unschedulable, "second node cordoned")
