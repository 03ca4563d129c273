"""The engine with a memory: repeats counted from the node's FaultHistory (and the same GPU
elsewhere), verification before return, failure climbing the ladder, repair after a
replacement back to the pool, retire, and the counting of replaced nodes. Plain values for
time; no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.api import Action, RemediationPolicy, RemediationPolicySpec
from gpuheal.api.faulthistory import EntryKind, FaultHistory, HistoryEntry
from gpuheal.api.names import Reason
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import Step
from gpuheal.policy import admit, cluster_counts, decide
from gpuheal.policy import faultrecord as fh
from gpuheal.policy.engine import human_window, repeat_phrase
from gpuheal.policy.inputs import done_actions, incident_view
from gpuheal.policy.types import (
    Act,
    Blocked,
    ClusterCounts,
    History,
    IncidentSummary,
    IncidentView,
    Move,
    NodeCondition,
    NodeView,
    Observation,
    PoolCounts,
    VerificationState,
    Wait,
)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
UUID = "GPU-8f6c1a2b-1111-2222-3333-444455556666"
READY = NodeCondition("Ready", "True", T0 - 30 * DAY)
NODE = NodeView(name="gpu-7", labels={"pool": "a"}, conditions=[READY])
CALM = ClusterCounts(selected=100, unhealthy=1, remediating=0)
CHECK_JOB = {"namespace": "gpuheal-system", "template": {"template": {"spec": {}}}}


def spec(rules: list[dict[str, Any]], **rts: Any) -> RemediationPolicySpec:
    doc = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "a"}},
            "rules": rules,
            "safety": {"maxUnhealthy": 2, "stormCooldown": "0s"},
            "returnToService": {"healthyFor": "10m", **rts},
        },
    }
    return RemediationPolicy.model_validate(doc).spec


ECC = {
    "name": "ecc",
    "signals": {"xids": [94]},
    "escalation": {"occurrences": 3, "window": "168h", "scope": "Gpu"},
    "ladder": [
        {"name": "requeue", "steps": [{"action": "cordon"}]},
        {
            "name": "replace",
            "steps": [
                {"action": "cordon"},
                {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}},
            ],
        },
    ],
}
SLURM_REBOOT = {"action": "reboot", "reboot": {"hook": {"type": "Slurm"}}}
FELL_OFF = {
    "name": "fell-off-bus",
    "signals": {"xids": [79]},
    "escalation": {"occurrences": 2, "window": "24h", "scope": "Node"},
    "ladder": [
        {"name": "power-cycle", "steps": [{"action": "cordon"}, SLURM_REBOOT]},
        {
            "name": "replace",
            "steps": [
                {"action": "cordon"},
                {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}},
                SLURM_REBOOT,
            ],
        },
    ],
}


PCI = "0000:3b:00"


def xid(
    code: int, at: dt.datetime, gpu: str = PCI, *, gpu_uuid: str | None = UUID, **kw: Any
) -> Observation:
    """An XID on the GPU keyed by its PCI address (the canonical key), UUID known."""
    return Observation(time=at, xid=code, gpu=gpu, gpu_uuid=gpu_uuid, **kw)


def incident(policy: RemediationPolicySpec, rule: str, rung: int, **kw: Any) -> IncidentView:
    r = next(r for r in policy.rules if r.name == rule)
    done = frozenset(s.action for s in r.ladder[rung].steps)
    base = dict(
        rule=rule,
        ladder=r.ladder,
        rung=rung,
        started_at=T0 - HOUR,
        done=done,
        last_step_at=T0 - 50 * MIN,
        cordoned_by_us=True,
        slurm_drained_by_us=True,
        holds_slot=True,
        name="nrem-gpu-7-abc",
    )
    base.update(kw)
    return IncidentView(**base)  # type: ignore[arg-type]


# --- repeats from the history ---------------------------------------------------------------


def test_third_xid94_on_one_gpu_escalates_from_history_read_back_after_a_restart() -> None:
    """The first two XIDs are known only from the FaultHistory (source=history): what a
    restarted operator has after the Events expired."""
    policy = spec([ECC])
    past = [xid(94, T0 - 3 * DAY, source="history"), xid(94, T0 - DAY, source="history")]
    new = xid(94, T0, source="events", key="event/u3/1")
    decision = decide(policy, NODE, History(observations=[*past, new]), CALM, T0, new=new)
    assert isinstance(decision, Act)
    assert decision.operation is Move.OPEN
    assert decision.trigger is not None
    assert (decision.rung, decision.trigger.count) == (1, 3)
    assert decision.trigger.repeat == f"3rd XID 94 on {UUID} in 7d"
    # Without the history the same signal opens on the first rung.
    alone = decide(policy, NODE, History(observations=[new]), CALM, T0, new=new)
    assert isinstance(alone, Act)
    assert alone.rung == 0


@pytest.mark.parametrize(("age", "rung"), [(6 * DAY, 1), (8 * DAY, 0)])
def test_a_seven_day_window_counts_back_dated_history(age: dt.timedelta, rung: int) -> None:
    rule = {
        "name": "gpu-reset",
        "signals": {"xids": [48]},
        "escalation": {"occurrences": 2, "window": "168h", "scope": "Gpu"},
        "ladder": [
            {"name": "reset", "steps": [{"action": "cordon"}]},
            {"name": "reboot", "steps": [{"action": "cordon"}, SLURM_REBOOT]},
        ],
    }
    policy = spec([rule])
    new = xid(48, T0)
    history = History(observations=[xid(48, T0 - age, source="history"), new])
    decision = decide(policy, NODE, history, CALM, T0, new=new)
    assert isinstance(decision, Act)
    assert decision.rung == rung


def test_a_moved_gpu_brings_its_record_per_gpu_not_per_node() -> None:
    policy = spec([ECC])
    # The same GPU (its UUID) in another node's slot: another PCI address there.
    elsewhere = [xid(94, T0 - 2 * DAY, gpu="0000:5e:00"), xid(94, T0 - DAY, gpu="0000:5e:00")]
    new = xid(94, T0)
    decision = decide(
        policy, NODE, History(observations=[new], elsewhere=elsewhere), CALM, T0, new=new
    )
    assert isinstance(decision, Act)
    assert decision.rung == 1
    other_gpu = xid(94, T0, gpu_uuid="GPU-00000000-1111-2222-3333-444455556666")
    decision = decide(
        policy, NODE, History(observations=[other_gpu], elsewhere=elsewhere), CALM, T0,
        new=other_gpu,
    )  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.rung == 0
    node_scope = {**ECC, "escalation": {"occurrences": 3, "window": "168h", "scope": "Node"}}
    decision = decide(
        spec([node_scope]), NODE, History(observations=[new], elsewhere=elsewhere), CALM, T0,
        new=new,
    )  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.rung == 0, "other nodes' faults are not ours"


def test_escalation_of_an_open_incident_says_how_often_in_words() -> None:
    policy = spec([ECC])
    inc = incident(policy, "ecc", 0, started_at=T0 - HOUR)
    obs = [xid(94, T0 - 2 * DAY), xid(94, T0 - 2 * HOUR), xid(94, T0 - MIN)]
    decision = decide(policy, NODE, History(observations=obs, incident=inc), CALM, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.ESCALATE
    assert decision.message.startswith(f"3rd XID 94 on {UUID} in 7d: rung requeue -> replace")


def test_words() -> None:
    assert human_window("168h") == "7d"
    assert human_window("24h") == "24h"
    assert human_window("720h") == "30d"
    assert (
        repeat_phrase(2, xid(79, T0), "24h", per_gpu=False, node="n1") == "2nd XID 79 on n1 in 24h"
    )
    assert repeat_phrase(11, xid(48, T0, gpu_uuid=None), "1h", per_gpu=True) == (
        "11th XID 48 on GPU 0000:3b:00 in 1h"
    )


# --- verification before return, failure climbing ---------------------------------------------


CHECKED = spec([FELL_OFF], check={"type": "Job", "job": CHECK_JOB})


def test_after_the_reboot_the_check_runs_before_any_return() -> None:
    inc = incident(CHECKED, "fell-off-bus", 0)
    decision = decide(CHECKED, NODE, History(observations=[xid(79, T0 - HOUR)], incident=inc),
                      CALM, T0)  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.operation is Move.VERIFY
    assert decision.restart is True


def test_a_running_check_is_looked_at_not_restarted() -> None:
    run = VerificationState(started_at=T0 - 5 * MIN)
    inc = incident(CHECKED, "fell-off-bus", 0, verification=run)
    decision = decide(CHECKED, NODE, History(observations=[xid(79, T0 - HOUR)], incident=inc),
                      CALM, T0)  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.operation is Move.VERIFY
    assert decision.restart is False


def test_healthy_for_counts_from_the_passed_check_then_returns() -> None:
    run = VerificationState(started_at=T0 - 20 * MIN, passed_at=T0 - 5 * MIN)
    inc = incident(CHECKED, "fell-off-bus", 0, verification=run)
    history = History(observations=[xid(79, T0 - HOUR)], incident=inc)
    waiting = decide(CHECKED, NODE, history, CALM, T0)
    assert isinstance(waiting, Wait)
    assert waiting.until == T0 + 5 * MIN
    assert waiting.reason == Reason.HYSTERESIS_PENDING
    done = decide(CHECKED, NODE, history, CALM, T0 + 6 * MIN)
    assert isinstance(done, Act)
    assert done.operation is Move.RETURN_TO_SERVICE
    assert (done.uncordon, done.resume_slurm, done.to_pool) == (True, True, None)


def test_a_signal_after_the_check_passed_runs_it_again() -> None:
    run = VerificationState(started_at=T0 - 20 * MIN, passed_at=T0 - 15 * MIN)
    inc = incident(CHECKED, "fell-off-bus", 0, verification=run, started_at=T0 - 2 * HOUR)
    history = History(observations=[xid(79, T0 - 90 * MIN), xid(13, T0 - 10 * MIN)], incident=inc)
    decision = decide(CHECKED, NODE, history, CALM, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.VERIFY
    assert decision.restart


def test_a_failed_check_climbs_the_ladder_and_on_the_last_rung_fails() -> None:
    failed = VerificationState(started_at=T0 - 5 * MIN, failed_at=T0 - MIN, message="dcgmi: 1")
    low = incident(CHECKED, "fell-off-bus", 0, verification=failed)
    decision = decide(CHECKED, NODE, History(incident=low), CALM, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.ESCALATE
    assert (decision.rung, decision.reason) == (1, Reason.VERIFICATION_FAILED)
    top = incident(CHECKED, "fell-off-bus", 1, verification=failed, replaced_by="spare-1")
    decision = decide(CHECKED, NODE, History(incident=top), CALM, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.CLOSE
    assert decision.reason == Reason.VERIFICATION_FAILED


def test_a_reboot_that_did_not_happen_climbs_the_ladder() -> None:
    inc = incident(CHECKED, "fell-off-bus", 0, repair_failed="boot time unchanged after 20m")
    decision = decide(CHECKED, NODE, History(incident=inc), CALM, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.ESCALATE
    assert decision.reason == Reason.REPAIR_FAILED
    assert "boot time unchanged" in decision.message


def test_dry_run_would_verify() -> None:
    inc = incident(CHECKED, "fell-off-bus", 0, dry_run=True)
    decision = decide(CHECKED, NODE, History(incident=inc), CALM, T0)
    assert isinstance(decision, Blocked)
    assert decision.reason == Reason.DRY_RUN


# --- repaired after a replacement: back to the pool when it runs low -----------------------------


@pytest.mark.parametrize(
    ("pool", "to_pool"),
    [(PoolCounts(available=0, min_available=1), "spares"), (PoolCounts(2, 1), None)],
)
def test_a_repaired_replaced_node_refills_its_pool_when_low(
    pool: PoolCounts, to_pool: str | None
) -> None:
    run = VerificationState(started_at=T0 - 30 * MIN, passed_at=T0 - 20 * MIN)
    inc = incident(CHECKED, "fell-off-bus", 1, verification=run, replaced_by="spare-1")
    counts = dataclasses.replace(CALM, pools={"spares": pool})
    decision = decide(CHECKED, NODE, History(incident=inc), counts, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE
    assert decision.to_pool == to_pool


def test_replace_as_the_last_step_hands_the_node_to_repair() -> None:
    policy = spec([ECC])
    inc = incident(policy, "ecc", 1, replaced_by="spare-1")
    decision = decide(policy, NODE, History(observations=[xid(94, T0 - HOUR)] * 3, incident=inc),
                      CALM, T0)  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.operation is Move.CLOSE
    assert decision.reason == Reason.REPLACED


def test_retire_closes_for_good_and_is_never_first_sight_for_94() -> None:
    rule = {
        "name": "ecc",
        "signals": {"xidClasses": ["ContainedMemory"]},
        "ladder": [{"name": "out", "steps": [{"action": "cordon"}]}],
    }
    policy = spec([rule])
    # The CRD refuses retire on the first rung here now; a policy stored before that rule
    # existed still has it, and the engine must still guard the first sight.
    policy.rules[0].ladder[0].steps.append(Step(action=Action.RETIRE))
    new = xid(94, T0)
    opened = decide(policy, NODE, History(observations=[new]), CALM, T0, new=new)
    assert isinstance(opened, Act)
    assert opened.trigger is not None
    assert [s.action for s in opened.trigger.steps] == [Action.CORDON]
    inc = incident(policy, "ecc", 0)  # cordon and retire done
    closed = decide(policy, NODE, History(incident=inc), CALM, T0)
    assert isinstance(closed, Act)
    assert closed.reason == Reason.RETIRED


def test_a_later_rung_repeats_a_reboot_an_earlier_rung_did() -> None:
    body = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "NodeRemediation",
        "metadata": {"name": "nrem-x"},
        "spec": {
            "nodeName": "gpu-7",
            "policyRef": {"name": "p"},
            "rule": "fell-off-bus",
            "signals": [{"source": "Event", "observedAt": T0.isoformat(), "xid": 79}],
            "ladder": [
                r.model_dump(by_alias=True, exclude_none=True) for r in CHECKED.rules[0].ladder
            ],
        },
        "status": {
            "rung": 1,
            "timeline": [
                {"time": T0.isoformat(), "step": "power-cycle/cordon"},
                {"time": T0.isoformat(), "step": "power-cycle/reboot"},
            ],
        },
    }
    nrem = NodeRemediation.model_validate(body)
    assert done_actions(nrem) == (frozenset({Action.CORDON, Action.REBOOT}), T0)
    view = incident_view(nrem, approve_annotation="gpuheal.io/approve")
    assert view.done == frozenset({Action.CORDON})


# --- counting: replaced nodes no longer hold a slot ----------------------------------------------


def test_twenty_replaced_nodes_waiting_for_repair_do_not_trip_the_breaker() -> None:
    replaced = [
        IncidentSummary(
            name=f"nrem-{i}", node=f"n{i}", policy="p", active=False, holds_slot=False,
            replacement=f"spare-{i}", slot_taken_at=T0 - DAY,
        )
        for i in range(20)
    ]  # fmt: skip
    kept_out = [
        NodeView(name=f"n{i}", unschedulable=True, cordoned_by=f"nrem-{i}") for i in range(20)
    ]
    counts = cluster_counts("p", 125, replaced, kept_out)
    assert counts.remediating == 0
    policy = spec([ECC])
    assert admit(policy.safety, counts, T0).blocked is None
    # Without a replacement, the same nodes kept out do count (and block).
    unreplaced = [dataclasses.replace(i, replacement=None) for i in replaced]
    assert cluster_counts("p", 125, unreplaced, kept_out).remediating == 20


def test_an_open_incident_that_replaced_its_node_releases_its_slot() -> None:
    repairing = IncidentSummary(
        name="nrem-1", node="n1", policy="p", active=True, holds_slot=True, replacement="s1"
    )
    working = IncidentSummary(name="nrem-2", node="n2", policy="p", active=True, holds_slot=True)
    counts = cluster_counts("p", 10, [repairing, working], [], local_slots=["nrem-1"])
    assert counts.remediating == 1


# --- the history record itself ------------------------------------------------------------------


def _entries(n: int, start: dt.datetime, step: dt.timedelta) -> list[HistoryEntry]:
    return [fh.signal_entry(xid(94, start + i * step, key=f"k{i}")) for i in range(n)]


def test_merge_keeps_the_retention_and_the_cap_and_each_entry_once() -> None:
    old = _entries(3, T0 - 40 * DAY, DAY)
    new = _entries(600, T0 - 20 * DAY, MIN)
    merged = fh.merge(old, [*new, new[-1]], now=T0, retention=30 * DAY)
    assert len(merged) == 512
    assert merged == sorted(merged, key=lambda e: e.time)
    assert merged[-1] == new[-1]
    assert merged[0] == new[600 - 512]


def test_summary_per_gpu_and_offenders() -> None:
    other = "0000:5e:00"
    entries = [
        fh.signal_entry(xid(94, T0 - 3 * DAY)),
        fh.signal_entry(xid(94, T0 - DAY, gpu_uuid=None)),  # a reporter that names no UUID
        fh.signal_entry(xid(48, T0 - HOUR, gpu=other, gpu_uuid=None)),
        fh.event_entry(EntryKind.INCIDENT, T0 - HOUR, "nrem-1", rule="ecc", rung=0),
        fh.event_entry(EntryKind.OUTCOME, T0 - MIN, "nrem-1", outcome="Returned"),
    ]
    status = fh.summarise(entries, previous=None, now=T0, retention=30 * DAY)
    assert (status.faults, status.incidents, status.last_outcome) == (3, 1, "Returned")
    assert (status.worst_gpu, status.worst_gpu_faults) == (UUID, 2)
    assert status.gpus[0].pci_bus_id == "0000:3b:00"
    assert status.gpus[0].uuid == UUID
    assert status.gpus[1].id == other
    assert status.gpus[1].pci_bus_id == other
    assert status.summary == f"2 x XID 94 on {UUID} in 30d"
    assert status.conditions[0].type == "RepeatOffender"
    assert status.conditions[0].status == "True"
    doc = FaultHistory.model_validate(
        {"metadata": {"name": "gpu-7"}, "spec": {"nodeName": "gpu-7"}, "status": status.to_k8s()}
    )
    rows = fh.offenders([doc], since=T0 - 2 * DAY, by_gpu=True)
    assert sorted((r.gpu or "", r.faults) for r in rows) == [(other, 1), (UUID, 1)]
    rows = fh.offenders([doc], since=T0 - 7 * DAY, by_gpu=False)
    assert [(r.node, r.faults, r.last_outcome) for r in rows] == [("gpu-7", 3, "Returned")]
    assert fh.last_outcome_at(doc) == T0 - MIN


def test_observations_read_back_are_the_same_signals() -> None:
    seen = xid(
        94, T0.replace(microsecond=0), event_reason="GpuXid", event_uid="u1", key="event/u1/1"
    )
    doc = FaultHistory.model_validate(
        {
            "metadata": {"name": "gpu-7"},
            "spec": {"nodeName": "gpu-7"},
            "status": {"entries": [fh.signal_entry(seen).to_k8s()]},
        }
    )
    (back,) = fh.observations(doc)
    assert back.identity == seen.identity
    assert back.key == seen.key


# --- the policy's history settings ---------------------------------------------------------------


def test_retention_must_cover_every_window_and_a_day() -> None:
    with pytest.raises(ValidationError, match="must cover every rule's escalation window"):
        spec([ECC]).model_validate({**spec([ECC]).to_k8s(), "history": {"retention": "72h"}})
    with pytest.raises(ValidationError, match="at least 24h"):
        spec([ECC]).model_validate({**spec([ECC]).to_k8s(), "history": {"retention": "12h"}})
    assert spec([ECC]).history.retention == "720h"


# --- the shipped default policy ------------------------------------------------------------------


@pytest.mark.parametrize("code", [79, 62, 48])
def test_the_default_policy_never_returns_these_without_a_repair_and_a_check(code: int) -> None:
    """Every rung an XID 79/62/48 node can be on either keeps it out (replace/retire) or
    resets/reboots it through a real hook (never Noop), and the policy checks every node
    before it returns."""
    import pathlib

    import yaml

    from gpuheal.api.remediationpolicy import CheckType, HookType
    from gpuheal.policy.select import rule_matches

    root = pathlib.Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "examples" / "default-policy.yaml").read_text())
    policy = RemediationPolicy.model_validate(doc).spec
    assert policy.return_to_service.check.type is CheckType.JOB
    rule = next(r for r in policy.rules if rule_matches(r, xid(code, T0)))
    for rung in rule.ladder:
        actions = [s.action for s in rung.steps]
        if Action.REPLACE in actions or Action.RETIRE in actions:
            continue
        repairs = [s.reset or s.reboot for s in rung.steps if s.reset or s.reboot]
        assert repairs, f"{rule.name}/{rung.name} returns XID {code} without a reset/reboot"
        assert all(r.hook.type is not HookType.NOOP for r in repairs), rung.name
