"""The sandbox's Kubernetes is the real thing: scheduling, cordon, PDB-guarded eviction,
RBAC, CEL validation, ServiceAccount tokens, version stamping."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import wait_for

pytestmark = pytest.mark.integration


def _gpu_pod(name: str, labels: dict[str, str], node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": node_selector,
            "containers": [
                {
                    "name": "train",
                    "image": "example.invalid/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def test_version_is_the_pinned_upstream_release(sandbox: Sandbox) -> None:
    out = sandbox.kubectl("version", "-o", "json")
    version = json.loads(out.stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    assert version["clientVersion"]["gitVersion"] == "v1.36.3"


def test_gpu_nodes_look_like_gpu_operator_nodes(sandbox: Sandbox) -> None:
    core = sandbox.core_v1()
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert {"gpu-node-0", "gpu-node-3", "gpu-spare-0"} <= set(nodes)
    node = nodes["gpu-node-0"]
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]


def test_deployment_pods_are_scheduled_on_gpu_nodes_and_run(
    sandbox: Sandbox, namespace: str
) -> None:
    apps = client.AppsV1Api(sandbox.api_client())
    core = sandbox.core_v1()
    template = _gpu_pod("x", {"app": "train"}, {"nvidia.com/gpu.present": "true"})
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "train"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "train"}},
                "template": {"metadata": template["metadata"], "spec": template["spec"]},
            },
        },
    )

    def running() -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=train").items
        ok = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
        return ok if len(ok) == 3 else []

    pods = wait_for(running, "3 Running pods")
    gpu_nodes = {
        n.metadata.name for n in core.list_node(label_selector="nvidia.com/gpu.present=true").items
    }
    assert {p.spec.node_name for p in pods} <= gpu_nodes
    assert all(p.status.pod_ip for p in pods)


def test_scheduler_honours_cordon(
    sandbox: Sandbox, namespace: str, own_gpu_nodes: Callable[..., list[str]]
) -> None:
    core = sandbox.core_v1()
    cordoned, open_node = own_gpu_nodes(2, **{"gpuheal.io/cordon-test": "yes"})
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    for i in range(4):
        core.create_namespaced_pod(
            namespace, _gpu_pod(f"p{i}", {"app": "c"}, {"gpuheal.io/cordon-test": "yes"})
        )

    def scheduled() -> list[Any]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=c").items
        return pods if all(p.spec.node_name for p in pods) and len(pods) == 4 else []

    pods = wait_for(scheduled, "4 scheduled pods")
    assert {p.spec.node_name for p in pods} == {open_node}


def test_eviction_respects_pod_disruption_budget(
    sandbox: Sandbox, namespace: str, own_gpu_nodes: Callable[..., list[str]]
) -> None:
    core = sandbox.core_v1()
    policy = client.PolicyV1Api(sandbox.api_client())
    (node,) = own_gpu_nodes(1)
    core.create_namespaced_pod(
        namespace, _gpu_pod("victim", {"app": "pdb"}, {"kubernetes.io/hostname": node})
    )
    wait_for(
        lambda: core.read_namespaced_pod("victim", namespace).status.phase == "Running",
        "victim Running",
    )
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pdb"}}},
        },
    )
    # The disruption controller must have computed the PDB's status before it can block.
    wait_for(
        lambda: (
            policy.read_namespaced_pod_disruption_budget("keep", namespace).status.current_healthy
            == 1
        ),
        "PDB status",
    )
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="victim", namespace=namespace))
    with pytest.raises(ApiException) as blocked:
        core.create_namespaced_pod_eviction("victim", namespace, eviction)
    assert blocked.value.status == 429
    assert "disruption budget" in blocked.value.body

    policy.patch_namespaced_pod_disruption_budget("keep", namespace, {"spec": {"minAvailable": 0}})
    wait_for(
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "keep", namespace
            ).status.disruptions_allowed
            == 1
        ),
        "PDB allows a disruption",
    )
    core.create_namespaced_pod_eviction("victim", namespace, eviction)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("victim", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, "evicted pod deleted (kwok completes the graceful deletion)")


def test_rbac_denies_until_granted(sandbox: Sandbox, namespace: str) -> None:
    kubeconfig = sandbox.control_plane.kubeconfig_for_user("alice", ("developers",))
    alice = client.CoreV1Api(sandbox.api_client(kubeconfig))
    with pytest.raises(ApiException) as denied:
        alice.list_namespaced_pod(namespace)
    assert denied.value.status == 403
    assert 'User "alice" cannot list resource "pods"' in json.loads(denied.value.body)["message"]

    sandbox.kubectl(
        "create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", namespace
    )
    sandbox.kubectl(
        "create", "rolebinding", "alice-reads", "--role=pod-reader", "--user=alice", "-n", namespace
    )
    wait_for(lambda: alice.list_namespaced_pod(namespace).items == [], "alice may list pods")
    with pytest.raises(ApiException) as still_denied:
        alice.list_node()
    assert still_denied.value.status == 403


def test_service_account_token_is_minted_and_rbac_applies(sandbox: Sandbox, namespace: str) -> None:
    sandbox.kubectl("create", "serviceaccount", "op", "-n", namespace)
    kubeconfig = sandbox.control_plane.kubeconfig_for_service_account(namespace, "op")
    sa = client.CoreV1Api(sandbox.api_client(kubeconfig))
    with pytest.raises(ApiException) as denied:
        sa.list_node()
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:op" in json.loads(denied.value.body)["message"]

    sandbox.kubectl(
        "create", "clusterrole", f"{namespace}-nodes", "--verb=list", "--resource=nodes"
    )
    sandbox.kubectl(
        "create",
        "clusterrolebinding",
        f"{namespace}-nodes",
        f"--clusterrole={namespace}-nodes",
        f"--serviceaccount={namespace}:op",
    )
    try:
        names = wait_for(
            lambda: [n.metadata.name for n in sa.list_node().items], "SA may list nodes"
        )
        assert "gpu-node-0" in names
    finally:
        sandbox.kubectl("delete", "clusterrolebinding", f"{namespace}-nodes", check=False)
        sandbox.kubectl("delete", "clusterrole", f"{namespace}-nodes", check=False)


CEL_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.sandbox.test}
spec:
  group: sandbox.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "has(self.maxUnhealthy) != has(self.minHealthy)"
              message: "exactly one of maxUnhealthy or minHealthy must be set"
            properties:
              maxUnhealthy: {type: integer}
              minHealthy: {type: integer}
"""


def test_crd_cel_rule_rejects_bad_object(sandbox: Sandbox, namespace: str) -> None:
    sandbox.kubectl("apply", "-f", "-", input=CEL_CRD)
    wait_for(
        lambda: (
            sandbox.kubectl(
                "wait", "--for=condition=Established", "crd/widgets.sandbox.test", check=False
            ).returncode
            == 0
        ),
        "CRD established",
    )
    head = "apiVersion: sandbox.test/v1\nkind: Widget\n"
    good = head + "metadata: {name: good}\nspec: {maxUnhealthy: 1}\n"
    bad = head + "metadata: {name: bad}\nspec: {maxUnhealthy: 1, minHealthy: 2}\n"
    wait_for(
        lambda: (
            sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=good, check=False).returncode
            == 0
        ),
        "good Widget accepted",
    )
    rejected = sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=bad, check=False)
    assert rejected.returncode != 0
    assert "exactly one of maxUnhealthy or minHealthy must be set" in rejected.stderr
