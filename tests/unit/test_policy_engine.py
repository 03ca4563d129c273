"""Decision engine: table tests with plain values for time, plus property tests."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pathlib
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.api import Action, LabelSelector, RemediationPolicy, RemediationPolicySpec, Rule, Rung
from gpuheal.api.names import Reason
from gpuheal.api.remediationpolicy import DISRUPTIVE_ACTIONS
from gpuheal.policy import allowed_unhealthy, decide, select_policy
from gpuheal.policy.types import (
    Act,
    Blocked,
    ClusterCounts,
    History,
    Idle,
    IncidentView,
    Move,
    NodeCondition,
    NodeView,
    Observation,
    VerificationState,
    Wait,
)
from gpuheal.xid import RecoveryAction

ROOT = pathlib.Path(__file__).resolve().parents[2]
T0 = dt.datetime(2025, 6, 1, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
GPU_A = "0000:3b:00"
GPU_B = "0000:5e:00"


def live_example() -> dict[str, Any]:
    """examples/default-policy.yaml with dry run off (it ships in dry run; these tests are
    about what its ladders do once it is live)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "default-policy.yaml").read_text())
    assert doc["spec"]["safety"]["dryRun"] is True
    doc["spec"]["safety"]["dryRun"] = False
    return doc


def default_spec(**safety: Any) -> RemediationPolicySpec:
    doc = live_example()
    doc["spec"]["safety"].update(safety)
    return RemediationPolicy.model_validate(doc).spec


SPEC = default_spec()
READY = NodeCondition("Ready", "True", T0 - 24 * HOUR)
NODE = NodeView(name="gpu-0", labels={"nvidia.com/gpu.present": "true"}, conditions=[READY])
CALM = ClusterCounts(selected=100, unhealthy=1, remediating=0)


def xid(code: int, at: dt.datetime, gpu: str = GPU_A, **kw: Any) -> Observation:
    return Observation(time=at, xid=code, gpu=gpu, **kw)


def ops(decision: object) -> tuple[str, str | None, int | None]:
    """(the action the decision starts with, rule, rung): for a new incident, its first step."""
    assert isinstance(decision, Act), decision
    if decision.operation is Move.OPEN:
        assert decision.trigger is not None
        return decision.trigger.steps[0].action.value, decision.rule, decision.rung
    return decision.operation.value, decision.rule, decision.rung


# --- starting an incident -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("observations", "expected"),
    [
        ([xid(79, T0)], ("cordon", "fell-off-bus", 0)),
        ([xid(79, T0 - 2 * HOUR), xid(79, T0)], ("cordon", "fell-off-bus", 1)),  # 2nd in window
        ([xid(79, T0 - 25 * HOUR), xid(79, T0)], ("cordon", "fell-off-bus", 0)),  # outside 24h
        ([xid(94, T0)], ("slurmDrain", "contained-ecc", 0)),
        ([xid(62, T0)], ("cordon", "gpu-reset", 0)),
        ([xid(74, T0)], ("cordon", "gpu-reset", 0)),
        ([xid(63, T0)], ("cordon", "row-remap-pending", 0)),
        ([xid(13, T0)], ("alert", "application-fault", 0)),
        ([xid(999, T0)], ("alert", "unknown-xid", 0)),
        (
            [xid(154, T0, recovery_action=RecoveryAction.NODE_REBOOT)],
            ("cordon", "driver-says-reboot", 0),
        ),
        (
            [xid(154, T0, recovery_action=RecoveryAction.GPU_RESET)],
            ("cordon", "driver-says-reset", 0),
        ),
        (
            [xid(154, T0, recovery_action=RecoveryAction.DRAIN_P2P)],
            ("cordon", "driver-says-drain-p2p", 0),
        ),
        ([xid(13, T0), xid(79, T0)], ("cordon", "fell-off-bus", 0)),  # most severe rule first
    ],
)
def test_first_step_per_xid(
    observations: list[Observation], expected: tuple[str, str, int]
) -> None:
    decision = decide(SPEC, NODE, History(observations=observations), CALM, T0)
    assert ops(decision) == expected


def test_154_recovered_to_none_does_nothing() -> None:
    obs = [xid(154, T0, recovery_action=RecoveryAction.NONE)]
    assert isinstance(decide(SPEC, NODE, History(observations=obs), CALM, T0), Idle)


def test_no_signal_is_idle_healthy() -> None:
    decision = decide(SPEC, NODE, History(), CALM, T0)
    assert decision == Idle(Reason.HEALTHY, "no signal matches a rule")


def test_observation_from_the_future_is_ignored() -> None:
    assert isinstance(decide(SPEC, NODE, History(observations=[xid(79, T0 + MIN)]), CALM, T0), Idle)


def test_replayed_old_event_after_resolution_starts_nothing() -> None:
    history = History(observations=[xid(79, T0 - HOUR)], last_resolved_at=T0 - 30 * MIN)
    assert isinstance(decide(SPEC, NODE, history, CALM, T0), Idle)


# --- XID 94 and application faults: repeats on the same GPU ----------------------------------


