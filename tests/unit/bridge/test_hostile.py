"""Hostile input found by probing the running bridge in front of a real Slurm (issue 16):
each case here failed before its fix. The same input against the live bridge and Slurm is
``tests/integration/test_bridge_hostile.py``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuheal.xid.parse import MAX_XID
from gpuheal_bridge.api.models import (
    CheckpointSignal,
    DrainRequest,
    JobRequeueRequest,
    RebootRequest,
    ResumeOutcome,
    ResumeRequest,
)
from gpuheal_bridge.api.names import (
    IDEMPOTENCY_KEY_MAX,
    IDEMPOTENCY_KEY_PATTERN,
    JOB_ID_MAX,
    JOB_ID_PATTERN,
    NODE_NAME_MAX,
    NODE_NAME_PATTERN,
    XID_MAX,
    InvalidName,
    node_name_problem,
    validate_job_id,
)
from gpuheal_bridge.operations import Operations, OwnershipConflict
from gpuheal_bridge.server.app import MAX_BODY_BYTES
from gpuheal_bridge.server.idempotency import valid_key
from tests.unit.bridge.fakes import FakeSlurm
from tests.unit.bridge.test_app import make_client

TOKEN = "t0ken-for-the-operator-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(slurm: FakeSlurm, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(slurm, tmp_path) as c:
        yield c


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ---- resume names the incident whose drain it lifts -----------------------------------------
async def test_resume_without_incident_does_not_lift_another_incidents_drain(
    ops: Operations, slurm: FakeSlurm
) -> None:
    """A valid token and no incident used to lift any gpuheal drain, e.g. another incident's."""
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc", xid=79))
    with pytest.raises(OwnershipConflict, match="nrem-abc"):
        await ops.resume("node1", "node1", ResumeRequest())
    assert slurm.mutating_calls() == ["drain"]
    resumed = await ops.resume("node1", "node1", ResumeRequest(incident="nrem-abc"))
    assert resumed.outcome is ResumeOutcome.RESUMED


async def test_resume_with_force_lifts_any_drain(ops: Operations, slurm: FakeSlurm) -> None:
    await ops.drain("node1", "node1", DrainRequest(incident="nrem-abc"))
    forced = await ops.resume("node1", "node1", ResumeRequest(force=True))
    assert forced.outcome is ResumeOutcome.RESUMED
    assert slurm.mutating_calls() == ["drain", "resume"]


def test_http_resume_without_incident_is_409_and_audited(
    client: TestClient, slurm: FakeSlurm, tmp_path: Path
) -> None:
    client.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "nrem-abc"})
    refused = client.post("/v1/nodes/node1/resume", headers=AUTH)
    assert refused.status_code == 409
    assert refused.json()["error"] == "conflict"
    assert "nrem-abc" in refused.json()["message"]
    assert slurm.mutating_calls() == ["drain"]
    assert [(x["who"], x["op"], x["status"]) for x in audit(tmp_path)][-1] == (
        "operator",
        "resume_node",
        409,
    )


# ---- checkpoint signals: only those a job can catch ------------------------------------------
@pytest.mark.parametrize(
    "bad", ["9", "19", "KILL", "SIGKILL", "STOP", "SIGSTOP", "0", "09", "31", "99", "64", "-9"]
)
def test_uncatchable_or_unknown_signals_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError):
        CheckpointSignal(signal=bad)


@pytest.mark.parametrize(
    "good", ["USR1", "SIGUSR2", "TERM", "INT", "HUP", "CONT", "URG", "10", "12", "15", "2", "1"]
)
def test_catchable_signals_are_accepted(good: str) -> None:
    assert CheckpointSignal(signal=good).signal == good


# ---- XIDs: the operator's bound --------------------------------------------------------------
@pytest.mark.parametrize("xid", [0, -1, XID_MAX + 1, 100000])
def test_xids_outside_the_operators_range_are_refused(xid: int) -> None:
    with pytest.raises(ValidationError):
        DrainRequest(incident="nrem-a", xid=xid)
    with pytest.raises(ValidationError):
        RebootRequest(incident="nrem-a", xid=xid)


def test_the_bridge_takes_every_xid_the_operator_can_open_an_incident_for() -> None:
    assert XID_MAX == MAX_XID
    assert DrainRequest(incident="nrem-a", xid=MAX_XID).xid == MAX_XID
    assert DrainRequest(incident="nrem-a", xid=1).xid == 1


