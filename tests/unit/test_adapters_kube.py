"""The operator's one Kubernetes client: REST paths on one aiohttp session with kopf's
credentials, against a small local HTTP server (no TLS, no cluster)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kopf
import pytest
from aiohttp import web

from gpuheal.adapters.kube import ApiError, Kube, Transport


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """Answers like the API server for a few paths; records every request."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.text()
        seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "auth": request.headers.get("Authorization"),
                "type": request.headers.get("Content-Type"),
                "body": json.loads(body) if body else None,
            }
        )
        if request.headers.get("Authorization") == "Bearer old":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        if request.path == "/api/v1/nodes/gone":
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.query.get("watch") == "true":
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i in range(2):
                line = {"type": "MODIFIED", "object": {"metadata": {"name": f"n{i}"}}}
                await resp.write(json.dumps(line).encode() + b"\n")
            return resp
        return web.json_response({"metadata": {"name": "x", "resourceVersion": "7"}, "items": []})

    async with serving(handle) as url:
        yield url, seen


@contextlib.asynccontextmanager
async def serving(
    handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """`handle` answering every path on a local port; yields its base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_status_and_events_carry_no_url_past_its_host(
    server: tuple[str, list[dict[str, Any]]],
) -> None:
    """Whatever a step's message holds (a hook's error, a bridge's URL), what is written to a
    status or an Event names a URL by scheme and host only (`redact_urls`, as the log)."""
    url, seen = server
    secret = "https://hooks.example.com/services/T0/B1/s3cr3t?sig=abc"
    kube = Kube(Transport(lambda: kopf.ConnectionInfo(server=url, token="t")))
    try:
        status = {
            "rung": 1,
            "conditions": [{"type": "Reset", "message": f"POST {secret}: 503", "status": "False"}],
            "timeline": [{"message": f"hook {secret} down"}],
        }
        await kube.patch_custom_status("noderemediations", "nrem-a", status)
        sent = seen[-1]["body"]["status"]
        assert "s3cr3t" not in json.dumps(sent)
        assert sent["conditions"][0]["message"] == "POST https://hooks.example.com/...: 503"
        assert sent["timeline"][0]["message"] == "hook https://hooks.example.com/... down"
        assert sent["rung"] == 1
        await kube.send_event(
            {"kind": "Node", "metadata": {"name": "n1"}}, reason="R", message=f"at {secret}."
        )
        assert seen[-1]["body"]["message"] == "at https://hooks.example.com/...."
    finally:
        await kube.close()


async def test_requests_paths_and_a_rotated_token(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = server
    tokens = iter(["old", "new"])  # the service-account token rotates: 401, log in again
    kube = Kube(Transport(lambda: kopf.ConnectionInfo(server=url, token=next(tokens))))
    try:
        assert await kube.get_node("gone") is None
        assert [r["auth"] for r in seen] == ["Bearer old", "Bearer new"]
        await kube.cordon("n1", "nrem-a")  # GET then PATCH under the resourceVersion read
        patch = seen[-1]
        assert (patch["method"], patch["path"]) == ("PATCH", "/api/v1/nodes/n1")
        assert patch["type"] == "application/merge-patch+json"
        assert patch["body"]["spec"] == {"unschedulable": True}
        assert patch["body"]["metadata"]["resourceVersion"] == "7"
        await kube.patch_custom_status("noderemediations", "nrem-a", {"rung": 1},
                                       resource_version="7")  # fmt: skip
        assert seen[-1]["path"] == "/apis/gpuheal.io/v1alpha1/noderemediations/nrem-a/status"
        await kube.evict({"metadata": {"name": "p", "namespace": "ns"}}, grace_seconds=3)
        assert seen[-1]["path"] == "/api/v1/namespaces/ns/pods/p/eviction"
        assert seen[-1]["body"]["deleteOptions"] == {"gracePeriodSeconds": 3}
        await kube.pods_on_node("n1")
        assert seen[-1]["query"] == {"fieldSelector": "spec.nodeName=n1"}
        events = kube.list_watch("node_events")
        first = await anext(events)
        assert first.type == "SYNCED"
        listed = seen[-1]
        assert listed["query"]["fieldSelector"] == "involvedObject.kind=Node,source!=gpuheal"
        assert (await anext(events)).obj["metadata"]["name"] == "n0"
        watch = seen[-1]["query"]
        assert (watch["watch"], watch["resourceVersion"]) == ("true", "7")
        await events.aclose()
        # --event-namespace: the list and the watch read that namespace only
        events = kube.list_watch("node_events", namespace="default")
        assert (await anext(events)).type == "SYNCED"
        assert seen[-1]["path"] == "/api/v1/namespaces/default/events"
        await anext(events)
        assert (seen[-1]["path"], seen[-1]["query"]["watch"]) == (
            "/api/v1/namespaces/default/events", "true")  # fmt: skip
        await events.aclose()
    finally:
        await kube.close()


async def test_errors_carry_the_status(server: tuple[str, list[dict[str, Any]]]) -> None:
    url, _ = server
    kube = Kube(Transport(lambda: kopf.ConnectionInfo(server=url, token="old")))
    try:
        with pytest.raises(ApiError) as err:  # 401 twice: the new login did not help
            await kube.list_nodes()
        assert err.value.status == 401
    finally:
        await kube.close()


def test_gpuheal_run_loads_no_generated_kubernetes_client() -> None:
    """kopf imports every Kubernetes client it finds; `gpuheal run` hides both before it."""
    probe = (
        "import sys; from gpuheal.cli.run import hide_unused_clients; hide_unused_clients(); "
        "import gpuheal.handlers.lifecycle, gpuheal.remediation.service; "
        "print(sorted({m.split('.')[0] for m, v in sys.modules.items() if v is not None "
        "and m.split('.')[0] in ('kubernetes', 'kubernetes_asyncio')}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
