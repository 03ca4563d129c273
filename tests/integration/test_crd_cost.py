"""The CRDs' CEL rules within the real API server's cost budgets: a policy at every bound is
accepted (no "actual cost limit exceeded"), and a policy at every bound that breaks every
cross-rule check still gets each check's own message, in words.

The budgets are the API server's: an estimate when the CRD is created (checked by every test
that installs the CRDs) and a count when an object is validated (checked here, with the
largest objects the schema allows).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuheal.api import RemediationPolicy
from tests.integration.test_crd_validation import crds  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

RULES, XIDS, CONDITIONS, EVENTS, RUNGS = 32, 16, 16, 16, 5


def _rung(n: int) -> dict[str, Any]:
    """Every action once, each with its options, different per rung."""
    return {
        "name": f"rung-{n}",
        "steps": [
            {"action": "alert"},
            {"action": "cordon"},
            {
                "action": "slurmDrain",
                "slurmDrain": {
                    "requeue": "requeue",
                    "checkpointSignal": "SIGUSR1",
                    "gracePeriod": f"{n + 1}m",
                },
            },
            {"action": "drain", "drain": {"timeout": "10m", "gracePeriod": "30s"}},
            {
                "action": "reset",
                "reset": {
                    "hook": {
                        "type": "Webhook",
                        "webhook": {"url": "https://bmc.example/" + "p" * 1000},
                    }
                },
            },
            {"action": "reboot", "reboot": {"hook": {"type": "Noop"}}},
            {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}},
        ],
    }


def _largest(name: str, *, clash: bool) -> dict[str, Any]:
    """Every list at its bound, every string long. `clash`: every rule lists the same
    signals (each cross-rule check fails 31 times over)."""
    rules = []
    for i in range(RULES):
        base = 0 if clash else i
        rules.append(
            {
                "name": f"rule-{i}",
                "signals": {
                    "xids": [1000 + base * XIDS + k for k in range(XIDS)],
                    "xidClasses": ["GpuReset", "NvLink"] if clash else [],
                    "conditions": [
                        {"type": f"Cond{base}x{k}" + "c" * 280, "status": "True", "for": "5m"}
                        for k in range(CONDITIONS)
                    ],
                    "events": [
                        {"reason": f"R{base}x{k}" + "r" * 100, "messageContains": "m" * 256}
                        for k in range(EVENTS)
                    ],
                },
                "escalation": {"occurrences": 2, "window": "24h"},
                "ladder": [_rung(n) for n in range(RUNGS)],
            }
        )
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {f"example.com/k{i}": "v" * 63 for i in range(32)}},
            "safety": {"maxUnhealthy": 1},
            "rules": rules,
        },
    }


def test_a_policy_at_every_bound_is_accepted(crds: Any) -> None:  # noqa: F811
    body = _largest("largest", clash=False)
    RemediationPolicy.model_validate(body)  # valid locally too
    result = crds.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False
    )
    assert result.returncode == 0, result.stderr[:2000]


def test_the_largest_clashing_policy_gets_every_message_in_words(crds: Any) -> None:  # noqa: F811
    body = _largest("largest-clash", clash=True)
    result = crds.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False
    )
    assert result.returncode != 0
    err = result.stderr
    assert "cost" not in err, err[:2000]
    for expected in (
        "XID 1000 is listed by rules rule-0 and rule-1",
        "XID class GpuReset is listed by rules rule-0 and rule-1",
        "condition Cond0x0",
        "Event reason R0x0",
    ):
        assert expected in err, f"{expected!r} not in {err[:3000]!r}"
