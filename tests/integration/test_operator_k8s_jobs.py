"""Kubernetes-native jobs meet gpuheal's cordon and drain on the real sandbox: a NoExecute
cordon that kube-controller-manager acts on (Kueue's node hot swap reacts to the same taint),
and a plain Job whose pod, evicted by gpuheal's drain through the Eviction API, carries the
DisruptionTarget condition a `podFailurePolicy` uses to restart it without counting a failure.
kwok runs no containers, but the API server, scheduler, kube-controller-manager (taint eviction,
Job controller) and the Eviction API are the real ones."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ProtocolError

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    pod_on,
    policy,
    wait_for,
)

pytestmark = pytest.mark.integration

TAINT = "gpuheal.io/unhealthy"
HOLD = "gpuheal.test/hold"  # a finalizer: the evicted pod stays readable after its deletion


def _taints(objects: Objects, node: str) -> list[Any]:
    """gpuheal's own (the node controller adds node.kubernetes.io/unschedulable to a cordon)."""
    return [t for t in objects.node(node).spec.taints or [] if t.key == TAINT]


def _disruption(pod: Any) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == "DisruptionTarget"), None)


def _held_pod(node: str, name: str, *, tolerate: bool) -> dict[str, Any]:
    body = pod_on(node, name, {"app": name})
    body["metadata"]["finalizers"] = [HOLD]
    if tolerate:
        body["spec"]["tolerations"] = [{"key": TAINT, "operator": "Exists"}]
    return body


@pytest.fixture
def release_holds(sandbox: Sandbox, namespace: str) -> Iterator[None]:
    yield
    core = sandbox.core_v1()
    for pod in core.list_namespaced_pod(namespace).items:
        if HOLD in (pod.metadata.finalizers or []):
            core.patch_namespaced_pod(
                pod.metadata.name, namespace, {"metadata": {"finalizers": None}}
            )


