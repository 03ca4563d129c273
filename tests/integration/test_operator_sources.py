"""Detection with two sources on: one XID reported by a Node Event (naming the GPU by PCI
address, as the agent and node-problem-detector do) and by dcgm-exporter (naming it by UUID
and PCI address) is one observation, so a first XID 79 stays on the first rung.

The exporter is a local HTTP server serving dcgm-exporter's text format (the real exporter
needs a GPU); its pods are a real DaemonSet's on kwok GPU nodes (the sandbox's
kube-controller-manager makes them) with hostNetwork, so kwok gives them the node's address
(127.0.0.1) and the operator scrapes them exactly as it would in a cluster. Only that
DaemonSet's pods are scraped, and only the series whose Hostname is the pod's node count.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    cordon_only_rule,
    dump,
    hold,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration

UUID = "GPU-8f6c1d2e-1111-2222-3333-444455556666"


def exporter_text(count: int, hostname: str = "n") -> str:
    labels = f'gpu="0",UUID="{UUID}",pci_bus_id="00000000:3B:00.0",Hostname="{hostname}"'
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


def exporter_daemonset(sandbox: Sandbox, namespace: str, name: str, nodes: list[str]) -> str:
    """A DaemonSet ``name`` whose pods (label app=<name>, hostNetwork) run on ``nodes`` only;
    waits until each is Running with an address. Its uid."""
    apps = client.AppsV1Api(sandbox.api_client())
    labels = {"app": name}
    on_nodes = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    only = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [on_nodes]}]}}  # fmt: skip
    made = apps.create_namespaced_daemon_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "hostNetwork": True,
                        "tolerations": [{"operator": "Exists"}],
                        "affinity": {"nodeAffinity": only},
                        "containers": [{"name": "exporter", "image": "example.invalid/dcgm:1"}],
                    },
                },
            },
        },
    )  # fmt: skip
    core = sandbox.core_v1()

    def running() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={name}").items
        up = {p.spec.node_name for p in pods if p.status.phase == "Running" and p.status.pod_ip}
        return up == set(nodes)

    wait_for(running, f"the DaemonSet {name}'s pods Running on {nodes}", timeout=90)
    return str(made.metadata.uid)


def test_an_xid_from_an_event_and_from_dcgm_exporter_is_one_observation(  # noqa: PLR0917
    sandbox: Sandbox,
    namespace: str,
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
    _Exporter.text = exporter_text(0, node)
    exporter_daemonset(sandbox, namespace, f"dcgm-{cid}", [node])
    try:
        run_operator(
            "--sources", "events,dcgm",
            "--dcgm-selector", f"app=dcgm-{cid}",
            "--dcgm-namespace", namespace,
            "--dcgm-daemonset", f"dcgm-{cid}",
            "--dcgm-port", str(exporter),
            "--dcgm-interval", "0.5",
        )  # fmt: skip
        wait_for(lambda: _Exporter.scrapes >= 2, "the exporter scraped (baseline)")
        simulate_xid(core, node, 79, pci="0000:3b:00")  # the kernel line, by PCI address
        _Exporter.text = exporter_text(1, node)  # dcgm-exporter counts the same XID, by UUID
        scraped = _Exporter.scrapes
        wait_for(lambda: _Exporter.scrapes >= scraped + 3, "dcgm scraped after the XID")
        nrem = wait_for(lambda: objects.incident(node), "incident")
        hold(lambda: len(objects.incidents(node)) == 1, "one incident", 2)
        nrem = objects.get("noderemediations", nrem["metadata"]["name"])
        assert len(nrem["spec"]["signals"]) == 1, dump(nrem["spec"]["signals"])
        assert nrem["status"]["rung"] == 0, dump(nrem["status"])  # a first XID 79: rung 0
        assert nrem["spec"]["signals"][0]["pciBusId"] == "0000:3b:00"
    finally:
        sandbox.kubectl("delete", "events", "-n", "default",
                        f"--field-selector=involvedObject.name={node}", check=False)  # fmt: skip


def test_a_labelled_pod_not_of_the_daemonset_or_another_hostname_injects_nothing(  # noqa: PLR0917
    sandbox: Sandbox,
    namespace: str,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    exporter: int,
) -> None:
    """Whoever may create a pod with the exporter's label must not speak for a node: a bare
    pod labelled like the exporter on node A serving a rising XID counter for A starts
    nothing, nor does the DaemonSet's own pod on node B while what it serves names A; once
    the exporter on B names B, B's XID opens B's incident."""
    core = sandbox.core_v1()
    node_a, node_b = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(79)]))
    name = f"dcgm-{cid}"
    _Exporter.text = exporter_text(0, node_a)
    exporter_daemonset(sandbox, namespace, name, [node_b])
    # The impostor: a ReplicaSet's pod with the exporter's label on node A (a bare pod with
    # it would be adopted by the DaemonSet's controller, which deletes what it does not want).
    impostor = {"app": name, "impostor": cid}
    client.AppsV1Api(sandbox.api_client()).create_namespaced_replica_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": f"impostor-{cid}"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": impostor},
                "template": {
                    "metadata": {"labels": impostor},
                    "spec": {
                        "nodeName": node_a,
                        "hostNetwork": True,
                        "containers": [{"name": "exporter", "image": "example.invalid/dcgm:1"}],
                    },
                },
            },
        },
    )
    wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=f"impostor={cid}").items
            if p.status.phase == "Running" and p.spec.node_name == node_a
        ],
        "the impostor pod Running on A",
    )
    op = run_operator(
        "--sources", "events,dcgm",
        "--dcgm-selector", f"app={name}",
        "--dcgm-namespace", namespace,
        "--dcgm-daemonset", name,
        "--dcgm-port", str(exporter),
        "--dcgm-interval", "0.5",
    )  # fmt: skip
    wait_for(lambda: _Exporter.scrapes >= 2, "the exporter scraped (baseline)")
    _Exporter.text = exporter_text(1, node_a)  # an XID 79 "on A"
    scraped = _Exporter.scrapes
    wait_for(lambda: _Exporter.scrapes >= scraped + 3, "scraped after the XID")
    hold(
        lambda: not objects.incidents(node_a) and not objects.incidents(node_b),
        "no incident on A (the impostor's node) nor on B (its exporter names A)",
        seconds=4,
    )
    metrics = op.metrics()
    assert metrics.get('gpuheal_signals_total{result="untrusted",source="dcgm"}', 0) >= 1
    assert metrics.get('gpuheal_signals_total{result="wrong_node",source="dcgm"}', 0) >= 1
    assert f"is not a pod of the DaemonSet {namespace}/{name}" in op.log()
    _Exporter.text = exporter_text(2, node_b)  # the exporter on B speaks for B
    nrem = wait_for(lambda: objects.incident(node_b), "B's incident from its own exporter")
    assert nrem["spec"]["signals"][0]["source"] == "DcgmExporter", dump(nrem["spec"]["signals"])
    assert objects.incidents(node_a) == []


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
