"""What the bridge says it can do on its Slurm (``/v1/capabilities``, the start-up line) and
when it refuses to start: a backend that cannot requeue there."""

from __future__ import annotations

import httpx

from gpuheal_bridge.backends.capabilities import discover, refusal, summary
from tests.unit.bridge.fakes import FakeSlurm
from tests.unit.bridge.test_rest import backend, v038


async def test_rest_only_on_22_05_cannot_requeue_and_is_refused_in_one_line() -> None:
    found = await discover(backend(v038))
    a = found.answer
    assert found.reached
    assert (a.backend, a.slurm_version, a.rest_api_version) == ("rest", "22.05.8", "v0.0.38")
    assert a.capabilities == ["read_jobs", "read_nodes"]
    assert "requeue" in a.missing
    assert a.backends == {"rest": ["read_jobs", "read_nodes"]}
    why = refusal(found)
    assert why is not None
    assert "\n" not in why
    assert "cannot requeue jobs on Slurm 22.05.8 (slurmrestd v0.0.38" in why
    assert "--backend cli" in why
    assert "--rest-write-fallback cli" in why
    assert summary(found).startswith("backend rest on Slurm 22.05.8 (slurmrestd v0.0.38): can ")


async def test_rest_with_the_cli_fallback_can_do_everything_and_says_who_does_what() -> None:
    found = await discover(backend(v038, fallback=FakeSlurm()))
    assert refusal(found) is None
    assert found.answer.missing == []
    assert found.answer.backends["rest"] == ["read_jobs", "read_nodes"]
    assert "requeue" in found.answer.backends["fake"]


async def test_an_unreachable_slurm_is_no_reason_to_refuse() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    found = await discover(backend(down, version=None))
    assert not found.reached
    assert found.answer.slurm_version is None
    assert refusal(found) is None
    assert "not reachable" in summary(found)
