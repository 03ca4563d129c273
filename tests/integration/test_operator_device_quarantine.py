"""One GPU of eight out through DRA, the node in service (issue 21 item 1).

On the sandbox (Kubernetes 1.36 with DRADeviceTaintRules and resource.k8s.io/v1beta2 on; the
devtools fake DRA driver publishes the node's eight GPUs as NVIDIA's driver does): the real
scheduler allocates two pods' ResourceClaims on one node, an XID 94 names one of the GPUs,
the operator writes one DeviceTaintRule for that device (NoExecute), the real
kube-controller-manager evicts the pod that holds it, the pod on another GPU keeps running
and the node stays schedulable; a verified reset (a real webhook receiver, then the agent's
GPU report) lifts the rule. No mocks.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuheal.cli.simulate import simulate_xid
from gpuheal.xid.identity import GPU_REPORT_ANNOTATION, format_gpu_report
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.dra import gpu_claim, publish_gpu_slices, withdraw_gpu_slices
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.fixtures.slurm import on_every_release
from tests.integration.operator_harness import (
    SANDBOX_GPUS,
    Objects,
    OperatorProcess,
    Xid79Scene,
    agent_reports_gpus,
    completed,
    condition,
    dump,
    hold,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration

RESOURCE = ("resource.k8s.io", "v1beta2", "devicetaintrules")
BAD_PCI, GOOD_PCI = "0000:1b:00", "0000:1d:00"  # gpu-3 and gpu-5 of the sandbox's eight


class _Hook(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        type(self).calls.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def reset_webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Hook.calls = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/reset", _Hook.calls
    server.shutdown()


def _pod_with_claim(node: str, name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "train",
                    "image": "example.invalid/train:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _phase(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        return str(core.read_namespaced_pod(name, namespace).status.phase)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _rules(custom: client.CustomObjectsApi, incident: str) -> list[dict[str, Any]]:
    items = custom.list_cluster_custom_object(*RESOURCE)["items"]
    return [
        r for r in items if r["metadata"].get("labels", {}).get("gpuheal.io/incident") == incident
    ]


def test_xid94_quarantines_one_gpu_evicts_its_pod_and_a_verified_reset_lifts_it(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    run_operator: Callable[..., OperatorProcess],
    reset_webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    core = sandbox.core_v1()
    api = sandbox.api_client()
    custom = client.CustomObjectsApi(api)
    url, calls = reset_webhook
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    publish_gpu_slices(api, [node], SANDBOX_GPUS)
    agent_reports_gpus(core, node, ago=3600)  # the agent's map: what verifies the reset
    try:
        for role, pci in (("bad", BAD_PCI), ("good", GOOD_PCI)):
            custom.create_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaims",
                gpu_claim(f"gpu-{role}", SANDBOX_GPUS[pci]),
            )  # fmt: skip
            core.create_namespaced_pod(namespace, _pod_with_claim(node, role, f"gpu-{role}"))
        wait_for(
            lambda: [_phase(core, namespace, p) for p in ("bad", "good")] == ["Running"] * 2,
            "both pods Running with their claims allocated (scheduler, kwok)",
        )
        rule = {
            "name": "ecc",
            "signals": {"xids": [94]},
            "ladder": [
                {
                    "name": "gpu",
                    "steps": [
                        {"action": "quarantineDevice"},
                        {
                            "action": "reset",
                            "reset": {
                                "whenIdle": False,
                                "settle": "1s",
                                "hook": {"type": "Webhook", "webhook": {"url": url}},
                            },
                        },
                    ],
                }
            ],
        }
        objects.apply(
            "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="2s")
        )
        run_operator()
        simulate_xid(core, node, 94, pci=BAD_PCI)

        nrem = wait_for(lambda: objects.incident(node), "incident")
        name = nrem["metadata"]["name"]
        (taint,) = wait_for(lambda: _rules(custom, name), "one DeviceTaintRule")
        assert taint["spec"]["deviceSelector"] == {
            "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-3"
        }, dump(taint)  # fmt: skip
        assert taint["spec"]["taint"]["effect"] == "NoExecute"
        assert taint["spec"]["taint"]["value"] == "94"
        # kube-controller-manager evicts the pod whose claim holds gpu-3; gpu-5's stays.
        wait_for(lambda: _phase(core, namespace, "bad") is None, "the bad GPU's pod evicted")
        hold(lambda: _phase(core, namespace, "good") == "Running", "the other pod runs on", 2)
        assert not objects.node(node).spec.unschedulable, "the node stays in service"
        quarantined = wait_for(
            lambda: condition(o := objects.get("noderemediations", name), "DeviceQuarantined")
            and o,
            "DeviceQuarantined recorded",
        )  # fmt: skip
        assert condition(quarantined, "DeviceQuarantined")["status"] == "True"
        held = quarantined["status"]["quarantinedDevice"]
        assert (held["device"], held["pciBusId"]) == ("gpu-3", BAD_PCI), dump(held)
        assert held["rule"] == taint["metadata"]["name"]

        # The reset hook runs; the rule stays until the agent reports the GPUs after it.
        wait_for(lambda: calls, "the reset hook called")
        assert calls[0]["gpu"] == BAD_PCI, calls  # the hook may reset that GPU alone
        hold(lambda: _rules(custom, name), "no verified reset yet: the rule stays", 2)
        seen = format_gpu_report(dt.datetime.now(dt.UTC), SANDBOX_GPUS)
        core.patch_node(node, {"metadata": {"annotations": {GPU_REPORT_ANNOTATION: seen}}})
        done = wait_for(lambda: completed(o := objects.get("noderemediations", name)) and o,
                        "reset verified, returned", timeout=60)  # fmt: skip
        assert completed(done) == "Returned", dump(done["status"])
        assert condition(done, "Reset")["reason"] == "GpusReported"
        assert _rules(custom, name) == [], "the verified reset lifted the rule"
        assert done["status"]["quarantinedDevice"]["releasedAt"], dump(done["status"])
        assert _phase(core, namespace, "good") == "Running"
        history = json.dumps(objects.get("faulthistories", node) or {})
        assert "gpu-3" in history, history[:2000]
    finally:
        withdraw_gpu_slices(api, [node])


def test_without_a_dra_slice_the_step_is_skipped_and_the_rung_fences_the_node(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """A node whose GPUs are no DRA devices (no ResourceSlice): nothing is tainted, the step
    says why (DeviceQuarantined=False, NoDevice), and the rung's next step cordons the node
    as the policy says."""
    core = sandbox.core_v1()
    custom = client.CustomObjectsApi(sandbox.api_client())
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = {
        "name": "ecc",
        "signals": {"xids": [94]},
        "ladder": [
            {"name": "gpu", "steps": [{"action": "quarantineDevice"}, {"action": "cordon"}]}
        ],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    run_operator()
    simulate_xid(core, node, 94, pci=BAD_PCI)
    nrem = wait_for(
        lambda: condition(o := objects.incident(node), "Cordoned") and o, "the fallback cordon"
    )
    skipped = condition(nrem, "DeviceQuarantined")
    assert (skipped["status"], skipped["reason"]) == ("False", "NoDevice"), dump(nrem["status"])
    assert f"no ResourceSlice of driver gpu.nvidia.com for node {node}" in skipped["message"]
    assert "quarantinedDevice" not in nrem["status"]
    assert _rules(custom, nrem["metadata"]["name"]) == []
    assert objects.node(node).spec.unschedulable


def test_no_verified_reset_no_release_the_rule_stays_and_the_incident_says_so(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """A Noop reset repairs nothing: at the end the GPU's DeviceTaintRule stays, Returned=False
    DeviceStillQuarantined, the incident ends Remediated saying the GPU is still out."""
    core = sandbox.core_v1()
    api = sandbox.api_client()
    custom = client.CustomObjectsApi(api)
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    publish_gpu_slices(api, [node], SANDBOX_GPUS)
    name = ""
    try:
        rule = {
            "name": "ecc",
            "signals": {"xids": [94]},
            "ladder": [
                {
                    "name": "gpu",
                    "steps": [
                        {
                            "action": "quarantineDevice",
                            "quarantineDevice": {"effect": "NoSchedule"},
                        },
                        {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
                    ],
                }
            ],
        }
        objects.apply(
            "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="1s")
        )
        run_operator()
        simulate_xid(core, node, 94, pci=BAD_PCI)
        done = wait_for(lambda: completed(o := objects.incident(node)) and o, "incident ended")
        name = done["metadata"]["name"]
        assert completed(done) == "Remediated", dump(done["status"])
        returned = condition(done, "Returned")
        assert (returned["status"], returned["reason"]) == ("False", "DeviceStillQuarantined")
        assert condition(done, "Reset")["reason"] == "NoopHook"
        (kept,) = _rules(custom, name)
        assert kept["spec"]["taint"]["effect"] == "NoSchedule"
        assert kept["spec"]["deviceSelector"]["device"] == "gpu-3"
        held = done["status"]["quarantinedDevice"]
        assert "releasedAt" not in held, dump(held)
        assert "no reset of GPU 0000:1b:00 was asked for" in held["message"], dump(held)
        assert not objects.node(node).spec.unschedulable
    finally:
        for r in _rules(custom, name) if name else []:  # the rule gpuheal leaves for a person
            custom.delete_cluster_custom_object(*RESOURCE, r["metadata"]["name"])
        withdraw_gpu_slices(api, [node])


def _show(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("scontrol", "show", "job", "-d", job).stdout


def _gres(cluster: SlurmCluster, job: str) -> str | None:
    """The job's GRES indexes as Slurm prints them (``IDX:0-3``), None while it holds none."""
    m = re.search(r"GRES=gpu:\d+\(IDX:([^)]*)\)", _show(cluster, job))
    return m.group(1) if m else None


