"""Thin Kubernetes I/O for the operator (kubernetes_asyncio; never blocks the event loop).

Every write here is one idempotent API call that first looks at the world: cordon only what
is not cordoned, record ownership in the same PATCH, claim a spare under a resourceVersion
precondition. Nothing here decides *whether* to act; that is the caller's business.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuheal.api import names
from gpuheal.api.meta import rfc3339
from gpuheal.kubeapi import JSON, MERGE_PATCH, json_body, unless

log = logging.getLogger("gpuheal.adapters.kube")

R = TypeVar("R")


Watched = Literal["nodes", "node_events"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One step of `Kube.list_watch`: LISTED, SYNCED, ADDED, MODIFIED, DELETED or BLIND."""

    type: str
    obj: JSON


class KubeError(Exception):
    """An API call failed in a way the caller should retry later."""


class Conflict(KubeError):
    """The object changed since it was read (resourceVersion precondition failed)."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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


class Kube:
    """Async facade over the few API calls gpuheal makes."""

    def __init__(self, api: client.ApiClient, *, component: str = "gpuheal") -> None:
        self.api = api
        # Typed as Any: with `_preload_content=False` the generated signatures are wrong.
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.batch: Any = client.BatchV1Api(api)
        self.component = component

    async def close(self) -> None:
        await self.api.close()

    # ---- nodes -------------------------------------------------------------------------
    async def get_node(self, name: str) -> JSON | None:
        return await unless(404, self.core.read_node(name, _preload_content=False))

    async def list_nodes(self, label_selector: str | None = None) -> list[JSON]:
        kwargs: dict[str, Any] = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        items: list[JSON] = (await json_body(self.core.list_node(**kwargs)))["items"]
        return items

    async def _patch_node(self, name: str, patch: JSON) -> JSON:
        return await json_body(
            self.core.patch_node(name, patch, _content_type=MERGE_PATCH, _preload_content=False)
        )

    async def _look_then_write(
        self, node: str, change: Callable[[JSON | None], tuple[JSON | None, R]]
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
            try:
                await self._patch_node(node, patch)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            return outcome
        raise KubeError(f"node {node} kept changing while gpuheal wrote to it")

    async def cordon(self, node: str, incident: str) -> CordonOutcome:
        """Cordon ``node`` for ``incident``, writing ownership in the same PATCH: if an admin
        cordons between our read and our write, we look again and see it is theirs."""

        def change(body: JSON | None) -> tuple[JSON | None, CordonOutcome]:
            if body is None:
                raise KubeError(f"node {node} not found")
            owner = (body["metadata"].get("annotations") or {}).get(names.CORDONED_BY_ANNOTATION)
            if body.get("spec", {}).get("unschedulable"):
                return None, CordonOutcome.ALREADY_OURS if owner else CordonOutcome.BY_OTHER
            marks = {
                names.CORDONED_BY_ANNOTATION: incident,
                names.CORDONED_AT_ANNOTATION: rfc3339(_now()),
            }
            patch = {"metadata": {"annotations": marks}, "spec": {"unschedulable": True}}
            return patch, CordonOutcome.CORDONED

        return await self._look_then_write(node, change)

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
            if not body.get("spec", {}).get("unschedulable"):
                return patch, UncordonOutcome.NOT_CORDONED  # someone uncordoned: drop our mark
            patch["spec"] = {"unschedulable": None}
            return patch, UncordonOutcome.UNCORDONED

        return await self._look_then_write(node, change)

    async def patch_node_metadata(
        self,
        node: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        remove_taints: frozenset[str] = frozenset(),
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
        if remove_taints and current is not None:
            taints = current.get("spec", {}).get("taints") or []
            kept = [t for t in taints if t.get("key") not in remove_taints]
            if len(kept) != len(taints):
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
            try:
                await self.patch_node_metadata(
                    meta["name"],
                    labels={names.CLAIMED_BY_LABEL: incident},
                    annotations={names.CLAIMED_AT_ANNOTATION: rfc3339(_now())},
                    resource_version=meta["resourceVersion"],
                )
            except ApiException as exc:
                if exc.status in (404, 409):
                    continue
                raise
            return ClaimResult(node=meta["name"], already=False)
        return None

    # ---- pods --------------------------------------------------------------------------
    async def pods_on_node(self, node: str) -> list[JSON]:
        body = await json_body(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            )
        )
        items: list[JSON] = body["items"]
        return items

    async def list_pods(self, label_selector: str, namespace: str | None = None) -> list[JSON]:
        kwargs: dict[str, Any] = {"label_selector": label_selector, "_preload_content": False}
        if namespace:
            body = await json_body(self.core.list_namespaced_pod(namespace, **kwargs))
        else:
            body = await json_body(self.core.list_pod_for_all_namespaces(**kwargs))
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
        try:
            await json_body(
                self.core.create_namespaced_pod_eviction(
                    meta["name"], meta["namespace"], body, _preload_content=False
                )
            )
        except ApiException as exc:
            if exc.status == 429:
                return EvictOutcome.PDB_BLOCKED
            if exc.status == 404:
                return EvictOutcome.GONE
            raise
        return EvictOutcome.EVICTED

    async def delete_pod(self, pod: JSON, *, grace_seconds: int | None = None) -> EvictOutcome:
        meta = pod["metadata"]
        kwargs: dict[str, Any] = {"_preload_content": False}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = grace_seconds
        try:
            await json_body(
                self.core.delete_namespaced_pod(meta["name"], meta["namespace"], **kwargs)
            )
        except ApiException as exc:
            if exc.status == 404:
                return EvictOutcome.GONE
            raise
        return EvictOutcome.FORCED

    # ---- events ------------------------------------------------------------------------
    async def post_event(
        self,
        involved: JSON,
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
    ) -> None:
        """Record a core/v1 Event about ``involved``. Failures are logged, not raised: an Event
        is a courtesy, never a reason for a step to fail.

        The Event lives in the object's namespace, or in ``default`` for cluster-scoped objects
        (Nodes, NodeRemediations): the apiserver rejects any other namespace for those (422),
        and ``default`` is where the kubelet puts Node Events and ``kubectl describe`` looks.
        """
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        now = rfc3339(_now())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'gpuheal')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Node"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await json_body(
                self.core.create_namespaced_event(namespace, event, _preload_content=False)
            )
        except ApiException as exc:
            log.warning("could not post Event %s on %s: %s", reason, meta.get("name"), exc.reason)

    async def list_watch(
        self,
        resource: Watched,
        *,
        page: int = 500,
        timeout_seconds: int = 300,
        max_backoff: float = 60.0,
    ) -> AsyncIterator[WatchEvent]:
        """LIST (in pages: at most one page of full bodies in memory), then WATCH from the
        list's resourceVersion with bookmarks, forever.

        Yields every listed object as ``LISTED`` and then ``SYNCED`` (``obj["names"]``: the
        names listed, so a caller can drop what vanished meanwhile), then ``ADDED`` /
        ``MODIFIED`` / ``DELETED``. A 410 Gone relists. Any failure yields ``BLIND`` (with
        ``obj["message"]``), waits (1 s doubling to ``max_backoff``) and relists: a caller
        must treat that time as "cannot see", never as "nothing happened".
        """
        call = (
            self.core.list_node if resource == "nodes" else self.core.list_event_for_all_namespaces
        )
        # Events: server-side selector, so the Event firehose of pods never reaches us.
        selector = {} if resource == "nodes" else {"field_selector": "involvedObject.kind=Node"}
        rv: str | None = None
        backoff = 1.0
        while True:
            try:
                if rv is None:
                    listed: list[str] = []
                    async for items, list_rv in self._pages(call, page, **selector):
                        for item in items:
                            listed.append(str((item.get("metadata") or {}).get("name", "")))
                            yield WatchEvent("LISTED", item)
                        rv = list_rv
                    yield WatchEvent("SYNCED", {"names": listed})
                assert rv is not None
                async for ev in self._watch(call, rv, timeout_seconds, **selector):
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
                yield WatchEvent("BLIND", {"message": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
                backoff = min(max_backoff, backoff * 2)
                rv = None

    async def _pages(
        self, call: Any, limit: int, **kwargs: Any
    ) -> AsyncIterator[tuple[list[JSON], str]]:
        token: str | None = None
        while True:
            args: dict[str, Any] = {"limit": limit, "_preload_content": False, **kwargs}
            if token:
                args["_continue"] = token
            page = await json_body(call(**args))
            meta = page.get("metadata") or {}
            yield page["items"], str(meta.get("resourceVersion", ""))
            token = meta.get("continue")
            if not token:
                return

    async def _watch(
        self, call: Any, resource_version: str, timeout_seconds: int, **kwargs: Any
    ) -> AsyncIterator[JSON]:
        resp = await call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            **kwargs,
        )
        if resp.status != 200:
            raw = await resp.read()
            resp.release()
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = raw.decode(errors="replace")
            raise exc
        try:
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()

    # ---- jobs (reset / reboot hooks) -----------------------------------------------------
    async def get_job(self, namespace: str, name: str) -> JSON | None:
        call = self.batch.read_namespaced_job_status(name, namespace, _preload_content=False)
        return await unless(404, call)

    async def create_job(self, namespace: str, body: JSON) -> bool:
        """Create; False when a Job of that name exists already (409)."""
        call = self.batch.create_namespaced_job(namespace, body, _preload_content=False)
        return await unless(409, call) is not None

    # ---- gpuheal custom objects --------------------------------------------------------
    async def get_custom(self, plural: str, name: str) -> JSON | None:
        call = self.custom.get_cluster_custom_object(
            names.GROUP, names.VERSION, plural, name, _preload_content=False
        )
        return await unless(404, call)

    async def list_custom(self, plural: str, label_selector: str | None = None) -> list[JSON]:
        kwargs: dict[str, Any] = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        body = await json_body(
            self.custom.list_cluster_custom_object(names.GROUP, names.VERSION, plural, **kwargs)
        )
        items: list[JSON] = body["items"]
        return items

    async def create_custom(self, plural: str, body: JSON) -> JSON | None:
        """Create; ``None`` when an object of that name exists already (409)."""
        call = self.custom.create_cluster_custom_object(
            names.GROUP, names.VERSION, plural, body, _preload_content=False
        )
        return await unless(409, call)

    async def patch_custom(self, plural: str, name: str, patch: JSON) -> JSON:
        return await self._patch_custom(plural, name, patch, status=False)

    async def patch_custom_status(
        self, plural: str, name: str, status: JSON, *, resource_version: str | None = None
    ) -> JSON:
        """Merge-patch status; with ``resource_version`` the write fails (409, `Conflict`) if
        the object changed since it was read."""
        patch: JSON = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            return await self._patch_custom(plural, name, patch, status=True)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"{plural}/{name} changed since it was read") from exc
            raise

    async def _patch_custom(self, plural: str, name: str, patch: JSON, *, status: bool) -> JSON:
        call = (
            self.custom.patch_cluster_custom_object_status
            if status
            else self.custom.patch_cluster_custom_object
        )
        return await json_body(
            call(
                names.GROUP,
                names.VERSION,
                plural,
                name,
                patch,
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )
