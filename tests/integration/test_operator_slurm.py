"""XID 79 end to end: the operator on the sandbox's Kubernetes, the real Slurm bridge process
(`gpuheal-slurm-bridge`, CLI backend) and a real Slurm cluster whose node names are the
Kubernetes node names. No mocks."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    Xid79Scene,
    completed,
    condition,
    dump,
    hold,
    pdb_blocking,
    policy,
    pool,
    release_pdb,
    wait_for,
    xid79_rule,
)

pytestmark = pytest.mark.integration
START_RE = re.compile(r"START host=(\S+) restart_count=(\d+) resume_step=(\d+)")


def _job(cluster: SlurmCluster, job: str) -> tuple[str, str]:
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%N", check=False).stdout.strip()
    state, _, nodes = out.partition("|")
    return state, nodes


def _node(cluster: SlurmCluster, node: str) -> str:
    return cluster.run("scontrol", "show", "node", node, "-o").stdout


def test_xid79_drains_and_requeues_in_slurm_and_resumes_the_spare(
    xid79_scene: Callable[..., Xid79Scene],
    checkpoint_job: Path,
    tmp_path: Path,
) -> None:
    # The spare waits drained as the pool leaves it ("reserve pool"); promotion resumes it.
    scene = xid79_scene(work=2, slurm=True)
    (broken, other), (spare,) = scene.work, scene.spares
    objects, cluster = scene.objects, scene.cluster
    assert cluster is not None

    ckpt, out = tmp_path / "ckpt.state", tmp_path / "ckpt.out"
    # Land the job on `broken` without pinning it there (a pinned job could not move).
    cluster.run("scontrol", "update", f"NodeName={other}", "State=DRAIN", "Reason=hold")
    job = cluster.run(
        "sbatch", "--parsable", "-o", str(out), str(checkpoint_job), str(ckpt), "0.2"
    ).stdout.strip()
    wait_for(lambda: _job(cluster, job) == ("RUNNING", broken), f"job {job} RUNNING on {broken}")
    cluster.run("scontrol", "update", f"NodeName={other}", "State=RESUME")
    wait_for(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= 3, "3 checkpointed steps")

    op = scene.start()
    try:
        t0 = time.monotonic()
        scene.xid()
        nrem = wait_for(scene.incident, "NodeRemediation")
        name = nrem["metadata"]["name"]
        done = scene.completed(timeout=120)
        elapsed = time.monotonic() - t0
        print(f"\nXID 79 -> replaced in {elapsed:.2f}s; timeline:")
        for e in done["status"]["timeline"]:
            print(f"  {e['time']}  {e['step']:<22} {e['message']}")
        assert completed(done) == "Replaced", dump(done["status"])

        drained = _node(cluster, broken)
        assert re.search(rf"Reason=gpuheal: {name}\b", drained), drained
        assert "DRAIN" in drained
        assert condition(done, "SlurmDrained")["reason"] == "Drained"
        assert condition(done, "JobsRequeued")["status"] == "True"
        assert [j["jobId"] for j in done["status"]["requeuedJobs"]] == [job]
        assert done["status"]["ownership"] == {"cordoned": True, "slurmDrained": True}

        moved = wait_for(
            lambda: (s := _job(cluster, job))[0] == "RUNNING" and s[1] != broken and s[1],
            "job running elsewhere", timeout=60,
        )  # fmt: skip
        assert moved in (other, spare)
        spare_state = _node(cluster, spare)
        assert "DRAIN" not in spare_state, spare_state
        assert done["status"]["replacementNode"] == spare

        runs = wait_for(
            lambda: (r := START_RE.findall(out.read_text())) and len(r) >= 2 and r, "second START"
        )
        assert runs[1][0] == moved
        assert int(runs[1][1]) == 1
        assert int(runs[1][2]) >= 3, "resumed from its checkpoint"

        # Restart the operator: nothing runs twice (one requeue, one spare). The dead process's
        # Lease deleted rather than waited out (15 s): `start` returns once the new one leads.
        op.kill()
        op.delete_dead_lease()
        op.start()
        hold(lambda: len(objects.incidents(broken)) == 1, "still one incident", 3)
        assert "Restarts=1" in cluster.run("scontrol", "show", "job", job).stdout
    finally:
        op.stop()


def test_a_spare_an_admin_drained_or_cordoned_is_skipped_and_the_pool_says_why(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """Three spares, in name order: the first drained in Slurm by an admin ("admin: bad
    fan"), the second cordoned by an admin in Kubernetes, the third waiting as the pool
    leaves its spares (drained "reserve pool"). XID 79 promotes the third; the admin's drain
    and cordon stay as they were; the pool's status names both with the reason."""
    core = sandbox.core_v1()
    cid = os.urandom(3).hex()
    (broken,) = own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-work"})
    drained, cordoned, ready = sorted(own_gpu_nodes(3, **{"gpuheal.io/case": f"{cid}-spare"}))
    objects = Objects(sandbox.api_client())
    cluster = make_slurm_cluster([broken, drained, cordoned, ready], name="opspare")
    for spare in (cordoned, ready):
        cluster.run("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool")
    cluster.run("scontrol", "update", f"NodeName={drained}", "State=DRAIN", "Reason=admin: bad fan")
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    url, token_file, _ = bridge(cluster)
    pool_name = f"spares-{cid}"
    pool_manifest = pool(pool_name, f"{cid}-spare")
    pool_manifest["spec"]["promotion"]["slurm"] = {"resume": True}
    objects.apply("reservepools", pool_manifest)
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [xid79_rule(pool_name)]))
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        ["--bridge-url", url, "--bridge-token-file", str(token_file)],
    ).start()  # fmt: skip
    try:
        simulate_xid(core, broken, 79)
        nrem = wait_for(lambda: objects.incident(broken), "NodeRemediation")
        done = wait_for(
            lambda: completed(o := objects.get("noderemediations", nrem["metadata"]["name"]))
            and o,
            "incident completed", timeout=120,
        )  # fmt: skip
        assert completed(done) == "Replaced", dump(done["status"])
        assert done["status"]["replacementNode"] == ready, dump(done["status"])
        assert "DRAIN" not in _node(cluster, ready)

        admin_state = _node(cluster, drained)
        assert "DRAIN" in admin_state, admin_state
        assert "Reason=admin: bad fan" in admin_state, admin_state
        for spare in (drained, cordoned):
            labels = objects.node(spare).metadata.labels or {}
            assert "gpuheal.io/promoted" not in labels, (spare, labels)
            assert "gpuheal.io/claimed-by" not in labels, (spare, labels)
        assert objects.node(cordoned).spec.unschedulable, "the admin's cordon stays"
        assert "Reason=reserve pool" in _node(cluster, cordoned), "never resumed"

        def unavailable() -> dict[str, dict[str, Any]] | None:
            status = (objects.get("reservepools", pool_name) or {}).get("status") or {}
            out = {u["node"]: u for u in status.get("unavailable") or []}
            return out if {drained, cordoned} <= out.keys() else None

        out = wait_for(unavailable, "the pool names both unavailable spares", timeout=60)
        assert out[drained]["reason"] == "DrainedInSlurm", out
        assert "admin: bad fan" in out[drained]["message"], out
        assert out[cordoned]["reason"] == "Cordoned", out
        assert ready not in out
    finally:
        op.stop()
        objects.cleanup([broken, drained, cordoned, ready])