# ---- the OpenAPI document says what the server enforces --------------------------------------
def _param(spec: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    params = spec["paths"][path][method]["parameters"]
    found: dict[str, Any] = next(p["schema"] for p in params if p["name"] == name)
    return found


def test_openapi_shows_the_grammar_of_names_ids_and_keys(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/v1/nodes/{node}", "/v1/nodes/{node}/drain", "/v1/nodes/{node}/resume"):
        method = "get" if path == "/v1/nodes/{node}" else "post"
        node = _param(spec, path, method, "node")
        assert node["pattern"] == NODE_NAME_PATTERN
        assert node["maxLength"] == NODE_NAME_MAX
    for method, path in (("get", "/v1/jobs/{job_id}"), ("post", "/v1/jobs/{job_id}/requeue")):
        assert _param(spec, path, method, "job_id")["pattern"] == JOB_ID_PATTERN
    key = _param(spec, "/v1/nodes/{node}/drain", "post", "Idempotency-Key")
    assert key == {
        "type": "string",
        "minLength": 1,
        "maxLength": IDEMPOTENCY_KEY_MAX,
        "pattern": IDEMPOTENCY_KEY_PATTERN,
        "title": "Idempotency-Key",
    }  # no "null": a client that sends the text "null" as every key reuses one key
    from_node = spec["components"]["schemas"]["JobRequeueRequest"]["properties"]["from_node"]
    assert {
        "type": "string",
        "minLength": 1,
        "maxLength": NODE_NAME_MAX,
        "pattern": NODE_NAME_PATTERN,
    }.items() <= from_node.items()
    assert "from_node" in spec["components"]["schemas"]["JobRequeueRequest"]["required"]
    drain = spec["components"]["schemas"]["DrainRequest"]["properties"]["xid"]["anyOf"][0]
    assert (drain["minimum"], drain["maximum"]) == (1, XID_MAX)


@given(st.text(max_size=300) | st.from_regex(NODE_NAME_PATTERN, fullmatch=True))
def test_node_pattern_agrees_with_the_servers_check(name: str) -> None:
    schema_ok = re.fullmatch(NODE_NAME_PATTERN, name) is not None and len(name) <= NODE_NAME_MAX
    assert schema_ok == (node_name_problem(name) is None), name


@given(
    st.integers(min_value=-10, max_value=2 * JOB_ID_MAX).map(str)
    | st.integers(min_value=JOB_ID_MAX - 1000, max_value=JOB_ID_MAX + 1000).map(str)
    | st.text(max_size=12)
)
def test_job_id_pattern_agrees_with_the_servers_check(text: str) -> None:
    try:
        validate_job_id(text)
        server_ok = True
    except InvalidName:
        server_ok = False
    assert (re.fullmatch(JOB_ID_PATTERN, text) is not None) == server_ok, text


@pytest.mark.parametrize(
    ("text", "ok"),
    [("1", True), (str(JOB_ID_MAX), True), (str(JOB_ID_MAX + 1), False), ("0", False)],
)
def test_job_id_pattern_bounds(text: str, ok: bool) -> None:
    assert (re.fullmatch(JOB_ID_PATTERN, text) is not None) is ok


@given(st.text(max_size=210))
def test_key_pattern_agrees_with_the_servers_check(key: str) -> None:
    schema_ok = re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key) is not None and len(key) <= 200
    assert schema_ok == valid_key(key)


def test_job_id_0_and_a_from_node_with_spaces_are_refused_with_reasons(
    client: TestClient, slurm: FakeSlurm
) -> None:
    resp = client.post("/v1/jobs/0/requeue", headers=AUTH, json={"from_node": "node1"})
    assert resp.status_code == 422
    assert "positive" in resp.json()["message"]
    resp = client.post("/v1/jobs/7/requeue", headers=AUTH, json={"from_node": "node 1"})
    assert resp.status_code == 422
    assert "from_node" in resp.json()["message"]
    assert slurm.calls == []
    with pytest.raises(ValidationError):
        JobRequeueRequest(from_node="nöde")


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("gpuheal: spares", "must not start with 'gpuheal:'"),
        ("  gpuheal:nrem-x xid=79", "must not start with 'gpuheal:'"),
        ("spares\nState=IDLE", "one line"),
        ("spares\rok", "one line"),
        ("spares [root@2026-11-23T12:00:00]", "'[' or ']'"),
    ],
)
def test_a_reserve_reason_that_is_not_one_plain_line_of_its_own_is_refused(
    client: TestClient, slurm: FakeSlurm, reason: str, why: str
) -> None:
    """`scontrol show node` prints the reason on a line of its own and the bridge reads it
    line by line; a reason starting with gpuheal's prefix would make the pool's drain read as
    an incident's (and be resumed as one)."""
    slurm.add_node("node4", "IDLE", ("DRAIN",), reason="gpuheal: nrem-a xid=79")
    resp = client.post(
        "/v1/nodes/node4/reserve", headers=AUTH, json={"incident": "nrem-a", "reason": reason}
    )
    assert resp.status_code == 422
    assert why in resp.json()["message"]
    assert "reason" in resp.json()["message"]
    assert slurm.mutating_calls() == []


