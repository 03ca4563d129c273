"""`service.stop` (kopf's clean-up) never raises: kopf retries a failed clean-up after its
default backoff, 60 s, the chart's whole termination grace, so a pod whose stop failed
part-way was killed at the end of it instead of exiting."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.remediation import service
from gpuheal.remediation.state import Runtime


class _Lease:
    def __init__(self, failure: BaseException | None = None, hang: bool = False) -> None:
        self.failure, self.hang, self.released = failure, hang, False

    async def release(self) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        if self.failure is not None:
            raise self.failure
        self.released = True


def _runtime(lease: _Lease) -> Runtime:
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.ports.lease = lease  # type: ignore[assignment]
    return rt


async def test_a_stop_that_fails_part_way_is_logged_and_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = _runtime(_Lease(RuntimeError("token of a deleted ServiceAccount")))
    with caplog.at_level(logging.ERROR, logger="gpuheal.service"):
        await service.stop(rt.ports, rt.view, rt.books)  # kopf sees no failure to retry
    assert "clean-up failed part-way" in caplog.text
    assert "token of a deleted ServiceAccount" in caplog.text


async def test_a_lease_release_that_hangs_is_cut_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "RELEASE_WITHIN", 0.05)
    rt = _runtime(_Lease(hang=True))
    closed: list[str] = []

    class _Kube:
        async def close(self) -> None:
            closed.append("kube")

    rt.ports.kube = _Kube()  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="gpuheal.service"):
        await asyncio.wait_for(service.stop(rt.ports, rt.view, rt.books), 10)
    assert "Lease not released within 0.05s" in caplog.text  # the cut, said
    assert closed == ["kube"]  # and the rest of the stop still done


async def test_a_clean_stop_releases_the_lease() -> None:
    lease = _Lease()
    rt = _runtime(lease)
    await service.stop(rt.ports, rt.view, rt.books)
    assert lease.released
