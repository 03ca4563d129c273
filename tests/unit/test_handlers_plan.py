"""The operator's pure planning: policy choice, rule matching, escalation, gates, health."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal import plan
from gpuheal.api.remediationpolicy import Action, RemediationPolicy
from gpuheal.incident import NodeCondition, NodeView
from gpuheal.xid.types import RecoveryAction

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)


def make_policy(
    name: str = "p",
    *,
    labels: dict[str, str] | None = None,
    priority: int = 0,
    rules: list[dict[str, Any]] | None = None,
    **safety: Any,
) -> RemediationPolicy:
    return RemediationPolicy.model_validate(
        {
            "apiVersion": "gpuheal.io/v1alpha1",
            "kind": "RemediationPolicy",
            "metadata": {"name": name, "generation": 1},
            "spec": {
                "nodeSelector": {"matchLabels": labels or {"pool": "train"}},
                "priority": priority,
                "rules": rules
                or [
                    {
                        "name": "ecc",
                        "signals": {"xids": [94]},
                        "escalation": {"occurrences": 3, "window": "1h", "scope": "Gpu"},
                        "ladder": [
                            {"name": "requeue", "steps": [{"action": "cordon"}]},
                            {
                                "name": "reset",
                                "steps": [
                                    {"action": "cordon"},
                                    {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
                                ],
                            },
                        ],
                    },
                    {
                        "name": "app",
                        "signals": {"xidClasses": ["Application"]},
                        "escalation": {"occurrences": 2, "window": "1h"},
                        "ladder": [
                            {"name": "alert", "steps": [{"action": "alert"}]},
                            {"name": "cordon", "steps": [{"action": "cordon"}]},
                        ],
                    },
                    {
                        "name": "degraded",
                        "signals": {"conditions": [{"type": "GpuDegraded", "for": "5m"}]},
                        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
                    },
                    {
                        "name": "driver-reboot",
                        "signals": {"xids": [154], "recoveryActions": ["NodeReboot"]},
                        "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
                    },
                ],
                "safety": {
                    **({} if "minHealthy" in safety else {"maxUnhealthy": 2}),
                    "stormCooldown": "0s",
                    **safety,
                },
            },
        }
    )


def sig(key: str, *, xid: int | None = 94, gpu: str | None = "0000:3b:00", minutes: int = 0,
        **kw: Any) -> plan.Signal:  # fmt: skip
    return plan.Signal(source="events", key=key, time=NOW - dt.timedelta(minutes=minutes),
                       xid=xid, gpu=gpu, **kw)  # fmt: skip


def view(name: str = "n1", *, ready: bool = True, labels: dict[str, str] | None = None,
         conds: tuple[NodeCondition, ...] = ()) -> NodeView:  # fmt: skip
    ready_c = NodeCondition("Ready", "True" if ready else "False", "", NOW)
    return NodeView(name=name, uid="u", labels=labels or {"pool": "train"},
                    unschedulable=False, conditions=(ready_c, *conds))  # fmt: skip


def test_highest_priority_policy_wins_and_a_tie_selects_none() -> None:
    low, high = make_policy("low"), make_policy("high", priority=5)
    assert plan.choose_policy([low, high], {"pool": "train"}).policy is high
    tie = plan.choose_policy([low, make_policy("other")], {"pool": "train"})
    assert tie.policy is None
    assert tie.overlapping == ("low", "other")
    assert plan.choose_policy([low], {"pool": "infer"}).policy is None


def test_rules_match_by_xid_class_condition_and_recovery_action() -> None:
    p = make_policy()
    assert plan.match_rule(p, sig("a")).name == "ecc"  # type: ignore[union-attr]
    assert plan.match_rule(p, sig("b", xid=13)).name == "app"  # type: ignore[union-attr]
    assert plan.match_rule(p, sig("c", xid=999)) is None
    cond = plan.Signal("conditions", "k", NOW, condition_type="GpuDegraded",
                       condition_status="True")  # fmt: skip
    assert plan.match_rule(p, cond).name == "degraded"  # type: ignore[union-attr]
    reboot = sig("d", xid=154, recovery_action=RecoveryAction.NODE_REBOOT)
    assert plan.match_rule(p, reboot).name == "driver-reboot"  # type: ignore[union-attr]
    assert plan.match_rule(p, sig("e", xid=154, recovery_action=RecoveryAction.NONE)) is None


def test_repeats_on_the_same_gpu_within_the_window_climb_the_ladder() -> None:
    p = make_policy()
    rule = p.spec.rules[0]
    history = [sig("1", minutes=30), sig("2", minutes=10)]
    assert plan.occurrences(rule, sig("3"), history, NOW) == 3
    assert plan.rung_for(rule, 3) == 1
    assert plan.rung_for(rule, 2) == 0
    # another GPU, an old one, and the same signal seen again do not count
    other_gpu = [sig("1", gpu="0000:5e:00"), sig("2", minutes=120), sig("3")]
    assert plan.occurrences(rule, sig("3"), other_gpu, NOW) == 1


@pytest.mark.parametrize(
    ("safety", "selected", "allowed"),
    [
        ({"maxUnhealthy": 2}, 10, 2),
        ({"maxUnhealthy": "25%"}, 10, 2),  # rounded down
        ({"minHealthy": "75%"}, 10, 2),  # 7.5 healthy rounds up to 8
        ({"minHealthy": 12}, 10, 0),
    ],
)
def test_allowed_unhealthy(safety: dict[str, Any], selected: int, allowed: int) -> None:
    assert plan.allowed_unhealthy(make_policy(**safety), selected) == allowed


def test_slot_gate_breaker_rate_limit_and_cooldown() -> None:
    p = make_policy(rateLimit={"remediations": 2, "window": "1h"}, stormCooldown="10m")
    kw: dict[str, Any] = {"selected": 10, "breaker_closed_at": None, "now": NOW}
    assert plan.slot_gate(p, taken=1, started_in_window=[], **kw) is None
    full = plan.slot_gate(p, taken=2, started_in_window=[], **kw)
    assert full is not None
    assert full.gate is plan.Gate.CIRCUIT_BREAKER_OPEN
    recent = [NOW - dt.timedelta(minutes=5), NOW - dt.timedelta(minutes=20)]
    limited = plan.slot_gate(p, taken=0, started_in_window=recent, **kw)
    assert limited is not None
    assert limited.gate is plan.Gate.RATE_LIMITED
    old = [NOW - dt.timedelta(hours=2)] * 5
    assert plan.slot_gate(p, taken=0, started_in_window=old, **kw) is None
    kw["breaker_closed_at"] = NOW - dt.timedelta(minutes=3)
    cooling = plan.slot_gate(p, taken=0, started_in_window=[], **kw)
    assert cooling is not None
    assert cooling.gate is plan.Gate.STORM_COOLDOWN


@given(st.integers(0, 500), st.integers(0, 100), st.integers(0, 600))
def test_slot_gate_never_allows_more_than_max_unhealthy(
    selected: int, pct: int, taken: int
) -> None:
    p = make_policy(maxUnhealthy=f"{pct}%")
    allowed = plan.allowed_unhealthy(p, selected)
    verdict = plan.slot_gate(p, selected=selected, taken=taken, started_in_window=[],
                             breaker_closed_at=None, now=NOW)  # fmt: skip
    assert (verdict is None) == (taken < allowed)
    assert allowed <= selected


def test_health_for_return_to_service() -> None:
    p = make_policy()
    assert plan.unhealthy_reasons(p, view()) == []
    assert plan.unhealthy_reasons(p, view(ready=False)) == ["Ready is not True"]
    bad = NodeCondition("GpuDegraded", "True", "X", NOW)
    assert plan.unhealthy_reasons(p, view(conds=(bad,))) == ["GpuDegraded=True"]
    assert plan.held_for(p, "GpuDegraded", "True") == dt.timedelta(minutes=5)
    assert plan.held_for(p, "GpuDegraded", "False") is None


def test_detection_goes_through_the_engine_with_first_sight_guards() -> None:
    p = make_policy(
        rules=[
            {
                "name": "ecc-class",
                "signals": {"xidClasses": ["ContainedMemory"]},
                "ladder": [{"name": "all", "steps": [
                    {"action": "cordon"},
                    {"action": "replace", "replace": {"reservePoolRef": {"name": "s"}}},
                ]}],
            },
            {
                "name": "app",
                "signals": {"xids": [13]},
                "ladder": [{"name": "cordon", "steps": [{"action": "cordon"}]}],
            },
        ]
    )  # fmt: skip
    first = plan.trigger_for(p, view(), sig("a", xid=94), [])
    assert first is not None
    assert [s.action for s in first.steps] == [Action.CORDON]  # 94 never replaces first time
    again = plan.trigger_for(p, view(), sig("b", xid=94), [sig("a", xid=94, minutes=5)])
    assert again is not None
    assert [s.action for s in again.steps] == [Action.CORDON, Action.REPLACE]
    app = plan.trigger_for(p, view(), sig("c", xid=13), [])
    assert app is not None
    assert [s.action for s in app.steps] == [Action.ALERT]  # an application fault, once
    assert plan.trigger_for(p, view(), sig("d", xid=999), []) is None


def _incident(policy: RemediationPolicy, *, dry_run: bool = False, annotations: Any = None) -> Any:
    from gpuheal.api.noderemediation import NodeRemediation

    rule = policy.spec.rules[0]
    return NodeRemediation.model_validate(
        {
            "metadata": {"name": "nrem-1", "annotations": annotations or {}},
            "spec": {
                "nodeName": "n1",
                "policyRef": {"name": policy.metadata.name},
                "rule": rule.name,
                "signals": [{"source": "Event", "observedAt": NOW.isoformat(), "xid": 94,
                             "pciBusId": "0000:3b:00"}],
                "ladder": [r.to_k8s() for r in rule.ladder],
                "dryRun": dry_run,
            },
        }
    )  # fmt: skip


def _decide(policy: RemediationPolicy, nrem: Any, timeline: list[dict[str, str]],
            rung: int = 0, **kw: Any) -> Any:  # fmt: skip
    status = {"rung": rung, "timeline": timeline, "ownership": {"cordoned": True}}
    conds = [{"type": "Detected", "status": "True", "lastTransitionTime": "2026-11-22T06:00:00Z"}]
    return plan.decide_open(policy, nrem, status, conds, view(), [], NOW, blind=False,
                            approve_key="gpuheal.io/approve", **kw)  # fmt: skip


def test_open_incident_steps_come_from_the_engine() -> None:
    from gpuheal import policy as engine

    p = make_policy(requireApproval=["reset"])
    nrem = _incident(p)
    first = _decide(p, nrem, [], rung=1)
    assert isinstance(first, engine.Act)
    assert first.step.action is Action.CORDON  # type: ignore[union-attr]
    done = [{"time": "2026-11-22T06:00:00.100Z", "step": "reset/cordon"}]
    held = _decide(p, nrem, done, rung=1)
    assert isinstance(held, engine.Blocked)
    assert held.reason == "ApprovalPending"
    ok = _decide(p, _incident(p, annotations={"gpuheal.io/approve": "reset"}), done, rung=1)
    assert isinstance(ok, engine.Act)
    assert ok.step.action is Action.RESET  # type: ignore[union-attr]
    dry = _decide(p, _incident(p, dry_run=True), [], rung=0)
    assert isinstance(dry, engine.Blocked)
    assert dry.reason == "DryRun"
    assert dry.would is not None
    assert dry.would.step.action is Action.CORDON  # type: ignore[union-attr]
    blind = plan.decide_open(p, nrem, {"rung": 0, "timeline": [
        {"time": "2026-11-22T06:00:00.100Z", "step": "requeue/cordon"}],
        "ownership": {"cordoned": True}}, [], view(), [], NOW, blind=True,
        approve_key="a")  # fmt: skip
    assert isinstance(blind, engine.Blocked)
    assert blind.reason == "SignalSourceBlind"
