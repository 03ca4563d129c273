"""A policy or pool stored by the API server that the operator cannot read (written before a
rule was added, or by a newer CRD) is ignored, and its status says so (Ready=False,
InvalidSpec, the field and why) instead of keeping the last good object's Ready=True."""

from __future__ import annotations

import copy
import datetime as dt
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.api.names import POOL_PLURAL
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.remediation import objects, report
from gpuheal.remediation.state import Runtime
from tests.unit.test_policy_select import make_policy

NOW = dt.datetime(2026, 11, 23, 22, 0, tzinfo=dt.UTC)
LOW = {
    "type": "Low",
    "status": "False",
    "reason": "EnoughSpares",
    "message": "2 available, minAvailable 1",
    "lastTransitionTime": "2026-11-23T20:00:00Z",
    "observedGeneration": 1,
}


def pool_body(reason: str = "reserve pool", generation: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": "spares", "generation": generation, "resourceVersion": "7"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "spares"}},
            "minAvailable": 1,
            "promotion": {"slurm": {"reserveReason": reason}},
        },
        "status": {
            "observedGeneration": 1,
            "conditions": [
                LOW,
                {**LOW, "type": "Ready", "status": "True", "reason": "Active", "message": ""},
            ],
        },
    }


@pytest.fixture
def rt() -> Runtime:
    return Runtime(OperatorConfig(), Metrics(CollectorRegistry()))


def test_a_pool_that_does_not_parse_is_ignored_and_said_so(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    objects.pool_changed(rt.view, "ADDED", pool_body())
    assert "spares" in rt.view.pools
    with caplog.at_level(logging.ERROR, "gpuheal.objects"):
        objects.pool_changed(rt.view, "MODIFIED", pool_body("gpuheal: mine", generation=3))
        objects.pool_changed(rt.view, "MODIFIED", pool_body("gpuheal: mine", generation=3))
    assert "spares" not in rt.view.pools  # not used while it does not parse
    bad = rt.view.unparsed[(POOL_PLURAL, "spares")]
    assert bad.generation == 3
    assert bad.why.startswith("spec.promotion.slurm.reserveReason: ")
    assert "Value error" not in bad.why
    assert len(caplog.records) == 1  # once per generation, not per status write

    status = report.unparsed_status(bad, NOW)
    assert status["observedGeneration"] == 3
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.promotion.slurm.reserveReason" in ready["message"]
    assert ready["lastTransitionTime"] == "2026-11-23T22:00:00Z"
    assert {c["type"]: c for c in status["conditions"]}["Low"] == LOW  # left as it was

    objects.pool_changed(rt.view, "MODIFIED", pool_body("reserve pool", generation=4))
    assert "spares" in rt.view.pools
    assert rt.view.unparsed == {}
    ready_again = report.pool_status(
        rt.ports, rt.view, rt.books, rt.view.pools["spares"], NOW
    ).conditions
    assert [(c.status, c.reason) for c in ready_again if c.type == "Ready"] == [("True", "Active")]


def test_a_deleted_unparsed_pool_is_forgotten(rt: Runtime) -> None:
    objects.pool_changed(rt.view, "ADDED", pool_body("a\nb"))
    assert (POOL_PLURAL, "spares") in rt.view.unparsed
    objects.pool_changed(rt.view, "DELETED", pool_body("a\nb"))
    assert rt.view.unparsed == {}


def test_a_policy_that_does_not_parse_is_dropped_and_said_so(rt: Runtime) -> None:
    body = make_policy("p", labels={"pool": "p"}).to_k8s()
    body["metadata"]["generation"] = 5
    objects.policy_changed(rt.ports, rt.view, rt.books, "ADDED", body)
    assert "p" in rt.view.policies
    broken = copy.deepcopy(body)
    broken["spec"]["safety"]["maxUnhealthy"] = "lots"
    broken["metadata"]["generation"] = 6
    objects.policy_changed(rt.ports, rt.view, rt.books, "MODIFIED", broken)
    assert "p" not in rt.view.policies
    why = rt.view.unparsed[("remediationpolicies", "p")].why
    assert why.startswith("spec.safety.maxUnhealthy")


class _Kube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    async def patch_custom_status(self, plural: str, name: str, status: Any) -> None:
        self.patches.append((plural, name, status))


async def test_report_writes_the_unparsed_status_once(rt: Runtime) -> None:
    kube = _Kube()
    rt.ports.kube = kube  # type: ignore[assignment]
    objects.pool_changed(rt.view, "ADDED", pool_body("gpuheal: mine"))
    last: dict[tuple[str, str], Any] = {}
    await report.report_once(rt.ports, rt.view, rt.books, last)
    await report.report_once(rt.ports, rt.view, rt.books, last)
    assert [(p, n) for p, n, _ in kube.patches] == [(POOL_PLURAL, "spares")]
    ready = {c["type"]: c for c in kube.patches[0][2]["conditions"]}["Ready"]
    assert ready["reason"] == "InvalidSpec"
