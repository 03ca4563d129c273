"""The FaultHistory writer's API requests, against a small local HTTP server that keeps the
objects it is sent (no cluster): a node's first fault creates its history without a GET that
would only say 404, the GPU map comes from the node view (no GET of the Node per write), and
a history someone else made meanwhile (409 on create) is read and merged into."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuheal.adapters.kube import Kube, Transport
from gpuheal.api.faulthistory import EntryKind, HistoryEntry
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy.inputs import node_view
from gpuheal.remediation import historywriter
from gpuheal.remediation.state import Runtime
from gpuheal.xid.identity import GPU_MAP_ANNOTATION
from tests.unit.test_adapters_kube import serving

PATH = "/apis/gpuheal.io/v1alpha1/faulthistories"
UUID = "GPU-0b9f4f2c-1d5e-4c3a-9f6e-2a7b8c9d0e1f"
PCI = "0000:3b:00"


class Api:
    """FaultHistories by name; every request as `VERB path`."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.seen: list[str] = []
        self.version = 0

    def _stored(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        body["metadata"].update(resourceVersion=str(self.version), generation=1)
        self.objects[body["metadata"]["name"]] = body
        return body

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path}")
        name = request.path.removeprefix(PATH).strip("/").removesuffix("/status")
        if request.method == "POST":
            body = json.loads(await request.text())
            if body["metadata"]["name"] in self.objects:
                return web.json_response({"kind": "Status", "code": 409}, status=409)
            return web.json_response(self._stored(body), status=201)
        if name not in self.objects:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.method == "PATCH":
            current = self.objects[name]
            patch = json.loads(await request.text())
            if patch["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
                return web.json_response({"kind": "Status", "code": 409}, status=409)
            return web.json_response(self._stored({**current, "status": patch["status"]}))
        return web.json_response(self.objects[name])


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, Api]]:
    fake = Api()
    async with serving(fake.handle) as url:
        yield url, fake


def _signal(at: dt.datetime) -> HistoryEntry:
    return HistoryEntry(time=at, kind=EntryKind.SIGNAL, source="events", xid=79, gpu=UUID,
                        gpu_uuid=UUID)  # fmt: skip


async def test_history_writes_ask_only_what_the_operator_does_not_know(
    api: tuple[str, Api],
) -> None:
    url, fake = api
    rt = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    rt.ports.kube = Kube(Transport(lambda: kopf.ConnectionInfo(server=url, token="t")))
    gpus = {GPU_MAP_ANNOTATION: json.dumps({PCI: UUID})}  # the agent's map: in the view
    for name in ("n1", "n2"):
        rt.view.nodes[name] = node_view({"metadata": {"name": name, "annotations": gpus}})
    now = dt.datetime.now(dt.UTC)
    try:
        # a first fault: created, then its status written; no GET of it or of the Node
        written = await historywriter.flush(rt.ports, rt.view, "n1", [_signal(now)])
        assert fake.seen == [f"POST {PATH}", f"PATCH {PATH}/n1/status"]
        assert [(g.uuid, g.pci_bus_id) for g in written.status.gpus] == [(UUID, PCI)]
        # the next: the history is known now, read (for its entries) and written
        fake.seen.clear()
        later = now + dt.timedelta(seconds=1)
        written = await historywriter.flush(rt.ports, rt.view, "n1", [_signal(later)])
        assert fake.seen == [f"GET {PATH}/n1", f"PATCH {PATH}/n1/status"]
        assert written.status.gpus[0].faults == 2
        # n2's history made by someone else (a restore) since we last looked: 409, read, merged
        fake._stored({"metadata": {"name": "n2"}, "spec": {"nodeName": "n2"},
                      "status": {"entries": [_signal(now).to_k8s()]}})  # fmt: skip
        fake.seen.clear()
        written = await historywriter.flush(rt.ports, rt.view, "n2", [_signal(later)])
        assert fake.seen == [f"POST {PATH}", f"GET {PATH}/n2", f"PATCH {PATH}/n2/status"]
        assert written.status.gpus[0].faults == 2
    finally:
        await rt.ports.kube.close()
