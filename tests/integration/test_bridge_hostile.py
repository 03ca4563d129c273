"""Hostile input against the bridge as a process, in front of the sandbox's real Slurm.

Schemathesis fuzzes the live OpenAPI document (positive and negative data, with a token and
without), then hand-made hostile input: shell metacharacters, ``..``, flag-looking names,
very long and non-ASCII names, hostlists, job ids out of range, uncatchable signals, a resume
that names no incident, oversized and deeply nested bodies. Slurm's commands go through a
shim that logs their exact argv. Asserted: no 5xx; every refusal a 4xx whose body says why;
no Slurm command carried attacker text or a flag the bridge does not use; Slurm's own state
(and slurmctld's log) changed only for the node that was asked for; the audit log records
who (the token's name) asked for what, refusals included. Figures: ``RESULT`` lines (``-s``).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuheal_bridge.api.models import ErrorCode
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess

pytestmark = pytest.mark.integration
TOKEN = "hostile-bridge-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODES = ("hx-node-0", "hx-node-1", "hx-node-2")
VICTIM = "nrem-victim"  # another incident's drain, on NODES[0]
SEP, END = "\x1f", "\x1e"
# Every flag the bridge's CLI backend passes to Slurm's commands (backends/cli.py).
BRIDGE_FLAGS = {"-h", "-t", "-w", "-j", "-o", "-O", "--full", "--batch", "--version"}
ERROR_CODES = {code.value for code in ErrorCode}  # the bridge's documented refusals
MARKER = "pwn"  # in every hand-made hostile value: never on a Slurm command line


def _shim(bin_dir: Path, log: Path, real: Path) -> None:
    """Slurm's commands log their exact argv (fields split by \\x1f, records by \\x1e, one
    write each), then run the real ones."""
    bin_dir.mkdir()
    for tool in ("scontrol", "squeue", "scancel", "sinfo", "sbatch"):
        path = bin_dir / tool
        path.write_text(
            "#!/bin/sh\n"
            f'rec="{tool}"\n'
            f'for a in "$@"; do rec="$rec$(printf "\\037")$a"; done\n'
            f'printf "%s\\036" "$rec" >> {log}\n'
            f'exec {real / tool} "$@"\n'
        )
        path.chmod(0o755)


@dataclass
class Tally:
    sent: int = 0
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    refusals_with_reason: int = 0
    problems: list[str] = field(default_factory=list)

    def see(self, what: str, status: int, body: str) -> None:
        self.sent += 1
        self.statuses[status] += 1
        if status >= 500:
            self.problems.append(f"{what}: {status} {body[:300]}")
        elif status >= 400:
            try:
                err = json.loads(body)
            except ValueError:
                err = None
            if isinstance(err, dict) and err.get("error") in ERROR_CODES and err.get("message"):
                self.refusals_with_reason += 1
            else:
                self.problems.append(f"{what}: {status} without a reason: {body[:300]}")


@pytest.fixture
def hostile(
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    tmp_path: Path,
) -> tuple[SlurmCluster, BridgeProcess, Path]:
    cluster = make_slurm_cluster(NODES, name="hostile")
    calls = tmp_path / "slurm-argv.log"
    _shim(tmp_path / "bin", calls, cluster.bin_dir or Path("/usr/bin"))
    bridge = run_bridge(cluster, "--slurm-bin-dir", str(tmp_path / "bin"), token=TOKEN)
    return cluster, bridge, calls


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "bridge-state" / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _argv(calls: Path) -> list[list[str]]:
    return [rec.split(SEP) for rec in calls.read_text(errors="replace").split(END) if rec]


def _check_slurm_commands(calls: Path, allowed_nodes: set[str], *, marked: bool = True) -> int:
    """No attacker text (``marked``: the hand-made values carry MARKER; schemathesis's random
    ones may spell it by chance) and no foreign flag on any Slurm command; node updates only
    on ``allowed_nodes``. Returns the number of commands run."""
    argvs = _argv(calls)
    for argv in argvs:
        for arg in argv[1:]:
            assert not marked or MARKER not in arg.lower(), argv
            flag = arg.split("=", 1)[0]
            assert not arg.startswith("-") or flag in BRIDGE_FLAGS | {"--signal"}, argv
        if argv[:2] == ["scontrol", "update"] and argv[2].startswith("NodeName="):
            assert argv[2].removeprefix("NodeName=") in allowed_nodes, argv
    return len(argvs)


def _slurmctld_node_updates(cluster: SlurmCluster) -> set[str]:
    text = (cluster.log_dir / "slurmctld.log").read_text(errors="replace")
    return set(re.findall(r"update_node: node (\S+)", text))


def _drain_reason(cluster: SlurmCluster, node: str) -> str:
    out = cluster.run("scontrol", "show", "node", "-o", node).stdout
    m = re.search(r"Reason=(.*?) \[", out)
    return m.group(1) if m else ""


# ---- schemathesis over the live OpenAPI ------------------------------------------------------
def test_schemathesis_over_the_live_openapi_with_and_without_a_token(
    hostile: tuple[SlurmCluster, BridgeProcess, Path],
) -> None:
    cluster, bridge, calls = hostile
    tally = Tally()
    schema = schemathesis.openapi.from_url(f"{bridge.url}/openapi.json")

    def reason_in_body(_ctx: object, response: schemathesis.Response, case: Any) -> None:
        tally.see(f"{case.method} {case.formatted_path}", response.status_code, response.text)
        assert response.status_code < 500, f"{case.method} {case.formatted_path}"

    def schema_says_what_server_enforces(
        _ctx: object, response: schemathesis.Response, case: Any
    ) -> None:
        """Data the document calls valid is not refused as invalid: a 422 for it is only a
        key reused for another request (which no schema can say)."""
        if case.meta.generation.mode is GenerationMode.POSITIVE and response.status_code == 422:
            assert response.json()["error"] == "idempotency_mismatch", response.text

    def negative_is_refused(_ctx: object, response: schemathesis.Response, case: Any) -> None:
        # an operation without parameters or body (GET /v1/capabilities) has no negative input:
        # its "negative" case differs only in the Authorization header, which the test sets
        raw = case.operation.definition.raw
        takes_input = bool(raw.get("parameters") or raw.get("requestBody"))
        negative = case.meta.generation.mode is GenerationMode.NEGATIVE
        if negative and takes_input and case.path.startswith("/v1"):
            assert response.status_code >= 400, f"{case.method} {case.path}: {response.text}"

    checks = [
        reason_in_body,
        schema_says_what_server_enforces,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]

    def fuzz(op: Any, mode: GenerationMode, headers: dict[str, str], examples: int) -> None:
        extra = [negative_is_refused] if headers else []

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case: Any) -> None:
            response = case.call(headers=headers, timeout=60)
            case.validate_response(response, checks=checks + extra)

        try:
            run()
        except Unsatisfiable:  # negative data for an operation with no input: none exists
            assert mode is GenerationMode.NEGATIVE

    for headers, examples in ((AUTH, 20), ({}, 8)):
        for result in schema.get_all_operations():
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz(result.ok(), mode, headers, examples)
    assert tally.problems == []
    assert tally.statuses[401] > 0
    n_cmds = _check_slurm_commands(calls, allowed_nodes=set(), marked=False)
    assert cluster.node_states() == dict.fromkeys(NODES, "idle")
    assert _slurmctld_node_updates(cluster) == set()
    print(
        f"RESULT schemathesis: requests={tally.sent} 5xx=0 "
        f"refusals_with_reason={tally.refusals_with_reason} "
        f"statuses={dict(sorted(tally.statuses.items()))} slurm_commands={n_cmds} "
        "nodes_changed=0"
    )


# ---- hand-made hostile input -----------------------------------------------------------------
HOSTILE_NODES = [
    "pwn;reboot", "pwn$(touch${IFS}/tmp/pwned)", "`pwn`", "pwn|id", "pwn&&id", "pwn>x",
    "..", "%2e%2e", "pwn%2f..%2f..", "-pwn", "--help-pwn", "-w", "--pwn=1", "pwn name",
    "pwn%09tab", "pwn%00", "pwn%0areboot", "pwñ", "节点pwn", "pwn-\u202e", "p" * 254 + MARKER,
    "pwn" * 2000, "pwn[0-2]", "pwn,hx-node-1", "NodeName=pwn", "pwn'", 'pwn"',
]  # fmt: skip
HOSTILE_JOBS = [
    "0", "-1", "4294967294", "99999999999", "1_2", "1e3", "0x10", "+7", "%207", "٣", "07",
    "1;pwn", "-pwn", "18446744073709551617",
]  # fmt: skip


def test_hostile_names_ids_bodies_and_signals_change_nothing_in_slurm(
    hostile: tuple[SlurmCluster, BridgeProcess, Path], tmp_path: Path
) -> None:
    cluster, bridge, calls = hostile
    tally = Tally()
    posts: list[tuple[str, int]] = []  # authenticated POSTs: (target, status)
    with httpx.Client(base_url=bridge.url, timeout=60) as http:

        def send(
            method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any
        ) -> httpx.Response:
            resp = http.request(method, path, headers={**AUTH, **(headers or {})}, **kw)
            tally.see(f"{method} {path[:80]}", resp.status_code, resp.text)
            if method == "POST" and "Authorization" not in (headers or {}):
                posts.append((path, resp.status_code))
            return resp

        # another incident's drain, which nothing below may lift
        assert (
            send("POST", f"/v1/nodes/{NODES[0]}/drain", json={"incident": VICTIM}).status_code
            == 200
        )
        for name in HOSTILE_NODES:
            for method, suffix, body in (
                ("GET", "", None),
                ("GET", "/jobs", None),
                ("POST", "/drain", {"incident": "nrem-pwn"}),
                ("POST", "/resume", {"force": True}),
                ("POST", "/reboot", {"incident": "nrem-pwn"}),
                ("POST", "/reserve", {"incident": "nrem-pwn"}),
            ):
                resp = send(method, f"/v1/nodes/{name}{suffix}", json=body)
                assert 400 <= resp.status_code < 500, (name, suffix, resp.status_code)
        for job in HOSTILE_JOBS:
            assert 400 <= send("GET", f"/v1/jobs/{job}").status_code < 500, job
            requeue = send("POST", f"/v1/jobs/{job}/requeue", json={"from_node": NODES[0]})
            assert 400 <= requeue.status_code < 500, job
        # ids the API takes but squeue 22.05 refuses ("Invalid job id: N", above 2**31 - 1):
        # no such job, a 404 (not a 200 "failed" stored under the key)
        for job in ("2147483648", "4294906480", "4294967293"):
            assert send("GET", f"/v1/jobs/{job}").status_code == 404, job
            requeue = send("POST", f"/v1/jobs/{job}/requeue", json={"from_node": NODES[0]})
            assert requeue.status_code == 404, job
        for hostlist in (
            "hx-node-[0-2]",
            "--help",
            "$(pwn)",
            "-w hx-node-1",
            "hx-node-0,hx-node-1",
        ):
            resp = send("POST", "/v1/jobs/7/requeue", json={"from_node": hostlist})
            assert resp.status_code == 422, hostlist
        node1 = f"/v1/nodes/{NODES[1]}"
        for sig in ("9", "19", "KILL", "SIGSTOP", "USR1; pwn", "--full", "-9", "0"):
            body = {"incident": "nrem-sig", "requeue": {"checkpoint": {"signal": sig}}}
            assert send("POST", f"{node1}/drain", json=body).status_code == 422, sig
        for xid in (0, -1, 65536, 100000):
            body = {"incident": "nrem-xid", "xid": xid}
            assert send("POST", f"{node1}/drain", json=body).status_code == 422, xid
        for reason in ("", "[pwn]", "x" * 129):
            body = {"incident": "nrem-r", "reason": reason}
            assert send("POST", f"{node1}/reserve", json=body).status_code == 422, reason
        # a valid token, no incident: another incident's drain stays
        resp = send("POST", f"/v1/nodes/{NODES[0]}/resume", json={})
        assert resp.status_code == 409
        assert VICTIM in resp.json()["message"]
        resp = send("POST", f"/v1/nodes/{NODES[0]}/resume", json={"incident": "nrem-other"})
        assert resp.status_code == 409
        # Idempotency-Key: "null" for two different requests, too long, not printable
        key = {"Idempotency-Key": "null"}
        assert send("POST", f"{node1}/resume", headers=key, json={}).status_code == 200
        resp = send("POST", f"{node1}/resume", headers=key, json={"incident": "nrem-b"})
        assert resp.json()["error"] == "idempotency_mismatch"
        long_key = {"Idempotency-Key": "k" * 201}
        assert send("POST", f"{node1}/resume", headers=long_key, json={}).status_code == 422
        # oversized, chunked, deeply nested, not JSON, wrong type
        big = {"incident": "nrem-pwn", "pad": "x" * 2_000_000}
        assert send("POST", f"{node1}/drain", json=big).status_code == 413

        def chunks() -> Any:
            yield b'{"incident": "nrem-pwn", "pad": "'
            for _ in range(64):
                yield b"x" * 65536
            yield b'"}'

        resp = send(
            "POST", f"{node1}/drain", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 413
        nested = '{"incident": "nrem-pwn", "requeue": ' + "[" * 30000 + "]" * 30000 + "}"
        resp = send(
            "POST", f"{node1}/drain", content=nested, headers={"Content-Type": "application/json"}
        )
        assert 400 <= resp.status_code < 500
        for content in (b"not json pwn", b"\xff\xfe\x00pwn", b"[]", b"null", b'"pwn"'):
            resp = send(
                "POST",
                f"{node1}/drain",
                content=content,
                headers={"Content-Type": "application/json"},
            )
            assert 400 <= resp.status_code < 500, content
        resp = send(
            "POST",
            f"{node1}/drain",
            content=b"incident=pwn",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert 400 <= resp.status_code < 500
        # without a token: 401, nothing else
        for name in ("pwn;reboot", NODES[1]):
            resp = send(
                "POST",
                f"/v1/nodes/{name}/drain",
                headers={"Authorization": "Bearer pwn-0123456789abcdef"},
                json={"incident": "nrem-pwn"},
            )
            assert resp.status_code == 401

    assert tally.problems == []
    assert bridge.proc.poll() is None
    n_cmds = _check_slurm_commands(calls, allowed_nodes={NODES[0]})
    # Slurm's own state: the victim's drain stands, nothing else drained
    states = cluster.node_states()
    assert states[NODES[1]] == states[NODES[2]] == "idle", states
    assert _drain_reason(cluster, NODES[0]) == f"gpuheal: {VICTIM}"
    assert _slurmctld_node_updates(cluster) <= {NODES[0]}
    # the audit log: who asked for what, refusals too; a 401 names no one but its address
    lines = _audit(tmp_path)
    unauthorized = [x for x in lines if x["status"] == 401]
    # two 401s from one address within the minute: one line, the second only counted
    assert [(x["who"], bool(x["peer"])) for x in unauthorized] == [(None, True)]
    lines = [x for x in lines if x["status"] != 401]
    assert len(lines) == len(posts), (len(lines), len(posts))
    assert {x["who"] for x in lines} == {"operator"}
    assert [x["status"] for x in lines] == [status for _, status in posts]
    refused = [x for x in lines if x["status"] >= 400]
    assert all(x["result"].get("message") for x in refused)
    assert all(len(json.dumps(x)) < 8000 for x in lines)  # hostile input is cut, not copied
    print(
        f"RESULT hostile: requests={tally.sent} 5xx=0 refusals_with_reason="
        f"{tally.refusals_with_reason} statuses={dict(sorted(tally.statuses.items()))} "
        f"audit_lines={len(lines)} (refusals {len(refused)}) slurm_commands={n_cmds} "
        "attacker_text_on_slurm_command_lines=0 nodes_changed=0 (besides the one asked for)"
    )
