"""The operator's memory is in the API (FaultHistory), on the real sandbox apiserver: a
SIGKILL between two XIDs forgets nothing, a 7-day window counts back-dated history, replaced
nodes waiting for repair hold no maxUnhealthy slot, a low pool asks its refill webhook, and
`gpuheal history` / `kubectl get faulthistories` list the repeat offender. No mocks."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client

from gpuheal.cli.simulate import kernel_line, simulate_xid
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    GROUP,
    REPO,
    VERSION,
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    hold,
    policy,
    pool,
    wait_for,
)

pytestmark = pytest.mark.integration

UUID = "GPU-8f6c1a2b-0000-4000-8000-00000000c0de"


def _uuid_line(code: int) -> str:
    """The driver's XID line plus its identity line, as `gpuheal agent` posts them."""
    return f"{kernel_line(code)}\nNVRM: GPU at PCI:0000:3b:00: {UUID}"


def _forget_the_past(core: client.CoreV1Api, objects: Objects, node: str) -> None:
    """What an operator restarted days later finds: the node's Events have expired and a
    person cleaned up the finished NodeRemediations. Only the FaultHistory remembers."""
    sel = f"involvedObject.kind=Node,involvedObject.name={node}"
    for ev in core.list_event_for_all_namespaces(field_selector=sel).items:
        core.delete_namespaced_event(ev.metadata.name, ev.metadata.namespace)
    for item in objects.incidents(node):
        assert completed(item), dump(item.get("status"))
        objects.delete("noderemediations", item["metadata"]["name"])


def _history(objects: Objects, node: str) -> dict[str, Any]:
    return objects.get("faulthistories", node) or {}


