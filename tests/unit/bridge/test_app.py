"""HTTP layer with FastAPI's TestClient and the in-memory Slurm."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuheal_bridge.nodemap import NodeMapper
from gpuheal_bridge.operations import DEFAULT_RESERVE_REASONS, Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from gpuheal_bridge.server.audit import RefusalThrottle
from gpuheal_bridge.server.auth import Scope, Token
from tests.unit.bridge.fakes import FakeClock, FakeJob, FakeSlurm

TOKEN = "t0ken-for-the-operator-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_client(slurm: FakeSlurm, tmp_path: Path, **kw: object) -> TestClient:
    clock = FakeClock()
    settings = BridgeSettings(
        backend=slurm,
        tokens={"operator": TOKEN},
        state_dir=tmp_path / "state",
        audit_log=tmp_path / "audit.jsonl",
        operations=Operations(
            slurm,
            clock=clock,
            sleep=clock.sleep,
            reserve_reasons=kw.pop("reserve_reasons", DEFAULT_RESERVE_REASONS),  # type: ignore[arg-type]
        ),
        **{"health_interval": 0, **kw},  # type: ignore[arg-type]  # no background ping
    )
    # The peer is loopback: plain HTTP from anywhere else is refused (see the transport tests).
    return TestClient(create_app(settings), client=("127.0.0.1", 50000))


@pytest.fixture
def client(slurm: FakeSlurm, tmp_path: Path) -> Iterator[TestClient]:
    with make_client(slurm, tmp_path) as c:
        yield c


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/v1/nodes/node1", None),
        ("get", "/v1/nodes/node1/jobs", None),
        ("post", "/v1/nodes/node1/drain", {"incident": "nrem-a"}),
        ("post", "/v1/nodes/node2/resume", {"force": True}),
        ("post", "/v1/jobs/7/requeue", {}),
        ("post", "/v1/nodes/node1;reboot/drain", {"incident": "nrem-a"}),  # 401 before 422
        ("post", "/v1/nodes/node1/drain", "not json"),
    ],
)
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}]
)
def test_401_touches_nothing(  # noqa: PLR0917 - pytest passes fixtures positionally
    client: TestClient,
    slurm: FakeSlurm,
    tmp_path: Path,
    method: str,
    path: str,
    body: object,
    headers: dict[str, str],
) -> None:
    kw = {"content": body} if isinstance(body, str) else {"json": body}
    resp = client.request(method, path, headers=headers, **kw)
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert resp.json()["error"] == "unauthorized"
    assert slurm.calls == []
    # written down with the caller's address, and no one's name
    (line,) = (tmp_path / "audit.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["who"], record["peer"], record["status"]) == (None, "127.0.0.1", 401)
    assert (record["method"], record["target"]) == (method.upper(), path)
    assert record["result"]["error"] == "unauthorized"


def test_a_flood_of_401s_writes_one_audit_line_per_source_and_interval(
    slurm: FakeSlurm, tmp_path: Path
) -> None:
    clock = FakeClock()
    throttle = RefusalThrottle(60.0, clock=clock)
    bad = {"Authorization": "Bearer wrong-token-0123456789"}
    audit = tmp_path / "audit.jsonl"

    def lines() -> list[dict[str, object]]:
        return [json.loads(line) for line in audit.read_text().splitlines()]

    with make_client(slurm, tmp_path, refusals=throttle) as c:
        for _ in range(200):
            assert c.get("/v1/nodes/node1", headers=bad).status_code == 401
        assert len(lines()) == 1
        assert "suppressed" not in lines()[0]
        # A refusal of another kind from the same address has its own line.
        c.app.state.services.auth.replace({"reader": Token(TOKEN, frozenset({Scope.READ}))})
        assert (
            c.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "x"}).status_code == 403
        )
        assert [r["status"] for r in lines()] == [401, 403]
        # The interval over: the next 401 is written, saying how many were left out.
        clock.now += 60
        assert c.get("/v1/nodes/node1", headers=bad).status_code == 401
        last = lines()[-1]
        assert (last["status"], last["suppressed"], last["peer"]) == (401, 199, "127.0.0.1")
    assert slurm.calls == []


def test_refusal_throttle_per_source_and_bounded() -> None:
    clock = FakeClock()
    throttle = RefusalThrottle(10.0, clock=clock, max_sources=3)
    assert throttle.admit("10.0.0.1", 401) == 0
    assert throttle.admit("10.0.0.1", 401) is None
    assert throttle.admit("10.0.0.2", 401) == 0  # another source: its own line
    assert throttle.admit(None, 401) == 0
    clock.now += 9.9
    assert throttle.admit("10.0.0.1", 401) is None
    clock.now += 0.1
    assert throttle.admit("10.0.0.1", 401) == 2
    assert throttle.admit("10.0.0.1", 401) is None
    # A fourth source past max_sources: the ended intervals are forgotten, and it is written.
    assert throttle.admit("10.0.0.4", 401) == 0
    assert len(throttle._seen) <= 3


def test_probes_need_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert "requeue" in ready.json()["capabilities"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/v1/nodes/node1;reboot", "';'"),
        ("/v1/nodes/node[1-100]", "hostlist"),
        ("/v1/nodes/-rf", "start with"),
        ("/v1/jobs/12_3", "array"),
        ("/v1/jobs/abc", "positive"),
    ],
)
def test_422_for_bad_names(client: TestClient, slurm: FakeSlurm, path: str, why: str) -> None:
    resp = client.get(path, headers=AUTH)
    assert resp.status_code == 422
    assert resp.json()["error"] == "invalid"
    assert why in resp.json()["message"]
    assert slurm.calls == []


def test_422_for_bad_body(client: TestClient, slurm: FakeSlurm) -> None:
    resp = client.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "Bad Id!"})
    assert resp.status_code == 422
    assert "incident" in resp.json()["message"]
    resp = client.post(
        "/v1/nodes/node1/drain",
        headers=AUTH,
        json={"incident": "a", "requeue": {"checkpoint": {"signal": "KILL; rm"}}},
    )
    assert resp.status_code == 422
    assert slurm.mutating_calls() == []


def test_404_unknown_node_and_job(client: TestClient) -> None:
    assert client.get("/v1/nodes/nodeX", headers=AUTH).status_code == 404
    resp = client.post("/v1/nodes/nodeX/drain", headers=AUTH, json={"incident": "i"})
    assert resp.status_code == 404
    assert resp.json()["error"] == "not_found"
    body = {"from_node": "node1"}
    assert client.post("/v1/jobs/404/requeue", headers=AUTH, json=body).status_code == 404


def test_503_with_retry_after_when_slurmctld_down(client: TestClient, slurm: FakeSlurm) -> None:
    slurm.down = True
    resp = client.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "i"})
    assert resp.status_code == 503
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.json()["error"] == "unavailable"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["ready"] is False


def test_409_resume_of_admin_drain(client: TestClient, slurm: FakeSlurm) -> None:
    resp = client.post("/v1/nodes/node2/resume", headers=AUTH, json={})
    assert resp.status_code == 409
    body = resp.json()
    assert body["error"] == "conflict"
    assert body["owner"] == "other"
    assert body["current"]["reason"] == "admin maintenance: fan swap"
    assert slurm.mutating_calls() == []


def test_drain_admin_drained_reports_owner(client: TestClient, slurm: FakeSlurm) -> None:
    resp = client.post("/v1/nodes/node2/drain", headers=AUTH, json={"incident": "i"})
    assert resp.status_code == 200
    assert resp.json()["outcome"] == "drained_by_other"
    assert resp.json()["owner"] == "other"
    assert slurm.mutating_calls() == []


def test_resume_without_body(client: TestClient) -> None:
    resp = client.post("/v1/nodes/node3/resume", headers=AUTH)
    assert resp.status_code == 200
    assert resp.json()["outcome"] == "not_drained"
    # a drain of gpuheal's is lifted only for its incident (or with force)
    client.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "i"})
    assert client.post("/v1/nodes/node1/resume", headers=AUTH).status_code == 409
    resp = client.post("/v1/nodes/node1/resume", headers=AUTH, json={"incident": "i"})
    assert resp.status_code == 200
    assert resp.json()["outcome"] == "resumed"


def test_idempotency_key_replays_and_persists(slurm: FakeSlurm, tmp_path: Path) -> None:
    slurm.add_job(FakeJob(7, ["node1"]))
    headers = {**AUTH, "Idempotency-Key": "req-1"}
    body = {"mode": "requeue", "from_node": "node1"}
    with make_client(slurm, tmp_path) as c:
        first = c.post("/v1/jobs/7/requeue", headers=headers, json=body)
        assert first.status_code == 200
        assert first.json()["outcome"] == "requeued"
        slurm.jobs[7].state, slurm.jobs[7].nodes, slurm.jobs[7].script = "RUNNING", ["node3"], []
        again = c.post("/v1/jobs/7/requeue", headers=headers, json=body)
        assert again.headers["Idempotency-Replayed"] == "true"
        assert again.json() == first.json()
        other = c.post("/v1/jobs/7/requeue", headers=headers, json={**body, "mode": "requeuehold"})
        assert other.status_code == 422
        assert other.json()["error"] == "idempotency_mismatch"
    # a restarted bridge (new app, same state dir) still answers from the store
    with make_client(slurm, tmp_path) as c:
        third = c.post("/v1/jobs/7/requeue", headers=headers, json=body)
        assert third.headers.get("Idempotency-Replayed") == "true"
    assert slurm.mutating_calls().count("requeue") == 1
    assert slurm.jobs[7].restart_count == 1


def test_503_is_not_stored_for_replay(client: TestClient, slurm: FakeSlurm) -> None:
    headers = {**AUTH, "Idempotency-Key": "req-2"}
    slurm.down = True
    assert (
        client.post("/v1/nodes/node1/drain", headers=headers, json={"incident": "i"}).status_code
        == 503
    )
    slurm.down = False
    resp = client.post("/v1/nodes/node1/drain", headers=headers, json={"incident": "i"})
    assert resp.status_code == 200
    assert resp.json()["outcome"] == "drained"


def test_audit_log_lines(client: TestClient, slurm: FakeSlurm, tmp_path: Path) -> None:
    client.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "nrem-a", "xid": 79})
    client.post("/v1/nodes/node2/resume", headers=AUTH, json={})
    lines = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(x["who"], x["op"], x["target"], x["status"]) for x in lines] == [
        ("operator", "drain_node", "node1", 200),
        ("operator", "resume_node", "node2", 409),
    ]
    assert lines[0]["result"]["outcome"] == "drained"
    assert lines[0]["request"] == {"incident": "nrem-a", "xid": 79, "requeue": None}


def test_metrics(client: TestClient) -> None:
    client.get("/v1/nodes/node1", headers=AUTH)
    client.get("/v1/nodes/nodeX", headers=AUTH)
    client.get("/v1/nodes/node1")
    text = client.get("/metrics").text
    assert 'gpuheal_bridge_requests_total{operation="get_node",result="success"} 1.0' in text
    assert 'gpuheal_bridge_requests_total{operation="get_node",result="not_found"} 1.0' in text
    assert 'gpuheal_bridge_requests_total{operation="get_node",result="unauthorized"} 1.0' in text
    assert "gpuheal_bridge_request_duration_seconds_bucket" in text
    assert "process_cpu_seconds_total" in text  # prometheus-client's process collector
    assert "python_info{" in text


def test_metrics_path_answers_without_redirect(client: TestClient) -> None:
    """Prometheus scrapes ``/metrics`` as configured; a 307 to ``/metrics/`` is a lost scrape."""
    resp = client.get("/metrics", follow_redirects=False)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    openmetrics = client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")


def test_node_mapping_applies(slurm: FakeSlurm, tmp_path: Path) -> None:
    mapper = NodeMapper(regex=r"^(?P<short>[^.]+)\.", template="{short}")
    with make_client(slurm, tmp_path, node_mapper=mapper) as c:
        resp = c.get("/v1/nodes/node1.cluster.local", headers=AUTH)
        assert resp.status_code == 200
        assert resp.json()["node"] == "node1.cluster.local"
        assert resp.json()["slurm_node"] == "node1"
        assert c.get("/v1/nodes/nodots", headers=AUTH).status_code == 404


def test_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert {"/v1/nodes/{node}/drain", "/v1/jobs/{job_id}/requeue", "/readyz"} <= set(doc["paths"])
    params = doc["paths"]["/v1/nodes/{node}/drain"]["post"]["parameters"]
    assert any(p["name"] == "Idempotency-Key" for p in params)
    # the bearer scheme is declared, and every /v1 operation (only those) requires it
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer <token>`: one of the bridge's named tokens.",
    }
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert (op.get("security") == [{"bearer": []}]) is path.startswith("/v1"), path


@pytest.mark.parametrize(
    ("peer", "base", "served"),
    [
        ("127.0.0.1", "http://bridge", True),
        ("127.8.9.1", "http://bridge", True),
        ("::1", "http://bridge", True),
        ("::ffff:127.0.0.1", "http://bridge", True),
        ("10.0.0.7", "http://bridge", False),
        ("fd00::7", "http://bridge", False),
        ("testclient", "http://bridge", False),  # not an address: not loopback
        ("10.0.0.7", "https://bridge", True),  # came over TLS
    ],
)
def test_plain_http_is_served_to_loopback_only(
    slurm: FakeSlurm, tmp_path: Path, peer: str, base: str, served: bool
) -> None:
    app = create_app(BridgeSettings(backend=slurm, tokens={"op": TOKEN}, health_interval=0))
    with TestClient(app, base_url=base, client=(peer, 40000)) as c:
        for path in ("/healthz", "/v1/nodes/node1", "/metrics"):
            resp = c.get(path, headers=AUTH)
            assert (resp.status_code != 403) is served, (path, resp.text)
        if not served:
            assert resp.json()["error"] == "insecure_transport"
            drain = c.post("/v1/nodes/node1/drain", headers=AUTH, json={"incident": "nrem-a"})
            assert drain.status_code == 403
            assert slurm.mutating_calls() == []
    insecure = create_app(
        BridgeSettings(
            backend=slurm, tokens={"op": TOKEN}, health_interval=0, remote_plain_http=True
        )
    )
    with TestClient(insecure, base_url=base, client=(peer, 40000)) as c:
        assert c.get("/v1/nodes/node1", headers=AUTH).status_code == 200


def test_tokens_replaced_at_once(client: TestClient) -> None:
    auth = client.app.state.services.auth  # type: ignore[attr-defined]
    new = "n3w-t0ken-for-the-operator-987654"
    auth.replace({"operator": TOKEN, "rotated": new})
    assert client.get("/v1/nodes/node1", headers={"Authorization": f"Bearer {new}"}).is_success
    auth.replace({"rotated": new})
    assert client.get("/v1/nodes/node1", headers=AUTH).status_code == 401
    with pytest.raises(ValueError, match="no bearer tokens"):
        auth.replace({})
    assert client.get("/v1/nodes/node1", headers={"Authorization": f"Bearer {new}"}).is_success


def test_slurmctld_gauge_is_refreshed_without_readyz(slurm: FakeSlurm, tmp_path: Path) -> None:
    """Nobody calls /readyz (the chart probes /healthz): the gauge still follows slurmctld."""
    with make_client(slurm, tmp_path, health_interval=0.05) as c:

        def gauge() -> str:
            text = c.get("/metrics").text
            return next(
                ln for ln in text.splitlines() if ln.startswith("gpuheal_bridge_slurmctld_up")
            )

        deadline = time.monotonic() + 5
        while gauge() != "gpuheal_bridge_slurmctld_up 1.0" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gauge() == "gpuheal_bridge_slurmctld_up 1.0"
        slurm.down = True
        deadline = time.monotonic() + 5
        while gauge() != "gpuheal_bridge_slurmctld_up 0.0" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gauge() == "gpuheal_bridge_slurmctld_up 0.0"
        assert all(op == "ping" for op, _ in slurm.calls)


def test_openapi_says_force_and_reserve_reason_exclude_each_other(client: TestClient) -> None:
    """The server refuses a resume with both (422): the document says so, so a client (and
    schemathesis's positive cases) never takes such a body for a valid one."""
    doc = client.get("/openapi.json").json()
    body = doc["paths"]["/v1/nodes/{node}/resume"]["post"]["requestBody"]["content"]
    refs = [s["$ref"] for s in body["application/json"]["schema"]["anyOf"] if "$ref" in s]
    assert refs == ["#/components/schemas/ResumeRequest"], body
    schema = doc["components"]["schemas"]["ResumeRequest"]
    assert schema["not"] == {
        "required": ["force", "reserve_reason"],
        "properties": {"force": {"const": True}, "reserve_reason": {"type": "string"}},
    }
    resp = client.post(
        "/v1/nodes/node1/resume",
        json={"force": True, "reserve_reason": "reserve pool"},
        headers={**AUTH, "Idempotency-Key": "k-both"},
    )
    assert resp.status_code == 422, resp.text
    assert "exclude each other" in resp.json()["message"]


def test_capabilities_route_needs_a_token_and_reads_slurm(
    client: TestClient, slurm: FakeSlurm
) -> None:
    assert client.get("/v1/capabilities").status_code == 401
    resp = client.get("/v1/capabilities", headers=AUTH)
    assert resp.status_code == 200
    body = resp.json()
    assert (body["backend"], body["slurm_version"], body["missing"]) == ("fake", "22.05.8", [])
    assert "requeue" in body["capabilities"]
    assert ("ping", ()) in slurm.calls