def test_xid94_never_replaces_on_first_sight_even_if_policy_says_so() -> None:
    doc = live_example()
    # A policy that puts replace on rung 0 for 94 (by its class). The CRD and the model reject
    # one now, but a policy stored before that rule existed may still carry it, so the engine
    # keeps its guard: the replace step is moved onto rung 0 past validation.
    doc["spec"]["rules"] = [
        {
            "name": "greedy",
            "signals": {"xidClasses": ["ContainedMemory"]},
            "escalation": {"occurrences": 2, "window": "24h"},
            "ladder": [
                {"name": "now", "steps": [{"action": "cordon"}]},
                {
                    "name": "later",
                    "steps": [
                        {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}}
                    ],
                },
            ],
        }
    ]
    spec = RemediationPolicy.model_validate(doc).spec
    greedy = spec.rules[0]
    spec.rules[0] = Rule.model_construct(
        name=greedy.name,
        signals=greedy.signals,
        ladder=[Rung.model_construct(name="now", steps=[*greedy.ladder[0].steps,
                                                        *greedy.ladder[1].steps])],
    )  # fmt: skip
    history = History(observations=[xid(94, T0)])
    decision = decide(spec, NODE, history, CALM, T0)
    assert ops(decision) == ("cordon", "greedy", 0)
    incident = IncidentView(
        rule="greedy",
        ladder=spec.rules[0].ladder,
        rung=0,
        started_at=T0,
        done=frozenset({Action.CORDON}),
        cordoned_by_us=True,
        trigger_xid=94,
        trigger_gpu=GPU_A,
    )
    after = decide(
        spec, NODE, History(observations=[xid(94, T0)], incident=incident), CALM, T0 + MIN
    )
    assert not (isinstance(after, Act) and after.operation is Action.REPLACE), after


@pytest.mark.parametrize(
    ("gpus", "rung"),
    [([GPU_A, GPU_A, GPU_A], 1), ([GPU_A, GPU_B, GPU_A], 0), ([GPU_A, GPU_A], 0)],
)
def test_xid94_escalates_on_repeats_on_the_same_gpu(gpus: list[str], rung: int) -> None:
    obs = [xid(94, T0 - (len(gpus) - i) * HOUR, gpu=g) for i, g in enumerate(gpus)]
    decision = decide(SPEC, NODE, History(observations=obs), CALM, T0)
    assert isinstance(decision, Act)
    assert decision.rung == rung


@pytest.mark.parametrize(
    ("gpus", "operation"),
    [
        ([GPU_A], "alert"),
        ([GPU_A, GPU_B, GPU_B.replace("5e", "86")], "alert"),  # three GPUs: three buggy jobs
        ([GPU_A, GPU_A, GPU_A], "cordon"),  # same GPU three times: the GPU
    ],
)
def test_application_xids_act_only_on_repeats_on_the_same_gpu(
    gpus: list[str], operation: str
) -> None:
    obs = [xid(13, T0 - i * MIN, gpu=g) for i, g in enumerate(gpus)]
    assert ops(decide(SPEC, NODE, History(observations=obs), CALM, T0))[0] == operation


# --- conditions held for a duration -----------------------------------------------------------


def test_condition_not_held_long_enough_waits_until_it_would_be() -> None:
    node = NodeView(name="n", conditions=[NodeCondition("Ready", "False", T0 - 2 * MIN)])
    decision = decide(SPEC, node, History(), CALM, T0)
    assert isinstance(decision, Wait)
    assert (decision.until, decision.reason) == (T0 + 3 * MIN, Reason.CONDITION_PENDING)
    assert "Ready=False has not held long enough" in decision.message


def test_condition_held_long_enough_acts() -> None:
    node = NodeView(name="n", conditions=[NodeCondition("Ready", "Unknown", T0 - 6 * MIN)])
    assert ops(decide(SPEC, node, History(), CALM, T0)) == ("cordon", "node-not-ready", 0)


def test_healthy_condition_is_not_a_trigger() -> None:
    node = NodeView(name="n", conditions=[NodeCondition("Ready", "True", T0 - 6 * MIN)])
    assert isinstance(decide(SPEC, node, History(), CALM, T0), Idle)


# --- safety gates ---------------------------------------------------------------------------
# A new signal always opens an incident (so every unhealthy node is on record); the gates
# hold its first disruptive step, the one that would take the node out of service.


def first_step_of(spec: RemediationPolicySpec, code: int = 79, **kw: Any) -> IncidentView:
    rule = next(x for x in spec.rules if code in x.signals.xids)
    return IncidentView(
        rule=rule.name, ladder=rule.ladder, rung=0, started_at=T0, trigger_xid=code, **kw
    )


