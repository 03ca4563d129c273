"""Fuzz the API from its own OpenAPI document (schemathesis): no 5xx, answers match the schema.

Runs against the in-memory Slurm (fake clock, so checkpoint grace periods do not sleep).
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm

TOKEN = "fuzz-token-0123456789abcdef"


def _app() -> object:
    """The app on an in-memory Slurm; in-memory idempotency store (no state_dir)."""
    slurm = FakeSlurm()
    for i in range(3):
        slurm.add_node(f"node{i}", "MIXED")
    slurm.add_node("admin", "IDLE", ("DRAIN",), "admin: fan")
    slurm.add_job(FakeJob(1, ["node1"]))
    clock = FakeClock()
    return create_app(
        BridgeSettings(
            backend=slurm,
            tokens={"fuzz": TOKEN},
            operations=Operations(slurm, clock=clock, sleep=clock.sleep),
            # schemathesis calls as "testclient" over http: the transport rule (plain HTTP
            # from loopback only) is tested in test_app; here the API behind it is fuzzed.
            remote_plain_http=True,
        )
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


def not_a_server_error(
    ctx: object, response: schemathesis.Response, case: schemathesis.Case[Any]
) -> None:
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_from_openapi(case: schemathesis.Case[Any]) -> None:
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
