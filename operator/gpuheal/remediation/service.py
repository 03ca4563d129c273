"""Start and stop the operator's own work: clients, the single-active-copy Lease, the views
read before any signal is handled, and the long-running tasks (watches, scrapes, status)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine
from typing import Any

from prometheus_client import start_http_server
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from gpuheal.adapters.events import EventOutbox
from gpuheal.adapters.kube import ApiError, Kube
from gpuheal.adapters.notify import WebhookSender
from gpuheal.adapters.slurm import BridgeSlurm
from gpuheal.api.names import HISTORY_PLURAL, POLICY_PLURAL, POOL_PLURAL, EventReason
from gpuheal.config import bridge_targets, parse_events, parse_webhooks, secret_item
from gpuheal.remediation import historywriter, objects, report, sources
from gpuheal.remediation.lease import Lease
from gpuheal.remediation.notify import Notifier, SecretUrl, Target, secret_url
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports

log = logging.getLogger("gpuheal.service")

#: seconds a stopping operator gives the Lease's release (else it expires by itself)
RELEASE_WITHIN = 5.0


async def start(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, *, serve_metrics: bool
) -> None:
    """Everything before the first signal. Safe to call again after a failure part-way
    (kopf retries start-up): nothing is started twice."""
    cfg = ports.config
    if ports.kube is None:
        ports.kube = Kube.connect(cfg.kubeconfig, component="gpuheal")
    if cfg.lease_duration > 0 and ports.lease is None:
        ports.lease = Lease(ports.kube, cfg.namespace, duration=cfg.lease_duration)
        await ports.lease.acquire()  # a second copy waits here: nothing below runs in it
        _spawn(books, "lease", ports.lease.keep(_lost_lease))
    if ports.events is None:
        # Once this copy leads: a standby posts nothing, and one stopped while it waits
        # (a rollout, `helm uninstall`) leaves no task behind that kopf waits 5 s for.
        posted = ports.metrics.events
        ports.events = EventOutbox(ports.kube, count=lambda result: posted.labels(result).inc())
        _spawn(books, "outbox", ports.events.run())
    if not ports.bridges:
        calls = ports.metrics.bridge_calls
        for name, target in bridge_targets(cfg).items():
            ports.bridges[name] = BridgeSlurm.from_settings(
                target.url,
                target.token_file,
                target.ca_file,
                # One attempt per call: the driver retries (same idempotency key, its own
                # backoff or the bridge's Retry-After) and says Blocked=BridgeUnavailable
                # from the first failure; retries inside the client hid it for ~25 s.
                retries=0,
                on_call=lambda operation, result: calls.labels(operation, result).inc(),
            )
        ports.slurm = ports.bridges.get(cfg.bridge_cluster)
    if ports.notifier is None:
        events = parse_events(cfg.notify_events)
        ports.notify_targets = [
            Target(None, fmt, events, SecretUrl(cfg.namespace, *ref))
            if (ref := secret_item(url))
            else Target(url, fmt, events)
            for fmt, url in parse_webhooks(cfg.notify_webhooks or "")
        ]
        sender = ports.notify_sender = WebhookSender(cfg.notify_timeout)
        sent = ports.metrics.notifications
        kube = ports.kube
        ports.notifier = Notifier(
            lambda url, body, key: sender.post(url, body, key=key),
            queue_size=cfg.notify_queue_size,
            retries=cfg.notify_retries,
            on_result=lambda event, result: sent.labels(event.value, result).inc(),
            resolve=lambda ref: secret_url(kube, ref),
        )
    if cfg.metrics_port and serve_metrics and not books.metrics_served:
        start_http_server(cfg.metrics_port, registry=ports.metrics.registry)
        books.metrics_served = True
    await _prefill(ports, cluster, books)
    if "incidents" not in _running(books):
        incidents_ready = asyncio.Event()
        _spawn(books, "incidents", sources.watch_incidents(ports, cluster, books, incidents_ready))
        await asyncio.wait_for(incidents_ready.wait(), timeout=300)  # before any signal
        _breakers_from_incidents(cluster)
    if "nodes" not in _running(books):
        nodes_ready = asyncio.Event()
        _spawn(books, "nodes", sources.watch_nodes(ports, cluster, books, nodes_ready))
        await asyncio.wait_for(nodes_ready.wait(), timeout=300)  # views before any signal
    if "events" in cfg.sources:
        _spawn(books, "events", sources.watch_events(ports, cluster, books))
    if "dcgm" in cfg.sources:
        _spawn(books, "dcgm", sources.scrape_dcgm(ports, cluster, books))
    _spawn(books, "status", report.report_forever(ports, cluster, books))
    _spawn(books, "history", historywriter.write_forever(ports, cluster, books))
    for name, bridge in ports.bridges.items():
        _spawn(books, f"bridge:{name}", _watch_bridge(ports, name, bridge))
    log.info(
        "gpuheal started: sources=%s bridges=%s",
        ",".join(sorted(cfg.sources)),
        ",".join(f"{c}={b.client.base_url}" for c, b in ports.bridges.items()) or "none",
    )


async def _watch_bridge(
    ports: Ports, cluster: str, bridge: BridgeSlurm, every: float = 15.0
) -> None:
    """`gpuheal_bridge_up{cluster}`: does the bridge answer /readyz (slurmctld reachable)?
    And does a call behind the token get through? A refused token or a URL where nothing
    answers is a misconfiguration: /readyz says it, one log line and one Event on the
    operator's Pod when it starts or changes, one line when it ends. Looked at again every
    5 s while it lasts, so the fix shows soon."""
    gauge = ports.metrics.bridge_up.labels(cluster)
    key = f"bridge:{cluster}"
    while True:
        gauge.set(1 if await bridge.ready() else 0)
        wrong = await bridge.misconfigured()
        if wrong is None:
            ports.readiness.resolved(key)
        else:
            kind, message = wrong
            if ports.readiness.problem(key, f"Slurm cluster {cluster}: {message}"):
                reason = (
                    EventReason.BRIDGE_AUTH_REFUSED
                    if kind == "refused"
                    else EventReason.BRIDGE_UNREACHABLE
                )
                sources.tell_on_pod(ports, reason, f"Slurm cluster {cluster}: {message}")
        await asyncio.sleep(every if wrong is None else min(every, 5.0))


def _breakers_from_incidents(cluster: ClusterView) -> None:
    """A policy whose status lost its breaker (deleted and re-created) gets it back from its
    incidents, so a storm cooldown is not skipped (`ClusterView.breakers_from_incidents`)."""
    for name in cluster.breakers_from_incidents():
        log.warning(
            "RemediationPolicy %s: its status says nothing of the breaker (re-created?); "
            "open, as its held incidents recorded",
            name,
        )


def _lost_lease() -> None:
    """Another copy may hold the Lease now: stop at once, do not finish any step."""
    logging.getLogger("gpuheal.service").critical("Lease lost: exiting")
    os._exit(70)


async def _prefill(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    """Read policies, pools and fault histories before any incident or signal is handled
    (the incidents' own watch lists them next, so that a signal seen at start-up attaches to
    the incident it belongs to instead of opening a second, and counts with everything the
    nodes went through before)."""
    for item in await _list_retrying(ports, POLICY_PLURAL):
        objects.policy_changed(ports, cluster, books, None, item)
    for item in await _list_retrying(ports, POOL_PLURAL):
        objects.pool_changed(cluster, None, item)
    for item in await _list_retrying(ports, HISTORY_PLURAL):
        objects.history_changed(cluster, None, item)


def _running(books: Bookkeeping) -> set[str]:
    return {t.get_name() for t in books.tasks if not t.done()}


def _spawn(books: Bookkeeping, name: str, coro: Coroutine[Any, Any, Any]) -> None:
    if name in _running(books):
        coro.close()
        return
    books.tasks.append(asyncio.create_task(coro, name=name))


async def _list_retrying(ports: Ports, plural: str) -> list[dict[str, Any]]:
    """LIST, riding out a CRD that was just created ("storage is (re)initializing", 429) or an
    API server that is restarting: jittered backoff for about a minute, then give up (kopf
    retries start-up)."""

    def transient(exc: BaseException) -> bool:
        return isinstance(exc, ApiError) and exc.status in (404, 429, 500, 503)

    def say(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        if isinstance(exc, ApiError) and exc.status == 429:
            # Not load: kube-apiserver answers 429 "storage is (re)initializing" for a custom
            # resource until its storage is ready, i.e. just after the CRD was created or
            # changed, or the API server (re)started. Expected; worth a line, not a warning.
            log.info("listing %s: the API server is still initializing its storage for them "
                     "(429); retrying in %.1fs", plural, wait)  # fmt: skip
            return
        log.info("listing %s: %s; retrying in %.1fs", plural, getattr(exc, "reason", exc), wait)

    async for attempt in AsyncRetrying(
        retry=retry_if_exception(transient),
        wait=wait_exponential_jitter(initial=0.5, max=8),
        stop=stop_after_delay(60),
        before_sleep=say,
        reraise=True,
    ):
        with attempt:
            return await ports.require_kube().list_custom(plural)
    raise AssertionError("unreachable: tenacity reraises")


async def stop(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    """Stop what `start` started; never raises. kopf retries a failed clean-up after its
    default backoff (60 s), which in a pod is the chart's whole termination grace: a stop
    that fails part-way is logged, and the process exits at once anyway (the Lease, if not
    released, expires by itself)."""
    try:
        await _stop(ports, cluster, books)
    except Exception:
        log.exception("clean-up failed part-way; exiting anyway")


async def _stop(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    if books.history_queue and ports.kube is not None:
        with contextlib.suppress(Exception):  # a clean stop writes what is queued
            await asyncio.wait_for(historywriter.write_queued(ports, cluster, books), timeout=5)
    outbox = [t for t in books.tasks if t.get_name() == "outbox"]
    pending = [t for t in [*books.tasks, *books.drivers.values()] if t not in outbox]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if ports.events is not None:
        await ports.events.flush(within=5.0)  # what is left is logged, not dropped silently
    for task in outbox:
        task.cancel()
    await asyncio.gather(*outbox, return_exceptions=True)
    for timer in books.condition_timers.values():
        timer.cancel()
    if ports.lease is not None:
        # Bounded: an apiserver that does not answer must not hold the exit to the grace's end
        try:
            await asyncio.wait_for(ports.lease.release(), timeout=RELEASE_WITHIN)
        except TimeoutError:
            log.warning("Lease not released within %gs: it expires by itself", RELEASE_WITHIN)
    for bridge in ports.bridges.values():
        await bridge.close()
    if ports.notifier is not None:
        await ports.notifier.close()
    if ports.notify_sender is not None:
        await ports.notify_sender.aclose()
    if ports.kube is not None:
        await ports.kube.close()