@pytest.mark.parametrize(
    ("spec", "counts", "reason", "retry_at"),
    [
        (default_spec(requireApproval=["cordon"]), CALM, Reason.APPROVAL_PENDING, None),
        (SPEC, ClusterCounts(selected=100, unhealthy=12, remediating=10), Reason.BREAKER_OPEN,
         None),
        # 10% of 5 rounds to 0, floored at 1: one node out already fills it
        (SPEC, ClusterCounts(selected=5, unhealthy=1, remediating=1), Reason.BREAKER_OPEN, None),
        (
            SPEC,
            ClusterCounts(selected=100, unhealthy=1, remediating=0,
                          breaker_changed_at=T0 - 5 * MIN),
            Reason.STORM_COOLDOWN,
            T0 + 10 * MIN,
        ),
        (
            SPEC,
            ClusterCounts(selected=100, unhealthy=1, remediating=0,
                          recent_starts=[T0 - 50 * MIN + i * MIN for i in range(10)]),
            Reason.RATE_LIMITED,
            T0 + 10 * MIN,  # the oldest start (T0-50m) leaves the 1h window
        ),
    ],
)  # fmt: skip
def test_gates_hold_the_first_disruptive_step(
    spec: RemediationPolicySpec,
    counts: ClusterCounts,
    reason: Reason,
    retry_at: dt.datetime | None,
) -> None:
    opened = decide(spec, NODE, History(observations=[xid(79, T0)]), counts, T0)
    assert ops(opened) == ("cordon", "fell-off-bus", 0)  # the incident opens regardless
    history = History(observations=[xid(79, T0)], incident=first_step_of(spec))
    decision = decide(spec, NODE, history, counts, T0)
    assert isinstance(decision, Blocked)
    assert (decision.reason, decision.retry_at) == (reason, retry_at)
    assert decision.would is not None  # says what it would have done
    assert decision.would.operation is Action.CORDON


def test_paused_records_the_incident_and_holds_it_and_dry_run_records_without_acting() -> None:
    spec = default_spec(paused=True)
    opened = decide(spec, NODE, History(observations=[xid(79, T0)]), CALM, T0)
    assert ops(opened) == ("cordon", "fell-off-bus", 0)  # recorded: nothing is lost
    paused = decide(spec, NODE, History(incident=first_step_of(spec)), CALM, T0)
    assert isinstance(paused, Blocked)
    assert paused.reason == Reason.PAUSED
    history = History(observations=[xid(79, T0)], incident=first_step_of(SPEC, dry_run=True))
    dry = decide(SPEC, NODE, history, CALM, T0)
    assert isinstance(dry, Blocked)
    assert dry.reason == Reason.DRY_RUN
    assert dry.would is not None
    assert dry.would.operation is Action.CORDON


def test_the_first_disruptive_step_takes_a_slot_and_later_ones_pass_a_full_breaker() -> None:
    first = decide(SPEC, NODE, History(incident=first_step_of(SPEC)), CALM, T0)
    assert isinstance(first, Act)
    assert (first.operation, first.takes_slot) == (Action.CORDON, True)
    full = ClusterCounts(selected=100, unhealthy=40, remediating=10, breaker_open=True)
    holding = first_step_of(SPEC, done=frozenset({Action.CORDON}), holds_slot=True)
    later = decide(SPEC, NODE, History(incident=holding), full, T0)
    assert isinstance(later, Act)
    assert (later.operation, later.takes_slot) == (Action.SLURM_DRAIN, False)


def test_a_crash_between_the_cordon_and_its_record_does_not_block_the_incident_behind_itself() -> (
    None
):
    """Found by the crash points (`cordon.after`): the restarted operator counted the node's
    mark as a slot taken and blocked the incident that had taken it (1 of 1 out, 1 allowed)."""
    spec = default_spec(maxUnhealthy=1)
    counts = ClusterCounts(selected=1, unhealthy=1, remediating=1)  # its own mark, counted
    own = dataclasses.replace(NODE, unschedulable=True, cordoned_by="nrem-gpu-0-abc")
    incident = first_step_of(spec, name="nrem-gpu-0-abc")
    resumed = decide(spec, own, History(incident=incident), counts, T0)
    assert isinstance(resumed, Act), resumed
    assert (resumed.operation, resumed.takes_slot) == (Action.CORDON, True)
    # Another incident's mark, or a person's cordon, still counts against this one.
    other = dataclasses.replace(own, cordoned_by="nrem-gpu-0-old")
    blocked = decide(spec, other, History(incident=incident), counts, T0)
    assert isinstance(blocked, Blocked)
    assert blocked.reason == Reason.BREAKER_OPEN


def test_the_breaker_opens_when_full_and_closes_into_its_cooldown() -> None:
    full = ClusterCounts(selected=100, unhealthy=40, remediating=10)
    blocked = decide(SPEC, NODE, History(incident=first_step_of(SPEC)), full, T0)
    assert isinstance(blocked, Blocked)
    assert (blocked.reason, blocked.breaker) == (Reason.BREAKER_OPEN, True)
    still = dataclasses.replace(full, breaker_open=True)
    again = decide(SPEC, NODE, History(incident=first_step_of(SPEC)), still, T0)
    assert isinstance(again, Blocked)
    assert again.breaker is None  # open already: no change to record
    freed = dataclasses.replace(still, remediating=9)
    closing = decide(SPEC, NODE, History(incident=first_step_of(SPEC)), freed, T0)
    assert isinstance(closing, Blocked)
    assert (closing.reason, closing.breaker) == (Reason.STORM_COOLDOWN, False)
    assert closing.retry_at == T0 + 15 * MIN
    no_cooldown = default_spec(stormCooldown="0s")
    act = decide(no_cooldown, NODE, History(incident=first_step_of(no_cooldown)), freed, T0)
    assert isinstance(act, Act)
    assert (act.takes_slot, act.breaker) == (True, False)


