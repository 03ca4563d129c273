"""slurmrestd backend: reads from captured v0.0.38 answers; writes in the documented v0.0.40+
shapes (what 23.11+ accept); operations 22.05 lacks raise Unsupported or go to the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpuheal_bridge.api.models import SignalTarget
from gpuheal_bridge.backends.base import Capability, NotFound, Rejected, Unsupported
from gpuheal_bridge.backends.rest import (
    JwtFile,
    RestBackend,
    job_update_body,
    node_update_body,
    signal_params,
)
from tests.unit.bridge.fakes import FakeSlurm

DATA = Path(__file__).parent / "data"


def captured(name: str) -> object:
    return json.loads((DATA / name).read_text())


def backend(handler: object, version: str = "v0.0.38", **kw: object) -> RestBackend:
    return RestBackend(
        "http://restd",
        **{"token": "jwt", **kw},  # type: ignore[arg-type]
        api_version=version,
        transport=httpx.MockTransport(handler),  # type: ignore[arg-type]
    )


def v038(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    routes = {
        "/slurm/v0.0.38/ping": (200, "restd_ping.json"),
        "/slurm/v0.0.38/node/node1": (200, "restd_node_node1.json"),
        "/slurm/v0.0.38/node/nodeX": (500, "restd_node_nodeX.json"),  # 22.05: 500 + errors
        "/slurm/v0.0.38/jobs": (200, "restd_jobs.json"),
        "/slurm/v0.0.38/job/999": (500, "restd_job_999.json"),
    }
    if request.method == "POST" and path.startswith("/slurm/v0.0.38/node/"):
        return httpx.Response(405)
    status, name = routes[path]
    return httpx.Response(status, json=captured(name))


async def test_reads_on_v0038() -> None:
    b = backend(v038)
    ping = await b.ping()
    assert ping.up
    assert ping.version == "22.05.8"
    node = await b.get_node("node1")
    assert node.drain
    assert node.reason == "gpuheal: nrem-abc xid=79"
    with pytest.raises(NotFound):
        await b.get_node("nodeX")
    with pytest.raises(NotFound):
        await b.get_job(999)
    assert [j.job_id for j in await b.jobs_on_node("node3")] == [1]
    assert b.capabilities() == {Capability.READ_NODES, Capability.READ_JOBS}
    await b.aclose()


async def test_writes_on_v0038_are_capability_errors() -> None:
    b = backend(v038)
    with pytest.raises(Unsupported):
        await b.drain("node1", "gpuheal: i xid=1")
    with pytest.raises(Unsupported):
        await b.requeue(1, hold=False)
    with pytest.raises(Unsupported):
        await b.signal(1, "USR1", SignalTarget.FULL)


async def test_v0038_writes_go_to_fallback() -> None:
    fake = FakeSlurm()
    fake.add_node("node1")
    b = backend(v038, fallback=fake)
    await b.drain("node1", "gpuheal: i xid=1")
    assert fake.nodes["node1"].reason == "gpuheal: i xid=1"
    assert Capability.REQUEUE in b.capabilities()


async def test_v0040_node_update_and_signal_shapes() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"errors": [], "warnings": []})

    b = backend(handler, version="v0.0.40")
    await b.drain("node1", "gpuheal: i xid=79")
    await b.resume("node1")
    await b.signal(7, "USR1", SignalTarget.FULL)
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/slurm/v0.0.40/node/node1"),
        ("POST", "/slurm/v0.0.40/node/node1"),
        ("DELETE", "/slurm/v0.0.40/job/7"),
    ]
    assert json.loads(seen[0].content) == {"state": ["DRAIN"], "reason": "gpuheal: i xid=79"}
    assert json.loads(seen[1].content) == {"state": ["RESUME"]}
    assert dict(seen[2].url.params) == {"signal": "SIGUSR1", "flags": "FULL_JOB"}
    assert seen[0].headers["X-SLURM-USER-TOKEN"] == "jwt"
    assert {Capability.DRAIN, Capability.RESUME, Capability.SIGNAL} <= b.capabilities()


async def test_v0045_requeues_and_updates_jobs_itself() -> None:
    """26.05: requeue is ``GET .../job/{id}/requeue`` (``Hold=true`` for requeuehold), the
    job updates are ``POST .../job/{id}`` (shapes from its slurmrestd's OpenAPI document)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        key = "status" if request.url.path.endswith("/requeue") else "results"
        return httpx.Response(200, json={key: [{"job_id": 7, "error_code": 0}], "errors": []})

    b = backend(handler, version="v0.0.45")
    await b.requeue(7, hold=False)
    await b.requeue(7, hold=True)
    await b.set_excluded_nodes(7, ["node1"])
    await b.set_excluded_nodes(7, [], required_nodes=[])
    await b.start_now(7, excluded_nodes=["node1"])
    assert [(r.method, r.url.path) for r in seen] == [
        ("GET", "/slurm/v0.0.45/job/7/requeue"),
        ("GET", "/slurm/v0.0.45/job/7/requeue"),
        *[("POST", "/slurm/v0.0.45/job/7")] * 3,
    ]
    assert "Hold" not in seen[0].url.params
    assert seen[1].url.params["Hold"] == "true"  # 26.05.5: "?Hold=" is a plain requeue
    assert json.loads(seen[2].content) == {"excluded_nodes": ["node1"]}
    assert json.loads(seen[3].content) == {"excluded_nodes": "", "required_nodes": ""}
    expedite = json.loads(seen[4].content)
    assert expedite["excluded_nodes"] == ["node1"]
    assert expedite["begin_time"]["set"] is True
    assert {Capability.REQUEUE, Capability.UPDATE_JOB} <= b.capabilities()
    assert Capability.REBOOT not in b.capabilities()


async def test_v0045_a_job_error_in_a_200_answer_is_raised() -> None:
    """slurmrestd answers a refused requeue with 200 and the job's error code in ``status``."""

    def handler(request: httpx.Request) -> httpx.Response:
        entry = {"job_id": 7, "error_code": 2021, "error": "Job is pending execution"}
        return httpx.Response(200, json={"status": [entry], "errors": []})

    with pytest.raises(Rejected, match="pending execution"):
        await backend(handler, version="v0.0.45").requeue(7, hold=False)


async def test_before_v0045_requeue_and_job_updates_go_to_the_fallback() -> None:
    fake = FakeSlurm()
    b = backend(v038, version="v0.0.44", fallback=fake)
    assert Capability.REQUEUE not in b.own_capabilities()
    with pytest.raises(NotFound):  # the fallback answered: it does not know job 1
        await b.requeue(1, hold=False)
    with pytest.raises(NotFound):
        await b.set_excluded_nodes(1, ["node1"])
    assert [op for op, _ in fake.calls] == ["requeue", "set_excluded_nodes"]


def test_body_helpers() -> None:
    assert job_update_body(["a", "b"], None) == {"excluded_nodes": ["a", "b"]}
    assert job_update_body(None, []) == {"required_nodes": ""}  # [] would change nothing
    assert node_update_body(41, "DRAIN", "r") == {"state": ["DRAIN"], "reason": "r"}
    with pytest.raises(Unsupported):
        node_update_body(38, "DRAIN", "r")
    assert signal_params(38, "USR1", SignalTarget.STEPS) == {"signal": "SIGUSR1"}
    assert signal_params(41, "SIGUSR2", SignalTarget.BATCH) == {
        "signal": "SIGUSR2",
        "flags": "BATCH_JOB",
    }
    with pytest.raises(Unsupported):
        signal_params(38, "USR1", SignalTarget.FULL)


async def test_version_detection_picks_newest() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/openapi/v3"
        paths: dict[str, object] = {f"/slurm/v0.0.{n}/ping": {} for n in (36, 37, 38)}
        return httpx.Response(200, json={"paths": paths})

    b = RestBackend("http://restd", transport=httpx.MockTransport(handler))
    assert await b._api() == "v0.0.38"


async def test_a_rotated_jwt_file_is_used_from_the_next_call(tmp_path: Path) -> None:
    """The JWT file rewritten (a new inode, as a Secret volume or ``mv`` swaps it) and then
    edited in place: each call after a change sends the new JWT, with no new backend."""
    jwt = tmp_path / "jwt"
    jwt.write_text("first-jwt\n")
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("X-SLURM-USER-TOKEN"))
        return v038(request)

    b = backend(handler, token=JwtFile(jwt), user="gpuheal")
    assert (await b.ping()).up
    staged = tmp_path / "jwt.new"
    staged.write_text("second-jwt\n")
    staged.replace(jwt)
    assert (await b.ping()).up
    jwt.write_text("third-jwt-longer\n")  # in place: same inode, new size and mtime
    assert (await b.ping()).up
    jwt.unlink()  # gone for a moment: the last JWT stays
    assert (await b.ping()).up
    assert seen == ["first-jwt", "second-jwt", "third-jwt-longer", "third-jwt-longer"]
    await b.aclose()


async def test_ping_on_v0045_reads_the_release_from_meta_slurm() -> None:
    """26.05.5's answer (captured on the sandbox): ``meta.slurm`` (22.05: ``meta.Slurm``) and
    ``responding`` instead of ``ping``."""
    answer = {
        "pings": [{"hostname": "vm", "responding": True, "latency": 554, "primary": True}],
        "meta": {"slurm": {"version": {"major": "26", "minor": "05", "micro": "5"},
                           "release": "26.05.5", "cluster": "gpuheal"}},
        "errors": [], "warnings": [],
    }  # fmt: skip

    def v045(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/slurm/v0.0.45/ping"
        return httpx.Response(200, json=answer)

    ping = await backend(v045, version="v0.0.45").ping()
    assert (ping.up, ping.version, ping.detail) == (True, "26.05.5", "slurmrestd v0.0.45: vm=UP")
