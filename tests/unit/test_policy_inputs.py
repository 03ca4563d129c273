"""From API objects to the engine's inputs: incident names, the compact node view, Event
dedupe keys, the drain filter, conditions and how a signal is recorded on an incident."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuheal.api.meta import ConditionStatus, rfc3339_ms, set_condition
from gpuheal.api.names import CORDONED_BY_ANNOTATION, incident_name
from gpuheal.cli.simulate import condition_patch, kernel_line, xid_event
from gpuheal.policy import pods_to_evict
from gpuheal.policy.engine import faults, same_fault
from gpuheal.policy.inputs import (
    NodeEvent,
    event_observation,
    event_observations,
    kept_conditions,
    node_event,
    node_view,
    signal_record,
)
from gpuheal.policy.select import pod_is_evicted_by_drain
from gpuheal.policy.types import Observation
from gpuheal.xid.identity import parse_gpu_map
from gpuheal.xid.parse import parse_event

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)


def test_incident_name_is_deterministic_short_and_a_dns_label() -> None:
    a = incident_name("gpu-node-0", "event/u1/1")
    assert a == incident_name("gpu-node-0", "event/u1/1")
    assert a != incident_name("gpu-node-0", "event/u1/2")
    long = incident_name("Node.With.Dots." + "x" * 300, "k")
    assert len(long) <= 63  # the bridge's incident id grammar
    assert long == long.lower()


@given(st.text(min_size=1, max_size=300), st.text(max_size=50))
def test_incident_name_always_fits_the_bridge_grammar(node: str, key: str) -> None:
    import re

    name = incident_name(node, key)
    assert re.fullmatch(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?", name)


def node_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": "n1",
            "uid": "u1",
            "labels": {"pool": "train", "gpuheal.io/claimed-by": "nrem-x"},
            "annotations": {CORDONED_BY_ANNOTATION: "nrem-y", "big": "x" * 10000},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"unschedulable": True, "taints": [{"key": "t", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastTransitionTime": "2026-11-22T05:00:00Z"},
                {"type": "MemoryPressure", "status": "False"},
                {"type": "GpuXid", "status": "True", "reason": "Xid79"},
            ],
            "images": [{"names": ["a" * 200]}] * 50,
        },
    }  # fmt: skip
    body.update(over)
    return body


def test_node_view_keeps_only_what_gpuheal_reads() -> None:
    v = node_view(node_body())
    assert (v.name, v.uid, v.unschedulable, v.ready) == ("n1", "u1", True, True)
    assert v.cordoned_by == "nrem-y"
    assert v.claimed_by == "nrem-x"
    assert v.taints == ("t",)
    assert [c.type for c in v.conditions] == ["Ready", "GpuXid"]  # kubelet pressure dropped
    assert v.condition("Ready").last_transition_time == dt.datetime(2026, 11, 22, 5, tzinfo=dt.UTC)  # type: ignore[union-attr]
    assert not hasattr(v, "__dict__")  # slots: no per-object dict


def test_node_view_is_total() -> None:
    assert node_view({}).name == ""
    assert node_view({"status": {"conditions": [{"status": "x"}, None.__class__]}}).conditions == ()  # type: ignore[list-item]


def test_event_dedupe_key_is_uid_and_count_and_repeats_differ() -> None:
    body = xid_event({"metadata": {"name": "n1", "uid": "nu"}}, kernel_line(79))
    body["metadata"]["uid"] = "e1"
    ev = node_event(body)
    assert ev is not None
    assert ev.dedupe_key == "event/e1/1"
    body["count"] = 2
    assert node_event(body).dedupe_key == "event/e1/2"  # type: ignore[union-attr]
    body["series"] = {"count": 5, "lastObservedTime": "2026-11-22T06:00:00Z"}
    again = node_event(body)
    assert again is not None
    assert again.dedupe_key == "event/e1/5"
    assert again.last_seen == NOW
    assert node_event({"involvedObject": {"kind": "Pod", "name": "p"}}) is None


def test_simulated_event_is_read_as_the_xid_it_carries() -> None:
    body = xid_event({"metadata": {"name": "n1", "uid": "nu"}}, kernel_line(94, pci="0000:5e:00"))
    body["metadata"]["uid"] = "e9"
    ev = node_event(body)
    assert ev is not None
    assert (ev.reason, ev.type, ev.component) == ("GpuXid", "Warning", "kernel-monitor")
    signal = event_observation(ev, NOW)
    assert signal is not None
    assert (signal.xid, signal.gpu, signal.event_uid) == (94, "0000:5e:00", "e9")
    parsed = parse_event(ev.reason, ev.message)
    assert parsed is not None
    assert parsed.xid == 94
    normal = NodeEvent("u", "n1", "RegisteredNode", "Registered", 1, NOW, type="Normal")
    assert event_observation(normal, NOW) is None


def test_condition_patch_only_names_its_own_condition() -> None:
    patch = condition_patch("GpuXid", "True", "Xid79", "line")
    (cond,) = patch["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("GpuXid", "True", "Xid79")


def pod(kind: str | None = None, phase: str = "Running", mirror: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if kind:
        meta["ownerReferences"] = [{"kind": kind, "name": "o"}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "x"}
    return {"metadata": meta, "status": {"phase": phase}}


def test_drain_skips_daemonset_mirror_and_finished_pods() -> None:
    assert pod_is_evicted_by_drain(pod())
    assert pod_is_evicted_by_drain(pod("ReplicaSet"))
    assert not pod_is_evicted_by_drain(pod("DaemonSet"))
    assert not pod_is_evicted_by_drain(pod(mirror=True))
    assert not pod_is_evicted_by_drain(pod(phase="Succeeded"))
    assert len(pods_to_evict([pod(), pod("DaemonSet"), pod(phase="Failed")])) == 1


def test_set_condition_moves_transition_time_only_on_change() -> None:
    later = NOW + dt.timedelta(minutes=5)
    true, false = ConditionStatus.TRUE, ConditionStatus.FALSE
    conds = set_condition([], type_="Blocked", status=true, reason="A", message="m", now=NOW)
    same = set_condition(conds, type_="Blocked", status=true, reason="B", message="n", now=later)
    assert same[0].last_transition_time == NOW
    assert same[0].reason == "B"
    flipped = set_condition(same, type_="Blocked", status=false, reason="C", message="", now=later)
    assert flipped[0].last_transition_time == later
    assert flipped[0].status is false
    assert rfc3339_ms(NOW) == "2026-11-22T06:00:00.000Z"


def test_signal_record_fits_the_crd_model() -> None:
    obs = Observation(NOW, xid=79, gpu="0000:3b:00", event_uid="e", source="events", key="k",
                      event_reason="GpuXid", message="m")  # fmt: skip
    rec = signal_record(obs).to_k8s()
    assert rec == {"source": "Event", "observedAt": "2026-11-22T06:00:00Z", "xid": 79,
                   "pciBusId": "0000:3b:00", "eventReason": "GpuXid", "eventUid": "e",
                   "message": "m"}  # fmt: skip
    uuid = "GPU-12345678-1234-1234-1234-123456789abc"
    dcgm = signal_record(Observation(NOW, xid=48, gpu=uuid, source="dcgm", key="k"))
    assert dcgm.to_k8s()["gpuUuid"] == uuid
    assert dcgm.to_k8s()["source"] == "DcgmExporter"


UUID_A = "GPU-12345678-1234-1234-1234-123456789abc"


def _event(message: str, uid: str, *, reason: str = "GpuXid") -> NodeEvent:
    return NodeEvent(uid, "n1", reason, message, 1, NOW)


def test_one_gpu_one_key_whatever_the_source_names() -> None:
    """An Event naming the GPU by PCI address, one naming it by UUID only (mapped through the
    agent's annotation) and dcgm-exporter's both-labels sample are the same GPU."""
    by_pci = event_observation(_event(kernel_line(94, pci="0000:3b:00"), "e1"), NOW)
    by_uuid = event_observation(_event(f"XID 94 on {UUID_A}", "e2"), NOW, parse_gpu_map(
        f'{{"0000:3b:00": "{UUID_A}"}}'))  # fmt: skip
    assert by_pci is not None
    assert by_uuid is not None
    assert by_pci.gpu == by_uuid.gpu == "0000:3b:00"
    unmapped = event_observation(_event(f"XID 94 on {UUID_A}", "e3"), NOW)
    assert unmapped is not None
    assert unmapped.gpu == UUID_A  # still stable, just not joinable with PCI-only sources


def test_a_message_naming_two_gpus_is_two_observations() -> None:
    lines = kernel_line(48, pci="0000:3b:00") + "\n" + kernel_line(48, pci="0000:5e:00")
    found = event_observations(_event(lines, "e1"), NOW)
    assert [(o.xid, o.gpu) for o in found] == [(48, "0000:3b:00"), (48, "0000:5e:00")]
    assert len({o.key for o in found}) == 2


def test_npds_two_events_for_one_fall_off_the_bus_are_one_fault() -> None:
    """node-problem-detector posts the XID 79 line and the driver's "fallen off the bus"
    message as two Events: one fault, so the first XID 79 stays on the first rung."""
    xid_line = event_observation(_event(kernel_line(79, pci="0000:3b:00"), "e1"), NOW)
    fallen = event_observation(
        _event("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", "e2"), NOW
    )
    assert xid_line is not None
    assert fallen is not None
    assert (fallen.xid, fallen.gpu) == (79, "0000:3b:00")
    assert xid_line.reporter != fallen.reporter
    assert same_fault(xid_line, fallen)
    assert faults([xid_line, fallen]) == [[xid_line, fallen]]
    # the same reporter again is a repeat (a second fault), not a second report
    again = event_observation(_event(kernel_line(79, pci="0000:3b:00"), "e3"), NOW)
    assert again is not None
    assert not same_fault(xid_line, again)
    assert len(faults([xid_line, fallen, again])) == 2


def test_a_reset_moved_past_without_its_condition_true_is_a_skipped_repair() -> None:
    from gpuheal.api.noderemediation import NodeRemediation
    from gpuheal.api.remediationpolicy import Action
    from gpuheal.policy.inputs import skipped_repairs

    def nrem(reset_status: str, reason: str) -> NodeRemediation:
        conditions = [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
            for t, s, r in (("Cordoned", "True", "Cordoned"), ("Reset", reset_status, reason))
        ]
        return NodeRemediation.model_validate(
            {
                "metadata": {"name": "nrem-1"},
                "spec": {
                    "nodeName": "n1",
                    "policyRef": {"name": "p"},
                    "rule": "r",
                    "signals": [{"source": "Event", "observedAt": "2025-01-01T00:00:00Z"}],
                    "ladder": [{"name": "reset", "steps": [{"action": "cordon"}]}],
                },
                "status": {"conditions": conditions},
            }
        )

    done = {Action.CORDON, Action.RESET}
    assert skipped_repairs(nrem("False", "NoopHook"), done) == {Action.RESET}
    assert skipped_repairs(nrem("True", "GpusReported"), done) == frozenset()


def _pressure_policy(*types: str) -> Any:
    from tests.unit.test_policy_select import make_policy

    rule = {
        "name": "pressure",
        "signals": {"conditions": [{"type": t, "status": "True"} for t in types]},
        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
    }
    return make_policy(rules=[rule])


def test_a_kubelet_condition_a_rule_names_is_kept_the_others_dropped() -> None:
    keep = kept_conditions([_pressure_policy("MemoryPressure", "GpuDegraded").spec])
    assert keep == {"MemoryPressure"}  # not GpuDegraded: only kubelet conditions are dropped
    body = node_body()
    body["status"]["conditions"].append({"type": "DiskPressure", "status": "True"})
    assert [c.type for c in node_view(body, keep).conditions] == [
        "Ready",
        "MemoryPressure",
        "GpuXid",
    ]