@on_every_release
def test_xid94_on_one_gpu_requeues_only_the_slurm_job_holding_its_index(
    xid79_scene: Callable[..., Xid79Scene], sandbox: Sandbox
) -> None:
    """Slurm (real, 26.05 and 22.05; gres.conf with one File= per GPU; the bridge's CLI
    backend) runs two jobs of four GPUs on the node: IDX 0-3 and 4-7. XID 94 on gpu-3: the
    DRA device is tainted, the job holding GRES index 3 is requeued (off the node), the
    other keeps running where it is, and the Slurm node is neither drained nor changed,
    which is what the README documents: Slurm cannot take one index out, and hands index 3
    to the next job that asks for it."""
    rule = {
        "name": "ecc",
        "signals": {"xids": [94]},
        "ladder": [{"name": "gpu", "steps": [{"action": "quarantineDevice"}]}],
    }
    scene = xid79_scene(work=1, spares=0, slurm=True, rules=[rule])
    node, objects, cluster = scene.broken, scene.objects, scene.cluster
    assert cluster is not None
    api = sandbox.api_client()
    publish_gpu_slices(api, [node], SANDBOX_GPUS)
    try:
        sbatch = ("sbatch", "--parsable", "--requeue", "-o", "/dev/null", "--gres=gpu:4")
        low = cluster.run(*sbatch, "-w", node, "--wrap", "sleep 600").stdout.strip()
        wait_for(lambda: _gres(cluster, low), f"job {low} running with its GPUs")
        high = cluster.run(*sbatch, "-w", node, "--wrap", "sleep 600").stdout.strip()
        wait_for(lambda: _gres(cluster, high), f"job {high} running with its GPUs")
        assert (_gres(cluster, low), _gres(cluster, high)) == ("0-3", "4-7")

        scene.start()
        simulate_xid(scene.core, node, 94, pci=BAD_PCI)  # gpu-3: GRES index 3
        nrem = wait_for(
            lambda: condition(o := objects.incident(node), "DeviceQuarantined") and o,
            "DeviceQuarantined",
        )
        said = condition(nrem, "DeviceQuarantined") or {}
        assert (said["status"], said["reason"]) == ("True", "DeviceTainted"), dump(nrem["status"])
        held = nrem["status"]["quarantinedDevice"]
        assert (held["device"], held["slurmGpuIndex"]) == ("gpu-3", 3), dump(held)
        assert held["requeuedJobs"] == [low], dump(held)
        assert f"job(s) {low} holding GRES index 3 requeued" in held["slurm"], held["slurm"]
        assert "1 other job(s) keep running" in held["slurm"], held["slurm"]

        # The job on GPUs 0-3 left the node (excluded: it would get index 3 again there).
        moved = wait_for(
            lambda: "JobState=PENDING" in (shown := _show(cluster, low)) and shown,
            f"job {low} requeued",
        )
        assert "Restarts=1" in moved, moved
        assert re.search(rf"\bExcNodeList={node}\b", moved), moved
        # The job on GPUs 4-7 runs on, untouched.
        kept = _show(cluster, high)
        assert "JobState=RUNNING" in kept, kept
        assert "Restarts=0" in kept, kept
        assert _gres(cluster, high) == "4-7"
        # The Slurm node stays in service, as documented, and Slurm still gives out index 3.
        slurm_node = cluster.run("scontrol", "show", "node", node, "-o").stdout
        assert "DRAIN" not in slurm_node, slurm_node
        assert "Gres=gpu:8" in slurm_node, slurm_node
        late = cluster.run(*sbatch, "-w", node, "--wrap", "sleep 600").stdout.strip()
        wait_for(lambda: _gres(cluster, late), f"job {late} running with its GPUs")
        assert _gres(cluster, late) == "0-3", "Slurm hands out the bad GPU's index again"
        spec = objects.node(node).spec
        assert spec is None or not spec.unschedulable, "the Kubernetes node stays in service"
    finally:
        withdraw_gpu_slices(api, [node])
