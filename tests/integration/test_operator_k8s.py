"""The operator on the real sandbox (kube-apiserver, kwok GPU nodes): no mocks.

Each test has its own nodes (`own_gpu_nodes`) and a policy selecting only them, and runs its
own operator process (SIGKILL-able), so tests do not interfere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from gpuheal.api import OPT_OUT_LABEL
from gpuheal.cli.simulate import simulate_condition, simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    Xid79Scene,
    completed,
    condition,
    cordon_only_rule,
    dump,
    hold,
    node_events,
    pdb_blocking,
    pod_gone,
    pod_on,
    policy,
    release_pdb,
    wait_for,
)

pytestmark = pytest.mark.integration

CORDONED_BY = "gpuheal.io/cordoned-by"
CLAIMED_BY = "gpuheal.io/claimed-by"


# ---------------------------------------------------------------------------------------------
def test_xid79_cordons_evicts_through_pdb_and_claims_a_spare(
    sandbox: Sandbox,
    namespace: str,
    xid79_scene: Callable[..., Xid79Scene],
    objects: Objects,
) -> None:
    core = sandbox.core_v1()
    scene = xid79_scene(work=2)
    (broken, healthy), (spare,) = scene.work, scene.spares
    pol = pdb_blocking(sandbox, namespace, broken)
    # A DaemonSet pod on the node: a drain leaves it (it would come straight back).
    apps = client.AppsV1Api(sandbox.api_client())
    apps.create_namespaced_daemon_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": broken},
                        "containers": [{"name": "a", "image": "example.invalid/agent:1"}],
                    },
                },
            },
        },
    )
    wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace, label_selector="app=agent").items
            if p.status.phase == "Running"
        ],
        "DaemonSet pod Running",
    )
    op = scene.start()

    scene.xid()

    nrem = wait_for(scene.incident, "NodeRemediation for the XID")
    name = nrem["metadata"]["name"]
    node = wait_for(lambda: (n := objects.node(broken)).spec.unschedulable and n, "node cordoned")
    assert node.metadata.annotations[CORDONED_BY] == name
    blocked = wait_for(
        lambda: (
            (c := condition(objects.get("noderemediations", name), "Blocked"))
            and c["status"] == "True"
            and c["reason"] == "PodDisruptionBudget"
            and c
        ),
        "drain blocked by the PDB",
    )
    assert "PodDisruptionBudget" in blocked["message"]
    hold(lambda: not pod_gone(core, namespace, "victim"), "PDB keeps the pod", 2)
    # The ladder says replace: the spare is claimed and promoted beside the drain (issue 14),
    # not after it, so the requeued work finds it ready.
    early = wait_for(
        lambda: (n := objects.node(spare)).metadata.labels.get(CLAIMED_BY) == name and n,
        "spare claimed while the drain is still held",
    )
    assert early.metadata.labels["gpuheal.io/promoted"] == "true"
    reserved = condition(objects.get("noderemediations", name), "ReplacementClaimed")
    assert reserved is not None
    assert reserved["status"] == "True"
    assert condition(objects.get("noderemediations", name), "Drained")["status"] != "True"

    release_pdb(pol, namespace)

    done = wait_for(
        lambda: completed(o := objects.get("noderemediations", name)) and o,
        "incident completed",
        timeout=90,
    )
    assert completed(done) == "Replaced", dump(done["status"])
    assert pod_gone(core, namespace, "victim")
    agents = core.list_namespaced_pod(namespace, label_selector="app=agent").items
    assert [p.spec.node_name for p in agents] == [broken], "DaemonSet pod left in place"
    status = done["status"]
    assert status["replacementNode"] == spare
    promoted = objects.node(spare)
    assert promoted.metadata.labels[CLAIMED_BY] == name
    assert promoted.metadata.labels["gpuheal.io/promoted"] == "true"
    assert promoted.metadata.annotations["gpuheal.io/replaces"] == broken
    for type_ in ("Detected", "Cordoned", "Drained", "ReplacementClaimed"):
        c = condition(done, type_)
        assert c is not None, type_
        assert (c["status"], bool(c["lastTransitionTime"])) == ("True", True), type_
    no_slurm = condition(done, "SlurmDrained")  # no bridge here: nothing drained, none claimed
    assert (no_slurm["status"], no_slurm["reason"]) == ("False", "SlurmNotConfigured"), no_slurm
    assert condition(done, "Blocked")["status"] == "False"
    steps = [e["step"] for e in status["timeline"]]
    assert steps[0] == "Detected"
    assert steps[-1] == "Completed"
    for step in ("replace/cordon", "replace/drain", "replace/replace"):
        assert steps.count(step) == 1, steps
    assert status["ownership"]["cordoned"] is True
    assert not objects.node(healthy).spec.unschedulable
    reasons = {e.reason for e in node_events(core, broken)}
    assert {"GpuXid", "RemediationCreated"} <= reasons
    reasons = {e.reason for e in node_events(core, name, "NodeRemediation")}
    # one Event reason per step outcome (no catch-all "RemediationStep" any more)
    assert {
        "RemediationBlocked",
        "Cordoned",
        "Drained",
        "ReplacementClaimed",
        "Replaced",
    } <= reasons
    assert "RemediationStep" not in reasons
    m = op.metrics()
    assert m['gpuheal_incidents_total{source="events",trigger="xid"}'] == 1
    assert m['gpuheal_incidents_completed_total{outcome="replaced"}'] == 1
    assert m['gpuheal_evictions_total{result="pdb_blocked"}'] >= 1


def test_sigkill_mid_drain_then_restart_repeats_nothing_and_replays_start_nothing(
    sandbox: Sandbox,
    namespace: str,
    xid79_scene: Callable[..., Xid79Scene],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    scene = xid79_scene(spares=2)
    broken, spares = scene.broken, scene.spares
    pol = pdb_blocking(sandbox, namespace, broken)
    op = scene.start()
    scene.xid()
    nrem = wait_for(scene.incident, "NodeRemediation")
    name = nrem["metadata"]["name"]
    wait_for(
        lambda: (
            (c := condition(objects.get("noderemediations", name), "Blocked"))
            and c["reason"] == "PodDisruptionBudget"
        ),
        "drain blocked by the PDB",
    )
    before = objects.get("noderemediations", name)
    cordoned_at = condition(before, "Cordoned")["lastTransitionTime"]

    op.kill()  # SIGKILL in the middle of the drain step
    op.delete_dead_lease()
    release_pdb(pol, namespace)
    op2 = run_operator()

    done = wait_for(
        lambda: completed(o := objects.get("noderemediations", name)) and o,
        "incident completed after the restart",
        timeout=90,
    )
    assert completed(done) == "Replaced"
    assert len(objects.incidents(broken)) == 1, "the relisted XID Event opened nothing new"
    assert condition(done, "Cordoned")["lastTransitionTime"] == cordoned_at
    steps = [e["step"] for e in done["status"]["timeline"]]
    assert (steps.count("replace/cordon"), steps.count("replace/replace")) == (1, 1), steps
    claimed = [s for s in spares if objects.node(s).metadata.labels.get(CLAIMED_BY) == name]
    assert len(claimed) == 1, "exactly one spare claimed"
    assert done["status"]["replacementNode"] == claimed[0]

    # A third start: the same Event is listed again; it is recognised, nothing starts.
    op2.stop()
    op3 = run_operator()
    hold(lambda: len(objects.incidents(broken)) == 1, "one incident", 3)
    m = op3.metrics()
    assert m.get('gpuheal_signals_total{result="duplicate",source="events"}', 0) >= 1
    assert 'gpuheal_incidents_total{source="events",trigger="xid"}' not in m


def test_dry_run_records_the_plan_and_changes_nothing(
    sandbox: Sandbox,
    namespace: str,
    xid79_scene: Callable[..., Xid79Scene],
    objects: Objects,
) -> None:
    core = sandbox.core_v1()
    scene = xid79_scene(dryRun=True)
    broken, (spare,) = scene.broken, scene.spares
    core.create_namespaced_pod(namespace, pod_on(broken, "bystander", {"app": "b"}))
    wait_for(
        lambda: core.read_namespaced_pod("bystander", namespace).status.phase == "Running",
        "pod Running",
    )
    scene.start()
    scene.xid()
    done = scene.completed("dry-run incident", timeout=60)
    assert completed(done) == "DryRun"
    assert done["spec"]["dryRun"] is True
    for type_ in ("Cordoned", "SlurmDrained", "Drained", "ReplacementClaimed"):
        c = condition(done, type_)
        assert (c["status"], c["reason"]) == ("False", "DryRun"), c
    node = objects.node(broken)
    assert not node.spec.unschedulable
    assert CORDONED_BY not in (node.metadata.annotations or {})
    assert CLAIMED_BY not in objects.node(spare).metadata.labels
    assert core.read_namespaced_pod("bystander", namespace).status.phase == "Running"


def test_a_dry_run_alert_leaves_detected_as_it_was(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """An alert step has no condition of its own: in a dry run it must not write Detected
    False (the next pass would then open the incident again: a second Detected entry, a
    second 'opened', the ladder back to its first rung)."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = cordon_only_rule(94)
    rule["ladder"][0]["steps"].insert(0, {"action": "alert"})
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], dryRun=True))
    run_operator()
    simulate_xid(core, node, 94)
    done = wait_for(lambda: completed(o := objects.incident(node)) and o, "dry-run incident")
    assert completed(done) == "DryRun", dump(done["status"])
    detected = condition(done, "Detected")
    assert detected["status"] == "True", dump(detected)
    steps = [e["step"] for e in done["status"]["timeline"]]
    assert steps.count("Detected") == 1, steps
    assert "cordon/alert" in steps, steps
    assert condition(done, "Cordoned")["reason"] == "DryRun"
    assert not objects.node(node).spec.unschedulable


