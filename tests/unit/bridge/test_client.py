"""The operator's client against a mock transport: retries, Retry-After, keys, error types."""

from __future__ import annotations

import json

import httpx
import pytest
import tenacity

from gpuheal_bridge.api.models import CheckpointSignal, RequeueOptions
from gpuheal_bridge.client import (
    BridgeClient,
    BridgeConflict,
    BridgeInvalid,
    BridgeNotFound,
    BridgeUnauthorized,
    BridgeUnavailable,
    parse_retry_after,
    retry_wait,
)

NODE = {
    "node": "node1",
    "slurm_node": "node1",
    "state": "MIXED",
    "flags": ["DRAIN"],
    "drain": True,
    "unavailable": True,
    "reason": "gpuheal: i1 xid=79",
    "owner": "gpuheal",
    "incident": "i1",
    "xid": 79,
}
DRAINED = {
    "node": "node1",
    "slurm_node": "node1",
    "outcome": "drained",
    "owner": "gpuheal",
    "previous": {**NODE, "flags": [], "drain": False, "unavailable": False, "owner": "none"},
    "current": NODE,
    "jobs": [],
}


class Recorder:
    def __init__(self, answers: list[httpx.Response | Exception]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def client(rec: Recorder, slept: list[float]) -> BridgeClient:
    async def sleep(s: float) -> None:
        slept.append(s)

    return BridgeClient(
        "http://bridge", "tok" * 8, transport=httpx.MockTransport(rec), retries=3, sleep=sleep
    )


async def test_drain_retries_503_with_same_key_and_honours_retry_after() -> None:
    unavailable = {"error": "unavailable", "message": "slurmctld down", "retry_after_seconds": 7}
    rec = Recorder(
        [
            httpx.Response(503, json=unavailable, headers={"Retry-After": "7"}),
            httpx.ConnectError("refused"),
            httpx.Response(200, json=DRAINED),
        ]
    )
    slept: list[float] = []
    async with client(rec, slept) as c:
        resp = await c.drain("node1", incident="i1", xid=79, requeue=RequeueOptions())
    assert resp.outcome == "drained"
    keys = {r.headers["Idempotency-Key"] for r in rec.requests}
    assert len(rec.requests) == 3
    assert len(keys) == 1
    assert rec.requests[0].headers["Authorization"] == "Bearer " + "tok" * 8
    assert slept[0] >= 7  # Retry-After is the floor
    assert json.loads(rec.requests[0].content)["incident"] == "i1"


async def test_gives_up_after_retries() -> None:
    rec = Recorder([httpx.ReadTimeout("slow")] * 4)
    slept: list[float] = []
    async with client(rec, slept) as c:
        with pytest.raises(BridgeUnavailable):
            await c.get_node("node1")
    assert len(rec.requests) == 4
    assert len(slept) == 3


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, BridgeUnauthorized), (404, BridgeNotFound), (409, BridgeConflict), (422, BridgeInvalid)],
)
async def test_client_errors_are_not_retried(status: int, error: type[Exception]) -> None:
    body = {"error": "conflict", "message": "drained by someone else", "owner": "other"}
    rec = Recorder([httpx.Response(status, json=body)])
    async with client(rec, []) as c:
        with pytest.raises(error) as info:
            await c.resume("node2", incident="i1")
    assert len(rec.requests) == 1
    assert info.value.status == status  # type: ignore[attr-defined]


async def test_explicit_key_and_requeue_body() -> None:
    result = {"job_id": 7, "outcome": "requeued"}
    rec = Recorder([httpx.Response(200, json=result)])
    async with client(rec, []) as c:
        opts = RequeueOptions(checkpoint=CheckpointSignal(grace_seconds=20), expedite=True)
        out = await c.requeue_job(7, opts, from_node="node1", idempotency_key="nrem-a/requeue/7")
    assert out.outcome == "requeued"
    req = rec.requests[0]
    assert req.headers["Idempotency-Key"] == "nrem-a/requeue/7"
    sent = json.loads(req.content)
    assert sent["from_node"] == "node1"
    assert sent["checkpoint"]["grace_seconds"] == 20
    assert req.extensions["timeout"]["read"] >= 30 + 20 + 30  # budget for grace + expedite


def waited(
    monkeypatch: pytest.MonkeyPatch,
    attempt: int,
    retry_after: float | None,
    pick: str,
) -> float:
    """``retry_wait(0.5, 30)`` after ``attempt`` failed tries (0-based, as the loop counted
    them), with tenacity's jitter pinned to the low or high end of its window."""
    ends = {"low": lambda lo, hi: lo, "high": lambda lo, hi: hi}
    monkeypatch.setattr(tenacity.wait.random, "uniform", ends[pick])
    state = tenacity.RetryCallState(tenacity.AsyncRetrying(), None, (), {})
    state.attempt_number = attempt + 1
    exc = BridgeUnavailable("down", 503, retry_after=retry_after)
    state.set_exception((BridgeUnavailable, exc, None))
    return retry_wait(0.5, 30)(state)


def test_backoff_and_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_retry_after("5") == 5
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert waited(monkeypatch, 3, retry_after=None, pick="high") == 4.0
    assert waited(monkeypatch, 10, retry_after=None, pick="high") == 30
    assert waited(monkeypatch, 0, retry_after=100, pick="low") == 30
