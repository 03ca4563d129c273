"""`gpuheal.readiness`: a problem is said once per change, /readyz answers with the reasons."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

import pytest

from gpuheal.readiness import Readiness


def test_each_problem_is_said_once_per_change_and_once_resolved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = Readiness(logging.getLogger("t"))
    assert r.answer() == (200, "ready\n")
    with caplog.at_level(logging.WARNING, logger="t"):
        assert r.problem("bridge:a", "token refused")
        assert not r.problem("bridge:a", "token refused")  # the same again: silent
        assert r.problem("forbidden:events", "events forbidden")
        assert r.answer() == (503, "not ready: token refused; events forbidden\n")
        assert r.problem("bridge:a", "unreachable")  # changed: said
        assert r.resolved("bridge:a")
        assert not r.resolved("bridge:a")
        assert r.resolved("forbidden:events")
    said = [rec.getMessage() for rec in caplog.records]
    assert said == [
        "not ready: token refused",
        "not ready: events forbidden",
        "not ready: unreachable",
        "resolved: unreachable",
        "resolved: events forbidden",
    ]
    assert r.answer() == (200, "ready\n")


def test_readyz_serves_the_answer() -> None:
    r = Readiness(logging.getLogger("t"))
    server = r.serve(0, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert (resp.status, resp.read()) == (200, b"ready\n")
        r.problem("k", "the kernel log cannot be read")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 503
        assert err.value.read() == b"not ready: the kernel log cannot be read\n"
    finally:
        server.shutdown()
        server.server_close()
