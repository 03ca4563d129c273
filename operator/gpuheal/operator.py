"""`gpuheal run`: the operator process (kopf), its settings, start-up and clean-up.

In-process for tests: ``run(OperatorConfig(...), stop_flag=...)`` in a thread, or
``python -m gpuheal.operator run --kubeconfig ...`` as a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, start_http_server

from gpuheal import incident as inc
from gpuheal.adapters.kube import Kube, make_api_client
from gpuheal.adapters.lease import Lease
from gpuheal.adapters.slurm import BridgeSlurm
from gpuheal.config import OperatorConfig, add_run_arguments, config_from_args
from gpuheal.handlers import remediation, sources, status, watch
from gpuheal.handlers.runtime import Runtime
from gpuheal.metrics import Metrics

log = logging.getLogger("gpuheal.operator")


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **kwargs: Any) -> Any:
    """In-cluster service account in a pod, else the kubeconfig (``--kubeconfig`` /
    ``$KUBECONFIG``), read at login time by kopf's own parser (no client library state)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        return kopf.login_with_service_account(settings=settings, **kwargs)
    return kopf.login_with_kubeconfig(settings=settings, **kwargs)


@kopf.on.startup(backoff=2)
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    cfg = rt.config
    # kopf's own bookkeeping: annotations (never our typed status), Events for its errors.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.gpuheal.io"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.gpuheal.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    settings.execution.max_workers = 4

    if rt.kube is None:
        rt.kube = Kube(await make_api_client(cfg.kubeconfig), component="gpuheal")
    if cfg.lease_duration > 0 and rt.lease is None:
        rt.lease = Lease(rt.kube.api, cfg.namespace, duration=cfg.lease_duration)
        await rt.lease.acquire()  # a second copy waits here: nothing below runs in it
        _spawn(rt, "lease", rt.lease.keep(_lost_lease))
    if cfg.bridge_url and rt.slurm is None:
        rt.slurm = BridgeSlurm.from_settings(
            cfg.bridge_url, cfg.bridge_token_file, cfg.bridge_ca_file
        )
    if cfg.metrics_port and memo.get("serve_metrics", True) and not memo.get("metrics_up"):
        start_http_server(cfg.metrics_port, registry=rt.metrics.registry)
        memo["metrics_up"] = True
    await _prefill(rt)
    # Start-up may be retried by kopf (an error below): never start a task twice.
    nodes_ready = asyncio.Event() if "nodes" not in _running(rt) else None
    if nodes_ready is not None:
        _spawn(rt, "nodes", sources.watch_nodes(rt, nodes_ready))
        await asyncio.wait_for(nodes_ready.wait(), timeout=300)  # views before any signal
    if "events" in cfg.sources:
        _spawn(rt, "events", sources.watch_events(rt))
    if "dcgm" in cfg.sources:
        _spawn(rt, "dcgm", sources.scrape_dcgm(rt))
    _spawn(rt, "status", status.report_forever(rt))
    log.info("gpuheal started: sources=%s bridge=%s", ",".join(sorted(cfg.sources)), cfg.bridge_url)


def _lost_lease() -> None:
    """Another copy may hold the Lease now: stop at once, do not finish any step."""
    logging.getLogger("gpuheal.operator").critical("Lease lost: exiting")
    os._exit(70)


async def _prefill(rt: Runtime) -> None:
    """Read policies, pools and incidents before any signal is handled, so that a signal
    seen at start-up attaches to the incident it belongs to instead of opening a second."""
    for plural, setter in (
        (inc.POLICY_PLURAL, watch.set_policy),
        (inc.POOL_PLURAL, watch.set_pool),
    ):
        for item in await _list_retrying(rt, plural):
            setter(rt, None, item)
    for item in await _list_retrying(rt, inc.NREM_PLURAL):
        if watch.set_incident(rt, None, item):
            remediation.ensure_driver(rt, item["metadata"]["name"])


def _running(rt: Runtime) -> set[str]:
    return {t.get_name() for t in rt.tasks if not t.done()}


def _spawn(rt: Runtime, name: str, coro: Any) -> None:
    if name in _running(rt):
        coro.close()
        return
    rt.tasks.append(asyncio.create_task(coro, name=name))


async def _list_retrying(rt: Runtime, plural: str, attempts: int = 30) -> list[dict[str, Any]]:
    """LIST, riding out a CRD that was just created (429 "storage is (re)initializing")."""
    for attempt in range(attempts):
        try:
            return await rt.require_kube().list_custom(plural)
        except ApiException as exc:
            if exc.status not in (404, 429, 500, 503) or attempt == attempts - 1:
                raise
            log.info("listing %s: %s; retrying", plural, exc.reason)
            await asyncio.sleep(1.0)
    return []


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    pending = [*rt.tasks, *rt.drivers.values()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for timer in rt.condition_timers.values():
        timer.cancel()
    if rt.lease is not None:
        await rt.lease.release()
    if rt.slurm is not None:
        await rt.slurm.close()
    if rt.kube is not None:
        await rt.kube.close()


@kopf.on.probe(id="incidents")
async def probe_incidents(memo: Any, **_: Any) -> int:
    rt: Runtime = memo.runtime
    return sum(1 for i in rt.incidents.values() if i.active)


def configure_logging(log_format: str, verbose: bool = False) -> None:
    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.PLAIN,
        log_refkey="k8s",
    )
    if not verbose:
        # kopf logs every on.event call at INFO ("Handler 'node_event' succeeded"): with
        # thousands of nodes that is noise; failures still log at WARNING and above.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def run(
    cfg: OperatorConfig,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
    registry: CollectorRegistry | None = None,
    serve_metrics: bool = True,
) -> None:
    """Run the operator until stopped (blocks). Cluster-wide; standalone (one active copy:
    see docs/operator.md for the single-replica Recreate deployment)."""
    if cfg.kubeconfig:
        os.environ["KUBECONFIG"] = cfg.kubeconfig
    rt = Runtime(config=cfg, metrics=Metrics(registry) if registry is not None else Metrics())
    memo = kopf.Memo(runtime=rt, serve_metrics=serve_metrics)
    liveness = f"http://0.0.0.0:{cfg.health_port}/healthz" if cfg.health_port else None
    kopf.run(
        clusterwide=True,
        standalone=True,
        liveness_endpoint=liveness,
        memo=memo,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_in_thread(cfg: OperatorConfig) -> tuple[threading.Thread, threading.Event]:
    """Start the operator in a thread (tests); set the returned event to stop it."""
    stop = threading.Event()
    ready = threading.Event()
    thread = threading.Thread(
        target=run,
        args=(cfg,),
        kwargs={"stop_flag": stop, "ready_flag": ready, "registry": CollectorRegistry()},
        daemon=True,
    )
    thread.start()
    return thread, stop


def _run_command(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    configure_logging(cfg.log_format, cfg.verbose)
    run(cfg)
    return 0


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`gpuheal run [flags]`: every flag also reads ``GPUHEAL_<FLAG>`` from the environment."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run", help="run the operator (kopf) against the current cluster"
    )
    add_run_arguments(parser)
    parser.set_defaults(func=_run_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuheal-operator")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
