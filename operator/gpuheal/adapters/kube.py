"""Thin Kubernetes I/O for the operator: kopf's credentials and kopf's transport (aiohttp),
the API's REST paths, plain JSON bodies; never blocks the event loop.

The operator's process holds this one Kubernetes client. kopf logs in with its own kubeconfig
or service-account parser (`connection`) and talks through aiohttp; this module uses the same
`kopf.ConnectionInfo` and the same library, so the process needs neither generated client
(`kubernetes_asyncio` alone is ~37 MiB of model classes; README "Speed and memory").

Every write here is one idempotent API call that first looks at the world: cordon only what
is not cordoned, record ownership in the same PATCH, claim a spare under a resourceVersion
precondition. Nothing here decides *whether* to act; that is the caller's business.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import enum
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import kopf

from gpuheal import crashpoints
from gpuheal.api import names
from gpuheal.api.meta import redact_urls, rfc3339

log = logging.getLogger("gpuheal.adapters.kube")

JSON = dict[str, Any]
R = TypeVar("R")
MERGE_PATCH = "application/merge-patch+json"
CORE = "/api/v1"
CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"
RESOURCE = "/apis/resource.k8s.io"
#: DeviceTaintRule is resource.k8s.io/v1 from Kubernetes 1.37 (GA), v1beta2 in 1.36 (beta,
#: behind the DRADeviceTaintRules gate and the off-by-default v1beta2 API): newest first.
DEVICE_TAINT_RULE_VERSIONS = ("v1", "v1beta2")


Watched = Literal["nodes", "node_events", "noderemediations"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One step of `Kube.list_watch`: LISTED, SYNCED, ADDED, MODIFIED, DELETED or BLIND."""

    type: str
    obj: JSON


class KubeError(Exception):
    """An API call failed in a way the caller should retry later."""


class Conflict(KubeError):
    """The object changed since it was read (resourceVersion precondition failed)."""


class ApiError(Exception):
    """The API server answered with an error status (``status``; ``body`` is its Status)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status = status
        self.reason = reason
        self.body = body


def _status_message(exc: ApiError) -> str:
    """The API server's own sentence in its Status body, else the error as it reads."""
    try:
        said = json.loads(exc.body).get("message")
    except (ValueError, AttributeError):
        said = None
    return str(said) if said else str(exc)


def connection(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """The service account in a pod (no kubeconfig named), else the kubeconfig (this file,
    ``$KUBECONFIG`` or ``~/.kube/config``), read by kopf's own parsers: what kopf logs in
    with (`gpuheal.handlers.lifecycle.login` calls this too)."""
    settings = kopf.OperatorSettings()
    info = None
    in_pod = os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG")
    if kubeconfig is None and in_pod:
        info = kopf.login_with_service_account(settings=settings)
    if info is None:
        if kubeconfig is not None:
            os.environ["KUBECONFIG"] = kubeconfig
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise KubeError("no Kubernetes credentials: not in a pod and no kubeconfig")
    return info


class Transport:
    """One aiohttp session to the API server. A 401 logs in again once (a rotated
    service-account token) and repeats the request."""

    def __init__(self, login: Callable[[], kopf.ConnectionInfo], *, pool: int = 100) -> None:
        self._login = login
        self._pool = pool
        self._session: aiohttp.ClientSession | None = None
        self.server = ""

    def _open(self) -> aiohttp.ClientSession:
        info = self._login()
        self.server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._pool, ssl=info.as_ssl_context()),
            headers={**info.as_http_headers(), "User-Agent": "gpuheal"},
            proxy=info.proxy_url,
            trust_env=info.trust_env,
        )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(
        self, method: str, path: str, *, limits: aiohttp.ClientTimeout, **kw: Any
    ) -> aiohttp.ClientResponse:
        for attempt in (0, 1):
            session = self._session or self._open()
            resp = await session.request(method, self.server + path, timeout=limits, **kw)
            if resp.status != 401 or attempt:
                return resp
            resp.release()
            self._session = None
            await session.close()
        raise AssertionError("unreachable")

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        seconds: float = 60.0,
    ) -> JSON:
        """One call; the JSON body of a 2xx answer, else `ApiError`."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if data is not None else None
        resp = await self._send(
            method,
            path,
            params=params,
            data=data,
            headers=headers,
            limits=aiohttp.ClientTimeout(total=seconds),
        )
        try:
            raw = await resp.read()
        finally:
            resp.release()
        if not 200 <= resp.status <= 299:
            raise ApiError(resp.status, resp.reason or "", raw.decode(errors="replace"))
        out: JSON = json.loads(raw)
        return out

    async def stream(
        self, path: str, params: Mapping[str, str | int], *, read_timeout: float
    ) -> AsyncIterator[JSON]:
        """A watch: one JSON object per line until the server ends it."""
        resp = await self._send(
            "GET",
            path,
            params=params,
            limits=aiohttp.ClientTimeout(total=None, sock_read=read_timeout),
        )
        try:
            if resp.status != 200:
                raw = await resp.read()
                raise ApiError(resp.status, resp.reason or "", raw.decode(errors="replace"))
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def _unless(status: int, call: Any) -> JSON | None:
    """The call's body, or None when the API answers `status` (404: absent, 409: exists)."""
    try:
        result: JSON = await call
    except ApiError as exc:
        if exc.status == status:
            return None
        raise
    return result


