"""Log in, start, stop and probe: kopf's lifecycle handlers, and `run` (kopf.run)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import kopf
from kopf._core.engines.peering import Identity  # kopf.run's type, not re-exported
from prometheus_client import CollectorRegistry

from gpuheal import crashpoints
from gpuheal.adapters.kube import connection
from gpuheal.api.meta import redact_url, redact_urls
from gpuheal.config import OperatorConfig
from gpuheal.handlers import objects as _objects  # noqa: F401 - registers its handlers
from gpuheal.metrics import Metrics
from gpuheal.remediation import service
from gpuheal.remediation.lease import default_identity
from gpuheal.remediation.state import Runtime


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """In-cluster service account in a pod, else the kubeconfig (``--kubeconfig`` /
    ``$KUBECONFIG``), read at login time by kopf's own parser (no client library state):
    the same credentials the operator's own client (`gpuheal.adapters.kube`) uses."""
    return connection()


@kopf.on.startup(backoff=2)
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
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
    rt: Runtime = memo.runtime
    await service.start(rt.ports, rt.view, rt.books, serve_metrics=memo.get("serve_metrics", True))


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    await service.stop(rt.ports, rt.view, rt.books)


@kopf.on.probe(id="incidents")
async def probe_incidents(memo: Any, **_: Any) -> int:
    rt: Runtime = memo.runtime
    return rt.view.incidents.open_count


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
    # httpx logs each request's URL at INFO ("HTTP Request: POST https://hooks.slack.com/
    # services/T../B../..."): a webhook URL is often a credential, so only its scheme and
    # host reach the log, whatever the level.
    httpx_log = logging.getLogger("httpx")
    if _redact_request_url not in httpx_log.filters:
        httpx_log.addFilter(_redact_request_url)
    # And every line, whoever writes it (a traceback naming a request, aiohttp, kopf): a URL
    # keeps its scheme and host only. On the handlers, which every logger's records reach.
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactUrls) for f in handler.filters):
            handler.addFilter(RedactUrls())


class RedactUrls(logging.Filter):
    """Cuts every URL in a record (its message, its arguments, its traceback) to scheme and
    host (`redact_urls`): webhook URLs are credentials (Slack's carries its token in the path),
    and no log line needs a path to be useful."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        said = redact_urls(message)
        if said != message:
            record.msg, record.args = said, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
            record.exc_info = None  # the text above is what a formatter shows
        return True


def _redact_request_url(record: logging.LogRecord) -> bool:
    if isinstance(record.args, tuple):
        record.args = tuple(redact_url(str(a)) if "://" in str(a) else a for a in record.args)
    return True


def run(
    cfg: OperatorConfig,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
    registry: CollectorRegistry | None = None,
    serve_metrics: bool = True,
) -> None:
    """Run the operator until stopped (blocks). Cluster-wide; one active copy at a time
    (the Lease; see docs/operator.md)."""
    if cfg.kubeconfig:
        os.environ["KUBECONFIG"] = cfg.kubeconfig
    crashpoints.arm(cfg.crash_at)  # tests only
    rt = Runtime(config=cfg, metrics=Metrics(registry) if registry is not None else Metrics())
    memo = kopf.Memo(runtime=rt, serve_metrics=serve_metrics)
    if cfg.ready_port:
        # Before kopf and the Lease: a copy waiting for the Lease answers too (ready: it has
        # nothing to do yet), and a misconfiguration found later keeps the process up, not
        # ready, saying why, where a crash would only loop.
        rt.ports.readiness.serve(cfg.ready_port)
    liveness = f"http://0.0.0.0:{cfg.health_port}/healthz" if cfg.health_port else None
    kopf.run(
        clusterwide=True,
        standalone=True,
        # kopf's own default is user@host from getpass.getuser(), which raises KeyError in the
        # image: the chart runs it as uid 65532, which has no passwd entry (a crash loop at
        # start, seen first as real pods under the chart). Only peering uses it, and it is off.
        identity=Identity(default_identity()),
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
