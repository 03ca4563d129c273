"""Start and stop the operator's own work: clients, the single-active-copy Lease, the views
read before any signal is handled, and the long-running tasks (watches, scrapes, status)."""

from __future__ import annotations

import asyncio
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
from gpuheal.adapters.lease import Lease
from gpuheal.adapters.slurm import BridgeSlurm
from gpuheal.api.names import POLICY_PLURAL, POOL_PLURAL
from gpuheal.remediation import objects, report, sources
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.service")


async def start(rt: Runtime, *, serve_metrics: bool) -> None:
    """Everything before the first signal. Safe to call again after a failure part-way
    (kopf retries start-up): nothing is started twice."""
    cfg = rt.config
    if rt.kube is None:
        rt.kube = Kube.connect(cfg.kubeconfig, component="gpuheal")
    if rt.events is None:
        events = rt.metrics.events
        rt.events = EventOutbox(rt.kube, count=lambda result: events.labels(result).inc())
        _spawn(rt, "outbox", rt.events.run())
    if cfg.lease_duration > 0 and rt.lease is None:
        rt.lease = Lease(rt.kube, cfg.namespace, duration=cfg.lease_duration)
        await rt.lease.acquire()  # a second copy waits here: nothing below runs in it
        _spawn(rt, "lease", rt.lease.keep(_lost_lease))
    if cfg.bridge_url and rt.slurm is None:
        calls = rt.metrics.bridge_calls
        rt.slurm = BridgeSlurm.from_settings(
            cfg.bridge_url,
            cfg.bridge_token_file,
            cfg.bridge_ca_file,
            on_call=lambda operation, result: calls.labels(operation, result).inc(),
        )
    if cfg.metrics_port and serve_metrics and not rt.metrics_served:
        start_http_server(cfg.metrics_port, registry=rt.metrics.registry)
        rt.metrics_served = True
    await _prefill(rt)
    if "incidents" not in _running(rt):
        incidents_ready = asyncio.Event()
        _spawn(rt, "incidents", sources.watch_incidents(rt, incidents_ready))
        await asyncio.wait_for(incidents_ready.wait(), timeout=300)  # before any signal
    if "nodes" not in _running(rt):
        nodes_ready = asyncio.Event()
        _spawn(rt, "nodes", sources.watch_nodes(rt, nodes_ready))
        await asyncio.wait_for(nodes_ready.wait(), timeout=300)  # views before any signal
    if "events" in cfg.sources:
        _spawn(rt, "events", sources.watch_events(rt))
    if "dcgm" in cfg.sources:
        _spawn(rt, "dcgm", sources.scrape_dcgm(rt))
    _spawn(rt, "status", report.report_forever(rt))
    if rt.slurm is not None:
        _spawn(rt, "bridge", _watch_bridge(rt))
    log.info("gpuheal started: sources=%s bridge=%s", ",".join(sorted(cfg.sources)), cfg.bridge_url)


async def _watch_bridge(rt: Runtime, every: float = 15.0) -> None:
    """`gpuheal_bridge_up`: does the bridge answer /readyz (slurmctld reachable)?"""
    assert rt.slurm is not None
    while True:
        rt.metrics.bridge_up.set(1 if await rt.slurm.ready() else 0)
        await asyncio.sleep(every)


def _lost_lease() -> None:
    """Another copy may hold the Lease now: stop at once, do not finish any step."""
    logging.getLogger("gpuheal.service").critical("Lease lost: exiting")
    os._exit(70)


async def _prefill(rt: Runtime) -> None:
    """Read policies and pools before any incident or signal is handled (the incidents'
    own watch lists them next, so that a signal seen at start-up attaches to the incident
    it belongs to instead of opening a second)."""
    for plural, changed in (
        (POLICY_PLURAL, objects.policy_changed),
        (POOL_PLURAL, objects.pool_changed),
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
        log.info("listing %s: %s; retrying", plural, getattr(exc, "reason", exc))

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
    if rt.slurm is not None:
        await rt.slurm.close()
    if rt.kube is not None:
        await rt.kube.close()
