"""Least privilege at the bridge (issue 23): token scopes, the node allowlist, ``from_node``
required, ``force`` only for ``admin``; every refusal audited with the caller's address.
The pure parts directly, the HTTP layer with FastAPI's TestClient and the in-memory Slurm."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuheal_bridge.api.models import CheckpointSignal, DrainRequest, RequeueOptions, ResumeRequest
from gpuheal_bridge.config import BridgeConfig, reserve_reasons
from gpuheal_bridge.nodemap import NodeMapper, NotAllowed
from gpuheal_bridge.operations import DEFAULT_RESERVE_REASONS, Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from gpuheal_bridge.server.auth import (
    DEFAULT_SCOPES,
    Caller,
    Scope,
    Token,
    body_scopes,
    parse_tokens,
    route_scope,
)
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm

OPERATOR = "operator-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- pure ------------------------------------------------------------------------------------


def test_token_lines_with_and_without_scopes() -> None:
    a, b, c = "a" * 20, "b" * 20, "c" * 20
    tokens = parse_tokens(
        f"operator:{a}\nviewer:{b}:read  # a dashboard\n{c}\n"
        f"admin:{'d' * 20}:admin,ops:{'e' * 20}:drain, resume ,read"
    )
    assert tokens["operator"] == Token(a, DEFAULT_SCOPES)  # the line before scopes existed
    assert tokens["viewer"] == Token(b, frozenset({Scope.READ}))
    assert Token(c, DEFAULT_SCOPES) in tokens.values()  # a bare token, as the chart writes it
    assert tokens["admin"].scopes == {Scope.ADMIN}
    assert tokens["ops"].scopes == {Scope.DRAIN, Scope.RESUME, Scope.READ}
    assert Scope.ADMIN not in DEFAULT_SCOPES
    assert DEFAULT_SCOPES | {Scope.ADMIN} == set(Scope)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("op:" + "a" * 20 + ":drain,resum", "unknown scope 'resum'"),
        ("op:" + "a" * 20 + ":", "unknown scope ''"),
        ("op:short:read", "shorter than 16"),
    ],
)
def test_token_lines_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_tokens(text)


def test_what_each_request_needs() -> None:
    assert route_scope("get_node") is Scope.READ
    assert route_scope("capabilities") is Scope.READ
    assert route_scope("resume_node") is Scope.RESUME
    assert route_scope("reserve_node") is Scope.DRAIN
    assert route_scope("signal_job") is Scope.SIGNAL  # a signal alone: no requeue scope
    assert route_scope("a_route_added_later") is Scope.ADMIN  # closed until listed
    drain = DrainRequest(incident="nrem-a")
    assert body_scopes(drain) == set()
    requeue = RequeueOptions(checkpoint=CheckpointSignal())
    assert body_scopes(DrainRequest(incident="nrem-a", requeue=requeue)) == {
        Scope.REQUEUE,
        Scope.SIGNAL,
    }
    assert body_scopes(ResumeRequest(force=True)) == {Scope.ADMIN}
    assert body_scopes(ResumeRequest(reserve_reason="reserve pool")) == set()
    operator = Caller("operator", DEFAULT_SCOPES)
    assert operator.missing({Scope.ADMIN, Scope.READ}) == [Scope.ADMIN]
    assert Caller("root", frozenset({Scope.ADMIN})).missing(set(Scope)) == []


def test_allowlist_is_a_hostlist_of_slurm_names() -> None:
    mapper = NodeMapper(
        regex=r"^(?P<short>[^.]+)", template="{short}", allowed="gpu-[01-03],login1"
    )
    assert mapper.to_slurm("gpu-02.example.com") == "gpu-02"
    assert mapper.to_slurm("login1") == "login1"
    with pytest.raises(NotAllowed, match=r"gpu-04.example.com \(Slurm gpu-04\) is not in"):
        mapper.to_slurm("gpu-04.example.com")
    assert NodeMapper().to_slurm("anything-9") == "anything-9"  # unset: every node


@pytest.mark.parametrize(("expr", "why"), [("gpu-[01-", "unbalanced"), ("", "is empty")])
def test_allowed_nodes_flag_is_checked_at_start(expr: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        BridgeConfig(allowed_nodes=expr)


# ---- over HTTP -------------------------------------------------------------------------------


def make_client(slurm: FakeSlurm, tmp_path: Path, **kw: Any) -> TestClient:
    clock = FakeClock()
    settings = BridgeSettings(
        backend=slurm,
        tokens={
            "operator": OPERATOR,  # as the chart writes it: a bare token, default scopes
            "reader": Token(READER, frozenset({Scope.READ})),
            "admin": Token(ADMIN, frozenset({Scope.ADMIN})),
        },
        state_dir=tmp_path / "state",
        audit_log=tmp_path / "audit.jsonl",
        operations=Operations(slurm, clock=clock, sleep=clock.sleep),
        health_interval=0,
        **kw,
    )
    return TestClient(create_app(settings), client=("127.0.0.1", 50000))


@pytest.fixture
def client(slurm: FakeSlurm, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(slurm, tmp_path) as c:
        yield c


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_a_token_without_the_scope_is_refused_and_audited(
    client: TestClient, slurm: FakeSlurm, tmp_path: Path
) -> None:
    assert client.get("/v1/nodes/node1", headers=auth(READER)).status_code == 200
    resp = client.post("/v1/nodes/node1/drain", headers=auth(READER), json={"incident": "i"})
    assert resp.status_code == 403
    assert resp.json()["error"] == "forbidden"
    assert "token 'reader' lacks the scope drain" in resp.json()["message"]
    assert slurm.mutating_calls() == []
    (line,) = audit(tmp_path)
    assert (line["who"], line["peer"], line["status"], line["op"]) == (
        "reader",
        "127.0.0.1",
        403,
        "drain_node",
    )


def test_a_drain_that_requeues_with_a_signal_needs_those_scopes(
    slurm: FakeSlurm, tmp_path: Path
) -> None:
    drainer = "drainer-token-0123456789abcdef"
    tokens = {"drainer": Token(drainer, frozenset({Scope.DRAIN, Scope.REQUEUE}))}
    slurm.add_job(FakeJob(7, ["node1"]))
    body = {"incident": "i", "requeue": {"checkpoint": {"signal": "USR1"}}}
    with make_client(slurm, tmp_path) as c:
        c.app.state.services.auth.replace(tokens)  # type: ignore[attr-defined]
        resp = c.post("/v1/nodes/node1/drain", headers=auth(drainer), json=body)
        assert resp.status_code == 403
        assert "lacks the scope signal" in resp.json()["message"]
        assert slurm.mutating_calls() == []
        body["requeue"] = {}
        assert c.post("/v1/nodes/node1/drain", headers=auth(drainer), json=body).is_success


def test_the_operators_token_cannot_resume_an_admins_drain(
    client: TestClient, slurm: FakeSlurm, tmp_path: Path
) -> None:
    """node2 carries an admin's drain. The operator's token (default scopes) is refused:
    without force by ownership (409), with force for want of admin (403); the admin's
    token lifts it."""
    plain = client.post("/v1/nodes/node2/resume", headers=auth(OPERATOR), json={})
    assert plain.status_code == 409
    forced = client.post("/v1/nodes/node2/resume", headers=auth(OPERATOR), json={"force": True})
    assert forced.status_code == 403
    message = forced.json()["message"]
    assert "token 'operator' lacks the scope admin" in message
    assert "reserve_reason" in message
    assert slurm.mutating_calls() == []
    assert [(a["who"], a["status"], a["peer"]) for a in audit(tmp_path)] == [
        ("operator", 409, "127.0.0.1"),
        ("operator", 403, "127.0.0.1"),
    ]
    admin = client.post("/v1/nodes/node2/resume", headers=auth(ADMIN), json={"force": True})
    assert admin.status_code == 200
    assert admin.json()["forced"] is True


def test_no_token_lifts_a_drain_by_naming_its_reason_as_a_reserve_pools(
    slurm: FakeSlurm, tmp_path: Path
) -> None:
    """node2 carries an admin's drain. A reserve_reason is lifted only when it is one of the
    bridge's reserve pool reasons (--reserve-reasons): the admin's reason sent back is 403
    for the resume scope and the operator's token alike, nothing is called; the pool's
    reason lifts a spare; a reserve may set only those reasons."""
    resumer = "resume-only-token-0123456789abcdef"
    slurm.add_node("node4", "IDLE", ("DRAIN",), reason="spares")
    slurm.add_node("node5", "IDLE", ("DRAIN",), reason="gpuheal: nrem-a xid=79")
    with make_client(slurm, tmp_path) as c:
        services = c.app.state.services  # type: ignore[attr-defined]
        services.ops.reserve_reasons = frozenset({"reserve pool", "spares"})
        services.auth.replace(
            {"operator": OPERATOR, "resumer": Token(resumer, frozenset({Scope.RESUME}))}
        )
        admins = slurm.nodes["node2"].reason
        assert admins
        for token in (resumer, OPERATOR):
            resp = c.post(
                "/v1/nodes/node2/resume", headers=auth(token), json={"reserve_reason": admins}
            )
            assert resp.status_code == 403, resp.text
            assert resp.json()["message"] == (
                f"{admins!r} is not one of the bridge's reserve pool reasons ('reserve pool', "
                "'spares'; --reserve-reasons): nothing was done"
            )
        assert slurm.calls == []
        spare = c.post(
            "/v1/nodes/node4/resume", headers=auth(resumer), json={"reserve_reason": "spares"}
        )
        assert spare.status_code == 200, spare.text
        assert spare.json()["outcome"] == "resumed"
        reserve = c.post(
            "/v1/nodes/node5/reserve",
            headers=auth(OPERATOR),
            json={"incident": "nrem-a", "reason": admins},
        )
        assert reserve.status_code == 403, reserve.text
        assert slurm.nodes["node5"].reason == "gpuheal: nrem-a xid=79"
    assert [(a["who"], a["status"]) for a in audit(tmp_path)] == [
        ("resumer", 403),
        ("operator", 403),
        ("resumer", 200),
        ("operator", 403),
    ]


def test_reserve_reasons_from_the_command_line() -> None:
    config = BridgeConfig(token_file=None, reserve_reasons="reserve pool| spares (rack 7, gpu) ")
    assert reserve_reasons(config.reserve_reasons) == {"reserve pool", "spares (rack 7, gpu)"}
    assert reserve_reasons(BridgeConfig().reserve_reasons) == DEFAULT_RESERVE_REASONS
    with pytest.raises(ValueError, match="--reserve-reasons is empty"):
        BridgeConfig(reserve_reasons=" | ")


def test_a_requeue_without_from_node_is_refused_naming_it(
    client: TestClient, slurm: FakeSlurm
) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    for body in ({}, {"mode": "requeuehold"}, {"checkpoint": {"signal": "USR1"}}):
        resp = client.post("/v1/jobs/7/requeue", headers=auth(OPERATOR), json=body)
        assert resp.status_code == 422
        assert "from_node" in resp.json()["message"]
    assert slurm.mutating_calls() == []
    body = {"from_node": "node1"}
    assert client.post("/v1/jobs/7/requeue", headers=auth(OPERATOR), json=body).is_success


def test_nodes_outside_the_allowlist_are_refused(slurm: FakeSlurm, tmp_path: Path) -> None:
    slurm.add_job(FakeJob(7, ["node2"]))
    mapper = NodeMapper(allowed="node[1,3]")
    with make_client(slurm, tmp_path, node_mapper=mapper) as c:
        assert c.get("/v1/nodes/node1", headers=auth(OPERATOR)).status_code == 200
        for method, path, body in (
            ("get", "/v1/nodes/node2", None),
            ("get", "/v1/nodes/node2/jobs", None),
            ("post", "/v1/nodes/node2/drain", {"incident": "i"}),
            ("post", "/v1/nodes/node2/resume", {"force": True}),
            ("post", "/v1/jobs/7/requeue", {"from_node": "node2"}),
        ):
            resp = c.request(method, path, headers=auth(ADMIN), json=body)
            assert resp.status_code == 403, path
            assert resp.json()["error"] == "forbidden"
            assert (
                "node2 is not in the bridge's allowed nodes (node[1,3])" in (resp.json()["message"])
            )
    assert slurm.mutating_calls() == []
    refused = [(a["op"], a["status"], a["peer"]) for a in audit(tmp_path)]
    assert refused == [
        ("get_node", 403, "127.0.0.1"),
        ("node_jobs", 403, "127.0.0.1"),
        ("drain_node", 403, "127.0.0.1"),
        ("resume_node", 403, "127.0.0.1"),
        ("requeue_job", 403, "127.0.0.1"),
    ]


def test_a_path_with_no_route_is_not_found_whatever_the_scopes(client: TestClient) -> None:
    """No route, nothing runs: 404/405 as before scopes, not a 403 asking for admin."""
    assert client.get("/v1/nodes/node1/nothing", headers=auth(READER)).status_code == 404
    assert client.delete("/v1/nodes/node1", headers=auth(READER)).status_code == 405


def test_a_signal_alone_needs_the_signal_scope_and_from_node(
    slurm: FakeSlurm, tmp_path: Path
) -> None:
    """``POST /v1/jobs/{id}/signal``: the signal scope (requeue is not enough), from_node
    required; the job is signalled and stays RUNNING, a replay signals it no second time."""
    requeuer = "requeuer-token-0123456789abcdef"
    signaller = "signaller-token-0123456789abcdef"
    tokens = {
        "requeuer": Token(requeuer, frozenset({Scope.REQUEUE})),
        "signaller": Token(signaller, frozenset({Scope.SIGNAL})),
    }
    slurm.add_job(FakeJob(7, ["node1"]))
    body = {"from_node": "node1", "signal": "USR1"}
    with make_client(slurm, tmp_path) as c:
        c.app.state.services.auth.replace(tokens)  # type: ignore[attr-defined]
        resp = c.post("/v1/jobs/7/signal", headers=auth(requeuer), json=body)
        assert resp.status_code == 403
        assert "lacks the scope signal" in resp.json()["message"]
        missing = c.post("/v1/jobs/7/signal", headers=auth(signaller), json={"signal": "USR1"})
        assert missing.status_code == 422
        assert "from_node" in missing.text
        assert slurm.mutating_calls() == []
        headers = {**auth(signaller), "Idempotency-Key": "nrem-a-checkpoint-7"}
        first = c.post("/v1/jobs/7/signal", headers=headers, json=body)
        assert first.status_code == 200
        assert first.json()["outcome"] == "signalled"
        again = c.post("/v1/jobs/7/signal", headers=headers, json=body)
        assert again.json() == first.json()
    assert slurm.mutating_calls() == ["signal"]