def test_a_plain_reserve_reason_is_taken(slurm: FakeSlurm, tmp_path: Path) -> None:
    """One of the bridge's reserve pool reasons (--reserve-reasons)."""
    slurm.add_node("node4", "IDLE", ("DRAIN",), reason="gpuheal: nrem-a xid=79")
    reasons = frozenset({"reserve pool", "spares (gpu pool, rack 7)"})
    with make_client(slurm, tmp_path, reserve_reasons=reasons) as client:
        resp = client.post(
            "/v1/nodes/node4/reserve",
            headers=AUTH,
            json={"incident": "nrem-a", "reason": "spares (gpu pool, rack 7)"},
        )
    assert resp.status_code == 200, resp.text
    assert slurm.nodes["node4"].reason == "spares (gpu pool, rack 7)"


# ---- oversized bodies, and refusals in the audit log -----------------------------------------
def test_an_oversized_body_is_refused_with_413_before_it_is_read(
    client: TestClient, slurm: FakeSlurm, tmp_path: Path
) -> None:
    big = {"incident": "nrem-a", "pad": "x" * (MAX_BODY_BYTES + 1)}
    resp = client.post("/v1/nodes/node1/drain", headers=AUTH, json=big)
    assert resp.status_code == 413
    assert resp.json()["error"] == "invalid"
    assert str(MAX_BODY_BYTES) in resp.json()["message"]
    assert slurm.calls == []
    [line] = audit(tmp_path)
    assert (line["who"], line["op"], line["target"], line["status"]) == (
        "operator",
        "drain_node",
        "node1",
        413,
    )


def test_an_oversized_chunked_body_is_refused_too(client: TestClient, slurm: FakeSlurm) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"incident": "nrem-a", "pad": "'
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b"x" * 4096
        yield b'"}'

    resp = client.post(
        "/v1/nodes/node1/drain",
        headers={**AUTH, "Content-Type": "application/json"},
        content=chunks(),
    )
    assert resp.status_code == 413
    assert slurm.calls == []


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/v1/nodes/node1;reboot/drain", {"incident": "nrem-a"}, {}, 422),
        ("/v1/nodes/node1/drain", {"incident": "Bad Id!"}, {}, 422),
        ("/v1/nodes/node1/drain", {"incident": "nrem-a", "xid": 100000}, {}, 422),
        ("/v1/jobs/0/requeue", {"from_node": "node1"}, {}, 422),
        ("/v1/nodes/nodeX/drain", {"incident": "nrem-a"}, {}, 404),
        ("/v1/nodes/node1/drain", {"incident": "nrem-a"}, {"Idempotency-Key": "\t"}, 422),
    ],
)
def test_refusals_are_audited_with_who_asked_for_what(  # noqa: PLR0917 - parametrized
    client: TestClient,
    slurm: FakeSlurm,
    tmp_path: Path,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    status: int,
) -> None:
    resp = client.post(path, headers={**AUTH, **headers}, json=body)
    assert resp.status_code == status
    assert resp.json()["message"]
    assert slurm.mutating_calls() == []
    [line] = audit(tmp_path)
    assert line["who"] == "operator"
    assert line["status"] == status
    assert line["op"] in {"drain_node", "requeue_job"}
    assert line["target"] == path.split("/")[3]
    assert line["result"]["message"] == resp.json()["message"]
