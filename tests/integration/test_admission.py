"""Least privilege at admission (docs/security.md, issue 23), on the real sandbox with the
chart installed (its ValidatingAdmissionPolicies in force), each request made with the token
of the identity it tests:

- node Jobs: in the node-jobs namespace only the operator's ServiceAccount may create a Job,
  and only one of the chart's (its images, commands, ServiceAccounts, volumes): one that
  mounts a Secret or a projected token, runs another image or command, keeps its token or
  mounts a hostPath is refused;
- the agent: its token, bound to its pod on node A, may patch the status of node A only,
  and there only its condition and its GPU annotations;
- the gpu-reset Job: its token, bound to its pod on node A, may patch node A only, and there
  only the GPU operands' labels and the annotation that keeps them (files/gpu_operands.py,
  run here as the Job's sidecar runs it);
- the operator: its token may change on a Node only unschedulable and gpuheal's labels,
  annotations and taints.

Requests that should be admitted are sent too, so that a refusal means the policy and not a
broken request. Job creates are server-side dry runs (admission runs, nothing is stored).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpuheal.remediation.steps import _job_spec
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import wait_for
from tests.integration.test_agent_sandbox import (  # noqa: F401 - fixtures
    CHART,
    agent_namespace,
    node_agent_kubeconfig,
    release,
)

# One worker for the module: its chart install (module-scoped, ~6 s) is then made once, not
# once on each worker that runs one of its items.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("admission")]


def _api(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(str(kubeconfig))


def _refusal(call: Callable[[], Any]) -> str | None:
    """The API server's 403 message for ``call``, or None when it was admitted."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 403:
            raise
        return str(json.loads(exc.body)["message"])
    return None


# --- node Jobs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_jobs(sandbox: Sandbox, release: tuple[str, str]) -> tuple[str, dict[str, Any]]:  # noqa: F811
    """(the node-jobs namespace, the chart's JobSpecs by ConfigMap key), read from the cluster."""
    name, _ = release
    ns = f"{name}-node-jobs"
    cm = sandbox.core_v1().read_namespaced_config_map("gpuheal-node-jobs", ns)
    keys = ("gpu-reset", "node-reboot", "gpu-check")
    return ns, {k: yaml.safe_load(cm.data[k]) for k in keys}


