"""One active operator: a coordination.k8s.io Lease, like client-go's leader election.

kopf has no leader election (peering only pauses lower-priority copies). gpuheal ships as a
single replica with the Recreate strategy; this Lease makes an accidental second copy
harmless: it waits in start-up (before any watch or signal source runs) until the Lease is
free, and a holder that cannot renew in time exits rather than act next to a new holder.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import uuid
from typing import Any

from gpuheal.adapters.kube import ApiError, Kube

log = logging.getLogger("gpuheal.lease")

LEASE_NAME = "gpuheal-operator"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _micro(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def lease_free(spec: dict[str, Any], me: str, now: dt.datetime) -> bool:
    """May ``me`` take the Lease described by ``spec`` (a dict of the wire fields) now?"""
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    return renewed is None or now >= renewed + dt.timedelta(seconds=duration)


class Lease:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        identity: str | None = None,
        duration: float = 15.0,
        name: str = LEASE_NAME,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.duration = duration
        self.renewed: dt.datetime | None = None

    def _body(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}  # fmt: skip

    async def _read(self) -> dict[str, Any]:
        return await self.kube.http.request("GET", self.kube.lease_path(self.namespace, self.name))

    async def _write(self, spec: dict[str, Any], rv: str | None) -> None:
        if rv is None:
            path, method = self.kube.lease_path(self.namespace), "POST"
        else:
            path, method = self.kube.lease_path(self.namespace, self.name), "PUT"
        await self.kube.http.request(method, path, body=self._body(spec, rv))

    async def try_acquire(self) -> bool:
        now = _now()
        try:
            current = await self._read()
        except ApiError as exc:
            if exc.status != 404:
                raise
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
                "leaseTransitions": 0,
            }
            try:
                await self._write(spec, None)
            except ApiError as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self.renewed = now
            return True
        wire = dict(current.get("spec") or {})
        if not lease_free(wire, self.identity, now):
            return False
        mine = wire.get("holderIdentity") == self.identity
        spec = {
            **wire,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": _micro(now),
            "acquireTime": wire.get("acquireTime") if mine else _micro(now),
            "leaseTransitions": int(wire.get("leaseTransitions") or 0) + (0 if mine else 1),
        }
        try:
            await self._write(spec, current["metadata"]["resourceVersion"])
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self.renewed = now
        return True

    async def acquire(self, *, every: float = 1.0) -> None:
        """Wait until this process holds the Lease."""
        announced = False
        while not await self.try_acquire():
            if not announced:
                log.info("another gpuheal holds Lease %s/%s; standing by", self.namespace,
                         self.name)  # fmt: skip
                announced = True
            await asyncio.sleep(every)
        log.info("holding Lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def keep(self, on_lost: Any) -> None:
        """Renew every third of the duration; call ``on_lost()`` if the Lease is gone or was
        not renewed within its duration (another copy may take it then)."""
        while True:
            await asyncio.sleep(self.duration / 3)
            try:
                ok = await self.try_acquire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("Lease renewal failed: %s", exc)
                ok = False
            if not ok and (self.renewed is None or _now() - self.renewed >= dt.timedelta(
                    seconds=self.duration * 0.9)):  # fmt: skip
                log.critical("lost Lease %s/%s; stopping", self.namespace, self.name)
                on_lost()
                return

    async def release(self) -> None:
        try:
            current = await self._read()
            wire = dict(current.get("spec") or {})
            if wire.get("holderIdentity") != self.identity:
                return
            wire["holderIdentity"] = None
            await self._write(wire, current["metadata"]["resourceVersion"])
        except ApiError as exc:
            log.warning("could not release Lease: %s", exc.reason)