def test_cooldown_over_acts() -> None:
    counts = ClusterCounts(
        selected=100, unhealthy=1, remediating=0, breaker_changed_at=T0 - 16 * MIN
    )
    decision = decide(SPEC, NODE, History(incident=first_step_of(SPEC)), counts, T0)
    assert isinstance(decision, Act)
    assert decision.operation is Action.CORDON


def test_alerts_pass_the_breaker() -> None:
    storm = ClusterCounts(selected=100, unhealthy=90, remediating=10)
    assert ops(decide(SPEC, NODE, History(observations=[xid(13, T0)]), storm, T0))[0] == "alert"


def test_opt_out_label_blocks_everything() -> None:
    node = NodeView(name="n", labels={"gpuheal.io/opt-out": "true"})
    decision = decide(SPEC, node, History(observations=[xid(79, T0)]), CALM, T0)
    assert isinstance(decision, Blocked)
    assert decision.reason == Reason.OPTED_OUT


def test_blind_source_starts_nothing() -> None:
    node = NodeView(name="n", sources_readable_since=None)
    decision = decide(SPEC, node, History(observations=[xid(79, T0)]), CALM, T0)
    assert decision == Idle(Reason.SOURCE_BLIND, "a signal source for this node cannot be read")


@pytest.mark.parametrize(
    ("max_unhealthy", "min_healthy", "selected", "allowed"),
    [
        (3, None, 100, 3),
        ("10%", None, 45, 4),
        (None, "90%", 45, 4),
        (None, 40, 45, 5),
        (None, "100%", 9, 0),
        (50, None, 10, 10),
        ("10%", None, 5, 1),  # a non-zero percent never rounds a small group down to 0
        ("0%", None, 5, 0),
        (0, None, 5, 0),
        ("10%", None, 0, 0),
    ],
)
def test_allowed_unhealthy(
    max_unhealthy: Any, min_healthy: Any, selected: int, allowed: int
) -> None:
    spec = default_spec(maxUnhealthy=max_unhealthy, minHealthy=min_healthy)
    assert allowed_unhealthy(spec.safety, selected) == allowed


# --- an open incident -----------------------------------------------------------------------


def incident_79(done: set[Action], rung: int = 0, **kw: Any) -> IncidentView:
    rule = next(x for x in SPEC.rules if x.name == "fell-off-bus")
    return IncidentView(
        rule="fell-off-bus",
        ladder=rule.ladder,
        rung=rung,
        started_at=T0,
        done=frozenset(done),
        trigger_xid=79,
        trigger_gpu=GPU_A,
        **kw,
    )


@pytest.mark.parametrize(
    ("done", "operation"),
    [
        (set(), "cordon"),
        ({Action.CORDON}, "slurmDrain"),
        ({Action.CORDON, Action.SLURM_DRAIN}, "drain"),
        ({Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN}, "reboot"),
    ],
)
def test_ladder_one_step_at_a_time(done: set[Action], operation: str) -> None:
    history = History(observations=[xid(79, T0)], incident=incident_79(done))
    assert ops(decide(SPEC, NODE, history, CALM, T0 + MIN))[0] == operation


def test_breaker_does_not_hold_up_an_open_incident() -> None:
    storm = ClusterCounts(selected=100, unhealthy=60, remediating=30, breaker_open=True)
    history = History(
        observations=[xid(79, T0)], incident=incident_79({Action.CORDON}, holds_slot=True)
    )
    assert ops(decide(SPEC, NODE, history, storm, T0 + MIN))[0] == "slurmDrain"


def test_repeat_during_incident_escalates_to_next_rung() -> None:
    history = History(
        observations=[xid(79, T0), xid(79, T0 + 10 * MIN)],
        incident=incident_79({Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN}),
    )
    decision = decide(SPEC, NODE, history, CALM, T0 + 11 * MIN)
    assert isinstance(decision, Act)
    assert (decision.operation, decision.rung, decision.reason) == (
        Move.ESCALATE,
        1,
        Reason.ESCALATED,
    )
    climbed = dataclasses.replace(history.incident, rung=1)  # type: ignore[arg-type]
    after = decide(SPEC, NODE, dataclasses.replace(history, incident=climbed), CALM, T0 + 11 * MIN)
    assert ops(after) == ("replace", "fell-off-bus", 1)  # done steps are not repeated


def test_replace_waits_for_approval_when_required() -> None:
    spec = default_spec(requireApproval=["replace"])
    done = {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN}
    history = History(observations=[xid(79, T0)], incident=incident_79(done, rung=1))
    decision = decide(spec, NODE, history, CALM, T0 + MIN)
    assert isinstance(decision, Blocked)
    assert decision.reason == Reason.APPROVAL_PENDING
    approved = History(
        observations=[xid(79, T0)],
        incident=incident_79(done, rung=1, approved=frozenset({Action.REPLACE})),
    )
    assert ops(decide(spec, NODE, approved, CALM, T0 + MIN))[0] == "replace"


def _reserve(decision: object) -> str | None:
    if not isinstance(decision, Act):
        return None
    return decision.reserve.action.value if decision.reserve is not None else None


@pytest.mark.parametrize(
    ("rung", "done", "counts", "safety", "expected"),
    [
        # the replace rung: the spare is claimed with the first disruptive step (slot taken)
        (1, set(), CALM, {}, ("cordon", "replace")),
        (1, {Action.CORDON}, CALM, {}, ("slurmDrain", "replace")),
        (1, {Action.CORDON, Action.SLURM_DRAIN}, CALM, {}, ("drain", "replace")),
        # the replace step itself claims (nothing to reserve beside it)
        (1, {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN}, CALM, {}, ("replace", None)),
        # the power-cycle rung has no replace step
        (0, set(), CALM, {}, ("cordon", None)),
        # the breaker holds the first step: no slot, no spare
        (1, set(), ClusterCounts(selected=100, unhealthy=10, remediating=10), {}, (None, None)),
        # replace needs a person's approval: the spare waits for it too
        (1, set(), CALM, {"requireApproval": ["replace"]}, ("cordon", None)),
        # a dry run claims nothing
        (1, set(), CALM, {"dryRun": True}, (None, None)),
    ],
)  # fmt: skip
def test_the_spare_is_claimed_as_soon_as_the_incident_may_disrupt(
    rung: int,
    done: set[Action],
    counts: ClusterCounts,
    safety: dict[str, Any],
    expected: tuple[str | None, str | None],
) -> None:
    spec = default_spec(**safety)
    dry = bool(safety.get("dryRun"))
    # an incident that took a step holds its slot
    incident = incident_79(done, rung=rung, holds_slot=bool(done), dry_run=dry)
    decision = decide(spec, NODE, History(observations=[xid(79, T0)], incident=incident), counts,
                      T0 + MIN)  # fmt: skip
    step = decision.step.action.value if isinstance(decision, Act) and decision.step else None
    assert (step, _reserve(decision)) == expected
    if expected[1] is not None:
        assert isinstance(decision, Act)
        assert decision.reserve is not None
        assert decision.reserve.replace is not None
        assert decision.reserve.replace.reserve_pool_ref.name == "spares"


def test_an_approved_replace_reserves_its_spare_early() -> None:
    spec = default_spec(requireApproval=["replace"])
    incident = incident_79(set(), rung=1, approved=frozenset({Action.REPLACE}))
    decision = decide(spec, NODE, History(observations=[xid(79, T0)], incident=incident), CALM,
                      T0 + MIN)  # fmt: skip
    assert _reserve(decision) == "replace"


def test_replaced_incident_closes_without_returning_the_node() -> None:
    done = {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN, Action.REPLACE}
    history = History(
        observations=[xid(79, T0)], incident=incident_79(done, rung=1, cordoned_by_us=True)
    )
    decision = decide(SPEC, NODE, history, CALM, T0 + HOUR)
    assert isinstance(decision, Act)
    assert (decision.operation, decision.reason) == (Move.CLOSE, Reason.REPLACED)


# --- return to service ------------------------------------------------------------------------

ALL_79 = {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN, Action.REBOOT}


def checked(at: dt.datetime) -> VerificationState:
    """The default policy's check (returnToService.check: the gpu-check Job) passed at `at`:
    the return-to-service tests below start from there (tests/unit/test_policy_history.py
    covers the check itself)."""
    return VerificationState(started_at=at, passed_at=at)


def test_the_default_policy_checks_the_node_before_any_return() -> None:
    incident = incident_79(ALL_79, last_step_at=T0 + 5 * MIN, cordoned_by_us=True)
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Act)
    assert decision.operation is Move.VERIFY


def test_return_waits_for_hysteresis() -> None:
    incident = incident_79(
        ALL_79, last_step_at=T0 + 5 * MIN, cordoned_by_us=True, verification=checked(T0 + 5 * MIN)
    )
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + 8 * MIN
    )
    assert isinstance(decision, Wait)
    assert decision.until == T0 + 15 * MIN
    assert decision.reason == Reason.HYSTERESIS_PENDING


def test_return_after_hysteresis_undoes_only_what_we_did() -> None:
    incident = incident_79(
        ALL_79,
        last_step_at=T0 + 5 * MIN,
        cordoned_by_us=True,
        slurm_drained_by_us=False,
        verification=checked(T0 + 5 * MIN),
    )
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + 15 * MIN
    )
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE
    assert (decision.uncordon, decision.resume_slurm) == (True, False)


def test_nothing_owned_closes_without_uncordon() -> None:
    incident = incident_79(  # an admin had cordoned it
        ALL_79, last_step_at=T0 + 5 * MIN, verification=checked(T0 + 5 * MIN)
    )
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Act)
    assert (decision.operation, decision.reason) == (Move.CLOSE, Reason.NOTHING_OWNED)


def test_a_quarantined_gpu_is_ours_to_undo_though_the_node_was_never_cordoned() -> None:
    incident = incident_79(
        ALL_79,
        last_step_at=T0 + 5 * MIN,
        verification=checked(T0 + 5 * MIN),
        quarantined_device="inc-gpu-3",
    )
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE
    assert (decision.uncordon, decision.resume_slurm) == (False, False)


def test_breaker_never_blocks_return_to_service() -> None:
    storm = ClusterCounts(
        selected=100, unhealthy=90, remediating=50, breaker_open=True, breaker_changed_at=T0
    )
    incident = incident_79(ALL_79, last_step_at=T0, cordoned_by_us=True, verification=checked(T0))
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), storm, T0 + HOUR
    )
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE


def test_blind_is_not_healthy_for_return() -> None:
    incident = incident_79(ALL_79, last_step_at=T0, cordoned_by_us=True, verification=checked(T0))
    node = NodeView(name="n", sources_readable_since=None)
    decision = decide(
        SPEC, node, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Blocked)
    assert decision.reason == Reason.SOURCE_BLIND
    # Readable again only recently: the blind spell does not count as healthy time.
    node = NodeView(name="n", conditions=[READY], sources_readable_since=T0 + HOUR - 2 * MIN)
    decision = decide(
        SPEC, node, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Wait)
    assert decision.until == T0 + HOUR + 8 * MIN


def test_still_bad_condition_keeps_node_out() -> None:
    rule = next(x for x in SPEC.rules if x.name == "node-not-ready")
    incident = IncidentView(
        rule=rule.name,
        ladder=rule.ladder,
        rung=0,
        started_at=T0,
        done=frozenset({Action.CORDON, Action.SLURM_DRAIN}),
        cordoned_by_us=True,
        verification=checked(T0 + 50 * MIN),
    )
    node = NodeView(name="n", conditions=[NodeCondition("Ready", "False", T0 - HOUR)])
    decision = decide(SPEC, node, History(incident=incident), CALM, T0 + HOUR)
    assert isinstance(decision, Wait)
    assert decision.reason == Reason.STILL_UNHEALTHY
    recovered = NodeView(name="n", conditions=[NodeCondition("Ready", "True", T0 + 50 * MIN)])
    assert isinstance(
        decide(SPEC, recovered, History(incident=incident), CALM, T0 + 55 * MIN), Wait
    )
    returned = decide(SPEC, recovered, History(incident=incident), CALM, T0 + HOUR)
    assert isinstance(returned, Act)
    assert returned.operation is Move.RETURN_TO_SERVICE


def test_paused_holds_everything_including_return() -> None:
    incident = incident_79(ALL_79, last_step_at=T0, cordoned_by_us=True)
    decision = decide(default_spec(paused=True), NODE, History(incident=incident), CALM, T0 + HOUR)
    assert isinstance(decision, Blocked)
    assert decision.reason == Reason.PAUSED


# --- policy selection ------------------------------------------------------------------------


def _sel(**labels: str) -> LabelSelector:
    return LabelSelector.model_validate({"matchLabels": labels})