def _job(template: dict[str, Any], name: str, node: str = "gpu-node-0") -> dict[str, Any]:
    """The Job the operator makes of a template (its own function: pinned, env added)."""
    spec = _job_spec(template, node=node, action="check", incident=name, pin=True)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def test_only_the_charts_node_jobs_from_the_operator_are_admitted(
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
    node_jobs: tuple[str, dict[str, Any]],
) -> None:
    name, namespace = release
    ns, templates = node_jobs
    operator = client.BatchV1Api(
        _api(sandbox.control_plane.kubeconfig_for_service_account(namespace, f"{name}-gpuheal"))
    )

    def create(api: client.BatchV1Api, body: dict[str, Any]) -> Any:
        return api.create_namespaced_job(ns, body, dry_run="All")

    check = templates["gpu-check"]

    def changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        job = _job(copy.deepcopy(check), "x-check")
        change(job["spec"]["template"]["spec"])
        return job

    # Another image: refused, naming it (waited for: the policy takes a moment to be in force).
    other_image = changed(lambda pod: pod["containers"][0].update(image="busybox:1.36"))
    refused = wait_for(
        lambda: _refusal(lambda: create(operator, other_image)),
        "the node-jobs admission policy in force",
        timeout=30,
    )
    assert "runs an image not allowed for node Jobs: busybox:1.36" in refused, refused

    # The chart's three Jobs, from the operator: admitted.
    for key, template in templates.items():
        assert _refusal(lambda t=template, k=key: create(operator, _job(t, f"x-{k}"))) is None, key

    secret = {"name": "loot", "secret": {"secretName": f"{name}-gpuheal-bridge-token"}}
    token = {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
    refusals = {
        "a Secret volume": (
            changed(lambda pod: pod.setdefault("volumes", []).append(secret)),
            "mounts volume(s) not allowed for node Jobs: loot",
        ),
        "a projected token": (
            changed(lambda pod: pod.setdefault("volumes", []).append(token)),
            "mounts volume(s) not allowed for node Jobs: tok",
        ),
        "the host's root": (
            changed(
                lambda pod: pod.setdefault("volumes", []).append(
                    {"name": "root", "hostPath": {"path": "/"}}
                )
            ),
            "mounts volume(s) not allowed for node Jobs: root",
        ),
        "another command": (
            changed(lambda pod: pod["containers"][0].update(args=["cat /etc/shadow"])),
            "the command of container(s) check is not one of the chart's node Jobs",
        ),
        "its token": (
            changed(lambda pod: pod.update(automountServiceAccountToken=True)),
            "runs as ServiceAccount default with its token",
        ),
        "the reset's ServiceAccount": (
            changed(lambda pod: pod.update(serviceAccountName=f"{name}-gpuheal-gpu-reset")),
            f"runs as ServiceAccount {name}-gpuheal-gpu-reset",
        ),
        "a Secret in its environment": (
            changed(
                lambda pod: pod["containers"][0]["env"].append(
                    {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                )
            ),
            "takes a Secret or envFrom into a container's environment",
        ),
    }
    for what, (body, message) in refusals.items():
        said = _refusal(lambda body=body: create(operator, body))
        assert said is not None, f"{what}: admitted"
        assert message in said, (what, said)

    # The chart's own Job from anyone else (here the cluster admin): refused.
    admin = client.BatchV1Api(sandbox.api_client())
    said = _refusal(lambda: create(admin, _job(check, "x-admin")))
    assert said is not None
    assert f"only gpuheal's operator (system:serviceaccount:{namespace}:{name}-gpuheal)" in said

    # The namespace holds no Secret, and no ServiceAccount but default and the reset's.
    core = sandbox.core_v1()
    assert core.list_namespaced_secret(ns).items == []
    accounts = {a.metadata.name for a in core.list_namespaced_service_account(ns).items}
    assert accounts <= {"default", f"{name}-gpuheal-gpu-reset"}, accounts


# --- the agent ------------------------------------------------------------------------------


def _gpu_xid(status: str) -> dict[str, Any]:
    return {"status": {"conditions": [{
        "type": "GpuXid", "status": status, "reason": "XidTest", "message": "test",
    }]}}  # fmt: skip


def test_the_agent_writes_its_own_nodes_condition_and_gpu_annotations_only(
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
    own_gpu_nodes: Callable[..., list[str]],
) -> None:
    name, _ = release
    own, other = own_gpu_nodes(2)
    agent = client.CoreV1Api(_api(node_agent_kubeconfig(sandbox, release, own)))

    def patch(node: str, body: dict[str, Any]) -> Any:
        return agent.patch_node_status(node, body)

    # Another node's status, the agent's own condition: refused, naming both nodes.
    said = wait_for(
        lambda: _refusal(lambda: patch(other, _gpu_xid("True"))),
        "the agent's node admission policy in force",
        timeout=30,
    )
    assert "the node agent may patch the status of its own node only" in said, said
    assert f"token bound to a pod on node {own}), node {other}" in said, said
    # A probe sent before the policy was in force went through: clear what it wrote, then
    # the refusals below must leave the other node untouched.
    sandbox.core_v1().patch_node_status(
        other, {"status": {"conditions": [{"type": "GpuXid", "$patch": "delete"}]}}
    )
    assert _refusal(lambda: patch(other, _gpu_xid("True"))) is not None

    # Its own node: its condition and its GPU map, admitted (what the agent writes).
    gpus = {"metadata": {"annotations": {"gpuheal.io/gpus": "0000:18:00=GPU-0"}}}
    assert _refusal(lambda: patch(own, _gpu_xid("False"))) is None
    assert _refusal(lambda: patch(own, gpus)) is None

    # Its own node, anything else: refused.
    ready = {"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "Forged", "message": "forged",
    }]}}  # fmt: skip
    said = _refusal(lambda: patch(own, ready))
    assert said is not None
    assert "may change only its own condition (GpuXid)" in said, said
    assert "this request changes Ready" in said, said
    opt_out = {"metadata": {"annotations": {"gpuheal.io/cordoned-by": "forged"}}}
    said = _refusal(lambda: patch(own, opt_out))
    assert said is not None
    assert "this request changes gpuheal.io/cordoned-by" in said, said
    label = {"metadata": {"labels": {"gpuheal.io/opt-out": "true"}}}
    said = _refusal(lambda: patch(own, label))
    assert said is not None
    assert "may not change the labels" in said, said
    capacity = {"status": {"capacity": {"nvidia.com/gpu": "0"}}}
    assert _refusal(lambda: patch(own, capacity)) is not None

    # Its ServiceAccount with a token bound to no pod: no node, refused everywhere.
    unbound = client.CoreV1Api(
        _api(
            sandbox.control_plane.kubeconfig_for_service_account(
                agent_namespace(release), f"{name}-gpuheal-agent"
            )
        )
    )
    said = _refusal(lambda: unbound.patch_node_status(own, _gpu_xid("True")))
    assert said is not None
    assert "(no node in its credentials)" in said, said
    conds = sandbox.core_v1().read_node_status(other).status.conditions or []
    assert not [c for c in conds if c.type == "GpuXid"]