def test_sigkill_between_two_xid94s_on_one_gpu_still_escalates_on_the_third(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    (spare,) = case(1, "spare")
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("reservepools", pool(f"spares-{cid}", f"{cid}-spare"))
    rule = {
        "name": "contained-ecc",
        "signals": {"xids": [94]},
        "escalation": {"occurrences": 3, "window": "168h", "scope": "Gpu"},
        "ladder": [
            {"name": "requeue", "steps": [{"action": "cordon"}]},
            {
                "name": "replace",
                "steps": [
                    {"action": "cordon"},
                    {"action": "replace", "replace": {"reservePoolRef": {"name": f"spares-{cid}"}}},
                ],
            },
        ],
    }
    objects.apply(
        "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="1s")
    )
    op = run_operator()
    for n in (1, 2):
        simulate_xid(core, node, 94, message=_uuid_line(94))
        done = wait_for(
            lambda: [o for o in objects.incidents(node) if completed(o)], f"XID 94 #{n} handled",
            timeout=60,
        )  # fmt: skip
        assert completed(done[0]) == "Returned", dump(done[0]["status"])
        assert done[0]["status"]["rung"] == 0
        wait_for(
            lambda n=n: (
                (h := _history(objects, node))
                and h.get("status", {}).get("faults") == n
                and [e["kind"] for e in h["status"]["entries"]].count("Outcome") == n
            ),
            f"FaultHistory with {n} fault(s) and {n} outcome(s)",
        )
        op.kill()  # SIGKILL: nothing of this process survives
        op.delete_dead_lease()
        _forget_the_past(core, objects, node)
        op = run_operator()

    simulate_xid(core, node, 94, message=_uuid_line(94))
    third = wait_for(lambda: completed(o := objects.incident(node)) and o, "third handled",
                     timeout=60)  # fmt: skip
    assert third["status"]["rung"] == 1, dump(third["status"])
    assert completed(third) == "Replaced", dump(third["status"])
    assert third["status"]["why"] == f"3rd XID 94 on {UUID} in 7d"
    assert f"3rd XID 94 on {UUID} in 7d" in condition(third, "Detected")["message"]
    assert third["status"]["replacementNode"] == spare
    history = wait_for(
        lambda: (
            (h := _history(objects, node))
            and h["status"].get("faults") == 3
            and h["status"].get("lastOutcome") == "Replaced"
            and h
        ),
        "three faults and the replacement on record",
    )
    status = history["status"]
    assert (status["worstGpu"], status["worstGpuFaults"]) == (UUID, 3)
    assert status["gpus"][0]["pciBusId"] == "0000:3b:00"
    assert status["summary"] == f"3 x XID 94 on {UUID} in 30d"
    assert (
        next(c for c in status["conditions"] if c["type"] == "RepeatOffender")["status"] == "True"
    )
    kinds = [e["kind"] for e in status["entries"]]
    assert kinds.count("Signal") == 3
    assert kinds.count("Outcome") == 3
    assert {"cordon", "replace"} <= {e.get("action") for e in status["entries"]}

    # `kubectl get faulthistories` and `gpuheal history` show the repeat offender.
    table = sandbox.kubectl("get", "faulthistories", node, "-o", "wide").stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "FAULTS", "INCIDENTS", "WORST-GPU", "GPU-FAULTS",
                                  "LAST-FAULT", "LAST-OUTCOME"]  # fmt: skip
    assert row.split()[:5] == [node, "3", "3", UUID, "3"]
    out = subprocess.run(
        [sys.executable, "-m", "gpuheal", "history", "--gpus", "--window", "7d", "--min", "3",
         "--kubeconfig", str(sandbox.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=True,
        env={"PYTHONPATH": f"{REPO / 'operator'}:{REPO / 'slurm-bridge'}", "PATH": "/usr/bin"},
    ).stdout  # fmt: skip
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [node, UUID, "0000:3b:00", "3", "94x3", "3"] in [r[:6] for r in rows], out


def test_a_seven_day_window_counts_back_dated_history(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """History written before this operator ever ran (a restore, an import): an XID 48 five
    days ago counts in the 7-day window, two older ones do not."""
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    entries = [
        {"time": (now - dt.timedelta(days=d)).isoformat(), "kind": "Signal", "source": "events",
         "xid": 48, "gpu": "0000:3b:00", "eventUid": f"old-{d}", "message": "back-dated"}
        for d in (9, 8, 5)
    ]  # fmt: skip
    custom = client.CustomObjectsApi(sandbox.api_client())
    custom.create_cluster_custom_object(
        GROUP, VERSION, "faulthistories",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "FaultHistory",
         "metadata": {"name": node}, "spec": {"nodeName": node}},
    )  # fmt: skip
    objects.created.append(("faulthistories", node))
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "faulthistories", node, {"status": {"entries": entries}}
    )
    rung = {"name": "r0", "steps": [{"action": "cordon"}]}
    rule = {
        "name": "dbe",
        "signals": {"xids": [48]},
        "escalation": {"occurrences": 2, "window": "168h", "scope": "Gpu"},
        "ladder": [  # rungs must differ (the CRD refuses a climb that changes nothing)
            rung,
            {"name": "r1", "steps": [{"action": "cordon"}, {"action": "drain"}]},
            {"name": "r2", "steps": [{"action": "cordon"}, {"action": "slurmDrain"}]},
        ],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    run_operator()
    simulate_xid(core, node, 48)
    nrem = wait_for(
        lambda: (o := objects.incident(node)) and condition(o, "Cordoned") and o, "cordoned"
    )
    # 2 in the window (5 days ago and now) climb one rung; counting all 4 would climb two.
    assert nrem["status"]["rung"] == 1, dump(nrem["status"])
    assert nrem["status"]["why"] == "2nd XID 48 on GPU 0000:3b:00 in 7d"
    merged = wait_for(
        lambda: (h := _history(objects, node))["status"].get("faults") == 4 and h,
        "the new XID written next to the back-dated ones",
    )
    times = [
        dt.datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
        for e in merged["status"]["entries"]
    ]
    assert times == sorted(times), "oldest first"


def test_twenty_replaced_nodes_waiting_for_repair_do_not_trip_the_breaker(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    nodes = case(22)
    spares = case(20, "spare")
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    objects.apply("reservepools", pool(f"spares-{cid}", f"{cid}-spare"))
    rule = {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "ladder": [
            {
                "name": "replace",
                "steps": [
                    {"action": "cordon"},
                    {"action": "replace", "replace": {"reservePoolRef": {"name": f"spares-{cid}"}}},
                ],
            }
        ],
    }
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [rule], max_unhealthy=5))
    run_operator()
    for n in nodes[:20]:
        simulate_xid(core, n, 79)

    def replaced() -> list[str]:
        return [n for n in nodes[:20] if completed(objects.incident(n)) == "Replaced"]

    wait_for(lambda: len(replaced()) == 20, "20 nodes replaced, 5 at a time", timeout=180)
    assert all(objects.node(n).spec.unschedulable for n in nodes[:20]), "kept out for repair"
    claimed = {objects.incident(n)["status"]["replacementNode"] for n in nodes[:20]}
    assert claimed == set(spares)
    # 20 nodes out waiting for repair, against maxUnhealthy 5: a new fault elsewhere heals.
    simulate_xid(core, nodes[20], 79)
    wait_for(lambda: objects.node(nodes[20]).spec.unschedulable, "new fault cordoned", timeout=30)
    fresh = objects.incident(nodes[20])
    # (It waits for a spare now, all 20 being taken: that is the pool, not the breaker.)
    blocked = condition(fresh, "Blocked")
    assert blocked is None or blocked["reason"] not in (
        "CircuitBreakerOpen", "StormCooldown", "RateLimited"
    ), dump(fresh["status"])  # fmt: skip
    # One read for both: a status written before the breaker's close also counts <= 1.
    body = wait_for(
        lambda: (
            (p := objects.get("remediationpolicies", pname))["status"]["remediatingNodes"] <= 1
            and condition(p, "CircuitBreakerOpen")["status"] == "False"
            and p
        ),
        "replaced nodes no longer counted, the breaker closed",
    )
    assert body["status"]["allowedUnhealthy"] == 5


class _Provisioner(BaseHTTPRequestHandler):
    """A site's provisioning system: accepts refill requests."""

    calls: ClassVar[list[tuple[dict[str, Any], str | None]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((body, self.headers.get("Idempotency-Key")))
        payload = b'{"accepted": true}'
        self.send_response(202)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def provisioner() -> Iterator[tuple[str, list[tuple[dict[str, Any], str | None]]]]:
    _Provisioner.calls = []
    server = HTTPServer(("127.0.0.1", 0), _Provisioner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/refill", _Provisioner.calls
    server.shutdown()


def test_a_low_pool_asks_its_refill_webhook_once_per_shortfall(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    provisioner: tuple[str, list[tuple[dict[str, Any], str | None]]],
) -> None:
    url, calls = provisioner
    case(1, "spare")
    cid = case.case_id  # type: ignore[attr-defined]
    name = f"spares-{cid}"
    body = pool(name, f"{cid}-spare")
    body["spec"]["minAvailable"] = 3
    body["spec"]["refill"] = {"provider": "Webhook", "webhook": {"url": url, "interval": "1h"}}
    objects.apply("reservepools", body)
    op = run_operator()
    status = wait_for(
        lambda: (
            (s := (objects.get("reservepools", name) or {}).get("status") or {}).get("refill") and s
        ),
        "refill recorded in the pool's status",
    )
    assert status["refill"]["result"] == "Accepted", status
    assert status["refill"]["wanted"] == 2
    ((request, key),) = calls
    assert request["pool"] == name
    assert (request["available"], request["minAvailable"], request["wanted"]) == (1, 3, 2)
    assert request["nodeSelector"] == {"matchLabels": {"gpuheal.io/case": f"{cid}-spare"}}
    assert key is not None
    assert key.startswith(f"{name}-")
    # The same shortfall is not asked again: not by this process, nor after a restart.
    op.kill()
    op.delete_dead_lease()
    run_operator()
    hold(lambda: len(calls) == 1, "one request for one shortfall", 8)