@pytest.mark.parametrize(
    ("policies", "expected"),
    [
        ([("a", _sel(x="1"), 0)], ("a", ())),
        ([("a", _sel(x="1"), 0), ("b", _sel(), 5)], ("b", ())),
        ([("a", _sel(x="1"), 5), ("b", _sel(), 5)], (None, ("a", "b"))),
        ([("a", _sel(x="2"), 9), ("b", _sel(), 0)], ("b", ())),
        ([("a", _sel(x="2"), 0)], (None, ())),
    ],
)
def test_select_policy(
    policies: list[tuple[str, LabelSelector, int]], expected: tuple[Any, Any]
) -> None:
    assert select_policy({"x": "1"}, policies) == expected


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    selected=st.integers(min_value=1, max_value=200),
    percent=st.integers(min_value=0, max_value=100),
    broken_fraction=st.floats(min_value=0, max_value=1),
    already=st.integers(min_value=0, max_value=50),
    xid_code=st.sampled_from([79, 62, 48, 74, 94, 95, 119, 154]),
)
def test_never_more_than_max_unhealthy_in_remediation(
    selected: int, percent: int, broken_fraction: float, already: int, xid_code: int
) -> None:
    """Open an incident on every broken node, then let each ask for its first step with the
    counts as they stand: the engine never lets more than `allowed` nodes out at once."""
    spec = default_spec(maxUnhealthy=f"{percent}%", stormCooldown="0s", rateLimit=None)
    allowed = allowed_unhealthy(spec.safety, selected)
    remediating = min(already, allowed)
    broken = max(1, int(selected * broken_fraction))
    action = RecoveryAction.GPU_RESET if xid_code == 154 else None
    breaker = False
    for i in range(broken):
        obs = [xid(xid_code, T0, gpu=f"0000:{i % 256:02x}:00", recovery_action=action)]
        node = NodeView(name=f"n{i}", conditions=[READY])
        opened = decide(spec, node, History(observations=obs), CALM, T0)
        if not isinstance(opened, Act) or opened.trigger is None or opened.rule is None:
            continue
        if opened.operation is not Move.OPEN:
            continue  # alert only: nothing to take out
        rule = next(x for x in spec.rules if x.name == opened.rule)
        incident = IncidentView(
            rule=rule.name, ladder=rule.ladder, rung=opened.rung or 0, started_at=T0,
            trigger_xid=xid_code,
        )  # fmt: skip
        counts = ClusterCounts(selected, broken, remediating, breaker_open=breaker)
        decision = decide(spec, node, History(observations=obs, incident=incident), counts, T0)
        if isinstance(decision, Act) and decision.takes_slot:
            remediating += 1
        if isinstance(decision, Act | Blocked) and decision.breaker is not None:
            breaker = decision.breaker
        assert remediating <= allowed
    assert breaker == (remediating >= allowed and broken > allowed - min(already, allowed))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2000),
            st.integers(min_value=1, max_value=200),
            st.sampled_from([GPU_A, GPU_B, None]),
        ),
        max_size=30,
    ),
    st.integers(min_value=0, max_value=2000),
)
def test_decide_is_total(obs: list[tuple[int, int, str | None]], minutes: int) -> None:
    """Whatever the observations, the engine returns one of its four decisions."""
    observations = [
        xid(code, T0 + m * MIN, gpu=g) if g else Observation(time=T0 + m * MIN, xid=code)
        for m, code, g in obs
    ]
    decision = decide(SPEC, NODE, History(observations=observations), CALM, T0 + minutes * MIN)
    assert isinstance(decision, (Act, Wait, Blocked, Idle))
    if isinstance(decision, Act):
        assert decision.trigger is not None
        # 94 never replaces on first sight on a GPU.
        actions = [s.action for s in decision.trigger.steps]
        assert (
            Action.REPLACE not in actions
            or decision.rule != "contained-ecc"
            or (decision.rung == 1)
        )


def test_catalogue_alert_only_guard_overrides_an_eager_policy() -> None:
    """A policy that cordons on XID 13 still only alerts until 13 repeats on the same GPU."""
    doc = live_example()
    doc["spec"]["rules"] = [
        {
            "name": "eager",
            "signals": {"xids": [13]},
            "ladder": [{"name": "fence", "steps": [{"action": "cordon"}]}],
        }
    ]
    spec = RemediationPolicy.model_validate(doc).spec
    once = History(observations=[xid(13, T0)])
    assert ops(decide(spec, NODE, once, CALM, T0)) == ("alert", "eager", 0)
    other_gpu = History(observations=[xid(13, T0 - MIN, gpu=GPU_B), xid(13, T0)])
    assert ops(decide(spec, NODE, other_gpu, CALM, T0)) == ("alert", "eager", 0)
    twice = History(observations=[xid(13, T0 - MIN), xid(13, T0)])
    assert ops(decide(spec, NODE, twice, CALM, T0)) == ("cordon", "eager", 0)


def test_two_xids_in_the_same_second_are_two_occurrences() -> None:
    """Event times have whole seconds: two Events on one GPU in one second are two faults
    (they once counted as one, and escalation came a signal late)."""
    same_second = [
        xid(94, T0, event_uid="e1", event_reason="GpuXid"),
        xid(94, T0, event_uid="e2", event_reason="GpuXid"),
    ]
    third = xid(94, T0 + MIN, event_uid="e3", event_reason="GpuXid")
    decision = decide(SPEC, NODE, History(observations=same_second), CALM, T0 + MIN, new=third)
    assert isinstance(decision, Act)
    assert decision.trigger is not None
    assert decision.trigger.count == 3


def test_a_signal_in_the_second_an_incident_ended_is_new() -> None:
    """Event times have whole seconds: an XID at 12:00:00 after an incident that ended at
    12:00:00.4 is a new fault, not a replay (it once got lost as "stale")."""
    resolved = T0 + dt.timedelta(milliseconds=400)
    history = History(observations=[xid(79, T0 - HOUR)], last_resolved_at=resolved)
    decision = decide(SPEC, NODE, history, CALM, T0 + MIN, new=xid(79, T0))
    assert ops(decision) == ("cordon", "fell-off-bus", 1)  # and the earlier one still counts
    older = decide(SPEC, NODE, history, CALM, T0 + MIN, new=xid(79, T0 - MIN))
    assert isinstance(older, Idle)
    assert older.reason == Reason.STALE


