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
from gpuheal.api.names import HISTORY_PLURAL, POLICY_PLURAL, POOL_PLURAL
from gpuheal.config import bridge_targets, parse_events, parse_webhooks, secret_item
from gpuheal.remediation import historywriter, objects, report, sources
from gpuheal.remediation.lease import Lease
from gpuheal.remediation.notify import Notifier, SecretUrl, Target, secret_url
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.service")


async def start(rt: Runtime, *, serve_metrics: bool) -> None:
    """Everything before the first signal. Safe to call again after a failure part-way
    (kopf retries start-up): nothing is started twice."""
    cfg = rt.config
    if rt.kube is None:
        rt.kube = Kube.connect(cfg.kubeconfig, component="gpuheal")
    if rt.events is None:
        posted = rt.metrics.events
        rt.events = EventOutbox(rt.kube, count=lambda result: posted.labels(result).inc())
        _spawn(rt, "outbox", rt.events.run())
    if cfg.lease_duration > 0 and rt.lease is None:
        rt.lease = Lease(rt.kube, cfg.namespace, duration=cfg.lease_duration)
        await rt.lease.acquire()  # a second copy waits here: nothing below runs in it
        _spawn(rt, "lease", rt.lease.keep(_lost_lease))
    if not rt.bridges:
        calls = rt.metrics.bridge_calls
        for cluster, target in bridge_targets(cfg).items():
            rt.bridges[cluster] = BridgeSlurm.from_settings(
                target.url,
                target.token_file,
                target.ca_file,
                # One attempt per call: the driver retries (same idempotency key, its own
                # backoff or the bridge's Retry-After) and says Blocked=BridgeUnavailable
                # from the first failure; retries inside the client hid it for ~25 s.
                retries=0,
                on_call=lambda operation, result: calls.labels(operation, result).inc(),
            )
        rt.slurm = rt.bridges.get(cfg.bridge_cluster)
    if rt.notifier is None:
        events = parse_events(cfg.notify_events)
        rt.notify_targets = [
            Target(None, fmt, events, SecretUrl(cfg.namespace, *ref))
            if (ref := secret_item(url))
            else Target(url, fmt, events)
            for fmt, url in parse_webhooks(cfg.notify_webhooks or "")
        ]
        sender = rt.notify_sender = WebhookSender(cfg.notify_timeout)
        sent = rt.metrics.notifications
        kube = rt.kube
        rt.notifier = Notifier(
            lambda url, body, key: sender.post(url, body, key=key),
            queue_size=cfg.notify_queue_size,
            retries=cfg.notify_retries,
            on_result=lambda event, result: sent.labels(event.value, result).inc(),
            resolve=lambda ref: secret_url(kube, ref),
        )
    if cfg.metrics_port and serve_metrics and not rt.metrics_served:
        start_http_server(cfg.metrics_port, registry=rt.metrics.registry)
        rt.metrics_served = True
    await _prefill(rt)
    if "incidents" not in _running(rt):
        incidents_ready = asyncio.Event()
        _spawn(rt, "incidents", sources.watch_incidents(rt, incidents_ready))
        await asyncio.wait_for(incidents_ready.wait(), timeout=300)  # before any signal
        _breakers_from_incidents(rt)
    if "nodes" not in _running(rt):
        nodes_ready = asyncio.Event()
        _spawn(rt, "nodes", sources.watch_nodes(rt, nodes_ready))
        await asyncio.wait_for(nodes_ready.wait(), timeout=300)  # views before any signal
    if "events" in cfg.sources:
        _spawn(rt, "events", sources.watch_events(rt))
    if "dcgm" in cfg.sources:
        _spawn(rt, "dcgm", sources.scrape_dcgm(rt))
    _spawn(rt, "status", report.report_forever(rt))
    _spawn(rt, "history", historywriter.write_forever(rt))
    for cluster, bridge in rt.bridges.items():
        _spawn(rt, f"bridge:{cluster}", _watch_bridge(rt, cluster, bridge))
    log.info(
        "gpuheal started: sources=%s bridges=%s",
        ",".join(sorted(cfg.sources)),
        ",".join(f"{c}={b.client.base_url}" for c, b in rt.bridges.items()) or "none",
    )


async def _watch_bridge(
    rt: Runtime, cluster: str, bridge: BridgeSlurm, every: float = 15.0
) -> None:
    """`gpuheal_bridge_up{cluster}`: does the bridge answer /readyz (slurmctld reachable)?"""
    gauge = rt.metrics.bridge_up.labels(cluster)
    while True:
        gauge.set(1 if await bridge.ready() else 0)
        await asyncio.sleep(every)


def _breakers_from_incidents(rt: Runtime) -> None:
    """A policy whose status lost its breaker (deleted and re-created) gets it back from its
    incidents, so a storm cooldown is not skipped (`Runtime.breakers_from_incidents`)."""
    for name in rt.breakers_from_incidents():
        log.warning(
            "RemediationPolicy %s: its status says nothing of the breaker (re-created?); "
            "open, as its held incidents recorded",
            name,
        )


def _lost_lease() -> None:
    """Another copy may hold the Lease now: stop at once, do not finish any step."""
    logging.getLogger("gpuheal.service").critical("Lease lost: exiting")
    os._exit(70)


async def _prefill(rt: Runtime) -> None:
    """Read policies, pools and fault histories before any incident or signal is handled
    (the incidents' own watch lists them next, so that a signal seen at start-up attaches to
    the incident it belongs to instead of opening a second, and counts with everything the
    nodes went through before)."""
    for plural, changed in (
        (POLICY_PLURAL, objects.policy_changed),
        (POOL_PLURAL, objects.pool_changed),
        (HISTORY_PLURAL, objects.history_changed),
    ):
        for item in await _list_retrying(rt, plural):
            changed(rt, None, item)


def _running(rt: Runtime) -> set[str]:
    return {t.get_name() for t in rt.tasks if not t.done()}


def _spawn(rt: Runtime, name: str, coro: Coroutine[Any, Any, Any]) -> None:
    if name in _running(rt):
        coro.close()
        return
    rt.tasks.append(asyncio.create_task(coro, name=name))


async def _list_retrying(rt: Runtime, plural: str) -> list[dict[str, Any]]:
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
            return await rt.require_kube().list_custom(plural)
    raise AssertionError("unreachable: tenacity reraises")


async def stop(rt: Runtime) -> None:
    if rt.history_queue and rt.kube is not None:
        with contextlib.suppress(Exception):  # a clean stop writes what is queued
            await asyncio.wait_for(historywriter.write_queued(rt), timeout=5)
    outbox = [t for t in rt.tasks if t.get_name() == "outbox"]
    pending = [t for t in [*rt.tasks, *rt.drivers.values()] if t not in outbox]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    if rt.events is not None:
        await rt.events.flush(within=5.0)  # what is left is logged, not dropped silently
    for task in outbox:
        task.cancel()
    await asyncio.gather(*outbox, return_exceptions=True)
    for timer in rt.condition_timers.values():
        timer.cancel()
    if rt.lease is not None:
        await rt.lease.release()
    for bridge in rt.bridges.values():
        await bridge.close()
    if rt.notifier is not None:
        await rt.notifier.close()
    if rt.notify_sender is not None:
        await rt.notify_sender.aclose()
    if rt.kube is not None:
        await rt.kube.close()
