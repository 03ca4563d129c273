"""The operator among the systems around it, on the sandbox: several Slurm clusters, each
behind its own bridge (TLS, verified with a CA bundle), chosen per node; and people told
about each incident transition through webhooks on loopback. Real processes, no mocks."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.cli.simulate import simulate_xid
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    format_gpu_map,
    format_gpu_report,
)
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess, make_tls
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    agent_reports_gpus,
    completed,
    condition,
    cordon_only_rule,
    free_port,
    hold,
    node_events,
    policy,
    pool,
    wait_for,
    xid79_rule,
)

pytestmark = pytest.mark.integration
TOKEN_A = "cluster-a-bridge-token-0123456789"
TOKEN_B = "cluster-b-bridge-token-9876543210"


def drain_rule(xid: int = 79) -> dict[str, Any]:
    return {
        "name": f"xid-{xid}",
        "signals": {"xids": [xid]},
        "ladder": [
            {
                "name": "out",
                "steps": [
                    {"action": "cordon"},
                    {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
                ],
            }
        ],
    }


def slurm_reason(cluster: SlurmCluster, node: str) -> str:
    out = cluster.run("scontrol", "show", "node", node, "-o").stdout
    return out.partition(" Reason=")[2]


def audited(bridge: BridgeProcess) -> list[dict[str, Any]]:
    path = Path(bridge.argv[bridge.argv.index("--state-dir") + 1]) / "audit.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_each_node_is_drained_through_its_own_slurm_clusters_bridge(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    make_slurm_cluster: Callable[..., SlurmCluster],
    run_bridge: Callable[..., BridgeProcess],
    run_operator: Callable[..., OperatorProcess],
    tmp_path: Path,
) -> None:
    """Cluster A is the operator's --bridge-url (HTTPS, its CA given with --bridge-ca-file);
    cluster "hpc-b" comes from --bridges-file (HTTPS, its own CA and token). A node is in B by
    its label, or by its policy's spec.slurmCluster; a label naming an unknown cluster blocks
    the Slurm step and says why."""
    core = sandbox.core_v1()
    cid = case.case_id  # type: ignore[attr-defined]
    (in_a,) = case(1, "a")
    (labelled_b,) = case(1, "a", **{"gpuheal.io/slurm-cluster": "hpc-b"})
    (policy_b,) = case(1, "b")
    (lost,) = case(1, "a", **{"gpuheal.io/slurm-cluster": "hpc-z"})
    slurm_a = make_slurm_cluster([in_a, lost], name="cluster-a")
    slurm_b = make_slurm_cluster([labelled_b, policy_b], name="cluster-b")
    tls_a = make_tls(tmp_path / "pki-a", "127.0.0.1")
    tls_b = make_tls(tmp_path / "pki-b", "127.0.0.1")
    bridge_a = run_bridge(slurm_a, token=TOKEN_A, name="a", host="0.0.0.0", tls=tls_a)
    bridge_b = run_bridge(slurm_b, token=TOKEN_B, name="b", host="0.0.0.0", tls=tls_b)
    token_a, token_b = tmp_path / "op-token-a", tmp_path / "op-token-b"
    token_a.write_text(TOKEN_A)
    token_b.write_text(TOKEN_B)
    bridges_file = tmp_path / "bridges.yaml"
    bridges_file.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "hpc-b": {
                        "url": bridge_b.url,
                        "tokenFile": str(token_b),
                        "caFile": str(tls_b.ca),
                    },
                }
            }
        )
    )
    objects.apply("remediationpolicies", policy(f"pa-{cid}", f"{cid}-a", [drain_rule()]))
    by_policy = policy(f"pb-{cid}", f"{cid}-b", [drain_rule()])
    by_policy["spec"]["slurmCluster"] = "hpc-b"
    objects.apply("remediationpolicies", by_policy)
    op = run_operator(
        "--bridge-url", bridge_a.url, "--bridge-token-file", str(token_a),
        "--bridge-ca-file", str(tls_a.ca), "--bridge-cluster", "hpc-a",
        "--bridges-file", str(bridges_file),
    )  # fmt: skip

    def slurm_drained(node: str) -> dict[str, Any] | None:
        nrem = objects.incident(node)
        c = condition(nrem, "SlurmDrained")
        return nrem if c and c["status"] == "True" else None

    for node in (labelled_b, policy_b, in_a, lost):
        simulate_xid(core, node, 79)
    for node, cluster in ((labelled_b, slurm_b), (policy_b, slurm_b), (in_a, slurm_a)):
        nrem = wait_for(lambda n=node: slurm_drained(n), f"{node} drained in Slurm")
        name = nrem["metadata"]["name"]
        assert condition(nrem, "SlurmDrained")["reason"] == "Drained"
        assert slurm_reason(cluster, node).startswith(f"gpuheal: {name} xid=79")
    # each drain went through its own cluster's bridge, and only that one
    assert {a["target"] for a in audited(bridge_b) if a["op"] == "drain_node"} == {
        labelled_b,
        policy_b,
    }
    assert {a["target"] for a in audited(bridge_a) if a["op"] == "drain_node"} == {in_a}
    assert "Reason=" not in slurm_a.run("scontrol", "show", "node", lost, "-o").stdout
    blocked = wait_for(
        lambda: (o := objects.incident(lost))
        and (c := condition(o, "Blocked")) and c["reason"] == "SlurmClusterUnknown" and c,
        "the node of an unknown cluster blocks and says why",
    )  # fmt: skip
    assert "'hpc-z', which has no bridge (known: hpc-a, hpc-b)" in blocked["message"]
    m = op.metrics()
    assert m['gpuheal_bridge_up{cluster="hpc-a"}'] == 1
    assert m['gpuheal_bridge_up{cluster="hpc-b"}'] == 1
    assert "bridges=hpc-a=https://127.0.0.1" in op.log()


class Receiver:
    """Webhook receivers on loopback: every POST recorded by path; /hook answers 400 (a reset
    hook that refuses), everything else 200."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.got.append((self.path, body))
                self.send_response(400 if self.path == "/hook" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list[dict[str, Any]]:
        return [b for p, b in self.got if p == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def test_a_webhook_hears_each_incident_transition_once(  # noqa: PLR0917
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    own_gpu_nodes: Callable[..., list[str]],
    run_operator: Callable[..., OperatorProcess],
    receiver: Receiver,
) -> None:
    """XID 79: opened, then the replace waits for approval, then (approved) for a spare, then
    the spare comes and it completes; XID 95 on another node: its reset hook refuses, it
    fails. The operator's --notify-webhooks receiver (generic JSON) and the policy's own
    (Slack) each hear every transition once."""
    core = sandbox.core_v1()
    cid = case.case_id  # type: ignore[attr-defined]
    broken, refused = case(2)
    objects.apply("reservepools", pool(f"spares-{cid}", f"{cid}-spare"))  # empty for now
    reset_rule = {
        "name": "uncontained",
        "signals": {"xids": [95]},
        "ladder": [
            {
                "name": "reset",
                "steps": [
                    {"action": "cordon"},
                    {"action": "reset", "reset": {"hook": {
                        "type": "Webhook", "webhook": {"url": f"{receiver.url}/hook"}}}},
                ],
            }
        ],
    }  # fmt: skip
    manifest = policy(f"p-{cid}", f"{cid}-work", [xid79_rule(f"spares-{cid}"), reset_rule],
                      requireApproval=["replace"])  # fmt: skip
    manifest["spec"]["notifications"] = {
        "webhooks": [{"url": f"{receiver.url}/slack", "format": "Slack"}]
    }
    objects.apply("remediationpolicies", manifest)
    run_operator("--notify-webhooks", f"{receiver.url}/ops")

    def incident_blocked(reason: str) -> dict[str, Any]:
        return wait_for(  # type: ignore[no-any-return]
            lambda: (o := objects.incident(broken))
            and (c := condition(o, "Blocked")) and c["status"] == "True"
            and c["reason"] == reason and o,
            f"incident blocked: {reason}",
        )  # fmt: skip

    simulate_xid(core, broken, 79)
    name = incident_blocked("ApprovalPending")["metadata"]["name"]
    objects.patch("noderemediations", name,
                  {"metadata": {"annotations": {"gpuheal.io/approve": "replace"}}})  # fmt: skip
    incident_blocked("NoSpareAvailable")
    hold(lambda: not completed(objects.get("noderemediations", name)), "waits for a spare", 2)
    own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-spare"})
    wait_for(lambda: completed(objects.get("noderemediations", name)) == "Replaced", "replaced")
    # the node's agent knows its GPUs: a reset could be verified, so the hook is asked
    gpus = {f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)}
    seen = format_gpu_report(dt.datetime.now(dt.UTC), gpus)
    agent = {GPU_MAP_ANNOTATION: format_gpu_map(gpus), GPU_REPORT_ANNOTATION: seen}
    core.patch_node(refused, {"metadata": {"annotations": agent}})
    simulate_xid(core, refused, 95)
    failed = wait_for(lambda: completed(o := objects.incident(refused)) == "Failed" and o, "fails")
    assert condition(failed, "Reset")["reason"] == "HookRefused"
    other = failed["metadata"]["name"]

    want = [
        (name, "Opened", "SignalMatched"),
        (name, "ApprovalPending", "ApprovalPending"),
        (name, "Blocked", "NoSpareAvailable"),
        (name, "Completed", "Replaced"),
        (other, "Opened", "SignalMatched"),
        (other, "Failed", "HookRefused"),
    ]
    wait_for(lambda: len(receiver.at("/ops")) >= len(want), "every message at the receiver")
    hold(lambda: len(receiver.at("/ops")) == len(want), "and no second copy", 3)
    ops = receiver.at("/ops")
    assert [(m["incident"], m["event"], m["reason"]) for m in ops] == want
    assert {m["node"] for m in ops} == {broken, refused}
    assert all(m["source"] == "gpuheal" and m["policy"] == f"p-{cid}" for m in ops)
    assert ops[0]["xid"] == 79
    assert "gpuheal.io/approve=replace" in ops[1]["message"]
    slack = receiver.at("/slack")
    assert len(slack) == len(want)
    assert all(set(m) == {"text"} for m in slack)
    assert f"gpuheal incident `{name}` on `{broken}` XID 79: *needs approval*" in slack[1]["text"]
    assert f"`{other}` on `{refused}` XID 95: *FAILED* (HookRefused)" in slack[5]["text"]
    assert {p for p, _ in receiver.got} == {"/ops", "/slack", "/hook"}


def test_a_webhook_url_read_from_a_secret_is_used_and_never_shown(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    receiver: Receiver,
) -> None:
    """The operator's receiver (`secret:NAME/KEY`) and the policy's (`secretRef`) take their
    URLs from a Secret in the operator's namespace, read at each send (a rotated key counts
    from the next message). Every URL carries a secret in its path (as Slack's do): none is
    in the operator's log, the incident's spec (its ladder snapshot), status or Events, not
    even that of a receiver that is down; the reset hook, whose URL the snapshot keeps as
    scheme and host, is called at its whole URL (path and query), read from the policy."""
    core = sandbox.core_v1()
    cid = case.case_id  # type: ignore[attr-defined]
    first, second, unhooked = case(3)
    secret = f"notify-{cid}"
    token = f"T0KEN{cid}"
    url = lambda what: f"{receiver.url}/{token}-{what}"  # noqa: E731
    dead = f"http://127.0.0.1:{free_port()}/{token}-dead"
    core.create_namespaced_secret(
        "default",  # the harness's --namespace
        {"metadata": {"name": secret}, "stringData": {"ops": url("ops"), "team": url("team")}},
    )
    try:
        hookless = {
            "name": "uncontained",
            "signals": {"xids": [95]},
            "ladder": [{"name": "reset", "steps": [
                {"action": "cordon"},
                {"action": "reset", "reset": {"hook": {
                    "type": "Webhook", "webhook": {"url": f"{url('hook')}?sig={token}"}}}},
            ]}],
        }  # fmt: skip
        manifest = policy(f"p-{cid}", f"{cid}-work", [cordon_only_rule(94), hookless])
        manifest["spec"]["notifications"] = {
            "webhooks": [
                {"secretRef": {"name": secret, "key": "team"}, "format": "Slack"},
                {"url": dead, "events": ["Opened"]},  # down: its failure is logged
            ]
        }
        objects.apply("remediationpolicies", manifest)
        op = run_operator("--notify-webhooks", f"secret:{secret}/ops", "--notify-retries", "0")

        simulate_xid(core, first, 94)
        wait_for(lambda: receiver.at(f"/{token}-ops"), "the operator's receiver, by its Secret")
        wait_for(lambda: receiver.at(f"/{token}-team"), "the policy's receiver, by its Secret")
        assert receiver.at(f"/{token}-ops")[0]["node"] == first
        assert first in receiver.at(f"/{token}-team")[0]["text"]

        core.patch_namespaced_secret(secret, "default", {"stringData": {"team": url("rotated")}})
        simulate_xid(core, second, 94)
        wait_for(lambda: receiver.at(f"/{token}-rotated"), "the rotated URL at the next send")
        assert second in receiver.at(f"/{token}-rotated")[0]["text"]

        agent_reports_gpus(core, unhooked)  # a reset could be proven: the hook is asked
        simulate_xid(core, unhooked, 95)
        wait_for(
            lambda: receiver.at(f"/{token}-hook?sig={token}"),
            "the reset hook called at its whole URL, the policy's",
        )
        reset = wait_for(
            lambda: condition(objects.incident(unhooked), "Reset"), "the reset step recorded"
        )
        spec = (objects.incident(unhooked) or {})["spec"]
        (hook,) = [s["reset"]["hook"] for s in spec["ladder"][0]["steps"] if "reset" in s]
        assert hook["webhook"]["url"] == f"{receiver.url}/..."
        wait_for(lambda: "not delivered" in op.log(), "the dead receiver's failure logged")
        shown = {
            "operator log": op.log(),
            "reset condition": json.dumps(reset),
            "incidents' spec": json.dumps(
                [(objects.incident(n) or {}).get("spec") for n in (first, second, unhooked)]
            ),
            "incidents' status": json.dumps(
                [(objects.incident(n) or {}).get("status") for n in (first, second, unhooked)]
            ),
            "events": " ".join(
                e.message or "" for n in (first, second, unhooked) for e in node_events(core, n)
            ),
        }
        for where, text in shown.items():
            assert token not in text, f"a webhook URL's secret part in the {where}"
        assert "http://127.0.0.1:" in op.log()  # the dead receiver named by scheme and host
        assert f"Secret default/{secret} key" not in op.log()  # both Secrets answered
    finally:
        core.delete_namespaced_secret(secret, "default")