def test_one_fault_from_two_reporters_counts_once_and_a_real_repeat_twice() -> None:
    """An Event and dcgm-exporter (or NPD's two Events) reporting one XID 79: rung 0. The
    same reporter again within the window: a second fault, rung 1 (escalation 2 in 24 h)."""
    event = xid(79, T0, reporter="event:GpuXid:xid-line", event_uid="e1")
    dcgm = xid(79, T0 + 15 * dt.timedelta(seconds=1), reporter="dcgm")
    once = decide(SPEC, NODE, History(observations=[event]), CALM, T0 + MIN, new=dcgm)
    assert ops(once) == ("cordon", "fell-off-bus", 0)
    again = xid(79, T0 + 30 * dt.timedelta(seconds=1), reporter="event:GpuXid:xid-line",
                event_uid="e2")  # fmt: skip
    twice = decide(SPEC, NODE, History(observations=[event, dcgm]), CALM, T0 + MIN, new=again)
    assert ops(twice) == ("cordon", "fell-off-bus", 1)


# --- what a return rests on: a skipped repair, no check ----------------------------------------


def _no_check_spec() -> RemediationPolicySpec:
    doc = live_example()
    doc["spec"]["returnToService"]["check"] = {"type": "None"}
    return RemediationPolicy.model_validate(doc).spec


@pytest.mark.parametrize(
    ("skipped", "says"),
    [
        (frozenset(), "after its verified reboot"),
        (frozenset({Action.REBOOT}), "its reboot was skipped (Noop hook): not repaired"),
    ],
)
def test_a_return_with_no_check_says_nothing_verified_the_node(
    skipped: frozenset[Action], says: str
) -> None:
    incident = incident_79(
        ALL_79, last_step_at=T0 + 5 * MIN, cordoned_by_us=True, repairs_skipped=skipped
    )
    decision = decide(
        _no_check_spec(), NODE, History(observations=[xid(79, T0)], incident=incident), CALM,
        T0 + HOUR,
    )  # fmt: skip
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE
    assert decision.unchecked is not None
    assert "no check configured" in decision.unchecked
    assert says in decision.unchecked


def test_a_return_after_a_passed_check_is_not_unchecked() -> None:
    incident = incident_79(
        ALL_79, last_step_at=T0 + 5 * MIN, cordoned_by_us=True, verification=checked(T0 + 5 * MIN)
    )
    decision = decide(
        SPEC, NODE, History(observations=[xid(79, T0)], incident=incident), CALM, T0 + HOUR
    )
    assert isinstance(decision, Act)
    assert decision.operation is Move.RETURN_TO_SERVICE
    assert decision.unchecked is None


def test_a_skipped_repair_after_a_replacement_leaves_the_node_out_for_repair() -> None:
    doc = live_example()
    rung = doc["spec"]["rules"][0]["ladder"][1]
    assert rung["steps"][-1]["action"] == "replace"
    rung["steps"].append({"action": "reboot", "reboot": {"hook": {"type": "Noop"}}})
    spec = RemediationPolicy.model_validate(doc).spec
    done = {Action.CORDON, Action.SLURM_DRAIN, Action.DRAIN, Action.REPLACE, Action.REBOOT}
    rule = next(x for x in spec.rules if x.name == "fell-off-bus")

    def after(skipped: frozenset[Action]) -> object:
        incident = dataclasses.replace(
            incident_79(done, rung=1, cordoned_by_us=True, repairs_skipped=skipped),
            ladder=rule.ladder,
            replaced_by="spare-0",
        )
        return decide(spec, NODE, History(observations=[xid(79, T0)], incident=incident), CALM,
                      T0 + HOUR)  # fmt: skip

    closed = after(frozenset({Action.REBOOT}))
    assert isinstance(closed, Act)
    assert (closed.operation, closed.reason) == (Move.CLOSE, Reason.REPLACED)
    assert "reboot: skipped" in closed.message
    # A verified reboot after the replacement goes on to the check before its return.
    repaired = after(frozenset())
    assert isinstance(repaired, Act)
    assert repaired.operation is Move.VERIFY


def test_a_first_sight_that_only_warns_still_asks_the_jobs_to_checkpoint() -> None:
    """XID 13 the first time only alerts; a checkpoint step of the rung runs instead
    (it leaves the node and its jobs where they are), the cordon waits for a repeat. A
    checkpoint is no disruption: it takes no slot of the safety limits."""
    doc = live_example()
    doc["spec"]["rules"] = [
        {
            "name": "warns",
            "signals": {"xids": [13]},
            "ladder": [
                {"name": "fence", "steps": [{"action": "checkpoint"}, {"action": "cordon"}]}
            ],
        }
    ]
    spec = RemediationPolicy.model_validate(doc).spec
    once = decide(spec, NODE, History(observations=[xid(13, T0)]), CALM, T0)
    assert isinstance(once, Act)
    assert once.trigger is not None
    assert [s.action for s in once.trigger.steps] == [Action.CHECKPOINT]
    twice = decide(spec, NODE, History(observations=[xid(13, T0 - MIN), xid(13, T0)]), CALM, T0)
    assert isinstance(twice, Act)
    assert twice.trigger is not None
    assert [s.action for s in twice.trigger.steps] == [Action.CHECKPOINT, Action.CORDON]
    assert Action.CHECKPOINT not in DISRUPTIVE_ACTIONS
