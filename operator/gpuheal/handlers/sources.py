"""Signal sources that are not kopf watches: Events about Nodes (a narrow watch of our own,
server-side ``fieldSelector=involvedObject.kind=Node``) and dcgm-exporter scrapes.

"Blind" is not "healthy": a source that cannot be read sets ``gpuheal_source_up{source}`` to
0 and counts errors; it never starts or ends an incident by itself.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import httpx

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal.handlers import detect
from gpuheal.handlers.runtime import Runtime
from gpuheal.xid.parse import dcgm_xid_events, parse_dcgm_metrics, parse_event

log = logging.getLogger("gpuheal.sources")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def event_signal(ev: inc.NodeEvent) -> plan.Signal | None:
    """An Event about a Node as a signal: an XID when the parser reads one, else a plain
    event signal (policies may match it by reason)."""
    xid = parse_event(ev.reason, ev.message)
    if xid is None and ev.type != "Warning":
        return None
    return plan.Signal(
        source="events",
        key=ev.dedupe_key,
        time=ev.last_seen or _now(),
        xid=xid.xid if xid else None,
        gpu=xid.gpu_key if xid else None,
        recovery_action=xid.recovery_action if xid else None,
        event_reason=ev.reason,
        event_uid=ev.uid,
        message=ev.message[:1024],
    )


async def handle_event(rt: Runtime, body: dict[str, Any]) -> str | None:
    ev = inc.node_event(body)
    if ev is None or ev.component == rt.require_kube().component:
        return None  # not about a Node, or one of our own Events
    signal = event_signal(ev)
    if signal is None:
        return None
    stale = (_now() - signal.time).total_seconds() > rt.config.event_max_age
    return await detect.observe(rt, ev.node, signal, stale=stale)


async def watch_events(rt: Runtime) -> None:
    """List + watch Events about Nodes forever; relist on 410 Gone; back off on errors."""
    kube = rt.require_kube()
    rv: str | None = None
    backoff = 1.0
    while True:
        try:
            if rv is None:
                listing = await kube.list_node_events()
                rv = listing["metadata"]["resourceVersion"]
                for item in listing["items"]:
                    await handle_event(rt, item)
                rt.metrics.source_up.labels("events").set(1)
                rt.blind.discard("events")
            async for ev in kube.watch_node_events(rv):
                kind = ev.get("type")
                obj = ev.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        rv = None
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if kind in ("ADDED", "MODIFIED"):
                    await handle_event(rt, obj)
            backoff = 1.0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: blind for a while, never "healthy"
            rt.metrics.source_up.labels("events").set(0)
            rt.metrics.source_errors.labels("events").inc()
            rt.blind.add("events")
            log.warning("Event watch failed (%s); retrying in %.0fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(60.0, backoff * 2)
            rv = None


async def watch_nodes(rt: Runtime, ready: asyncio.Event | None = None) -> None:
    """Keep ``rt.nodes`` (compact views) in sync with the cluster's Nodes, forever.

    Paginated LIST, then watch from its resourceVersion (bookmarks keep it fresh); on 410
    Gone or an error, LIST again and drop views of Nodes that disappeared meanwhile."""
    from gpuheal.handlers.watch import node_changed

    kube = rt.require_kube()
    rv: str | None = None
    backoff = 1.0
    while True:
        try:
            if rv is None:
                seen: set[str] = set()
                async for items, list_rv in kube.list_nodes_paged():
                    for item in items:
                        seen.add(item["metadata"]["name"])
                        node_changed(rt, "ADDED", item)
                    rv = list_rv
                for gone in set(rt.nodes) - seen:
                    node_changed(rt, "DELETED", {"metadata": {"name": gone}})
                rt.blind.discard("nodes")
                if ready is not None:
                    ready.set()
            assert rv is not None
            async for ev in kube.watch_nodes(rv):
                kind = ev.get("type")
                obj = ev.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        rv = None
                    break
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    node_changed(rt, kind, obj)
            backoff = 1.0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            rt.blind.add("nodes")
            rt.metrics.source_errors.labels("nodes").inc()
            log.warning("Node watch failed (%s); retrying in %.0fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(60.0, backoff * 2)
            rv = None


async def scrape_dcgm(rt: Runtime) -> None:
    """Every ``--dcgm-interval`` seconds, scrape each dcgm-exporter pod (found by label
    selector) and turn XID counter rises / gauge changes into signals on its node."""
    previous: dict[str, dict[Any, float]] = {}
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            try:
                pods = await _dcgm_pods(rt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                rt.metrics.source_up.labels("dcgm").set(0)
                rt.metrics.source_errors.labels("dcgm").inc()
                log.warning("listing dcgm-exporter pods failed: %s", exc)
            else:
                for node, signal in await scrape_once(rt, http, pods, previous):
                    await detect.observe(rt, node, signal)
            await asyncio.sleep(rt.config.dcgm_interval)


async def scrape_once(
    rt: Runtime,
    http: httpx.AsyncClient,
    pods: list[dict[str, Any]],
    previous: dict[str, dict[Any, float]],
) -> list[tuple[str, plan.Signal]]:
    """One round over the exporter pods. The first scrape of a node only sets its baseline
    (an XID counted before we started is not new). A pod that cannot be read makes the
    source "blind" (``gpuheal_source_up{source="dcgm"} 0``) and says nothing about health."""
    out: list[tuple[str, plan.Signal]] = []
    failed = 0
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        ip = (pod.get("status") or {}).get("podIP")
        if not node or not ip:
            continue
        url = f"http://{ip}:{rt.config.dcgm_port}/metrics"
        try:
            resp = await http.get(url)
            resp.raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            failed += 1
            rt.metrics.source_errors.labels("dcgm").inc()
            log.warning("scrape of %s (%s) failed: %s", url, node, exc)
            continue
        now = _now()
        events, state = dcgm_xid_events(previous.get(node), parse_dcgm_metrics(resp.text), now)
        previous[node] = state
        for xe in events:
            key = f"dcgm/{node}/{xe.gpu_key}/{xe.xid}/{inc.rfc3339_ms(now)}"
            out.append((node, plan.Signal(source="dcgm", key=key, time=now, xid=xe.xid,
                                          gpu=xe.gpu_key, message=xe.message)))  # fmt: skip
    rt.metrics.source_up.labels("dcgm").set(1 if pods and not failed else 0)
    if failed:
        rt.blind.add("dcgm")
    else:
        rt.blind.discard("dcgm")
    return out


async def _dcgm_pods(rt: Runtime) -> list[dict[str, Any]]:
    pods = await rt.require_kube().list_pods(rt.config.dcgm_selector, rt.config.dcgm_namespace)
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
