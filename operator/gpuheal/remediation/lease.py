"""One active operator: a coordination.k8s.io Lease, like client-go's leader election.

kopf has no leader election (peering only pauses lower-priority copies). gpuheal ships as a
single replica with the Recreate strategy; this Lease makes an accidental second copy
harmless: it waits in start-up (before any watch or signal source runs) until the Lease is
free, and a holder that cannot renew in time exits rather than act next to a new holder.
Both waits are timed on each copy's own monotonic clock (the rule: `gpuheal.policy.lease`): the wall
clock only fills in the Lease's renewTime for people to read.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpuheal.adapters.kube import ApiError, Kube
from gpuheal.policy.lease import (
    Sighting,
    may_take,
    must_give_up,
    record_of,
    renewal_budget,
    sight,
)

log = logging.getLogger("gpuheal.lease")

LEASE_NAME = "gpuheal-operator"

#: TEST ONLY, never in production: seconds added to this process's wall clock as the Lease
#: reads it, to play a machine whose clock is off (tests/integration: a standby with a skewed
#: clock never leads beside the holder). The Helm chart has no value for it.
SKEW_ENV = "GPUHEAL_TEST_CLOCK_SKEW"


def _wall() -> dt.datetime:
    skew = float(os.environ.get(SKEW_ENV) or 0)
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew)


def _micro(ts: dt.datetime) -> str:
    return ts.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


class Lease:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        identity: str | None = None,
        duration: float = 15.0,
        name: str = LEASE_NAME,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = _wall,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.duration = duration
        self.clock = clock
        self.wall = wall
        #: When (``clock``) the last successful renewal began; None: not holding.
        self.renewed_at: float | None = None
        #: The record as last read, and since when it has not changed (``clock``).
        self.seen: Sighting | None = None

    def _body(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}  # fmt: skip

    async def _read(self) -> dict[str, Any]:
        return await self.kube.read_lease(self.namespace, self.name)

    async def _write(self, spec: dict[str, Any], rv: str | None) -> None:
        await self.kube.write_lease(self._body(spec, rv))

    async def try_acquire(self) -> bool:
        began = self.clock()  # before the read: what a standby sees is written after this
        stamp = _micro(self.wall())
        try:
            current = await self._read()
        except ApiError as exc:
            if exc.status != 404:
                raise
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            }
            try:
                await self._write(spec, None)
            except ApiError as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self.renewed_at = began
            return True
        wire = dict(current.get("spec") or {})
        self.seen = sight(self.seen, record_of(current), began)
        if not may_take(wire, self.identity, self.seen, began, self.duration):
            return False
        mine = wire.get("holderIdentity") == self.identity
        spec = {
            **wire,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": stamp,
            "acquireTime": wire.get("acquireTime") if mine else stamp,
            "leaseTransitions": int(wire.get("leaseTransitions") or 0) + (0 if mine else 1),
        }
        try:
            await self._write(spec, current["metadata"]["resourceVersion"])
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self.renewed_at = began
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

    async def keep(self, on_lost: Callable[[], None]) -> None:
        """Renew every third of the duration (a failed renewal is tried again sooner); call
        ``on_lost()`` once no renewal has succeeded within the renew deadline (two thirds of
        the duration) on this process's clock: a renewal that hangs is cut off at it."""
        ok = True
        while True:
            await asyncio.sleep(self.duration / 3 if ok else self.duration / 15)
            budget = renewal_budget(self.renewed_at, self.clock(), self.duration)
            try:
                ok = budget > 0 and await asyncio.wait_for(self.try_acquire(), budget)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                log.warning("Lease renewal took longer than the %.1fs left", budget)
                ok = False
            except Exception as exc:
                log.warning("Lease renewal failed: %s", exc)
                ok = False
            if not ok and must_give_up(self.renewed_at, self.clock(), self.duration):
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