def _redacted(value: Any) -> Any:
    """``value`` (JSON) with every string passed through `redact_urls`."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


def _q(name: str) -> str:
    return quote(name, safe="")


class CordonOutcome(enum.StrEnum):
    CORDONED = "cordoned"  # we set unschedulable now
    ALREADY_OURS = "already_ours"  # a previous attempt (maybe before a restart) did it
    BY_OTHER = "by_other"  # an admin (or another controller) had cordoned it: not ours


class UncordonOutcome(enum.StrEnum):
    UNCORDONED = "uncordoned"
    NOT_OURS = "not_ours"  # cordoned by someone else, or by another incident: left alone
    NOT_CORDONED = "not_cordoned"  # someone uncordoned it already: only our mark is removed


class EvictOutcome(enum.StrEnum):
    EVICTED = "evicted"
    PDB_BLOCKED = "pdb_blocked"  # 429: a PodDisruptionBudget allows no disruption now
    GONE = "gone"
    FORCED = "forced"


@dataclass(frozen=True)
class ClaimResult:
    node: str
    already: bool  # claimed by this incident before (restart): nothing was written now


class EventBudget:
    """client-go's Event spam filter, simplified: per object, a burst of Events, then one per
    `refill` seconds; the rest are dropped. Whatever arrives (a flood of 10,000 XID Events on
    one node), gpuheal's own Events about one object stay a handful."""

    def __init__(
        self,
        burst: int = 25,
        refill: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_objects: int = 10_000,
    ) -> None:
        self.burst, self.refill, self.clock, self.max_objects = burst, refill, clock, max_objects
        self.tokens: dict[str, tuple[float, float]] = {}  # object -> (tokens, at)
        self.dropped = 0

    def allow(self, key: str) -> bool:
        now = self.clock()
        tokens, at = self.tokens.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / self.refill)
        allowed = tokens >= 1.0
        self.tokens[key] = (tokens - 1.0 if allowed else tokens, now)  # most recent last
        if len(self.tokens) > self.max_objects:
            del self.tokens[next(iter(self.tokens))]
        if not allowed:
            self.dropped += 1
        return allowed