def test_storm_breaker_stops_at_max_unhealthy(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    nodes = case(10)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    objects.apply(
        "remediationpolicies", policy(pname, f"{cid}-work", [cordon_only_rule(94)], max_unhealthy=2)
    )
    run_operator()
    struck = nodes[:4]  # 40% of the selected nodes at once
    for n in struck:
        simulate_xid(core, n, 94)
    wait_for(lambda: all(objects.incident(n) for n in struck), "4 incidents")

    def cordoned() -> list[str]:
        return [n for n in nodes if objects.node(n).spec.unschedulable]

    wait_for(lambda: len(cordoned()) == 2, "2 nodes cordoned")

    def held() -> list[str]:
        return [
            n
            for n in struck
            if (c := condition(objects.incident(n), "Blocked"))
            and c["status"] == "True"
            and c["reason"] == "CircuitBreakerOpen"
        ]

    blocked = wait_for(lambda: h if len(h := held()) == 2 else None, "2 held by the breaker")
    hold(lambda: len(cordoned()) == 2, "no more than maxUnhealthy cordoned", 3)
    assert set(blocked).isdisjoint(cordoned())
    pstatus = wait_for(
        lambda: (
            (c := condition(objects.get("remediationpolicies", pname), "CircuitBreakerOpen"))
            and c["status"] == "True"
            and objects.get("remediationpolicies", pname)["status"]
        ),
        "policy CircuitBreakerOpen=True",
    )
    assert pstatus["remediatingNodes"] == 2
    assert pstatus["allowedUnhealthy"] == 2
    events = [
        e
        for n in blocked
        for e in node_events(core, objects.incident(n)["metadata"]["name"], "NodeRemediation")
    ]
    assert any(
        e.reason == "RemediationBlocked" and "CircuitBreakerOpen" in e.message for e in events
    )
    policy_events = node_events(core, pname, "RemediationPolicy")
    assert [e.reason for e in policy_events] == ["CircuitBreakerOpen"]


def test_the_breaker_closes_when_the_storm_is_over_with_no_incident_left_waiting(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """The one incident held by the breaker is opted out (a person takes that node), so no
    incident is left to look for a slot; once the other two return to service the breaker
    must close by itself, and the policy say so: not stay open until the next fault (whose
    look would only then start the storm cooldown)."""
    core = sandbox.core_v1()
    nodes = case(6)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    rules = [cordon_only_rule(94, reset=True)]
    body = policy(pname, f"{cid}-work", rules, max_unhealthy=2, healthy_for="8s")
    objects.apply("remediationpolicies", body)
    run_operator()
    struck = nodes[:3]
    for n in struck:
        simulate_xid(core, n, 94)

    def reason(node: str) -> str | None:
        c = condition(objects.incident(node), "Blocked")
        return c["reason"] if c and c["status"] == "True" else None

    held = wait_for(
        lambda: [n for n in struck if objects.incident(n) and reason(n) == "CircuitBreakerOpen"],
        "one incident held by the breaker",
    )
    core.patch_node(held[0], {"metadata": {"labels": {OPT_OUT_LABEL: "true"}}})
    wait_for(lambda: reason(held[0]) == "OptedOut", "the held incident opted out")
    returned = [n for n in struck if n != held[0]]
    wait_for(
        lambda: all(completed(objects.incident(n)) == "Returned" for n in returned),
        "the other two returned to service", timeout=60,
    )  # fmt: skip
    breaker = wait_for(
        lambda: (
            (c := condition(objects.get("remediationpolicies", pname), "CircuitBreakerOpen"))
            and c["status"] == "False"
            and c
        ),
        "the breaker closed with no incident waiting",
        timeout=30,
    )
    assert breaker["reason"] == "BreakerClosed", breaker
    assert breaker["message"].startswith("0 of 6 nodes out of service"), breaker


def test_breaker_counts_nodes_kept_cordoned_after_their_incident_closed(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """With return to service off, a cordon-only incident closes at once but its node stays
    out of service: it must keep counting against maxUnhealthy (a storm once cordoned 179
    nodes against a limit of 50 this way, one closed incident at a time)."""
    core = sandbox.core_v1()
    nodes = case(10)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    body = policy(pname, f"{cid}-work", [cordon_only_rule(94)], max_unhealthy=2)
    body["spec"]["returnToService"] = {"enabled": False, "healthyFor": "1h"}
    objects.apply("remediationpolicies", body)
    run_operator()
    struck = nodes[:4]
    for n in struck:
        simulate_xid(core, n, 94)
    wait_for(lambda: all(objects.incident(n) for n in struck), "4 incidents")

    def cordoned() -> list[str]:
        return [n for n in nodes if objects.node(n).spec.unschedulable]

    wait_for(lambda: len(cordoned()) == 2, "2 nodes cordoned")
    done = wait_for(
        lambda: [n for n in struck if completed(objects.incident(n))], "an incident closed"
    )
    assert set(done) <= set(cordoned())
    hold(lambda: len(cordoned()) == 2, "no more than maxUnhealthy kept out of service", 6)


def test_return_to_service_uncordons_only_what_gpuheal_cordoned(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    ours, admins = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    core.patch_node(admins, {"spec": {"unschedulable": True}})  # a person cordoned it
    objects.apply(
        "remediationpolicies",
        policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(94, reset=True)], healthy_for="2s"),
    )
    run_operator()
    for n in (ours, admins):
        simulate_xid(core, n, 94)
    for n in (ours, admins):
        done = wait_for(
            lambda n=n: completed(o := objects.incident(n)) and o,
            f"{n} incident completed",
            timeout=60,
        )
        # gpuheal returns what it took out; the admin's cordon is nothing of gpuheal's to undo
        assert completed(done) == ("Returned" if n == ours else "NothingToUndo"), dump(done)
        reset = condition(done, "Reset")
        assert (reset["status"], reset["reason"]) == ("False", "NoopHook"), dump(reset)
    assert not objects.node(ours).spec.unschedulable
    assert CORDONED_BY not in (objects.node(ours).metadata.annotations or {})
    assert objects.node(admins).spec.unschedulable, "the admin's cordon stays"
    admin_inc = objects.incident(admins)
    assert condition(admin_inc, "Cordoned")["reason"] == "AlreadyCordonedByOther"
    assert admin_inc["status"]["ownership"]["cordoned"] is False


def test_a_noop_repair_and_no_check_claim_neither_repair_nor_verification(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """Noop hooks run nothing and no check is configured: Reset and Rebooted are False
    (NoopHook, a RemediationStepSkipped Event each, "skipped" in the node's FaultHistory),
    Verified is Unknown (NoCheck, saying nothing repaired the node), and the node returns on
    healthyFor alone, as its policy (returnToService.check None) allows."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = cordon_only_rule(94, reset=True)
    rule["ladder"][0]["steps"].append({"action": "reboot", "reboot": {"hook": {"type": "Noop"}}})
    objects.apply(
        "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="2s")
    )
    run_operator()
    simulate_xid(core, node, 94)
    done = wait_for(lambda: completed(o := objects.incident(node)) and o, "returned", timeout=60)
    assert completed(done) == "Returned", dump(done["status"])
    for type_, action in (("Reset", "reset"), ("Rebooted", "reboot")):
        c = condition(done, type_)
        assert c is not None, dump(done["status"])
        assert (c["status"], c["reason"]) == ("False", "NoopHook"), dump(c)
        assert f"{action} hook is Noop: nothing ran" in c["message"]
    verified = condition(done, "Verified")
    assert verified is not None, dump(done["status"])
    assert (verified["status"], verified["reason"]) == ("Unknown", "NoCheck"), dump(verified)
    assert "reset and reboot were skipped" in verified["message"], verified["message"]
    assert "status" not in done or done["status"].get("repair") is None
    name = done["metadata"]["name"]
    skipped = wait_for(
        lambda: [
            e
            for e in node_events(core, name, kind="NodeRemediation")
            if e.reason == "RemediationStepSkipped"
        ],
        "skip Events",
    )
    assert {("reset" in e.message, "reboot" in e.message) for e in skipped} >= {
        (True, False),
        (False, True),
    }, [e.message for e in skipped]
    events = node_events(core, name, kind="NodeRemediation")
    assert not [e for e in events if e.reason in ("Reset", "Rebooted")]

    def repairs() -> list[dict[str, Any]] | None:
        fh = objects.get("faulthistories", node) or {}
        entries = [
            e
            for e in (fh.get("status") or fh.get("spec") or {}).get("entries") or []
            if e.get("action") in ("reset", "reboot")
        ]
        return entries if len(entries) >= 2 else None

    for entry in wait_for(repairs, "repair entries in the FaultHistory"):
        assert entry["message"].startswith("skipped: "), entry


def test_condition_held_shorter_than_for_does_nothing_longer_remediates(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = {
        "name": "degraded",
        "signals": {"conditions": [{"type": "GpuDegraded", "status": "True", "for": "4s"}]},
        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    run_operator()
    set_ = lambda s: simulate_condition(  # noqa: E731
        core, node, type_="GpuDegraded", status=s, reason="Test", message="flapping"
    )
    set_("True")
    hold(lambda: objects.incident(node) is None, "no incident inside `for`", 2)
    set_("False")
    hold(
        lambda: objects.incident(node) is None and not objects.node(node).spec.unschedulable,
        "nothing after a short blip",
        4,
    )
    set_("True")
    nrem = wait_for(lambda: objects.incident(node), "incident after `for`", timeout=20)
    assert nrem["spec"]["signals"][0]["conditionType"] == "GpuDegraded"
    wait_for(lambda: objects.node(node).spec.unschedulable, "cordoned")


def test_opt_out_label_and_pause_are_respected(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    opted, paused_node = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    core.patch_node(opted, {"metadata": {"labels": {"gpuheal.io/opt-out": "true"}}})
    pname = f"p-{cid}"
    objects.apply(
        "remediationpolicies", policy(pname, f"{cid}-work", [cordon_only_rule(94)], paused=True)
    )
    run_operator()
    simulate_xid(core, opted, 94)
    simulate_xid(core, paused_node, 94)
    nrem = wait_for(
        lambda: (
            (o := objects.incident(paused_node))
            and (c := condition(o, "Blocked"))
            and c["reason"] == "Paused"
            and o
        ),
        "paused incident says why",
    )
    hold(lambda: not objects.node(paused_node).spec.unschedulable, "pause changes nothing", 2)
    assert objects.incident(opted) is None
    assert not objects.node(opted).spec.unschedulable
    assert any(
        e.reason == "RemediationBlocked" and "opted out" in e.message
        for e in node_events(core, opted)
    )
    objects.patch("remediationpolicies", pname, {"spec": {"safety": {"paused": False}}})
    wait_for(lambda: objects.node(paused_node).spec.unschedulable, "cordoned once unpaused")
    assert objects.incident(paused_node)["metadata"]["name"] == nrem["metadata"]["name"]


def test_a_second_copy_stands_by_until_the_lease_is_free(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    first_node, second_node = case(2)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(94)]))
    active = run_operator()
    standby = run_operator(wait_started=False)
    wait_for(lambda: "standing by" in standby.log(), "second copy standing by")
    simulate_xid(core, first_node, 94)
    wait_for(lambda: objects.node(first_node).spec.unschedulable, "cordoned by the active copy")
    assert "gpuheal started" not in standby.log()
    assert len(objects.incidents(first_node)) == 1
    active.stop()  # releases the Lease
    wait_for(lambda: "gpuheal started" in standby.log(), "standby takes over", timeout=30)
    simulate_xid(core, second_node, 94)
    wait_for(lambda: objects.node(second_node).spec.unschedulable, "cordoned by the new holder")


def test_a_standby_with_a_skewed_clock_never_leads_beside_the_holder(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """Clocks a minute apart (these copies' Lease: 6 s). A standby whose clock runs ahead
    reads the holder's renewTime as a minute old; one whose clock runs behind reads it as a
    minute ahead. Neither may matter: a standby takes the Lease after 6 s of no change on its
    own monotonic clock, not before, and not a minute late. 6 s, not 3: a 3 s Lease's 2 s
    renew deadline is shorter than the event loop can stall at load 10-15 (4 xdist workers
    beside other sandboxes), and the holder then exits as it must, failing the hold."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(94)]))
    short = ("--lease-duration", "6")
    holder = run_operator(*short)
    ahead = run_operator(*short, wait_started=False, env={"GPUHEAL_TEST_CLOCK_SKEW": "60"})
    wait_for(lambda: "standing by" in ahead.log(), "the ahead copy standing by")
    assert holder.proc is not None
    hold(
        lambda: "gpuheal started" not in ahead.log() and holder.proc.poll() is None,
        "one leader while the holder renews",
        12,
    )
    assert "lost Lease" not in holder.log()
    holder.kill()  # no release: the Lease stops changing
    wait_for(lambda: "gpuheal started" in ahead.log(), "the ahead copy takes over", timeout=30)
    simulate_xid(core, node, 94)
    wait_for(lambda: objects.node(node).spec.unschedulable, "cordoned by the new holder")
    behind = run_operator(*short, wait_started=False, env={"GPUHEAL_TEST_CLOCK_SKEW": "-60"})
    wait_for(lambda: "standing by" in behind.log(), "the behind copy standing by")
    hold(lambda: "gpuheal started" not in behind.log(), "still one leader", 6)
    ahead.kill()
    # The Lease says it was renewed a minute in the behind copy's future: it waits 6 s of no
    # change (and its 1 s poll), not until its clock reaches that renewTime.
    wait_for(lambda: "gpuheal started" in behind.log(), "the behind copy takes over", timeout=30)


def test_replace_waits_for_approval_across_a_sigkill(
    xid79_scene: Callable[..., Xid79Scene],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    scene = xid79_scene(requireApproval=["replace"])
    spare = scene.spares[0]
    op = scene.start()
    scene.xid()
    nrem = wait_for(
        lambda: (o := scene.incident())
        and (c := condition(o, "Blocked")) and c["reason"] == "ApprovalPending" and o,
        "replace waits for approval",
    )  # fmt: skip
    name = nrem["metadata"]["name"]
    assert "gpuheal.io/approve=replace" in condition(nrem, "Blocked")["message"]
    assert condition(nrem, "Drained")["status"] == "True"
    op.kill()
    op.delete_dead_lease()
    run_operator()
    hold(lambda: CLAIMED_BY not in objects.node(spare).metadata.labels, "no spare unapproved", 2)
    objects.patch("noderemediations", name,
                  {"metadata": {"annotations": {"gpuheal.io/approve": "replace"}}})  # fmt: skip
    done = wait_for(lambda: completed(o := objects.get("noderemediations", name)) and o,
                    "replaced once approved")  # fmt: skip
    assert completed(done) == "Replaced"
    assert objects.node(spare).metadata.labels[CLAIMED_BY] == name
    steps = [e["step"] for e in done["status"]["timeline"]]
    assert (steps.count("replace/cordon"), steps.count("replace/drain")) == (1, 1), steps


def test_reset_when_idle_waits_for_the_pods_to_leave(
    sandbox: Sandbox,
    namespace: str,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work",
                                                 [cordon_only_rule(94, reset=True)]))  # fmt: skip
    core.create_namespaced_pod(namespace, pod_on(node, "job", {"app": "j"}))
    wait_for(lambda: core.read_namespaced_pod("job", namespace).status.phase == "Running", "pod")
    run_operator()
    simulate_xid(core, node, 94)
    nrem = wait_for(
        lambda: (o := objects.incident(node))
        and (c := condition(o, "Blocked")) and c["reason"] == "WaitingForIdle" and o,
        "reset waits for the node to be idle",
    )  # fmt: skip
    assert f"{namespace}/job" in condition(nrem, "Blocked")["message"]
    core.delete_namespaced_pod("job", namespace, grace_period_seconds=0)
    # once idle the (Noop) reset step runs: skipped, nothing ran
    wait_for(lambda: (c := condition(objects.incident(node), "Reset"))
             and c["reason"] == "NoopHook", "reset once idle")  # fmt: skip


def test_overlapping_policies_neither_acts_and_both_say_so(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    for name in (f"a-{cid}", f"b-{cid}"):
        objects.apply("remediationpolicies", policy(name, f"{cid}-work", [cordon_only_rule(94)]))
    run_operator()
    for name, other in ((f"a-{cid}", f"b-{cid}"), (f"b-{cid}", f"a-{cid}")):
        c = wait_for(
            lambda name=name: (c := condition(objects.get("remediationpolicies", name),
                                              "Overlapping")) and c["status"] == "True" and c,
            f"{name} Overlapping",
        )  # fmt: skip
        assert other in c["message"]
        assert node in c["message"]
    simulate_xid(core, node, 94)
    hold(lambda: objects.incident(node) is None and not objects.node(node).spec.unschedulable,
         "no policy acts on a contested node", 3)  # fmt: skip


def test_no_api_writes_while_nothing_is_wrong(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    nodes = case(5)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [cordon_only_rule(94)]))
    run_operator()
    wait_for(lambda: (objects.get("remediationpolicies", pname).get("status") or {}).get(
        "selectedNodes") == 5, "first status write")  # fmt: skip

    def versions() -> dict[str, str]:
        out = {n: objects.node(n).metadata.resource_version for n in nodes}
        out[pname] = objects.get("remediationpolicies", pname)["metadata"]["resourceVersion"]
        return out

    before = versions()
    hold(lambda: versions() == before, "nodes and policy untouched", 8, every=1)
    for n in nodes:
        annotations = objects.node(n).metadata.annotations or {}
        assert not [k for k in annotations if "kopf" in k or k.startswith("gpuheal.io/")]
