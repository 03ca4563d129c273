"""Real reset and reboot, verified, and no node back before it passed its check: the operator
on the sandbox's Kubernetes, the real Slurm bridge and a real Slurm whose RebootProgram
restarts the node's slurmd with -b (Slurm's own reboot states, a new BootTime). No mocks: a
check Job's exit code comes from kwok (the pod annotation `gpuheal.io/sandbox-exit-code`
plays a failing DCGM diagnostic), and a Job-driven reboot is proven only by the node's new
boot ID, which the test sets the way a kubelet does after a reboot."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuheal.api.names import NODE_LABEL
from gpuheal.cli.simulate import simulate_xid
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    format_gpu_map,
    format_gpu_report,
)
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import (
    REPO,
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    hold,
    node_events,
    policy,
    pool,
    wait_for,
)

pytestmark = pytest.mark.integration
CHART = REPO / "deploy" / "helm" / "gpuheal"
SPARE_TAINT = {"key": "gpuheal.io/spare", "effect": "NoSchedule"}


def _time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


class SlurmWatch:
    """Samples `scontrol show node -o` of some nodes every 0.1 s: (wall time, state, boot)."""

    def __init__(self, cluster: SlurmCluster, nodes: list[str]) -> None:
        self.cluster, self.nodes = cluster, nodes
        self.samples: dict[str, list[tuple[float, str, str, str]]] = {n: [] for n in nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in self.nodes:
                out = self.cluster.run("scontrol", "show", "node", "-o", node, check=False).stdout
                state = re.search(r"State=(\S+)", out)
                boot = re.search(r"BootTime=(\S+)", out)
                reason = out.partition(" Reason=")[2].strip()
                if state and boot:
                    self.samples[node].append((time.time(), state[1], boot[1], reason))
            self._stop.wait(0.1)

    def __enter__(self) -> SlurmWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def states(self, node: str) -> list[str]:
        return [s for _, s, _, _ in self.samples[node]]

    def boots(self, node: str) -> list[str]:
        return list(dict.fromkeys(b for _, _, b, _ in self.samples[node]))


def _check_job(namespace: str, *, exit_code: int | None = None) -> dict[str, Any]:
    annotations = {} if exit_code is None else {"gpuheal.io/sandbox-exit-code": str(exit_code)}
    return {
        "type": "Job",
        "timeout": "2m",
        "job": {
            "namespace": namespace,
            "template": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"annotations": annotations},
                    "spec": {
                        "containers": [
                            {"name": "dcgm-diag", "image": "nvcr.io/nvidia/cloud-native/dcgm:4",
                             "command": ["dcgmi", "diag", "-r", "2"]}
                        ],
                    },
                },
            },
        },
    }  # fmt: skip


def _rule(pool_name: str, *, repair_after_replace: bool = False) -> dict[str, Any]:
    reboot = {"action": "reboot", "reboot": {"hook": {"type": "Slurm"}, "timeout": "2m"}}
    fence = [
        {"action": "cordon"},
        {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
        {"action": "drain", "drain": {"timeout": "1m"}},
    ]
    replace = {"action": "replace", "replace": {"reservePoolRef": {"name": pool_name}}}
    if repair_after_replace:
        return {
            "name": "fell-off-bus",
            "signals": {"xids": [79]},
            "ladder": [{"name": "replace-and-repair", "steps": [*fence, replace, reboot]}],
        }
    return {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "escalation": {"occurrences": 2, "window": "24h", "scope": "Node"},
        "ladder": [
            {"name": "power-cycle", "steps": [*fence, reboot]},
            {"name": "replace", "steps": [*fence, replace]},
        ],
    }


def _slurm_node(cluster: SlurmCluster, node: str) -> str:
    return cluster.run("scontrol", "show", "node", "-o", node).stdout


@pytest.fixture
def operator_with_bridge(
    sandbox: Sandbox,
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> Iterator[Callable[[list[str]], tuple[SlurmCluster, OperatorProcess]]]:
    ops: list[OperatorProcess] = []

    def start(nodes: list[str]) -> tuple[SlurmCluster, OperatorProcess]:
        cluster = make_slurm_cluster(nodes, name="repair")
        url, token_file, _ = bridge(cluster)
        logs = tmp_path / f"op{len(ops)}"
        logs.mkdir()
        op = OperatorProcess(
            Path(sandbox.kubeconfig), logs,
            # _check_job is an inline template: run it, as a site with nodeJobs.inlineTemplates
            ["--bridge-url", url, "--bridge-token-file", str(token_file),
             "--inline-job-templates"],
        ).start()  # fmt: skip
        ops.append(op)
        return cluster, op

    yield start
    for op in ops:
        op.stop()


def test_xid79_reboots_through_slurm_checks_then_returns_and_a_failing_check_replaces(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    operator_with_bridge: Callable[[list[str]], tuple[SlurmCluster, OperatorProcess]],
) -> None:
    core = sandbox.core_v1()
    (good,) = case(1, "good")
    (bad,) = case(1, "bad")
    (spare,) = case(1, "spare")
    cid = case.case_id  # type: ignore[attr-defined]
    pool_name = f"spares-{cid}"
    body = pool(pool_name, f"{cid}-spare")
    body["spec"]["promotion"]["slurm"] = {"resume": True}
    objects.apply("reservepools", body)
    for role, check in (
        ("good", _check_job(namespace)),
        ("bad", _check_job(namespace, exit_code=1)),
    ):
        manifest = policy(f"p-{cid}-{role}", f"{cid}-{role}", [_rule(pool_name)], healthy_for="4s")
        manifest["spec"]["returnToService"]["check"] = check
        objects.apply("remediationpolicies", manifest)
    cluster, _ = operator_with_bridge([good, bad, spare])
    cluster.run("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool")

    with SlurmWatch(cluster, [good, bad]) as watch:
        for node in (good, bad):
            simulate_xid(core, node, 79)
        done = wait_for(lambda: completed(o := objects.incident(good)) and o, "good returned",
                        timeout=150)  # fmt: skip
        failed = wait_for(lambda: completed(o := objects.incident(bad)) and o, "bad replaced",
                          timeout=150)  # fmt: skip

    # The good node: Slurm rebooted it (its reboot states, a new BootTime), the check Job
    # passed, then healthyFor, then uncordon + RESUME.
    assert completed(done) == "Returned", dump(done["status"])
    seen = watch.states(good)
    assert any("REBOOT_REQUESTED" in s or "REBOOT_ISSUED" in s for s in seen), seen
    assert len(watch.boots(good)) >= 2, f"BootTime never changed: {watch.boots(good)}"
    rebooted = condition(done, "Rebooted")
    assert (rebooted["status"], rebooted["reason"]) == ("True", "SlurmRebooted"), rebooted
    assert "Slurm BootTime" in rebooted["message"]
    verified = condition(done, "Verified")
    assert (verified["status"], verified["reason"]) == ("True", "CheckPassed"), verified
    returned = condition(done, "Returned")
    assert returned["reason"] == "ReturnedToService"
    assert _time(returned["lastTransitionTime"]) >= _time(verified["lastTransitionTime"]) + (
        dt.timedelta(seconds=4)
    ), "healthyFor counts from the passed check"
    assert done["status"]["returnedTo"] == "Service"
    # Slurm kept the node drained (ours) through the reboot until the check had passed.
    verified_at = _time(verified["lastTransitionTime"]).timestamp()
    after_reboot = [
        (s, r) for t, s, _, r in watch.samples[good] if "REBOOT" not in s and t < verified_at - 1
    ][-5:]
    assert after_reboot, watch.samples[good][-10:]
    assert all("DRAIN" in s and r.startswith("gpuheal:") for s, r in after_reboot), after_reboot
    assert not objects.node(good).spec.unschedulable
    now = _slurm_node(cluster, good)
    assert "DRAIN" not in now, now
    assert "REBOOT" not in now, now
    jobs = client.BatchV1Api(sandbox.api_client()).list_namespaced_job(namespace).items
    check = next(j for j in jobs if j.metadata.name.startswith(done["metadata"]["name"]))
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={check.metadata.name}")
    assert pods.items[0].spec.node_name == good

    # The bad node: rebooted too, its check failed (exit code 1), so it climbed to replace
    # and never returned.
    assert completed(failed) == "Replaced", dump(failed["status"])
    assert failed["status"]["rung"] == 1
    check_failed = condition(failed, "Verified")
    assert (check_failed["status"], check_failed["reason"]) == ("False", "CheckFailed")
    assert any(
        e["step"] == "Escalated" and "power-cycle -> replace" in e["message"]
        for e in failed["status"]["timeline"]
    ), dump(failed["status"]["timeline"])
    assert failed["status"]["replacementNode"] == spare
    came_back = condition(failed, "Returned")
    assert came_back is None or came_back["status"] != "True", came_back
    hold(
        lambda: objects.node(bad).spec.unschedulable and "DRAIN" in _slurm_node(cluster, bad),
        "the node that failed its check stays out (Kubernetes and Slurm)",
        4,
    )
    history = objects.get("faulthistories", bad)
    assert history is not None
    actions = [(e.get("action"), e["message"][:6]) for e in history["status"]["entries"]
               if e["kind"] == "Action"]  # fmt: skip
    assert ("check", "failed") in actions, actions
    assert history["status"]["lastOutcome"] == "Replaced"


def test_a_repaired_node_goes_back_to_its_low_pool(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    operator_with_bridge: Callable[[list[str]], tuple[SlurmCluster, OperatorProcess]],
) -> None:
    core = sandbox.core_v1()
    (broken,) = case(1)
    (spare,) = case(1, "spare")
    core.patch_node(spare, {"spec": {"taints": [SPARE_TAINT]}})
    cid = case.case_id  # type: ignore[attr-defined]
    pool_name = f"spares-{cid}"
    body = pool(pool_name, f"{cid}-spare")
    body["spec"]["promotion"]["removeTaints"] = [SPARE_TAINT]
    body["spec"]["promotion"]["slurm"] = {"resume": True}
    objects.apply("reservepools", body)
    manifest = policy(
        f"p-{cid}", f"{cid}-work", [_rule(pool_name, repair_after_replace=True)], healthy_for="3s"
    )
    manifest["spec"]["returnToService"]["check"] = _check_job(namespace)
    objects.apply("remediationpolicies", manifest)
    cluster, _ = operator_with_bridge([broken, spare])
    cluster.run("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool")

    simulate_xid(core, broken, 79)
    done = wait_for(lambda: completed(o := objects.incident(broken)) and o, "repaired",
                    timeout=150)  # fmt: skip
    assert completed(done) == "ReturnedToPool", dump(done["status"])
    assert done["status"]["replacementNode"] == spare
    assert done["status"]["returnedTo"] == f"ReservePool/{pool_name}"
    assert condition(done, "Rebooted")["reason"] == "SlurmRebooted"
    assert condition(done, "Verified")["status"] == "True"
    node = objects.node(broken)
    labels = node.metadata.labels
    assert labels["gpuheal.io/case"] == f"{cid}-spare", "it carries the pool's labels"
    assert "gpuheal.io/promoted" not in labels
    assert "gpuheal.io/claimed-by" not in labels
    assert not node.spec.unschedulable
    assert "gpuheal.io/cordoned-by" not in (node.metadata.annotations or {})
    assert any(
        (t.key, t.effect) == ("gpuheal.io/spare", "NoSchedule") for t in node.spec.taints or []
    )
    slurm = _slurm_node(cluster, broken)
    assert "DRAIN" in slurm, slurm
    assert "Reason=reserve pool" in slurm, slurm
    promoted = objects.node(spare)
    assert promoted.metadata.labels["gpuheal.io/promoted"] == "true"
    assert "DRAIN" not in _slurm_node(cluster, spare)
    status = wait_for(
        lambda: (s := objects.get("reservepools", pool_name)["status"])["available"] == 1 and s,
        "the pool counts the repaired node as a spare",
    )
    assert status["claimed"] == 1
    history = wait_for(
        lambda: (
            (h := objects.get("faulthistories", broken))
            and h["status"].get("lastOutcome") == "ReturnedToPool"
            and h
        ),
        "the history says where it went",
    )
    assert history["status"]["faults"] == 1


def _node_jobs(sandbox: Sandbox, namespace: str, tmp_path: Path) -> Callable[[str], Any]:
    """The chart's gpuheal-node-jobs ConfigMap, rendered by helm, in `namespace`; returns
    hook(key): a Job hook from it."""
    rendered = subprocess.run(
        [str(cluster_bin_dir() / "helm"), "template", "gpuheal", str(CHART), "-n", namespace,
         "--set", f"nodeJobs.namespace={namespace}", "--set", "nodeJobs.createNamespace=false",
         "--show-only", "templates/node-jobs.yaml"],
        capture_output=True, text=True, check=True, timeout=60,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    sandbox.core_v1().create_namespaced_config_map(namespace, yaml.safe_load(rendered))
    # The gpu-reset Job's own ServiceAccount (the chart's templates/node-jobs-rbac.yaml).
    sandbox.core_v1().create_namespaced_service_account(
        namespace, {"metadata": {"name": "gpuheal-gpu-reset"}}
    )

    def hook(key: str) -> dict[str, Any]:
        return {"type": "Job", "job": {"namespace": namespace,
                "templateFrom": {"name": "gpuheal-node-jobs", "key": key}}}  # fmt: skip

    return hook


def _no_job_for(sandbox: Sandbox, namespace: str, node: str) -> None:
    jobs = client.BatchV1Api(sandbox.api_client())
    assert not jobs.list_namespaced_job(namespace, label_selector=f"{NODE_LABEL}={node}").items


def test_the_charts_reset_job_is_verified_by_the_agent_reporting_the_gpus_again(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The chart's gpu-reset Job runs on the node; the reset counts only once the node's
    agent reported the same GPUs again after it and no XID followed for `settle` (the node
    Ready with its GPUs allocatable proves nothing: it was so before). A node where no agent
    reports its GPUs is not reset: nothing could prove it."""
    core = sandbox.core_v1()
    hook = _node_jobs(sandbox, namespace, tmp_path)
    reset_node, no_agent = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    # What gpuheal agent writes: the GPUs it knows (PCI address -> UUID) and, with NVML, those
    # it sees and when (an hour ago: its start).
    gpus = {f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)}
    seen_before = format_gpu_report(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1), gpus)
    core.patch_node(
        reset_node,
        {"metadata": {"annotations": {GPU_MAP_ANNOTATION: format_gpu_map(gpus),
                                      GPU_REPORT_ANNOTATION: seen_before}}},
    )  # fmt: skip
    rules = [
        {"name": "reset", "signals": {"xids": [62]}, "ladder": [{"name": "reset", "steps": [
            {"action": "cordon"},
            {"action": "reset",
             "reset": {"whenIdle": False, "settle": "2s", "hook": hook("gpu-reset")}}]}]},
    ]  # fmt: skip
    manifest = policy(f"p-{cid}", f"{cid}-work", rules, healthy_for="2s")
    manifest["spec"]["returnToService"]["check"] = {"type": "Job", "job": hook("gpu-check")["job"]}
    objects.apply("remediationpolicies", manifest)
    op = OperatorProcess(Path(sandbox.kubeconfig), tmp_path).start()
    try:
        for node in (reset_node, no_agent):
            simulate_xid(core, node, 62)

        def verifying() -> dict[str, Any] | None:
            o = objects.incident(reset_node)
            c = condition(o, "Reset")
            said = c["message"] if c else ""
            return o if c and c["reason"] == "Verifying" and "not after the reset" in said else None

        # The reset Job completes (kwok) and the node is Ready with its GPUs allocatable, as
        # before the reset: not taken for one until the agent reports the GPUs after it.
        waiting = wait_for(verifying, "reset Job done, not verified", timeout=90)
        hold(lambda: not completed(objects.incident(reset_node)), "no report, no reset", 3)
        record = waiting["status"]["repair"]
        assert record["gpusBefore"] == gpus, dump(record)
        # The agent, back after the reset, reports the same GPUs (as it writes them).
        report = format_gpu_report(dt.datetime.now(dt.UTC), gpus)
        core.patch_node(reset_node, {"metadata": {"annotations": {GPU_REPORT_ANNOTATION: report}}})
        done = wait_for(lambda: completed(o := objects.incident(reset_node)) and o, "reset",
                        timeout=60)  # fmt: skip
        assert completed(done) == "Returned", dump(done["status"])
        reset = condition(done, "Reset")
        assert (reset["status"], reset["reason"]) == ("True", "GpusReported"), dump(reset)
        assert "8 of 8 GPUs reported again after the reset, same UUIDs" in reset["message"]
        jobs = client.BatchV1Api(sandbox.api_client())
        name = done["metadata"]["name"]
        job = jobs.read_namespaced_job(f"{name}-reset-0", namespace)
        pod = job.spec.template.spec
        assert pod.node_name == reset_node
        assert pod.containers[0].security_context.privileged is True
        assert any(t.operator == "Exists" for t in pod.tolerations)
        assert {"name": "NODE_NAME", "value": reset_node} in [
            {"name": e.name, "value": e.value} for e in pod.containers[0].env
        ]
        # No agent reports no_agent's GPUs: no reset asked for, the incident fails.
        unproven = wait_for(lambda: completed(o := objects.incident(no_agent)) and o,
                            "no agent: not reset", timeout=60)  # fmt: skip
        assert completed(unproven) == "Failed", dump(unproven["status"])
        c = condition(unproven, "Reset")
        assert (c["status"], c["reason"]) == ("False", "NoGpuReport"), dump(c)
        _no_job_for(sandbox, namespace, no_agent)
    finally:
        op.stop()