@pytest.mark.usefixtures("release_holds")
def test_a_noexecute_cordon_evicts_through_kube_controller_manager_and_leaves_with_the_cordon(
    sandbox: Sandbox,
    namespace: str,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    for name, tolerate in (("plain", False), ("tolerant", True)):
        core.create_namespaced_pod(namespace, _held_pod(node, name, tolerate=tolerate))
        wait_for(
            lambda n=name: core.read_namespaced_pod(n, namespace).status.phase == "Running",
            f"{name} Running",
        )
    rule = {
        "name": "xid-94",
        "signals": {"xids": [94]},
        "ladder": [
            {
                "name": "fence",
                "steps": [
                    {"action": "cordon", "cordon": {"taint": "NoExecute"}},
                    {
                        "action": "reset",
                        "reset": {"hook": {"type": "Noop"}, "whenIdle": False},
                    },
                ],
            }
        ],
    }
    objects.apply(
        "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="8s")
    )
    run_operator()
    simulate_xid(core, node, 94)
    (taint,) = wait_for(lambda: _taints(objects, node), "the NoExecute taint")
    incident = objects.incident(node)
    assert (taint.key, taint.effect) == (TAINT, "NoExecute")
    assert taint.value == incident["metadata"]["name"]
    assert objects.node(node).spec.unschedulable
    # kube-controller-manager's taint eviction: the pod that does not tolerate it goes,
    # marked as a disruption (what Job podFailurePolicy and JobSet read); the other stays.
    plain = wait_for(
        lambda: (
            (p := core.read_namespaced_pod("plain", namespace)).metadata.deletion_timestamp and p
        ),
        "the untolerating pod deleted",
    )
    mark = _disruption(plain)
    assert mark is not None, plain.status.conditions
    assert (mark.status, mark.reason) == ("True", "DeletionByTaintManager")
    tolerant = core.read_namespaced_pod("tolerant", namespace)
    assert tolerant.metadata.deletion_timestamp is None
    assert _disruption(tolerant) is None
    try:
        done = wait_for(
            lambda: completed(o := objects.incident(node)) and o, "returned", timeout=60
        )
    except AssertionError:
        raise AssertionError(dump(objects.incident(node)["status"])) from None
    assert completed(done) == "Returned", dump(done["status"])
    assert _taints(objects, node) == [], "the taint leaves with gpuheal's cordon"
    assert not objects.node(node).spec.unschedulable
    cordoned = condition(done, "Cordoned")
    assert "tainted gpuheal.io/unhealthy:NoExecute" in cordoned["message"], dump(cordoned)


def test_an_evicted_job_pod_carries_disruption_target_and_its_job_replaces_it_free(
    sandbox: Sandbox,
    namespace: str,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    batch = client.BatchV1Api(sandbox.api_client())
    nodes = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "backoffLimit": 0,  # any failure that counts fails the Job
            "podFailurePolicy": {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            },
            "template": {
                "metadata": {
                    "labels": {"app": "train"},
                    "annotations": {"gpuheal.io/sandbox-runs": "until deleted"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"gpuheal.io/case": f"{cid}-work"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "train", "image": "example.invalid/train:1"}],
                },
            },
        },
    }
    seen: list[tuple[str, str, list[tuple[str, str | None]]]] = []
    broke: list[str] = []  # why the watch ended early, if it did
    stop = threading.Event()

    def record() -> None:  # every state of the Job's pods, the last ones before deletion too
        w = watch.Watch()
        try:
            for ev in w.stream(
                core.list_namespaced_pod, namespace, label_selector="app=train", timeout_seconds=120
            ):
                pod = ev["object"]
                marks = [(c.type, c.reason) for c in pod.status.conditions or []]
                seen.append((ev["type"], pod.metadata.name, marks))
                if stop.is_set():
                    w.stop()
        # The thread outlives the test until the next pod event or its 120 s: a later test on
        # this worker that restarts the apiserver (test_operator_outages) cuts the stream.
        # That is no failure of this test; a cut while it still looks is reported by it.
        except (ProtocolError, ApiException, OSError) as exc:
            if not stop.is_set():
                broke.append(f"{type(exc).__name__}: {exc}")

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    batch.create_namespaced_job(namespace, job)
    first = wait_for(
        lambda: next(
            (
                p
                for p in core.list_namespaced_pod(namespace, label_selector="app=train").items
                if p.status.phase == "Running"
            ),
            None,
        ),
        "the Job's pod Running",
    )
    broken = first.spec.node_name
    rule = {
        "name": "xid-79",
        "signals": {"xids": [79]},
        "ladder": [
            {
                "name": "fence",
                "steps": [{"action": "cordon"}, {"action": "drain", "drain": {"timeout": "2m"}}],
            }
        ],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    run_operator()
    simulate_xid(core, broken, 79)

    def replacement() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector="app=train").items
        return next(
            (
                p
                for p in pods
                if p.metadata.name != first.metadata.name and p.status.phase == "Running"
            ),
            None,
        )

    try:
        again = wait_for(replacement, "the Job's new pod Running", timeout=60)
    except AssertionError:
        pods = core.list_namespaced_pod(namespace, label_selector="app=train").items
        state = [(p.metadata.name, p.status.phase, p.metadata.deletion_timestamp) for p in pods]
        job_status = batch.read_namespaced_job_status("train", namespace).status
        raise AssertionError(f"pods {state}; Job {job_status}; seen {seen}; {broke}") from None
    finally:
        stop.set()
    assert again.spec.node_name == next(n for n in nodes if n != broken)
    marks = {m for _, name, ms in seen if name == first.metadata.name for m in ms}
    assert ("DisruptionTarget", "EvictionByEvictionAPI") in marks, (seen, broke)
    drained = condition(objects.incident(broken), "Drained")
    assert drained is not None, dump(objects.incident(broken)["status"])
    status = batch.read_namespaced_job_status("train", namespace).status
    failed = [c.type for c in status.conditions or [] if c.status == "True"]
    assert "Failed" not in failed, status
    assert not status.failed, f"the disruption counted as the Job's failure: {status}"
