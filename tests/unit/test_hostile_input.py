"""Hostile cluster input, the pure parts: garbage annotations, Event floods, NodeRemediations
written by hand (the whole path runs on the sandbox: tests/integration/test_operator_hostile.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuheal.adapters.kube import EventBudget
from gpuheal.api import NodeRemediation, RemediationPolicy
from gpuheal.policy.inputs import node_view
from gpuheal.policy.types import IncidentSummary
from gpuheal.policy.vet import ladder_of, refusal
from gpuheal.xid.identity import GPU_MAP_ANNOTATION, parse_gpu_map


@pytest.mark.parametrize(
    "text",
    ["[" * 60_000, "{" * 30_000, '{"0000:3b:00": ' * 10_000, "not json", "[1, 2]", '{"x": 1}'],
)
def test_a_garbage_gpu_map_reads_as_empty(text: str) -> None:
    assert parse_gpu_map(text).by_pci == {}
    body = {"metadata": {"name": "n", "annotations": {GPU_MAP_ANNOTATION: text}}}
    assert node_view(body).gpus.by_pci == {}


def test_event_budget_allows_a_burst_then_one_per_refill() -> None:
    now = [0.0]
    budget = EventBudget(burst=3, refill=10.0, clock=lambda: now[0])
    assert [budget.allow("Node/default/a") for _ in range(5)] == [True, True, True, False, False]
    assert budget.allow("Node/default/b")  # another object has its own budget
    now[0] = 9.0
    assert not budget.allow("Node/default/a")  # 0.9 of a token
    now[0] = 20.0  # 2 tokens by now
    assert [budget.allow("Node/default/a") for _ in range(3)] == [True, True, False]
    assert budget.dropped == 4


def test_event_budget_remembers_a_bounded_number_of_objects() -> None:
    budget = EventBudget(burst=1, refill=3600.0, clock=lambda: 0.0, max_objects=10)
    for i in range(1000):
        assert budget.allow(f"Node/default/n{i}")
    assert len(budget.tokens) == 10


POLICY = RemediationPolicy.model_validate(
    {
        "metadata": {"name": "p"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "train"}},
            "safety": {"maxUnhealthy": 1},
            "rules": [
                {
                    "name": "gone",
                    "signals": {"xids": [79]},
                    "escalation": {"occurrences": 2, "window": "24h"},
                    "ladder": [
                        {"name": "fence", "steps": [{"action": "cordon"}, {"action": "drain"}]},
                        {
                            "name": "out",
                            "steps": [
                                {"action": "cordon"},
                                {
                                    "action": "replace",
                                    "replace": {"reservePoolRef": {"name": "spares"}},
                                },
                            ],
                        },
                    ],
                }
            ],
        },
    }
)


def _nrem(**spec: Any) -> NodeRemediation:
    rule = POLICY.spec.rules[0]
    base = {
        "nodeName": "gpu-1",
        "policyRef": {"name": "p"},
        "rule": "gone",
        "signals": [{"source": "Manual", "observedAt": "2026-01-01T00:00:00Z"}],
        "ladder": [r.to_k8s() for r in rule.ladder],
    }
    return NodeRemediation.model_validate(
        {"metadata": {"name": "by-hand"}, "spec": {**base, **spec}}
    )


def _summary(name: str, node: str = "gpu-1", *, started: bool = False) -> IncidentSummary:
    return IncidentSummary(
        name=name, node=node, policy="p", active=True, holds_slot=False, started=started,
    )  # fmt: skip


def test_a_noderemediation_gpuheal_could_have_opened_is_driven() -> None:
    nrem = _nrem()
    assert refusal("by-hand", nrem.spec, POLICY, "p", [_summary("by-hand")]) is None


@pytest.mark.parametrize(
    ("changes", "governing", "others", "why"),
    [
        ({"policyRef": {"name": "nope"}}, "p", [], "RemediationPolicy nope does not exist"),
        ({}, None, [], "RemediationPolicy p does not govern node gpu-1"),
        ({}, "other", [], "does not govern node gpu-1 (RemediationPolicy other does)"),
        ({}, "p", [_summary("gpuheals", started=True)], "already has an open incident, gpuheals"),
        ({"rule": "made-up"}, "p", [], "RemediationPolicy p has no rule made-up"),
        (
            {"ladder": [{"name": "fence", "steps": [{"action": "reboot", "reboot": {"hook": {
                "type": "Job", "job": {"namespace": "kube-system", "template": {}}}}}]}]},
            "p", [], "its ladder is not rule gone's",
        ),
    ],
)  # fmt: skip
def test_a_noderemediation_written_by_hand_is_refused(
    changes: dict[str, Any], governing: str | None, others: list[IncidentSummary], why: str
) -> None:
    nrem = _nrem(**changes)
    found = refusal("by-hand", nrem.spec, POLICY if changes.get("policyRef") is None else None,
                    governing, [_summary("by-hand"), *others])  # fmt: skip
    assert found is not None
    assert why in found


def test_only_an_incident_that_passed_its_first_look_holds_the_node() -> None:
    """Two not looked at yet: the first looked at takes the node (the driver marks it
    started before any await), the other is refused when its turn comes."""
    nrem = _nrem()
    others = [
        _summary("by-hand"),
        _summary("not-yet"),
        _summary("elsewhere", "gpu-2", started=True),
    ]
    assert refusal("by-hand", nrem.spec, POLICY, "p", others) is None
    others[1] = _summary("not-yet", started=True)
    assert "already has an open incident, not-yet" in (
        refusal("by-hand", nrem.spec, POLICY, "p", others) or ""
    )


def test_a_live_incident_under_a_dry_run_policy_is_refused() -> None:
    dry = POLICY.model_copy(deep=True)
    dry.spec.safety.dry_run = True
    assert "is in dry run" in (refusal("by-hand", _nrem().spec, dry, "p", []) or "")
    assert refusal("by-hand", _nrem(dryRun=True).spec, dry, "p", []) is None


def test_the_engines_guarded_rung_is_the_rules_ladder() -> None:
    rule = POLICY.spec.rules[0]
    ladder = [r.model_copy(deep=True) for r in rule.ladder]
    ladder[1].steps = [ladder[1].steps[0]]  # replace dropped on first sight (XID 94 guard)
    assert ladder_of(ladder, rule)
    ladder[0].steps = [ladder[0].steps[1], ladder[0].steps[0]]  # another order: not the rule's
    assert not ladder_of(ladder, rule)


def test_a_node_under_a_forged_or_stale_mark_counts_once_against_max_unhealthy() -> None:
    from gpuheal.policy.types import NodeView
    from tests.unit.test_policy_history import scanned_counts

    open_one = IncidentSummary(
        name="nrem-new", node="gpu-1", policy="p", active=True, holds_slot=True
    )
    marked = NodeView(name="gpu-1", unschedulable=True, cordoned_by="nrem-forged")
    other = NodeView(name="gpu-2", unschedulable=True, cordoned_by="nrem-old")
    counts = scanned_counts("p", 10, [open_one], [marked, other])
    assert counts.remediating == 2  # gpu-1 once (its open incident), gpu-2 (kept out)