# --- the gpu-reset Job ----------------------------------------------------------------------


def _operands(
    sandbox: Sandbox, token: Path, node: str, command: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """The reset's `operands` sidecar (files/gpu_operands.py `stop`/`restore`) for ``node``,
    with only ``token`` (no operand pods to wait for)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "GPU"))}
    env.update(
        NODE_NAME=node,
        GPUHEAL_INCIDENT="nrem-reset",
        GPU_OPERANDS="device-plugin,dcgm",
        GPU_OPERAND_PODS="",
        GPUHEAL_KUBE_API=sandbox.control_plane.server,
        GPUHEAL_KUBE_TOKEN_FILE=str(token),
        GPUHEAL_STATE_DIR=str(tmp_path),
        SSL_CERT_FILE=str(sandbox.control_plane.pki.ca.cert),  # the sandbox's CA
    )
    script = CHART / "files" / "gpu_operands.py"
    return subprocess.run(
        [sys.executable, str(script), command],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_gpu_reset_job_labels_its_own_node_only(
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
    own_gpu_nodes: Callable[..., list[str]],
    tmp_path: Path,
) -> None:
    name, _ = release
    ns, account = f"{name}-node-jobs", f"{name}-gpuheal-gpu-reset"
    own, other = own_gpu_nodes(2)
    # A pod of the reset's ServiceAccount on node A (kwok runs it): its token, as the kubelet
    # mounts it, carries node A.
    pod = f"reset-{own}"[:63]
    sandbox.core_v1().create_namespaced_pod(ns, {
        "metadata": {"name": pod},
        "spec": {
            "nodeName": own, "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "containers": [{"name": "operands", "image": "busybox:1.36"}],
        },
    })  # fmt: skip
    token = tmp_path / "token"
    token.write_text(
        sandbox.kubectl(
            "create",
            "token",
            account,
            "-n",
            ns,
            "--duration=3600s",
            "--bound-object-kind=Pod",
            f"--bound-object-name={pod}",
        ).stdout.strip()
    )
    reset = client.CoreV1Api(
        _api(sandbox.control_plane.kubeconfig_for_service_account(ns, account, bound_pod=pod))
    )

    def patch(node: str, body: dict[str, Any]) -> Any:
        return reset.patch_node(node, body)

    # Another node: refused, naming both (waited for: the policy takes a moment).
    said = wait_for(
        lambda: _refusal(
            lambda: patch(other, {"metadata": {"labels": {"gpuheal.io/gpu-reset": "x"}}})
        ),
        "the gpu-reset node admission policy in force",
        timeout=30,
    )
    assert "the gpu-reset Job may patch its own node only" in said, said
    assert f"token bound to a pod on node {own}), node {other}" in said, said
    sandbox.core_v1().patch_node(other, {"metadata": {"labels": {"gpuheal.io/gpu-reset": None}}})
    # The sidecar itself, told it runs on the other node: its patch refused, the node as it was.
    out = _operands(sandbox, token, other, "stop", tmp_path)
    assert out.returncode != 0, out
    assert "403" in out.stderr, out.stderr
    labels = sandbox.core_v1().read_node(other).metadata.labels or {}
    assert not [
        k for k in labels if k.startswith(("nvidia.com/gpu.deploy.", "gpuheal.io/gpu-reset"))
    ]

    # On its own node: the operands taken off and put back, as a reset does.
    out = _operands(sandbox, token, own, "stop", tmp_path)
    assert out.returncode == 0, out
    meta = sandbox.core_v1().read_node(own).metadata
    assert meta.labels["nvidia.com/gpu.deploy.dcgm"] == "false"
    assert meta.labels["gpuheal.io/gpu-reset"] == "nrem-reset"
    assert "gpuheal.io/gpu-reset-labels-before" in meta.annotations
    out = _operands(sandbox, token, own, "restore", tmp_path)
    assert out.returncode == 0, out
    meta = sandbox.core_v1().read_node(own).metadata
    assert "gpuheal.io/gpu-reset" not in (meta.labels or {})
    assert "gpuheal.io/gpu-reset-labels-before" not in (meta.annotations or {})

    # Its own node, anything else: refused.
    refused = {
        "another label": (
            {"metadata": {"labels": {"gpuheal.io/opt-out": "true"}}},
            "this request changes gpuheal.io/opt-out",
        ),
        "another annotation": (
            {"metadata": {"annotations": {"gpuheal.io/cordoned-by": "forged"}}},
            "this request changes gpuheal.io/cordoned-by",
        ),
        "a cordon": ({"spec": {"unschedulable": True}}, "may not change the spec"),
    }
    for what, (body, message) in refused.items():
        said = _refusal(lambda body=body: patch(own, body))
        assert said is not None, f"{what}: admitted"
        assert message in said, (what, said)
    # (Its status: RBAC grants no nodes/status, the policy would refuse it too.)
    assert _refusal(lambda: reset.patch_node_status(own, _gpu_xid("True"))) is not None

    # Its ServiceAccount with a token bound to no pod: refused.
    unbound = client.CoreV1Api(
        _api(sandbox.control_plane.kubeconfig_for_service_account(ns, account))
    )
    said = _refusal(
        lambda: unbound.patch_node(own, {"metadata": {"labels": {"gpuheal.io/gpu-reset": "x"}}})
    )
    assert said is not None
    assert "(no node in its credentials)" in said, said
    assert not (sandbox.core_v1().read_node(own).spec.unschedulable)


# --- the operator ---------------------------------------------------------------------------


def test_the_operators_node_writes_are_gpuheals_own(
    sandbox: Sandbox,
    release: tuple[str, str],  # noqa: F811
    own_gpu_nodes: Callable[..., list[str]],
) -> None:
    name, namespace = release
    (node,) = own_gpu_nodes(1)
    operator = client.CoreV1Api(
        _api(sandbox.control_plane.kubeconfig_for_service_account(namespace, f"{name}-gpuheal"))
    )

    def patch(body: dict[str, Any]) -> Any:
        return operator.patch_node(node, body)

    def foreign_label() -> str | None:
        said = _refusal(lambda: patch({"metadata": {"labels": {"team": "x"}}}))
        if said is None:
            # Admitted before the policy was in force: undone, else every later probe would
            # change nothing and pass the policy (it refuses changes, not a label present).
            sandbox.core_v1().patch_node(node, {"metadata": {"labels": {"team": None}}})
        return said

    # Someone else's label: refused, naming it.
    said = wait_for(foreign_label, "the operator's node admission policy in force", timeout=30)
    assert "may change only gpuheal.io/ labels" in said, said
    assert f"this request changes team on node {node}" in said, said

    # What the operator writes (a cordon and its mark, a claim, a gpuheal taint): admitted.
    # The patch below sets the whole taint list: wait until the node controller's own
    # (node.kubernetes.io/not-ready of a fresh node) are gone, else it would remove one.
    wait_for(lambda: not sandbox.core_v1().read_node(node).spec.taints, "no taint on the node")
    cordon = {
        "metadata": {
            "annotations": {"gpuheal.io/cordoned-by": "nrem-x"},
            "labels": {"gpuheal.io/claimed-by": "nrem-x"},
        },
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "gpuheal.io/spare", "effect": "NoSchedule"}],
        },
    }
    assert _refusal(lambda: patch(cordon)) is None

    refused = {
        "another annotation": {"metadata": {"annotations": {"example.com/owner": "x"}}},
        "another taint": {
            "spec": {
                "taints": [
                    {"key": "gpuheal.io/spare", "effect": "NoSchedule"},
                    {"key": "example.com/t", "effect": "NoSchedule"},
                ]
            }
        },
    }
    for what, body in refused.items():
        assert _refusal(lambda body=body: patch(body)) is not None, f"{what}: admitted"
    after = sandbox.core_v1().read_node(node)
    assert "team" not in (after.metadata.labels or {})
    assert after.spec.unschedulable is True
