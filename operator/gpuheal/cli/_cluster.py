"""The CLI's reads from the cluster (the sync client: a one-shot command needs no loop), and
what the client's failures mean to the person who typed the command (`CliError`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpuheal.api.names import GROUP, VERSION
from gpuheal.cli._common import CliError


def api(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """A client for the kubeconfig's (or the given) context; in a pod without a kubeconfig,
    the pod's ServiceAccount."""
    if kubeconfig and not os.path.exists(kubeconfig):
        raise CliError(f"kubeconfig {kubeconfig}: no such file")
    default = os.path.expanduser("~/.kube/config")
    try:
        if kubeconfig or os.path.exists(default) or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        else:
            configuration = client.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        where = kubeconfig or default
        if "No configuration found" in str(exc):
            raise CliError(
                f"no cluster to talk to: {where} holds no kubeconfig "
                "(give --kubeconfig, or set $KUBECONFIG)"
            ) from None
        raise CliError(f"kubeconfig {where}: {exc}") from None
    configuration.retries = 0  # an unreachable cluster is said at once, not after backoff
    global _server  # noqa: PLW0603 - one cluster per command: named in its errors
    _server = configuration.host
    return client.ApiClient(configuration)


_server: str | None = None
#: (connect, read) seconds per call: a cluster that does not answer is said within seconds.
TIMEOUT = (10, 60)


@contextlib.contextmanager
def said_plainly(what: str) -> Iterator[None]:
    """Turn the client's failures into one line for a person: cannot reach the API server,
    forbidden (and by whom), not found."""
    try:
        yield
    except ApiException as exc:
        raise CliError(_api_message(exc, what)) from None
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        where = f" at {_server}" if _server else ""
        raise CliError(f"cannot reach the Kubernetes API server{where}: {_short(reason)}") from None


T = TypeVar("T")

#: How long a read waits out "429 Too Many Requests" (an API server whose storage for the
#: resource is still initialising, just after a start or a CRD install; or priority and
#: fairness shedding load) before it is said as an error.
BUSY_PATIENCE = 30.0


def patiently(call: Callable[[], T], *, patience: float = BUSY_PATIENCE) -> T:
    """``call()``, again after the server's Retry-After (1-5 s) while it answers 429, for at
    most ``patience`` seconds. Only for reads: they are safe to repeat."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return call()
        except ApiException as exc:
            if exc.status != 429 or time.monotonic() >= deadline:
                raise
            retry_after = (exc.headers or {}).get("Retry-After", "1")
            wait = float(retry_after) if str(retry_after).isdigit() else 1.0
            time.sleep(max(0.5, min(wait, 5.0, deadline - time.monotonic())))


def _api_message(exc: ApiException, what: str) -> str:
    message = ""
    with contextlib.suppress(ValueError, TypeError):
        message = str(json.loads(exc.body or "{}").get("message") or "")
    if exc.status == 404:
        return message or f"{what} not found"
    if exc.status in (401, 403):
        return message or f"{exc.reason}: {what}"
    return f"{what}: {exc.status} {exc.reason}" + (f": {message}" if message else "")


def _short(reason: object) -> str:
    """urllib3's "HTTPSConnection(host=..., port=...): Failed to establish a new connection:
    [Errno 111] Connection refused" -> "Connection refused" (the server is named already)."""
    text = str(reason)
    for cut in ("Failed to establish a new connection: ", "): ", ">: "):
        if cut in text:
            text = text.split(cut, 1)[1]
            break
    return re.sub(r"^\[Errno -?\d+\] ", "", text)


def list_custom(api_client: client.ApiClient, plural: str, **kw: Any) -> dict[str, Any]:
    """The LIST answer (``items`` and ``metadata.resourceVersion``)."""
    custom: Any = client.CustomObjectsApi(api_client)
    with said_plainly(f"{plural}.{GROUP}"):
        answer: dict[str, Any] = patiently(
            lambda: custom.list_cluster_custom_object(
                GROUP, VERSION, plural, _request_timeout=TIMEOUT, **kw
            )
        )
    return answer


def watch_custom(
    api_client: client.ApiClient, plural: str, resource_version: str, **kw: Any
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(type, object) for each change after ``resource_version``, until the server ends the
    watch (the caller watches again from the last version) or says the version is too old
    (``("ERROR", {})``: the caller lists again)."""
    from kubernetes import watch

    custom: Any = client.CustomObjectsApi(api_client)
    stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
        custom.list_cluster_custom_object, GROUP, VERSION, plural,
        resource_version=resource_version, allow_watch_bookmarks=False, **kw,
    )  # fmt: skip
    with said_plainly(f"{plural}.{GROUP}"):
        try:
            for event in stream:
                yield str(event["type"]), dict(event["object"])
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: the version is too old; the caller lists again
                raise
            yield "ERROR", {}


def list_nodes(api_client: client.ApiClient, page: int = 500) -> list[dict[str, Any]]:
    """Every Node as plain JSON, a page at a time (the generated models cost ~10x the
    parse on thousands of Nodes, and one unpaginated LIST holds them all twice)."""
    core: Any = client.CoreV1Api(api_client)
    out: list[dict[str, Any]] = []
    token: str | None = None
    with said_plainly("nodes"):
        while True:
            kw: dict[str, Any] = {"limit": page, "_preload_content": False}
            if token:
                kw["_continue"] = token
            answer: Any = patiently(partial(core.list_node, _request_timeout=TIMEOUT, **kw))
            body = json.loads(answer.data)
            out.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return out
