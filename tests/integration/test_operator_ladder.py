"""Escalation on the sandbox: XID 94 repeated on one GPU climbs the ladder; XID 62 calls the
reset hook (a real webhook receiver) and its recurrence escalates to replacement."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    format_gpu_map,
    format_gpu_report,
)
from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
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


def test_xid94_three_times_on_one_gpu_escalates(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    core = sandbox.core_v1()
    (node,) = case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    rule = {
        "name": "ecc",
        "signals": {"xids": [94]},
        "escalation": {"occurrences": 3, "window": "1h", "scope": "Gpu"},
        "ladder": [
            {"name": "requeue", "steps": [{"action": "cordon"}]},
            {
                "name": "reset",
                "steps": [
                    {"action": "cordon"},
                    {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
                ],
            },
        ],
    }
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    run_operator()
    simulate_xid(core, node, 94, pci="0000:3b:00")
    nrem = wait_for(lambda: objects.incident(node), "incident")
    name = nrem["metadata"]["name"]
    wait_for(lambda: objects.node(node).spec.unschedulable, "cordoned")
    simulate_xid(core, node, 94, pci="0000:5e:00")  # another GPU: does not count
    simulate_xid(core, node, 94, pci="0000:3b:00")
    wait_for(lambda: len(objects.get("noderemediations", name)["spec"]["signals"]) == 3,
             "signals attached")  # fmt: skip
    hold(lambda: objects.get("noderemediations", name)["status"]["rung"] == 0,
         "two on this GPU: no escalation", 2)  # fmt: skip
    simulate_xid(core, node, 94, pci="0000:3b:00")  # third on the same GPU
    done = wait_for(  # a Noop reset: skipped, never True
        lambda: (c := condition(o := objects.get("noderemediations", name), "Reset"))
        and c["reason"] == "NoopHook" and o,
        "escalated to the reset rung",
    )  # fmt: skip
    assert done["status"]["rung"] == 1, dump(done["status"])
    assert len(objects.incidents(node)) == 1


def agent_says(core: Any, node: str, key: str, value: str) -> None:
    """A node annotation as gpuheal agent writes it (the sandbox's nodes have no agent)."""
    core.patch_node(node, {"metadata": {"annotations": {key: value}}})


class _Hook(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        type(self).calls.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def reset_webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Hook.calls = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/reset", _Hook.calls
    server.shutdown()


def test_xid62_calls_the_reset_hook_and_recurrence_replaces(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    reset_webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    core = sandbox.core_v1()
    url, calls = reset_webhook
    (node,) = case(1)
    (spare,) = case(1, "spare")
    cid = case.case_id  # type: ignore[attr-defined]
    objects.apply("reservepools", pool(f"spares-{cid}", f"{cid}-spare"))
    rule = {
        "name": "gpu-halt",
        "signals": {"xids": [62]},
        "escalation": {"occurrences": 2, "window": "1h", "scope": "Node"},
        "ladder": [
            {
                "name": "reset",
                "steps": [
                    {"action": "cordon"},
                    {
                        "action": "reset",
                        "reset": {
                            "settle": "1s",
                            "hook": {"type": "Webhook", "webhook": {"url": url}},
                        },
                    },
                ],
            },
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
        "remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule], healthy_for="2s")
    )
    # The node's agent knows its GPUs (what a reset is verified against)...
    gpus = {f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)}
    agent_says(core, node, GPU_MAP_ANNOTATION, format_gpu_map(gpus))
    started = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    agent_says(core, node, GPU_REPORT_ANNOTATION, format_gpu_report(started, gpus))
    run_operator()
    simulate_xid(core, node, 62)
    wait_for(lambda: calls, "the reset hook called")
    # ...and reports them again after the reset.
    agent_says(core, node, GPU_REPORT_ANNOTATION, format_gpu_report(dt.datetime.now(dt.UTC), gpus))
    first = wait_for(lambda: completed(o := objects.incident(node)) and o, "reset, returned",
                     timeout=60)  # fmt: skip
    assert completed(first) == "Returned", dump(first["status"])
    assert condition(first, "Reset")["reason"] == "GpusReported"
    assert len(calls) == 1
    assert calls[0]["action"] == "reset"
    assert calls[0]["node"] == node
    assert calls[0]["xid"] == 62
    assert not objects.node(node).spec.unschedulable

    simulate_xid(core, node, 62)  # recurrence within the window
    second = wait_for(
        lambda: (done := [o for o in objects.incidents(node)
                          if o["metadata"]["name"] != first["metadata"]["name"]
                          and completed(o)]) and done[0],
        "second incident done", timeout=60,
    )  # fmt: skip
    assert completed(second) == "Replaced", dump(second["status"])
    assert second["status"]["rung"] == 1
    assert second["status"]["replacementNode"] == spare
    assert len(calls) == 1, "no second reset: the recurrence went straight to replace"
    assert objects.node(node).spec.unschedulable