def test_the_charts_reboot_job_is_verified_by_a_new_boot_id(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The chart's node-reboot Job runs on the node; the reboot counts only once the node's
    boot ID (recorded before it) changed, never because the Job exited 0; a node reporting
    no boot ID is not rebooted: nothing could prove it."""
    core = sandbox.core_v1()
    hook = _node_jobs(sandbox, namespace, tmp_path)
    rebooted, stuck, no_boot_id = case(3)
    cid = case.case_id  # type: ignore[attr-defined]
    core.patch_node_status(no_boot_id, {"status": {"nodeInfo": {"bootID": ""}}})
    boot_before = objects.node(rebooted).status.node_info.boot_id
    assert boot_before, "a sandbox node has a boot ID, as from a kubelet"
    rules = [
        {"name": "reboot", "signals": {"xids": [79]}, "ladder": [{"name": "reboot", "steps": [
            {"action": "cordon"},
            {"action": "reboot", "reboot": {"timeout": "25s", "hook": hook("node-reboot")}}]}]},
    ]  # fmt: skip
    manifest = policy(f"p-{cid}", f"{cid}-work", rules, healthy_for="2s")
    manifest["spec"]["returnToService"]["check"] = {"type": "Job", "job": hook("gpu-check")["job"]}
    objects.apply("remediationpolicies", manifest)
    op = OperatorProcess(Path(sandbox.kubeconfig), tmp_path).start()
    try:
        for node in (rebooted, stuck, no_boot_id):
            simulate_xid(core, node, 79)

        # The reboot Jobs complete (kwok), but no boot ID changed: not rebooted yet.
        def verifying(node: str) -> dict[str, Any] | None:
            o = objects.incident(node)
            c = condition(o, "Rebooted")
            return (
                o
                if c and c["reason"] == "Verifying" and "bootID unchanged" in c["message"]
                else None
            )

        for node in (rebooted, stuck):
            seen = wait_for(lambda node=node: verifying(node), f"{node}: Job done, not verified")
            assert (
                seen["status"]["repair"]["bootIdBefore"]
                == objects.node(node).status.node_info.boot_id
            )
        # The kubelet of a rebooted node reports a new boot ID.
        core.patch_node_status(rebooted, {"status": {"nodeInfo": {"bootID": "boot-after"}}})
        back = wait_for(lambda: completed(o := objects.incident(rebooted)) and o, "rebooted",
                        timeout=60)  # fmt: skip
        assert completed(back) == "Returned", dump(back["status"])
        proof = condition(back, "Rebooted")
        assert (proof["status"], proof["reason"]) == ("True", "BootIDChanged"), dump(proof)
        assert f"bootID {boot_before} -> boot-after" in proof["message"]
        assert condition(back, "Verified")["reason"] == "CheckPassed"
        # The other one never changed its boot ID: the reboot is not taken on trust.
        never = wait_for(lambda: completed(o := objects.incident(stuck)) and o, "gave up",
                         timeout=60)  # fmt: skip
        assert completed(never) == "Failed", dump(never["status"])
        assert condition(never, "Rebooted")["reason"] == "NotVerified"
        assert objects.node(stuck).spec.unschedulable
        # A node without a boot ID: no reboot asked for, the incident fails.
        unproven = wait_for(lambda: completed(o := objects.incident(no_boot_id)) and o,
                            "no boot ID: not rebooted", timeout=60)  # fmt: skip
        assert completed(unproven) == "Failed", dump(unproven["status"])
        c = condition(unproven, "Rebooted")
        assert (c["status"], c["reason"]) == ("False", "NoBootID"), dump(c)
        _no_job_for(sandbox, namespace, no_boot_id)
    finally:
        op.stop()


def test_an_inline_job_template_creates_no_job_unless_the_operator_allows_it(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    namespace: str,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """A policy's inline hook.job.template is any pod on the node (docs/security.md): the
    operator without --inline-job-templates (the chart's default) creates no Job for it; the
    reboot is skipped, saying why on the incident's condition and in an Event."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    inline = {
        "type": "Job",
        "job": {
            "namespace": namespace,
            "template": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "x", "image": "example.invalid/anything", "command": ["sh"]}
                        ]
                    }
                }
            },
        },
    }
    rules = [
        {"name": "reboot", "signals": {"xids": [79]}, "ladder": [{"name": "reboot", "steps": [
            {"action": "cordon"}, {"action": "reboot", "reboot": {"hook": inline}}]}]},
    ]  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", rules))
    op = OperatorProcess(Path(sandbox.kubeconfig), tmp_path).start()
    try:
        simulate_xid(core, node, 79)

        def skipped() -> dict[str, Any] | None:
            c = condition(objects.incident(node), "Rebooted")
            return c if c and c["reason"] == "InlineJobTemplateDisabled" else None

        said = wait_for(skipped, "the reboot skipped: no inline template", timeout=60)
        assert said["status"] == "False", dump(said)
        assert "--inline-job-templates" in said["message"], dump(said)
        name = objects.incident(node)["metadata"]["name"]
        events = wait_for(
            lambda: [e for e in node_events(core, name, "NodeRemediation")
                     if e.reason == "RemediationStepSkipped"],
            "a RemediationStepSkipped Event",
        )  # fmt: skip
        assert "hook.job.template" in events[0].message
        jobs = client.BatchV1Api(sandbox.api_client())
        hold(
            lambda: (
                not jobs.list_namespaced_job(namespace, label_selector=f"{NODE_LABEL}={node}").items
            ),
            "no Job created for the inline template",
            3,
        )
    finally:
        op.stop()
