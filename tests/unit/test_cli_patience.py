"""The CLI waits out an API server that answers 429 (storage initialising, load shed) on
reads, for a bounded time, and says anything else at once."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from gpuheal.cli import _cluster


def busy(retry_after: str = "2") -> ApiException:
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": retry_after}
    return exc


def test_a_busy_server_is_asked_again_after_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(_cluster.time, "sleep", slept.append)
    answers: list[object] = [busy("2"), busy("60"), {"items": []}]

    def call() -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert _cluster.patiently(call) == {"items": []}
    assert slept == [2.0, 5.0]  # the server's word, capped at 5 s


def test_other_errors_and_a_server_busy_for_too_long_are_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cluster.time, "sleep", lambda s: None)

    def forbidden() -> object:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException) as refused:
        _cluster.patiently(forbidden)
    assert refused.value.status == 403

    def always_busy() -> object:
        raise busy()

    with pytest.raises(ApiException) as gave_up:
        _cluster.patiently(always_busy, patience=0.0)
    assert gave_up.value.status == 429
