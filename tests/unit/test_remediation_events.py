"""Events go out in the background, in order, retried while the API server is busy, and
an Event that cannot be posted is logged and counted, never dropped silently."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gpuheal.adapters.events import EventOutbox
from gpuheal.adapters.kube import ApiError, EventBudget


class FakeKube:
    """Answers `send_event` with the next failure in `failures` (then success)."""

    def __init__(self, failures: list[BaseException] | None = None) -> None:
        self.failures = list(failures or [])
        self.sent: list[tuple[str, str]] = []
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.budget = EventBudget(burst=3, refill=3600.0)

    def event_allowed(self, involved: dict[str, Any]) -> bool:
        return self.budget.allow(involved["metadata"]["name"])

    async def send_event(self, involved: dict[str, Any], **kw: Any) -> None:
        self.calls += 1
        await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append((involved["metadata"]["name"], kw["reason"]))


def node(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name}}


async def test_post_returns_at_once_and_the_workers_send_in_order() -> None:
    kube = FakeKube()
    kube.gate.clear()  # the API server is slow: post() must not wait for it
    counted: list[str] = []
    outbox = EventOutbox(kube, workers=1, count=counted.append)  # type: ignore[arg-type]
    for i in range(5):
        outbox.post(node(f"n{i}"), reason="RemediationCreated", message="m")
    assert kube.sent == []
    runner = asyncio.create_task(outbox.run())
    kube.gate.set()
    await asyncio.wait_for(outbox.queue.join(), 5)
    runner.cancel()
    assert kube.sent == [(f"n{i}", "RemediationCreated") for i in range(5)]
    assert counted == ["posted"] * 5


async def test_busy_api_server_is_retried_and_a_refusal_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    busy = [ApiError(503, "Service Unavailable"), ApiError(429, "Too Many Requests")]
    kube = FakeKube([*busy, ApiError(422, "Unprocessable", "bad namespace")])
    counted: list[str] = []
    outbox = EventOutbox(kube, workers=1, max_wait=0.01, count=counted.append)  # type: ignore[arg-type]
    runner = asyncio.create_task(outbox.run())
    with caplog.at_level(logging.WARNING, "gpuheal.adapters.events"):
        outbox.post(node("a"), reason="StepDone", message="cordoned")  # 503, 429, then 422
        outbox.post(node("b"), reason="StepDone", message="drained")
        await asyncio.wait_for(outbox.queue.join(), 5)
    runner.cancel()
    assert kube.sent == [("b", "StepDone")]
    assert sorted(counted) == ["lost", "posted"]
    assert "Event not posted (ApiError: 422 Unprocessable" in caplog.text
    assert "StepDone on Node a" in caplog.text
    assert "cordoned" in caplog.text


async def test_a_full_queue_and_what_is_left_at_shutdown_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    kube.gate.clear()  # never answers
    counted: list[str] = []
    outbox = EventOutbox(kube, workers=1, capacity=2, count=counted.append)  # type: ignore[arg-type]
    runner = asyncio.create_task(outbox.run())
    with caplog.at_level(logging.WARNING, "gpuheal.adapters.events"):
        for i in range(4):  # one in flight, two queued, the fourth does not fit
            outbox.post(node(f"n{i}"), reason="R", message=f"m{i}")
            await asyncio.sleep(0)
        await outbox.flush(within=0.05)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert counted.count("lost") == 4
    assert "the Event queue is full" in caplog.text
    assert "still queued at shutdown" in caplog.text
    assert "cancelled at shutdown" in caplog.text


async def test_past_an_objects_budget_events_are_dropped_before_the_queue() -> None:
    kube = FakeKube()
    results: list[str] = []
    outbox = EventOutbox(kube, count=results.append)  # type: ignore[arg-type]
    worker = asyncio.create_task(outbox.run())
    for i in range(5):
        outbox.post(node("n1"), reason=f"R{i}", message="m")
    outbox.post(node("n2"), reason="Other", message="m")
    await outbox.flush(5)
    worker.cancel()
    assert kube.sent == [("n1", "R0"), ("n1", "R1"), ("n1", "R2"), ("n2", "Other")]
    assert sorted(results) == ["dropped", "dropped", "posted", "posted", "posted", "posted"]
