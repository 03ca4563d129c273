"""The early spare claim beside a failing step (`driver._reserve_spare`): it never wakes
the driver unless it claimed a spare.

With the Slurm bridge's port closed, each pass of an incident whose rung ends in `replace`
fails its Slurm drain (a wait of 1, 2, 4 .. s) and starts the early claim, whose Slurm
resume fails too. A failed claim used to wake the driver: its pass failed the drain at once
and started the claim again, each failure waking the next (hundreds of bridge calls a
second, the event loop spinning). Here the pass is the driver's own bookkeeping around a
stand-in for the step and the claim (`steps.replace`, the only part that talks to the
cluster, is replaced); the loop is the real `driver._drive`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import Step
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.remediation import driver, steps
from gpuheal.remediation.record import Recorder
from gpuheal.remediation.state import Runtime

NAME = "nrem-1"
RESERVE = Step.model_validate(
    {"action": "replace", "replace": {"reservePoolRef": {"name": "spares"}}}
)


def _nrem() -> NodeRemediation:
    return NodeRemediation.model_validate(
        {
            "metadata": {"name": NAME},
            "spec": {
                "nodeName": "gpu-1",
                "policyRef": {"name": "p"},
                "rule": "xid",
                "signals": [{"source": "Manual", "observedAt": "2026-11-23T12:00:00Z"}],
                "ladder": [{"name": "replace", "steps": [
                    {"action": "slurmDrain"}, {"action": "replace", "replace": {
                        "reservePoolRef": {"name": "spares"}}}]}],
            },
        }
    )  # fmt: skip


REFUSED = steps.StepResult.wait(
    "ReplacementClaimed",
    "BridgeUnavailable",
    "claimed spare-1; Slurm resume pending: Slurm bridge http://127.0.0.1:1: refused",
    5.0,
)
NO_SPARE = steps.StepResult.wait("ReplacementClaimed", "NoSpareAvailable", "none ready", 5.0)
CLAIMED = steps.StepResult.done(
    "ReplacementClaimed", "SpareClaimed", "spare-1 promoted", replacementNode="spare-1"
)


async def _passes_in(
    monkeypatch: pytest.MonkeyPatch, claim: steps.StepResult | Exception, seconds: float
) -> tuple[int, int]:
    """Run the driver for ``seconds`` over passes that each fail the drain (a 1 s wait, the
    first rung of its backoff) beside the early claim ending in ``claim``: (passes, claims)."""
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.ports.kube = object()  # type: ignore[assignment]  # the stand-in claim never uses it
    nrem = _nrem()
    passes = claims = 0

    async def replace(*args: Any, **kwargs: Any) -> steps.StepResult:
        nonlocal claims
        claims += 1
        await asyncio.sleep(0)  # a call that fails at once (a closed port)
        if isinstance(claim, Exception):
            raise claim
        return claim

    async def advance(*args: Any) -> float:
        nonlocal passes, nrem
        passes += 1
        rec = Recorder(nrem, dt.datetime.now(dt.UTC))
        driver._record_reserved(rt.books, nrem, rec)
        nrem = nrem.model_copy(update={"status": rec.status})  # as written by the pass
        driver._reserve_spare(rt.ports, rt.view, rt.books, nrem, RESERVE)
        return 1.0  # the Slurm drain: BridgeUnavailable, look again in 1 s

    monkeypatch.setattr(steps, "replace", replace)
    monkeypatch.setattr(driver, "advance", advance)
    driver.ensure_driver(rt.ports, rt.view, rt.books, NAME)
    await asyncio.sleep(seconds)
    driver.stop_driver(rt.view, rt.books, NAME)
    return passes, claims


@pytest.mark.parametrize(
    "claim",
    [REFUSED, NO_SPARE, OSError("connection refused")],
    ids=["bridge-refused", "no-spare", "raised"],
)
async def test_a_failed_early_claim_does_not_wake_the_driver(
    monkeypatch: pytest.MonkeyPatch, claim: steps.StepResult | Exception
) -> None:
    passes, claims = await _passes_in(monkeypatch, claim, 0.5)
    assert (passes, claims) == (1, 1), (
        f"{passes} passes and {claims} early claims in 0.5 s with the drain waiting 1 s: "
        "the failed claim woke the driver, whose pass started it again (a wake-up loop)"
    )


async def test_a_claimed_spare_wakes_the_driver_to_record_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes, claims = await _passes_in(monkeypatch, CLAIMED, 0.5)
    # The pass it woke recorded the claim and started no other: the incident names its spare.
    assert (passes, claims) == (2, 1)
