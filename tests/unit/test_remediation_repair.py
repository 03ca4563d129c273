"""The pure parts of verified repair and the living pool: when a reset counts (GPUs back),
Job names and pinning, the verdict of a node-condition check, when a pool asks for spares."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpuheal.api.remediationpolicy import NodeConditionCheck
from gpuheal.api.reservepool import RefillStatus, ReservePool
from gpuheal.policy.spares import refill_due
from gpuheal.remediation import steps

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
MIN = dt.timedelta(minutes=1)


def node(
    *, ready: str = "True", alloc: str | None = "8", count: str | None = "8"
) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.count": count} if count else {}
    return {
        "metadata": {"name": "n1", "labels": labels},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": alloc} if alloc else {},
        },
    }


@pytest.mark.parametrize(
    ("body", "back", "says"),
    [
        (node(), True, "Ready, 8 of 8 GPUs allocatable"),
        (node(alloc="7"), False, "7 of 8 GPUs allocatable"),
        (node(alloc=None), False, "0 of 8 GPUs allocatable"),
        (node(ready="Unknown"), False, "node not Ready"),
        (node(count=None, alloc="8"), True, "Ready, 8 of 8 GPUs allocatable"),  # capacity
        (None, False, "node not found"),
    ],
)
def test_the_gpus_came_back(body: dict[str, Any] | None, back: bool, says: str) -> None:
    assert steps.gpus_back(body) == (back, says)


def test_job_names_fit_and_stay_distinct() -> None:
    short = steps.job_name_for("nrem-n1-abcd1234", "reboot-0")
    assert short == "nrem-n1-abcd1234-reboot-0"
    long_a = steps.job_name_for("nrem-" + "x" * 49 + "-aaaaaaaa", "check-1-2")
    long_b = steps.job_name_for("nrem-" + "x" * 49 + "-bbbbbbbb", "check-1-2")
    assert len(long_a) <= 63
    assert long_a != long_b
    assert long_a.endswith("-check-1-2")


def test_a_pinned_job_runs_on_the_node_whatever_its_taints() -> None:
    template = {"template": {"spec": {"nodeSelector": {"a": "b"}, "containers": [{"name": "c"}]}}}
    spec = steps._job_spec(template, node="n1", action="check", incident="i", pin=True)
    pod = spec["template"]["spec"]
    assert pod["nodeName"] == "n1"
    assert "nodeSelector" not in pod
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert {"name": "GPUHEAL_ACTION", "value": "check"} in pod["containers"][0]["env"]
    loose = steps._job_spec(template, node="n1", action="reboot", incident="i")
    assert "nodeName" not in loose["template"]["spec"]


def _cond(status: str, heartbeat: dt.datetime) -> dict[str, Any]:
    return {"status": {"conditions": [{
        "type": "GpuHealthy", "status": status, "reason": "DcgmHealth",
        "lastHeartbeatTime": heartbeat.isoformat(),
        "lastTransitionTime": (NOW - 60 * MIN).isoformat()}]}}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (_cond("True", NOW + MIN), "done"),  # a verdict after the check started
        (_cond("False", NOW + MIN), "failed"),
        (_cond("True", NOW - MIN), "wait"),  # from before: does not count
        (_cond("Unknown", NOW + MIN), "wait"),
        ({"status": {"conditions": []}}, "wait"),
    ],
)
def test_node_condition_verdicts_count_only_after_the_check_started(
    body: dict[str, Any], kind: str
) -> None:
    want = NodeConditionCheck(type="GpuHealthy")
    assert steps._condition_verdict(body, want, since=NOW, retry=1.0).kind == kind


def _pool(**refill: Any) -> ReservePool:
    return ReservePool.model_validate({
        "metadata": {"name": "spares"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "reserve"}}, "minAvailable": 3,
                 "refill": refill or {"provider": "None"}},
    })  # fmt: skip


WEBHOOK = {"provider": "Webhook", "webhook": {"url": "http://p/refill", "interval": "10m"}}


def test_refill_is_asked_once_per_shortfall_then_after_the_interval() -> None:
    spec = _pool(**WEBHOOK).spec
    since = NOW - 5 * MIN
    ask = refill_due("spares", spec, 1, low_since=since, last=None, now=NOW)
    assert ask is not None
    assert (ask.wanted, ask.since, ask.key) == (2, since, f"spares-{int(since.timestamp())}-2")
    asked = RefillStatus(requested_at=NOW, wanted=2, since=since, result="Accepted")
    assert refill_due("spares", spec, 1, low_since=since, last=asked, now=NOW + MIN) is None
    assert refill_due("spares", spec, 1, low_since=since, last=asked, now=NOW + 10 * MIN)
    assert refill_due("spares", spec, 0, low_since=since, last=asked, now=NOW + MIN), "worse"
    refused = RefillStatus(requested_at=NOW, wanted=2, since=since, result="Refused")
    assert refill_due("spares", spec, 1, low_since=since, last=refused, now=NOW + HOUR) is None
    later = NOW + HOUR
    assert refill_due("spares", spec, 1, low_since=later, last=refused, now=later), "new shortfall"
    assert refill_due("spares", spec, 3, low_since=None, last=None, now=NOW) is None, "not low"
    assert refill_due("spares", _pool().spec, 0, low_since=since, last=None, now=NOW) is None


HOUR = dt.timedelta(hours=1)
