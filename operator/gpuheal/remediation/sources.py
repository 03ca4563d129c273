"""The signal sources that are not kopf watches: Nodes and Events about Nodes (our own
list+watch, `Kube.list_watch`), and dcgm-exporter scrapes.

"Blind" is not "healthy": a source that cannot be read sets ``gpuheal_source_up{source}`` to
0 and counts errors; it never starts or ends an incident by itself. It holds back only the
nodes it covers: the Node and Event watches cover every node, a dcgm-exporter pod its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

from gpuheal.adapters.dcgm import DcgmScraper, ScrapeFailed
from gpuheal.adapters.kube import Watched
from gpuheal.api.meta import rfc3339_ms
from gpuheal.api.names import EventReason
from gpuheal.policy.inputs import NodeEvent, event_observations, node_event, reporter_of
from gpuheal.policy.trust import (
    Untrusted,
    exporter_pod_refusal,
    judge_event,
    samples_of_node,
)
from gpuheal.policy.types import NodeView, Observation
from gpuheal.remediation import intake
from gpuheal.remediation.objects import incident_changed, node_changed
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports
from gpuheal.xid.identity import NO_GPUS, normalize_uuid
from gpuheal.xid.parse import dcgm_xid_events, parse_dcgm_metrics

log = logging.getLogger("gpuheal.sources")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def tell_on_pod(ports: Ports, reason: EventReason, message: str) -> None:
    """A Warning Event on the operator's own Pod ($POD_NAME/$POD_NAMESPACE, set by the chart
    from the downward API), where `kubectl describe pod` shows it; outside a pod, the log
    line alone."""
    name = os.environ.get("POD_NAME")
    if ports.events is None or not name:
        return
    # with its uid, or `kubectl describe pod` does not list it (it selects on the uid)
    meta = {
        "name": name,
        "namespace": os.environ.get("POD_NAMESPACE"),
        "uid": os.environ.get("POD_UID"),
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
    ports.events.post(pod, reason=reason, message=message, type_="Warning")


def _blind(ports: Ports, cluster: ClusterView, source: str, failure: dict[str, Any]) -> None:
    ports.metrics.source_up.labels(source).set(0)
    ports.metrics.source_errors.labels(source).inc()
    cluster.set_blind(source)
    if not forbidden(ports, source, failure):
        log.warning("%s source blind: %s", source, failure["message"])


def forbidden(ports: Ports, what: str, failure: dict[str, Any]) -> bool:
    """A list/watch the API server refused with 403: the ServiceAccount lacks a verb, which
    no retry fixes. Said once (a log line, /readyz, an Event on the operator's Pod) instead of
    a warning at every relist; True then."""
    if failure.get("status") != 403:
        return False
    detail = failure.get("detail") or failure["message"]
    message = f"the API server forbids reading {what}: {detail}"
    if ports.readiness.problem(f"forbidden:{what}", message):
        tell_on_pod(ports, EventReason.FORBIDDEN, message)
    return True


def _seeing(ports: Ports, cluster: ClusterView, source: str) -> None:
    ports.metrics.source_up.labels(source).set(1)
    cluster.set_seeing(source, _now())
    ports.readiness.resolved(f"forbidden:{source}")


async def _follow(  # noqa: PLR0917
    ports: Ports,
    cluster: ClusterView,
    resource: Watched,
    source: str,
    ready: asyncio.Event | None,
    handle: Any,
    namespace: str | None = None,
) -> None:
    async for ev in ports.require_kube().list_watch(resource, namespace=namespace):
        if ev.type == "BLIND":
            _blind(ports, cluster, source, ev.obj)
        elif ev.type == "SYNCED":
            _seeing(ports, cluster, source)
            if ready is not None:
                ready.set()
        try:
            await handle(ev.type, ev.obj)
        except asyncio.CancelledError:
            raise
        except Exception:
            # One object nobody foresaw must not end the watch: the views would freeze.
            ports.metrics.source_errors.labels(source).inc()
            name = (ev.obj.get("metadata") or {}).get("name") if isinstance(ev.obj, dict) else None
            log.exception("%s: could not handle %s %s; skipped", source, ev.type, name)


async def watch_nodes(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, ready: asyncio.Event | None = None
) -> None:
    """Keep ``cluster.nodes`` (compact views) in sync with the cluster's Nodes, forever; after a
    relist, drop the views of Nodes that disappeared meanwhile. Lists again when asked
    (``cluster.relist_nodes``: a policy now names a kubelet condition the views dropped)."""

    async def handle(kind: str, obj: dict[str, Any]) -> None:
        if kind in ("LISTED", "ADDED", "MODIFIED", "DELETED"):
            node_changed(ports, cluster, books, "DELETED" if kind == "DELETED" else "ADDED", obj)
        elif kind == "SYNCED":
            for gone in set(cluster.nodes) - set(obj["names"]):
                node_changed(ports, cluster, books, "DELETED", {"metadata": {"name": gone}})

    while True:
        cluster.relist_nodes.clear()  # before the list: a request during it lists once more
        follow = asyncio.create_task(_follow(ports, cluster, "nodes", "nodes", ready, handle))
        asked = asyncio.create_task(cluster.relist_nodes.wait())
        try:
            await asyncio.wait((follow, asked), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (follow, asked):
                task.cancel()
            await asyncio.gather(follow, asked, return_exceptions=True)
        if not follow.cancelled() and (failed := follow.exception()) is not None:
            raise failed
        log.info(
            "listing Nodes again: the policies now name the kubelet conditions %s",
            ",".join(sorted(cluster.kept_conditions)) or "none",
        )


async def watch_incidents(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, ready: asyncio.Event | None = None
) -> None:
    """NodeRemediations, forever, through our own list+watch rather than kopf: most of their
    changes are the operator's own status writes, whose echo costs a JSON parse and a dict
    lookup here (`objects.incident_changed`), where kopf spent a deep copy and a diff on
    each. After a relist, incidents that vanished meanwhile are dropped."""
    async for ev in ports.require_kube().list_watch("noderemediations"):
        if ev.type in ("LISTED", "ADDED", "MODIFIED", "DELETED"):
            incident_changed(ports, cluster, books, ev.type, ev.obj)
        elif ev.type == "SYNCED":
            for gone in set(cluster.incidents) - set(ev.obj["names"]):
                incident_changed(ports, cluster, books, "DELETED", {"metadata": {"name": gone}})
            if ready is not None:
                ready.set()
            ports.readiness.resolved("forbidden:noderemediations")
        elif ev.type == "BLIND" and not forbidden(ports, "noderemediations", ev.obj):
            log.warning("NodeRemediation watch failed, relisting: %s", ev.obj["message"])


async def watch_events(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    """Events about Nodes in ``--event-namespace``, forever (server-side
    ``fieldSelector=involvedObject.kind=Node``): the API server accepts an Event about a Node
    in any namespace, and whoever may create Events in some namespace must not reach a Node
    through it."""

    async def handle(kind: str, obj: dict[str, Any]) -> None:
        if kind in ("LISTED", "ADDED", "MODIFIED"):
            await handle_event(ports, cluster, books, obj)

    namespace = ports.config.event_namespace
    await _follow(ports, cluster, "node_events", "events", None, handle, namespace)


async def handle_event(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, body: dict[str, Any]
) -> None:
    """Hand each XID the Event reports (or the Warning itself) to the intake (which handles
    it while the watch reads on), if it is in --event-namespace, about the Node gpuheal knows
    (its uid) and from a trusted reporter (`policy.trust`)."""
    ev = node_event(body)
    if ev is None or ev.component == ports.require_kube().component:
        return  # not about a Node, or one of our own Events
    view = cluster.nodes.get(ev.node)
    now = _now()
    observations = event_observations(ev, now, view.gpus if view is not None else None)
    if not observations:
        return
    policy = cluster.policy_of(ev.node) if view is not None else None
    verdict = judge_event(
        ev,
        observations,
        ports.config.trusted_reporters,
        policy.spec.rules if policy else (),
        namespace=ports.config.event_namespace,
        node_uid=view.uid if view is not None else "",
    )
    if verdict is not None:
        # Never to the intake: an untrusted signal must not even count in the node's history
        # (repeats there escalate a later real fault).
        ports.metrics.signals.labels("events", verdict.why).inc(len(observations))
        if verdict.matters and view is not None:
            _warn_untrusted(ports, books, view, ev, verdict, now)
        return
    for obs in observations:
        await intake.submit(ports, cluster, books, ev.node, obs)


UNTRUSTED_WARN_EVERY = dt.timedelta(minutes=10)
"""One Warning per node in this time, whichever reporters: a flood of forged Events (each
naming another reporter, say) must become neither a flood of gpuheal's own Events nor a
memory that grows with the forger's text (the metric counts every one)."""


def _warn_untrusted(  # noqa: PLR0917
    ports: Ports,
    books: Bookkeeping,
    view: NodeView,
    ev: NodeEvent,
    verdict: Untrusted,
    now: dt.datetime,
) -> None:
    node = view.name
    if (
        ev.last_seen is not None
        and (now - ev.last_seen).total_seconds() > ports.config.event_max_age
    ):
        return  # old enough to start nothing anyway (a relist replays it at every start)
    last = books.untrusted_warned.get(node)
    if last is not None and now - last < UNTRUSTED_WARN_EVERY:
        return
    books.untrusted_warned[node] = now
    log.warning("untrusted signal on %s: %s", node, verdict.message, extra={"node": node})
    ports.post_event(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": view.uid}},
        reason=EventReason.UNTRUSTED_SIGNAL,
        message=verdict.message,
        type_="Warning",
    )


async def scrape_dcgm(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    """Every ``--dcgm-interval`` seconds, scrape each pod of the dcgm-exporter DaemonSet
    (``--dcgm-daemonset`` in ``--dcgm-namespace``, listed by ``--dcgm-selector``) and turn XID
    counter rises / gauge changes into signals on its node."""
    cfg = ports.config
    previous: dict[str, dict[Any, float]] = {}
    told: set[str] = set()
    scraper = DcgmScraper(
        port=cfg.dcgm_port,
        timeout=cfg.dcgm_timeout,
        max_bytes=cfg.dcgm_max_bytes,
        scheme=cfg.dcgm_scheme,
        ca_file=cfg.dcgm_ca_file,
        server_name=cfg.dcgm_server_name,
        token_file=cfg.dcgm_token_file,
    )
    try:
        while True:
            try:
                pods = await _dcgm_pods(ports)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Every node an exporter covered is blind now (the others never were seen).
                ports.metrics.source_up.labels("dcgm").set(0)
                ports.metrics.source_errors.labels("dcgm").inc()
                for node in cluster.dcgm_nodes:
                    cluster.set_blind("dcgm", node)
                log.warning("dcgm source blind: listing dcgm-exporter pods failed: %s", exc)
            else:
                for node, obs in await scrape_once(ports, cluster, scraper, pods, previous, told):
                    await intake.submit(ports, cluster, books, node, obs)
            await asyncio.sleep(cfg.dcgm_interval)
    finally:
        await scraper.close()


_TOLD_MAX = 10_000  # pods and exporters already warned about: a bounded memory


def _tell_once(told: set[str], key: str, message: str, *args: Any) -> None:
    """A warning once per ``key`` (a pod's uid): a pod that stays wrong is counted at every
    round and named once, not every 15 seconds."""
    if key in told:
        return
    if len(told) >= _TOLD_MAX:
        told.clear()
    told.add(key)
    log.warning(message, *args)


async def scrape_once(  # noqa: PLR0917
    ports: Ports,
    cluster: ClusterView,
    scraper: DcgmScraper,
    pods: list[dict[str, Any]],
    previous: dict[str, dict[Any, float]],
    told: set[str] | None = None,
) -> list[tuple[str, Observation]]:
    """One round over the exporter pods. Only the DaemonSet's own pods are scraped
    (`policy.trust.exporter_pod_refusal`; the others are counted ``untrusted`` and named once),
    and of what one returns only the series whose ``Hostname`` is the pod's node count
    (`policy.trust.samples_of_node`; the others ``wrong_node``). The first scrape of a node
    only sets its baseline (an XID counted before we started is not new). A pod that cannot
    be read makes the source "blind" (``gpuheal_source_up{source="dcgm"} 0``) and says
    nothing about health."""
    cfg = ports.config
    told = told if told is not None else set()
    out: list[tuple[str, Observation]] = []
    failed = 0
    exporters = []
    for pod in pods:
        refusal = exporter_pod_refusal(
            pod, namespace=cfg.dcgm_namespace or "", daemonset=cfg.dcgm_daemonset
        )
        if refusal is None:
            exporters.append(pod)
            continue
        ports.metrics.signals.labels("dcgm", "untrusted").inc()
        uid = str((pod.get("metadata") or {}).get("uid"))
        _tell_once(told, f"pod/{uid}", "dcgm: not scraped: %s", refusal)
    covered = {(p.get("spec") or {}).get("nodeName") for p in exporters} - {None}
    for gone in cluster.dcgm_nodes - covered:  # no exporter there any more: nothing to be blind to
        cluster.blind_nodes.get("dcgm", set()).discard(gone)
    cluster.dcgm_nodes = {str(n) for n in covered}
    for pod in exporters:
        node = (pod.get("spec") or {}).get("nodeName")
        ip = (pod.get("status") or {}).get("podIP")
        if not node or not ip:
            continue
        try:
            text = await scraper.scrape(ip)
        except ScrapeFailed as exc:
            failed += 1
            ports.metrics.source_errors.labels("dcgm").inc()
            cluster.set_blind("dcgm", node)  # this node only: the others are still seen
            log.warning("scrape of %s failed: %s", node, exc)
            continue
        now = _now()
        cluster.set_seeing("dcgm", now, node)
        samples, elsewhere = samples_of_node(parse_dcgm_metrics(text), node)
        if elsewhere:
            ports.metrics.signals.labels("dcgm", "wrong_node").inc(elsewhere)
            meta = pod.get("metadata") or {}
            _tell_once(
                told,
                f"host/{meta.get('uid')}",
                "dcgm: %d series of the exporter pod %s/%s on node %s name another Hostname "
                "(or none): ignored",
                elsewhere, meta.get("namespace"), meta.get("name"), node,
            )  # fmt: skip
        events, state = dcgm_xid_events(previous.get(node), samples, now)
        previous[node] = state
        view = cluster.nodes.get(node)
        gpus = (view.gpus if view is not None else NO_GPUS).learn(
            (xe.pci_bus_id, xe.gpu_uuid) for xe in events
        )
        for xe in events:
            gpu = gpus.key(xe.pci_bus_id, xe.gpu_uuid)
            key = f"dcgm/{node}/{gpu}/{xe.xid}/{rfc3339_ms(now)}"
            out.append(
                (
                    node,
                    Observation(
                        time=now,
                        xid=xe.xid,
                        gpu=gpu,
                        message=xe.message,
                        source="dcgm",
                        key=key,
                        reporter=reporter_of("dcgm", None, xe.message),
                        gpu_uuid=(normalize_uuid(xe.gpu_uuid) if xe.gpu_uuid else None)
                        or gpus.uuid_of(xe.pci_bus_id),
                    ),
                )
            )
    ports.metrics.source_up.labels("dcgm").set(1 if exporters and not failed else 0)
    return out


async def _dcgm_pods(ports: Ports) -> list[dict[str, Any]]:
    pods = await ports.require_kube().list_pods(
        ports.config.dcgm_selector, ports.config.dcgm_namespace
    )
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