def test_xid94_bridge_down_then_back_returns_only_what_gpuheal_drained(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """XID 94 once on two nodes, one of them drained in Slurm by an admin. The bridge is down
    when the signal comes: the Slurm step waits (Blocked: BridgeUnavailable) and completes
    once the bridge is back. After the hysteresis both nodes return to service in Kubernetes,
    but only the node gpuheal drained is resumed in Slurm."""
    core = sandbox.core_v1()
    cid = os.urandom(3).hex()
    ours, admins = own_gpu_nodes(2, **{"gpuheal.io/case": f"{cid}-work"})
    objects = Objects(sandbox.api_client())
    cluster = make_slurm_cluster([ours, admins], name="op94")
    cluster.run("scontrol", "update", f"NodeName={admins}", "State=DRAIN", "Reason=admin: memtest")
    url, token_file, proc = bridge(cluster)
    port = int(url.rsplit(":", 1)[1])
    rule = {
        "name": "ecc",
        "signals": {"xids": [94]},
        "ladder": [{"name": "requeue", "steps": [
            {"action": "cordon"},
            {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
            {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule],
                                                 healthy_for="3s"))  # fmt: skip
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        ["--bridge-url", url, "--bridge-token-file", str(token_file)],
    ).start()  # fmt: skip
    try:
        proc.terminate()
        proc.wait(timeout=10)
        for n in (ours, admins):
            simulate_xid(core, n, 94)
        for n in (ours, admins):
            wait_for(
                lambda n=n: (c := condition(objects.incident(n), "Blocked"))
                and c["status"] == "True" and c["reason"] == "BridgeUnavailable",
                f"{n}: Slurm step waits for the bridge", timeout=30,
            )  # fmt: skip
        assert objects.node(ours).spec.unschedulable, "cordon does not wait for Slurm"
        bridge(cluster, port)  # back on the same address
        for n in (ours, admins):
            done = wait_for(lambda n=n: completed(o := objects.incident(n)) and o,
                            f"{n} returned", timeout=120)  # fmt: skip
            assert completed(done) == "Returned", dump(done["status"])
        ours_inc, admins_inc = objects.incident(ours), objects.incident(admins)
        assert condition(ours_inc, "SlurmDrained")["reason"] == "Drained"
        assert condition(admins_inc, "SlurmDrained")["reason"] == "DrainedByOther"
        assert admins_inc["status"]["ownership"] == {"cordoned": True, "slurmDrained": False}
        assert not objects.node(ours).spec.unschedulable
        assert not objects.node(admins).spec.unschedulable  # gpuheal cordoned it in Kubernetes
        assert "DRAIN" not in _node(cluster, ours), "our Slurm drain was resumed"
        admin_state = _node(cluster, admins)
        assert "DRAIN" in admin_state, admin_state
        assert "Reason=admin: memtest" in admin_state, admin_state
        m = op.metrics()
        assert m.get('gpuheal_blocked_total{reason="BridgeUnavailable"}', 0) >= 2
    finally:
        op.stop()
        objects.cleanup([ours, admins])


def test_sigkill_at_each_held_step_of_an_xid79_repeats_nothing(  # noqa: PLR0917
    sandbox: Sandbox,
    namespace: str,
    xid79_scene: Callable[..., Xid79Scene],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    checkpoint_job: Path,
    tmp_path: Path,
) -> None:
    """The operator is SIGKILLed while the incident waits at each step that can wait: Slurm
    drain (bridge down), pod drain (PDB), replace (approval). Each time a new process picks
    it up. In the end: one cordon, one requeue of the job, one spare claimed."""
    scene = xid79_scene(work=2, spares=2, slurm=True, requireApproval=["replace"])
    (broken, other), spares = scene.work, scene.spares
    objects, cluster, proc = scene.objects, scene.cluster, scene.bridge_proc
    assert cluster is not None
    assert proc is not None
    cluster.run("scontrol", "update", f"NodeName={other}", "State=DRAIN", "Reason=hold")
    ckpt, out = tmp_path / "ckpt.state", tmp_path / "ckpt.out"
    job = cluster.run(
        "sbatch", "--parsable", "-o", str(out), str(checkpoint_job), str(ckpt), "0.2"
    ).stdout.strip()
    wait_for(lambda: _job(cluster, job) == ("RUNNING", broken), f"job {job} on {broken}")
    cluster.run("scontrol", "update", f"NodeName={other}", "State=RESUME")
    pol = pdb_blocking(sandbox, namespace, broken)
    op = scene.start()

    def blocked(reason: str) -> Callable[[], Any]:
        return lambda: (
            (c := condition(objects.incident(broken), "Blocked"))
            and (c["status"] == "True" and c["reason"] == reason)
        )

    try:
        proc.terminate()
        proc.wait(timeout=10)
        scene.xid()
        wait_for(blocked("BridgeUnavailable"), "Slurm step waits for the bridge", timeout=30)
        name = objects.incident(broken)["metadata"]["name"]
        cordoned_at = condition(objects.incident(broken), "Cordoned")["lastTransitionTime"]
        op.kill()  # 1: in the Slurm step
        op.delete_dead_lease()  # the restart is tested, not the Lease's expiry (15 s)
        bridge(cluster, scene.bridge_port)
        op.start()
        wait_for(blocked("PodDisruptionBudget"), "drain held by the PDB", timeout=60)
        assert condition(objects.incident(broken), "SlurmDrained")["reason"] == "Drained"
        op.kill()  # 2: in the drain step
        op.delete_dead_lease()
        release_pdb(pol, namespace)
        op.start()
        wait_for(blocked("ApprovalPending"), "replace waits for approval", timeout=60)
        op.kill()  # 3: before replace
        op.delete_dead_lease()
        op.start()
        objects.patch("noderemediations", name,
                      {"metadata": {"annotations": {"gpuheal.io/approve": "replace"}}})  # fmt: skip
        done = wait_for(lambda: completed(o := objects.incident(broken)) and o, "completed",
                        timeout=90)  # fmt: skip
        assert completed(done) == "Replaced", dump(done["status"])
        assert len(objects.incidents(broken)) == 1
        assert condition(done, "Cordoned")["lastTransitionTime"] == cordoned_at
        steps = [e["step"] for e in done["status"]["timeline"]]
        for step in ("replace/cordon", "replace/slurmDrain", "replace/drain", "replace/replace"):
            assert steps.count(step) == 1, steps
        claimed = [s for s in spares if objects.node(s).metadata.labels.get(
            "gpuheal.io/claimed-by") == name]  # fmt: skip
        assert claimed == [done["status"]["replacementNode"]]
        assert [j["jobId"] for j in done["status"]["requeuedJobs"]] == [job]
        wait_for(lambda: (s := _job(cluster, job))[0] == "RUNNING" and s[1] != broken,
                 "job running elsewhere", timeout=60)  # fmt: skip
        assert "Restarts=1" in cluster.run("scontrol", "show", "job", job).stdout
    finally:
        op.stop()


def _slurm_state(cluster: SlurmCluster, node: str) -> str:
    m = re.search(r"\bState=(\S+)", _node(cluster, node))
    return m.group(1) if m else ""


def test_a_node_down_in_slurm_is_drained_by_gpuheal_and_stays_out_when_slurmd_answers(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The node's slurmd is gone and Slurm has the node DOWN when the XID comes. DOWN does
    not keep it out (ReturnToService=2 returns it as soon as slurmd registers): gpuheal
    drains it with its own reason, owns that drain, and the status says so; once slurmd
    answers again the node stays drained."""
    core = sandbox.core_v1()
    cid = os.urandom(3).hex()
    (node,) = own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-work"})
    objects = Objects(sandbox.api_client())
    cluster = make_slurm_cluster([node], name="opdn")
    url, token_file, _ = bridge(cluster)
    cluster.stop_daemon(f"slurmd@{node}")
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=Not responding")
    assert _slurm_state(cluster, node).startswith("DOWN"), _node(cluster, node)
    assert "DRAIN" not in _slurm_state(cluster, node), _node(cluster, node)
    rule = {
        "name": "bus",
        "signals": {"xids": [79]},
        "ladder": [{"name": "out", "steps": [
            {"action": "cordon"}, {"action": "slurmDrain", "slurmDrain": {"requeue": "none"}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        ["--bridge-url", url, "--bridge-token-file", str(token_file)],
    ).start()  # fmt: skip
    try:
        simulate_xid(core, node, 79)
        drained = wait_for(
            lambda: (c := condition(objects.incident(node), "SlurmDrained"))
            and c["status"] == "True" and c,
            "SlurmDrained", timeout=60,
        )  # fmt: skip
        nrem = objects.incident(node)
        name = nrem["metadata"]["name"]
        print(dump(drained))
        assert drained["reason"] == "DrainedWasDown", dump(nrem["status"])
        assert "was DOWN" in drained["message"]
        assert "'Not responding'" in drained["message"]
        assert nrem["status"]["ownership"]["slurmDrained"] is True
        state = _node(cluster, node)
        assert re.search(rf"Reason=gpuheal: {name} xid=79\b", state), state
        assert "DRAIN" in _slurm_state(cluster, node), state

        cluster.start_daemon(f"slurmd@{node}")
        back = wait_for(
            lambda: not (s := _slurm_state(cluster, node)).startswith("DOWN") and s,
            "slurmd registered (DOWN cleared)", timeout=60,
        )  # fmt: skip
        print(f"\nafter slurmd came back: {back}")
        hold(lambda: "DRAIN" in _slurm_state(cluster, node), "still drained", 5)
        assert f"Reason=gpuheal: {name}" in _node(cluster, node)
    finally:
        op.stop()
        objects.cleanup([node])


_STEPS = ("Cordoned", "SlurmDrained", "JobsRequeued", "Drained", "Reset", "Rebooted",
          "ReplacementClaimed", "Retired", "Verified")  # fmt: skip


def test_without_a_bridge_no_step_claims_what_it_did_not_do(
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """No Slurm bridge configured: the slurmDrain step is skipped (False, SlurmNotConfigured),
    only the cordon is True, and the return says only Kubernetes was returned. A node an
    admin had cordoned first: gpuheal owns nothing, so nothing is returned (Returned=False,
    NothingToUndo) and the admin's cordon stays."""
    core = sandbox.core_v1()
    cid = os.urandom(3).hex()
    node, admins = own_gpu_nodes(2, **{"gpuheal.io/case": f"{cid}-work"})
    objects = Objects(sandbox.api_client())
    core.patch_node(admins, {"spec": {"unschedulable": True}})
    rule = {
        "name": "bus",
        "signals": {"xids": [79]},
        "ladder": [{"name": "out", "steps": [
            {"action": "cordon"}, {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule],
                                                 healthy_for="3s"))  # fmt: skip
    op = OperatorProcess(Path(sandbox.kubeconfig), tmp_path, []).start()
    try:
        for n in (node, admins):
            simulate_xid(core, n, 79)
        done = wait_for(lambda: completed(o := objects.incident(node)) and o,
                        "incident completed", timeout=90)  # fmt: skip
        print(dump(done["status"]))
        conds = {c["type"]: c for c in done["status"]["conditions"]}
        claimed = sorted(t for t in _STEPS if t in conds and conds[t]["status"] == "True")
        assert claimed == ["Cordoned"], dump(done["status"])
        skipped = conds["SlurmDrained"]
        assert (skipped["status"], skipped["reason"]) == ("False", "SlurmNotConfigured")
        assert "JobsRequeued" not in conds
        assert done["status"]["ownership"] == {"cordoned": True, "slurmDrained": False}
        returned = conds["Returned"]
        assert (returned["status"], returned["reason"]) == ("True", "ReturnedInKubernetesOnly")
        assert "no Slurm bridge configured" in returned["message"]
        assert completed(done) == "ReturnedInKubernetesOnly"
        assert not objects.node(node).spec.unschedulable

        theirs = wait_for(lambda: completed(o := objects.incident(admins)) and o,
                          "admin-cordoned incident completed", timeout=60)  # fmt: skip
        nothing = condition(theirs, "Returned")
        assert nothing is not None
        assert (nothing["status"], nothing["reason"]) == ("False", "NothingToUndo"), nothing
        assert completed(theirs) == "NothingToUndo"
        assert objects.node(admins).spec.unschedulable, "the admin's cordon stays"
    finally:
        op.stop()
        objects.cleanup([node, admins])


@dataclasses.dataclass
class _Drained:
    """One node drained in its own Slurm by gpuheal (cordon + slurmDrain, jobs left) through
    its own bridge process, the operator running: the scene of a return test."""

    node: str
    objects: Objects
    cluster: SlurmCluster
    url: str
    bridge: subprocess.Popen[bytes]


@contextlib.contextmanager
def _drained_by_gpuheal(
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    *,
    name: str,
    healthy_for: str,
) -> Iterator[_Drained]:
    core = sandbox.core_v1()
    cid = os.urandom(3).hex()
    (node,) = own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-work"})
    objects = Objects(sandbox.api_client())
    cluster = make_slurm_cluster([node], name=name)
    url, token_file, proc = bridge(cluster)
    rule = {
        "name": "bus",
        "signals": {"xids": [79]},
        "ladder": [{"name": "out", "steps": [
            {"action": "cordon"}, {"action": "slurmDrain", "slurmDrain": {"requeue": "none"}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule],
                                                 healthy_for=healthy_for))  # fmt: skip
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        ["--bridge-url", url, "--bridge-token-file", str(token_file)],
    ).start()  # fmt: skip
    try:
        simulate_xid(core, node, 79)
        wait_for(
            lambda: (c := condition(objects.incident(node), "SlurmDrained"))
            and c["status"] == "True" and c["reason"] == "Drained",
            "SlurmDrained", timeout=60,
        )  # fmt: skip
        yield _Drained(node, objects, cluster, url, proc)
    finally:
        op.stop()
        objects.cleanup([node])


def test_a_refused_slurm_resume_is_not_a_return(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """gpuheal drained the node; an admin takes the drain over (their reason) before the
    return: the bridge refuses gpuheal's resume, the node stays drained with the admin's
    reason, Returned is False (SlurmResumeRefused) and the incident does not end Returned."""
    with _drained_by_gpuheal(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path,
                             name="oprf", healthy_for="8s") as scene:  # fmt: skip
        node, cluster = scene.node, scene.cluster
        cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                    "Reason=admin: memtest")  # fmt: skip
        done = wait_for(lambda: completed(o := scene.objects.incident(node)) and o,
                        "incident completed", timeout=90)  # fmt: skip
        returned = condition(done, "Returned")
        assert returned is not None, dump(done["status"])
        assert (returned["status"], returned["reason"]) == ("False", "SlurmResumeRefused")
        assert completed(done) == "Remediated", dump(done["status"])
        assert "not back in Slurm service" in condition(done, "Completed")["message"]
        state = _node(cluster, node)
        assert "DRAIN" in _slurm_state(cluster, node), state
        assert "Reason=admin: memtest" in state, state


def test_a_return_while_the_bridge_is_down_waits_for_it(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Callable[..., tuple[str, Path, subprocess.Popen[bytes]]],
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The bridge is down when the node is due back: the return does not claim it (Returned
    False, Blocked: BridgeUnavailable) and the incident stays open until the bridge is back,
    then resumes gpuheal's drain and ends Returned."""
    with _drained_by_gpuheal(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path,
                             name="opbd", healthy_for="3s") as scene:  # fmt: skip
        node, cluster, objects = scene.node, scene.cluster, scene.objects
        scene.bridge.terminate()
        scene.bridge.wait(timeout=10)
        waiting = wait_for(
            lambda: (o := objects.incident(node))
            and (c := condition(o, "Returned")) and c["reason"] == "BridgeUnavailable" and o,
            "the return waits for the bridge", timeout=60,
        )  # fmt: skip
        assert condition(waiting, "Returned")["status"] == "False"
        blocked = condition(waiting, "Blocked")
        assert (blocked["status"], blocked["reason"]) == ("True", "BridgeUnavailable")
        assert not completed(waiting)
        assert "DRAIN" in _slurm_state(cluster, node)
        bridge(cluster, int(scene.url.rsplit(":", 1)[1]))
        done = wait_for(lambda: completed(o := objects.incident(node)) and o,
                        "returned once the bridge is back", timeout=90)  # fmt: skip
        assert completed(done) == "Returned", dump(done["status"])
        returned = condition(done, "Returned")
        assert (returned["status"], returned["reason"]) == ("True", "ReturnedToService")
        assert "resumed" in returned["message"]
        assert "DRAIN" not in _slurm_state(cluster, node), _node(cluster, node)