class Kube:
    """Async facade over the few API calls gpuheal makes."""

    def __init__(self, transport: Transport, *, component: str = "gpuheal") -> None:
        self.http = transport
        self.component = component
        self.event_budget = EventBudget()

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, component: str = "gpuheal") -> Kube:
        """A client that logs in as `connection` says (lazily: no request is made here)."""
        return cls(Transport(lambda: connection(kubeconfig)), component=component)

    async def close(self) -> None:
        await self.http.close()

    # ---- nodes -------------------------------------------------------------------------
    async def get_node(self, name: str) -> JSON | None:
        return await _unless(404, self.http.request("GET", f"{CORE}/nodes/{_q(name)}"))

    async def list_nodes(self, label_selector: str | None = None) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[JSON] = (await self.http.request("GET", f"{CORE}/nodes", params=params))[
            "items"
        ]
        return items

    async def _patch_node(self, name: str, patch: JSON) -> JSON:
        return await self.http.request(
            "PATCH", f"{CORE}/nodes/{_q(name)}", body=patch, content_type=MERGE_PATCH
        )

    async def _look_then_write(
        self, node: str, effect: str, change: Callable[[JSON | None], tuple[JSON | None, R]]
    ) -> R:
        """Read the Node, let ``change`` say what to write (None: nothing) and what that
        means, write it under the resourceVersion it read. A 409 (someone wrote between our
        read and our write) means: look again."""
        for _ in range(5):
            body = await self.get_node(node)
            patch, outcome = change(body)
            if patch is None or body is None:
                return outcome
            patch.setdefault("metadata", {})["resourceVersion"] = body["metadata"][
                "resourceVersion"
            ]
            crashpoints.at(effect, "before")
            try:
                await self._patch_node(node, patch)
            except ApiError as exc:
                if exc.status == 409:
                    continue
                raise
            crashpoints.at(effect, "after")
            return outcome
        raise KubeError(f"node {node} kept changing while gpuheal wrote to it")

    async def cordon(
        self, node: str, incident: str, *, taint_effect: str | None = None
    ) -> CordonOutcome:
        """Cordon ``node`` for ``incident``, writing ownership in the same PATCH: if an admin
        cordons between our read and our write, we look again and see it is theirs. With
        ``taint_effect`` the same PATCH adds the taint gpuheal.io/unhealthy=<incident>."""

        def change(body: JSON | None) -> tuple[JSON | None, CordonOutcome]:
            if body is None:
                raise KubeError(f"node {node} not found")
            owner = (body["metadata"].get("annotations") or {}).get(names.CORDONED_BY_ANNOTATION)
            if body.get("spec", {}).get("unschedulable"):
                # Ours only if our mark names this incident: a mark naming another incident
                # (one that ended, or one a person made up) does not make this cordon ours.
                ours = owner == incident
                return None, CordonOutcome.ALREADY_OURS if ours else CordonOutcome.BY_OTHER
            marks = {
                names.CORDONED_BY_ANNOTATION: incident,
                names.CORDONED_AT_ANNOTATION: rfc3339(_now()),
            }
            spec: JSON = {"unschedulable": True}
            if taint_effect is not None:
                taints = [
                    t
                    for t in body.get("spec", {}).get("taints") or []
                    if t.get("key") != names.UNHEALTHY_TAINT
                ]
                ours = {"key": names.UNHEALTHY_TAINT, "value": incident, "effect": taint_effect}
                spec["taints"] = [*taints, ours]
            patch = {"metadata": {"annotations": marks}, "spec": spec}
            return patch, CordonOutcome.CORDONED

        return await self._look_then_write(node, "cordon", change)

    async def uncordon(
        self, node: str, incident: str, *, any_gpuheal: bool = False
    ) -> UncordonOutcome:
        """Uncordon only if our annotation says gpuheal (this incident, or any gpuheal
        incident with ``any_gpuheal``) cordoned it; an admin's cordon is never undone."""

        def change(body: JSON | None) -> tuple[JSON | None, UncordonOutcome]:
            if body is None:
                return None, UncordonOutcome.NOT_CORDONED
            owner = (body["metadata"].get("annotations") or {}).get(names.CORDONED_BY_ANNOTATION)
            if owner is None or (owner != incident and not any_gpuheal):
                return None, UncordonOutcome.NOT_OURS
            marks = {names.CORDONED_BY_ANNOTATION: None, names.CORDONED_AT_ANNOTATION: None}
            patch: JSON = {"metadata": {"annotations": marks}}
            taints = body.get("spec", {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != names.UNHEALTHY_TAINT]
            spec: JSON = {"taints": kept or None} if kept != taints else {}
            if not body.get("spec", {}).get("unschedulable"):
                if spec:
                    patch["spec"] = spec
                return patch, UncordonOutcome.NOT_CORDONED  # someone uncordoned: drop our mark
            patch["spec"] = {**spec, "unschedulable": None}
            return patch, UncordonOutcome.UNCORDONED

        return await self._look_then_write(node, "uncordon", change)

    async def patch_node_metadata(
        self,
        node: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        remove_taints: frozenset[str] = frozenset(),
        add_taints: tuple[JSON, ...] = (),
        current: JSON | None = None,
    ) -> JSON:
        meta: JSON = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if resource_version:
            meta["resourceVersion"] = resource_version
        patch: JSON = {"metadata": meta}
        if (remove_taints or add_taints) and current is not None:
            taints = current.get("spec", {}).get("taints") or []
            kept = [t for t in taints if t.get("key") not in remove_taints]
            have = {(t.get("key"), t.get("effect")) for t in kept}
            kept += [t for t in add_taints if (t.get("key"), t.get("effect")) not in have]
            if kept != taints:
                patch["spec"] = {"taints": kept or None}
        return await self._patch_node(node, patch)

    async def claim_spare(
        self,
        incident: str,
        candidates: list[JSON],
    ) -> ClaimResult | None:
        """Claim one of ``candidates`` (node bodies, best first) for ``incident``.

        The claim is a label written under the candidate's resourceVersion: two incidents
        racing for the same spare both send the same precondition, one wins, the other gets
        409 and moves on. A claim this incident made before (restart) is found first.
        """
        mine = await self.list_nodes(f"{names.CLAIMED_BY_LABEL}={incident}")
        if mine:
            return ClaimResult(node=mine[0]["metadata"]["name"], already=True)
        for cand in candidates:
            meta = cand["metadata"]
            if (meta.get("labels") or {}).get(names.CLAIMED_BY_LABEL):
                continue
            crashpoints.at("claim", "before")
            try:
                await self.patch_node_metadata(
                    meta["name"],
                    labels={names.CLAIMED_BY_LABEL: incident},
                    annotations={names.CLAIMED_AT_ANNOTATION: rfc3339(_now())},
                    resource_version=meta["resourceVersion"],
                )
            except ApiError as exc:
                if exc.status in (404, 409):
                    continue
                raise
            crashpoints.at("claim", "after")
            return ClaimResult(node=meta["name"], already=False)
        return None

    # ---- pods --------------------------------------------------------------------------
    async def pods_on_node(self, node: str) -> list[JSON]:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        items: list[JSON] = (await self.http.request("GET", f"{CORE}/pods", params=params))["items"]
        return items

    async def list_pods(self, label_selector: str, namespace: str | None = None) -> list[JSON]:
        path = f"{CORE}/namespaces/{_q(namespace)}/pods" if namespace else f"{CORE}/pods"
        body = await self.http.request("GET", path, params={"labelSelector": label_selector})
        items: list[JSON] = body["items"]
        return items

    async def evict(self, pod: JSON, *, grace_seconds: int | None = None) -> EvictOutcome:
        meta = pod["metadata"]
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        }
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        path = f"{CORE}/namespaces/{_q(meta['namespace'])}/pods/{_q(meta['name'])}/eviction"
        blocked = {429: EvictOutcome.PDB_BLOCKED, 404: EvictOutcome.GONE}
        return await self._end_pod("POST", path, EvictOutcome.EVICTED, blocked, body=body)

    async def delete_pod(self, pod: JSON, *, grace_seconds: int | None = None) -> EvictOutcome:
        meta = pod["metadata"]
        params = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        path = f"{CORE}/namespaces/{_q(meta['namespace'])}/pods/{_q(meta['name'])}"
        gone = {404: EvictOutcome.GONE}
        return await self._end_pod("DELETE", path, EvictOutcome.FORCED, gone, params=params)

    async def _end_pod(
        self,
        method: str,
        path: str,
        done: EvictOutcome,
        refused: Mapping[int, EvictOutcome],
        **request: Any,
    ) -> EvictOutcome:
        """One eviction or deletion (a crash point on each side): ``done``, or what the API
        server's refusal with a status in ``refused`` means."""
        crashpoints.at("evict", "before")
        try:
            await self.http.request(method, path, **request)
        except ApiError as exc:
            if exc.status in refused:
                return refused[exc.status]
            raise
        crashpoints.at("evict", "after")
        return done

    # ---- events ------------------------------------------------------------------------
    async def post_event(
        self,
        involved: JSON,
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Record a core/v1 Event about ``involved`` now. Failures are logged, not raised: an
        Event is a courtesy, never a reason for a step to fail. Past the object's `EventBudget`
        the Event is dropped (`event_allowed`). (The operator posts through
        `gpuheal.adapters.events.EventOutbox`, off its steps' path, with retries.)"""
        if not self.event_allowed(involved):
            return
        try:
            await self.send_event(involved, reason=reason, message=message, type_=type_)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("could not post Event %s on %s: %s", reason,
                        involved.get("metadata", {}).get("name"), exc)  # fmt: skip

    def event_allowed(self, involved: JSON) -> bool:
        """Within the object's `EventBudget` (25, then one per 10 s)? Past it an Event is
        dropped: the status says the same."""
        meta = involved.get("metadata", {})
        key = f"{involved.get('kind')}/{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if self.event_budget.allow(key):
            return True
        log.debug("an Event on %s dropped: too many on it lately", meta.get("name"))
        return False

    async def send_event(
        self,
        involved: JSON,
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
        at: dt.datetime | None = None,
    ) -> None:
        """Create a core/v1 Event about ``involved`` (``at``: when it happened; default now);
        raises what the API answers.

        The Event lives in the object's namespace, or in ``default`` for cluster-scoped objects
        (Nodes, NodeRemediations): the apiserver rejects any other namespace for those (422),
        and ``default`` is where the kubelet puts Node Events and ``kubectl describe`` looks.
        """
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        when = rfc3339(at or _now())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'gpuheal')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Node"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                # a namespaced object's (the operator's Pod): the API server refuses an Event
                # outside `default` whose involvedObject names no namespace (422)
                **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
            },
            "reason": reason,
            "message": redact_urls(message)[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }
        crashpoints.at("event", "before")
        await self.http.request("POST", f"{CORE}/namespaces/{_q(namespace)}/events", body=event)
        crashpoints.at("event", "after")

    async def list_watch(
        self,
        resource: Watched,
        *,
        page: int = 500,
        timeout_seconds: int = 300,
        max_backoff: float = 60.0,
        namespace: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """LIST (in pages: at most one page of full bodies in memory), then WATCH from the
        list's resourceVersion with bookmarks, forever.

        Yields every listed object as ``LISTED`` and then ``SYNCED`` (``obj["names"]``: the
        names listed, so a caller can drop what vanished meanwhile), then ``ADDED`` /
        ``MODIFIED`` / ``DELETED``. A 410 Gone relists. Any failure yields ``BLIND`` (with
        ``obj["message"]``), waits (1 s doubling to ``max_backoff``) and relists: a caller
        must treat that time as "cannot see", never as "nothing happened".
        ``namespace``: Events of that namespace only (``node_events``; None: every namespace).
        """
        path = {
            "nodes": f"{CORE}/nodes",
            "node_events": f"{CORE}/namespaces/{_q(namespace)}/events"
            if namespace
            else f"{CORE}/events",
            "noderemediations": f"{CUSTOM}/{names.NREM_PLURAL}",
        }[resource]
        # Events: server-side selector, so the Event firehose of pods never reaches us, nor
        # the Events gpuheal posts itself.
        selector = (
            {"fieldSelector": f"involvedObject.kind=Node,source!={self.component}"}
            if resource == "node_events"
            else {}
        )
        rv: str | None = None
        backoff = 1.0
        while True:
            try:
                if rv is None:
                    listed: list[str] = []
                    async for items, list_rv in self._pages(path, page, selector):
                        for item in items:
                            listed.append(str((item.get("metadata") or {}).get("name", "")))
                            yield WatchEvent("LISTED", item)
                        rv = list_rv
                    yield WatchEvent("SYNCED", {"names": listed})
                assert rv is not None
                params: dict[str, str | int] = {
                    **selector,
                    "watch": "true",
                    "allowWatchBookmarks": "true",
                    "resourceVersion": rv,
                    "timeoutSeconds": timeout_seconds,
                }
                async for ev in self.http.stream(path, params, read_timeout=timeout_seconds + 30):
                    kind = str(ev.get("type"))
                    obj = ev.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            rv = None
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        yield WatchEvent(kind, obj)
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: blind for a while, never "healthy"
                failure: JSON = {"message": f"{type(exc).__name__}: {exc}", "status": None}
                if isinstance(exc, ApiError):  # 403: RBAC; the Status's own sentence says who
                    failure.update(status=exc.status, detail=_status_message(exc))
                yield WatchEvent("BLIND", failure)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
                backoff = min(max_backoff, backoff * 2)
                rv = None

    async def _pages(
        self, path: str, limit: int, selector: Mapping[str, str]
    ) -> AsyncIterator[tuple[list[JSON], str]]:
        token: str | None = None
        while True:
            params: dict[str, str | int] = {"limit": limit, **selector}
            if token:
                params["continue"] = token
            page = await self.http.request("GET", path, params=params)
            meta = page.get("metadata") or {}
            yield page["items"], str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                return

    async def get_configmap(self, namespace: str, name: str) -> JSON | None:
        """A ConfigMap (a Job hook's `templateFrom`); None when absent."""
        path = f"{CORE}/namespaces/{_q(namespace)}/configmaps/{_q(name)}"
        return await _unless(404, self.http.request("GET", path))

    async def get_secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """One key of a Secret, decoded (a notification webhook's URL); None when the Secret
        or the key is absent. Nothing here logs it."""
        path = f"{CORE}/namespaces/{_q(namespace)}/secrets/{_q(name)}"
        body = await _unless(404, self.http.request("GET", path))
        value = ((body or {}).get("data") or {}).get(key)
        return None if value is None else base64.b64decode(value).decode(errors="replace")

    # ---- jobs (reset / reboot hooks) -----------------------------------------------------
    async def get_job(self, namespace: str, name: str) -> JSON | None:
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}"
        return await _unless(404, self.http.request("GET", path))

    async def create_job(self, namespace: str, body: JSON) -> bool:
        """Create; False when a Job of that name exists already (409)."""
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs"
        return await _unless(409, self.http.request("POST", path, body=body)) is not None

    # ---- leases (`gpuheal.remediation.lease`) -------------------------------------------
    def lease_path(self, namespace: str, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases"
        return base if name is None else f"{base}/{_q(name)}"

    async def read_lease(self, namespace: str, name: str) -> JSON:
        """The Lease; ApiError 404 when there is none."""
        result: JSON = await self.http.request("GET", self.lease_path(namespace, name))
        return result

    async def write_lease(self, body: JSON) -> None:
        """Create (no resourceVersion) or replace (resourceVersion: 409 when it changed)."""
        meta = body["metadata"]
        if meta.get("resourceVersion") is None:
            path, method = self.lease_path(meta["namespace"]), "POST"
        else:
            path, method = self.lease_path(meta["namespace"], meta["name"]), "PUT"
        await self.http.request(method, path, body=body)

    # ---- DRA: ResourceSlices and DeviceTaintRules (one GPU out) --------------------------
    async def resource_slices(self, node: str) -> list[JSON] | None:
        """The node's ResourceSlices (every driver); None when the API server serves no
        resource.k8s.io/v1 (a cluster without DRA)."""
        params = {"fieldSelector": f"spec.nodeName={node}"}
        call = self.http.request("GET", f"{RESOURCE}/v1/resourceslices", params=params)
        body = await _unless(404, call)
        return None if body is None else list(body.get("items") or [])

    async def device_taint_rule(self, name: str) -> JSON | None:
        """A DeviceTaintRule (v1 where served, 1.37+; else v1beta2), None when absent."""
        for version in DEVICE_TAINT_RULE_VERSIONS:
            path = f"{RESOURCE}/{version}/devicetaintrules/{_q(name)}"
            found = await _unless(404, self.http.request("GET", path))
            if found is not None:
                return found
        return None

    async def create_device_taint_rule(self, body: JSON) -> str:
        """Create it in the newest version the server serves; the version used, or "exists"
        (409: a retry finds its own rule). ApiError 404 when no version is served (the
        DRADeviceTaintRules gate or resource.k8s.io/v1beta2 off)."""
        last: ApiError | None = None
        for version in DEVICE_TAINT_RULE_VERSIONS:
            sent = {**body, "apiVersion": f"resource.k8s.io/{version}"}
            path = f"{RESOURCE}/{version}/devicetaintrules"
            try:
                await self.http.request("POST", path, body=sent)
            except ApiError as exc:
                if exc.status == 409:
                    return "exists"
                if exc.status != 404:
                    raise
                last = exc
                continue
            return version
        assert last is not None
        raise last

    async def delete_device_taint_rule(self, name: str) -> bool:
        """Delete; False when it was gone already (in every served version)."""
        for version in DEVICE_TAINT_RULE_VERSIONS:
            path = f"{RESOURCE}/{version}/devicetaintrules/{_q(name)}"
            if await _unless(404, self.http.request("DELETE", path)) is not None:
                return True
        return False

    # ---- gpuheal custom objects --------------------------------------------------------
    async def get_custom(self, plural: str, name: str) -> JSON | None:
        return await _unless(404, self.http.request("GET", f"{CUSTOM}/{plural}/{_q(name)}"))

    async def list_custom(self, plural: str, label_selector: str | None = None) -> list[JSON]:
        params = {"labelSelector": label_selector} if label_selector else None
        body = await self.http.request("GET", f"{CUSTOM}/{plural}", params=params)
        items: list[JSON] = body["items"]
        return items

    async def create_custom(self, plural: str, body: JSON) -> JSON | None:
        """Create; ``None`` when an object of that name exists already (409)."""
        return await _unless(409, self.http.request("POST", f"{CUSTOM}/{plural}", body=body))

    async def delete_custom(self, plural: str, name: str) -> bool:
        """Delete; False when it was gone already (404)."""
        call = self.http.request("DELETE", f"{CUSTOM}/{plural}/{_q(name)}")
        return await _unless(404, call) is not None

    async def patch_custom(self, plural: str, name: str, patch: JSON) -> JSON:
        return await self._patch_custom(plural, name, patch, status=False)

    async def patch_custom_status(
        self, plural: str, name: str, status: JSON, *, resource_version: str | None = None
    ) -> JSON:
        """Merge-patch status; with ``resource_version`` the write fails (409, `Conflict`) if
        the object changed since it was read. Every URL in its text is cut to scheme and host
        (`redact_urls`, as in the log): a webhook URL is a credential, and whoever may read
        the object's status is not always whoever may read the policy that named it."""
        patch: JSON = {"status": _redacted(status)}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            return await self._patch_custom(plural, name, patch, status=True)
        except ApiError as exc:
            if exc.status == 409:
                raise Conflict(f"{plural}/{name} changed since it was read") from exc
            raise

    async def _patch_custom(self, plural: str, name: str, patch: JSON, *, status: bool) -> JSON:
        path = f"{CUSTOM}/{plural}/{_q(name)}" + ("/status" if status else "")
        return await self.http.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
