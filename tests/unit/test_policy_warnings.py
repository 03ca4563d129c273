"""Warnings on a valid policy's status: what may be meant, or depends on the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from gpuheal.api import RemediationPolicy
from gpuheal.policy.warnings import policy_warnings

CORDON = [{"name": "fence", "steps": [{"action": "cordon"}]}]
POOL = {"reservePoolRef": {"name": "spares"}}
REPLACE = [{"name": "out", "steps": [{"action": "replace", "replace": POOL}]}]
NOOP = {"hook": {"type": "Noop"}}
CORDON_STEP = {"action": "cordon"}
SLURM_DRAIN = {"action": "slurmDrain", "slurmDrain": {"requeue": "none"}}
RESET = {"action": "reset", "reset": NOOP}
REBOOT_AT_ONCE = {"action": "reboot", "reboot": {**NOOP, "whenIdle": False}}


def _rung(name: str, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "steps": list(steps)}]


SLURM_CYCLE = {"powerCycle": True, "hook": {"type": "Slurm"}}
WARM_CYCLE = [{"name": "boot", "steps": [SLURM_DRAIN, {"action": "reboot", "reboot": SLURM_CYCLE}]}]


def _spec(*rules: dict[str, Any], **safety: Any) -> Any:
    doc = {
        "metadata": {"name": "p"},
        "spec": {
            "nodeSelector": {},
            "safety": {"maxUnhealthy": 2, **safety},
            "rules": list(rules),
        },
    }
    return RemediationPolicy.model_validate(doc).spec


def _rule(name: str, ladder: list[dict[str, Any]] = CORDON, **signals: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": name, "signals": signals, "ladder": ladder}
    if len(ladder) > 1:
        rule["escalation"] = {"occurrences": 2, "window": "24h"}
    return rule


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (_spec(_rule("gone", xids=[79])), []),
        (
            _spec(_rule("gone", ladder=REPLACE, xids=[79])),
            ["rule gone, rung out: ReservePool spares does not exist"],
        ),
        (
            _spec(_rule("app", xids=[13])),
            ["rule app: XID 13 only alerts the first time it is seen on a GPU"],
        ),
        (
            _spec(_rule("odd", xidClasses=["Unknown"])),
            ["rule odd: class Unknown only alerts the first time"],
        ),
        (
            _spec(_rule("gone", ladder=[*REPLACE, *CORDON], xids=[79])),
            [
                "rule gone, rung out: ReservePool spares does not exist",
                "rule gone: rung fence comes after rung out, which replaces the node",
            ],
        ),
        (
            _spec(_rule("warm", ladder=WARM_CYCLE, xids=[79])),
            ["rule warm, rung boot: reboot.powerCycle is ignored with a Slurm hook"],
        ),
        (
            _spec(_rule("driver", xids=[154])),
            ["rule driver takes every XID 154, also recovery action None"],
        ),
        (
            _spec(
                _rule(
                    "npd",
                    ladder=[*CORDON, {"name": "drain", "steps": [{"action": "drain"}]}],
                    conditions=[{"type": "GpuXid", "status": "True"}],
                )
            ),
            ["rule npd counts repeats per GPU, but its conditions and Events name no GPU"],
        ),
        (
            _spec(_rule("all-xid-events", events=[{"reason": "GpuXid"}]), _rule("gone", xids=[79])),
            [
                "rule all-xid-events takes every GpuXid Event (matched by reason), so rules below "
                "it (gone) see XIDs from dcgm-exporter only"
            ],
        ),
        (
            _spec(_rule("remap", ladder=_rung("reset", CORDON_STEP, RESET), xids=[63])),
            ["rule remap, rung reset: reset has no slurmDrain before it: on a Slurm node"],
        ),
        (_spec(_rule("remap", ladder=_rung("reset", SLURM_DRAIN, RESET), xids=[63])), []),
        (
            _spec(_rule("gone", ladder=_rung("reboot", SLURM_DRAIN, REBOOT_AT_ONCE), xids=[79])),
            ["rule gone, rung reboot: reboot has whenIdle: false: it runs at once"],
        ),
        (
            _spec(_rule("gone", xids=[79]), maxUnhealthy=0),
            ["safety: maxUnhealthy 0 lets none of the 10 selected nodes out of service"],
        ),
        (_spec(_rule("gone", xids=[79]), maxUnhealthy=0, dryRun=True), []),
    ],
)
def test_policy_warnings(spec: Any, expected: list[str]) -> None:
    found = policy_warnings(spec, pools=set(), selected=10)
    assert len(found) == len(expected), found
    for text, prefix in zip(found, expected, strict=True):
        assert text.startswith(prefix), (text, prefix)


def test_no_warning_once_the_pool_exists_and_no_breaker_warning_without_nodes() -> None:
    spec = _spec(_rule("gone", ladder=REPLACE, xids=[79]), maxUnhealthy=0)
    assert policy_warnings(spec, pools={"spares"}, selected=0) == []


def test_a_pool_that_exists_but_does_not_parse_is_named_as_such() -> None:
    spec = _spec(_rule("gone", ladder=REPLACE, xids=[79]))
    (found,) = policy_warnings(spec, pools=set(), selected=10, unreadable={"spares"})
    assert "ReservePool spares is ignored, its spec does not parse" in found
    assert "does not exist" not in found


@pytest.mark.parametrize(
    ("matched", "expected"),
    [
        (0, "nodeSelector matches no node: this policy acts on nothing"),
        (3, "nodeSelector matches 3 node(s) but governs none"),
    ],
)
def test_a_policy_that_governs_no_node_says_why(matched: int, expected: str) -> None:
    spec = _spec(_rule("gone", xids=[79]))
    assert [w[: len(expected)] for w in policy_warnings(spec, set(), 0, matched=matched)] == [
        expected
    ]
    assert policy_warnings(spec, set(), 4, matched=None) == []  # governs some: nothing to say
