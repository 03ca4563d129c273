"""Reboot through Slurm and hand-over to the reserve pool: operations on the in-memory Slurm,
the HTTP routes (4xx with reasons), the CLI backend's argument list, and the parsed boot
time."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal_bridge import repair
from gpuheal_bridge.api.models import (
    Owner,
    RebootNextState,
    RebootOutcome,
    RebootRequest,
    ReserveOutcome,
    ReserveRequest,
)
from gpuheal_bridge.backends.cli import CliBackend, CommandResult
from gpuheal_bridge.backends.parse import parse_node_line
from gpuheal_bridge.operations import Operations, OwnershipConflict
from tests.unit.bridge.conftest import DATA
from tests.unit.bridge.fakes import FakeSlurm
from tests.unit.bridge.test_app import AUTH, make_client


async def test_reboot_of_an_undrained_node_drains_it_first_and_it_stays_drained(
    ops: Operations, slurm: FakeSlurm
) -> None:
    resp = await repair.reboot(ops, "node3", "node3", RebootRequest(incident="nrem-a", xid=79))
    assert resp.outcome is RebootOutcome.REQUESTED
    assert resp.previous.owner is Owner.NONE
    assert resp.current.rebooting
    assert resp.current.incident == "nrem-a"
    assert slurm.mutating_calls() == ["drain", "reboot"]
    assert slurm.calls[-2][1] == ("node3", "gpuheal: nrem-a xid=79 reboot", False, False)
    slurm.finish_reboot("node3", "2026-03-01T12:00:00")
    after = await ops.get_node("node3", "node3")
    assert (after.drain, after.owner, after.incident) == (True, Owner.GPUHEAL, "nrem-a")
    assert not after.rebooting
    assert after.boot_time == "2026-03-01T12:00:00"


async def test_reboot_is_not_repeated_while_pending(ops: Operations, slurm: FakeSlurm) -> None:
    req = RebootRequest(incident="nrem-a")
    await repair.reboot(ops, "node3", "node3", req)
    again = await repair.reboot(ops, "node3", "node3", req)
    assert again.outcome is RebootOutcome.ALREADY_REQUESTED
    assert slurm.mutating_calls() == ["drain", "reboot"]


async def test_reboot_resume_mode_is_slurms_asap_nextstate_resume(
    ops: Operations, slurm: FakeSlurm
) -> None:
    req = RebootRequest(incident="nrem-a", next_state=RebootNextState.RESUME)
    await repair.reboot(ops, "node1", "node1", req)
    assert slurm.mutating_calls() == ["reboot"]
    assert slurm.calls[-2][1][2:] == (True, True)


async def test_someone_elses_drain_is_not_rebooted(ops: Operations, slurm: FakeSlurm) -> None:
    with pytest.raises(OwnershipConflict, match="someone else"):
        await repair.reboot(ops, "node2", "node2", RebootRequest(incident="nrem-a"))
    assert slurm.mutating_calls() == []


async def test_reserve_hands_our_drain_to_the_pool_once(ops: Operations, slurm: FakeSlurm) -> None:
    slurm.add_node("node4", "IDLE", ("DRAIN",), "gpuheal: nrem-a xid=79 reboot : reboot issued")
    resp = await repair.reserve(ops, "node4", "node4", ReserveRequest(incident="nrem-a"))
    assert resp.outcome is ReserveOutcome.RESERVED
    assert (resp.current.reason, resp.current.owner) == ("reserve pool", Owner.OTHER)
    again = await repair.reserve(ops, "node4", "node4", ReserveRequest(incident="nrem-a"))
    assert again.outcome is ReserveOutcome.ALREADY_RESERVED
    assert slurm.mutating_calls() == ["drain"]
    with pytest.raises(OwnershipConflict):
        await repair.reserve(ops, "node2", "node2", ReserveRequest(incident="nrem-a"))
    slurm.add_node("node5", "IDLE", ("DRAIN",), "gpuheal: nrem-b xid=79")
    with pytest.raises(OwnershipConflict, match="not for nrem-a"):
        await repair.reserve(ops, "node5", "node5", ReserveRequest(incident="nrem-a"))


def test_routes_answer_with_reasons(slurm: FakeSlurm, tmp_path: Path) -> None:
    with make_client(slurm, tmp_path) as client:
        ok = client.post("/v1/nodes/node3/reboot", json={"incident": "nrem-a"}, headers=AUTH)
        assert ok.status_code == 200, ok.text
        assert ok.json()["outcome"] == "requested"
        assert "REBOOT_REQUESTED" in ok.json()["current"]["flags"]
        theirs = client.post("/v1/nodes/node2/reboot", json={"incident": "nrem-a"}, headers=AUTH)
        assert theirs.status_code == 409
        assert theirs.json()["error"] == "conflict"
        assert "someone else" in theirs.json()["message"]
        assert theirs.json()["owner"] == "other"
        unknown = client.post("/v1/nodes/nope/reboot", json={"incident": "nrem-a"}, headers=AUTH)
        assert unknown.status_code == 404
        bad = client.post("/v1/nodes/node3/reboot", json={"incident": "NOT OK"}, headers=AUTH)
        assert bad.status_code == 422
        assert "incident" in bad.json()["message"]
        bad = client.post(
            "/v1/nodes/node3/reserve",
            json={"incident": "nrem-a", "reason": "x [y]"},
            headers=AUTH,
        )
        assert bad.status_code == 422
        pool = client.post("/v1/nodes/node3/reserve", json={"incident": "nrem-a"}, headers=AUTH)
        assert pool.status_code == 200, pool.text
        assert pool.json()["current"]["reason"] == "reserve pool"


async def test_cli_backend_argument_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = CliBackend()
    seen: list[tuple[str, ...]] = []

    async def run(tool: str, *args: str, limit: float | None = None) -> CommandResult:
        seen.append((tool, *args))
        return CommandResult((tool, *args), 0, "", "")

    monkeypatch.setattr(backend, "run", run)
    await backend.reboot("n1", "gpuheal: nrem-a reboot", asap=False, resume=False)
    await backend.reboot("n1", "r", asap=True, resume=True)
    assert seen == [
        ("scontrol", "reboot", "reason=gpuheal: nrem-a reboot", "n1"),
        ("scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=r", "n1"),
    ]


def test_boot_time_is_parsed() -> None:
    line = (DATA / "node3_idle.txt").read_text()
    node = parse_node_line(line)
    assert node.boot_time is not None
    assert node.slurmd_start_time is not None
    rebooting = parse_node_line(
        "NodeName=n0 Arch=x86_64 State=DOWN+DRAIN+REBOOT_ISSUED BootTime=None "
        "SlurmdStartTime=2026-11-23T13:14:27 Reason=gpuheal: nrem-x reboot : reboot issued "
        "[root@2026-11-23T13:14:29]"
    )
    assert rebooting.flags == ("DRAIN", "REBOOT_ISSUED")
    assert rebooting.boot_time is None
    assert rebooting.reason == "gpuheal: nrem-x reboot : reboot issued"


def test_openapi_lists_the_routes(slurm: FakeSlurm, tmp_path: Path) -> None:
    with make_client(slurm, tmp_path) as client:
        paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/nodes/{node}/reboot", "/v1/nodes/{node}/reserve"} <= set(paths)
