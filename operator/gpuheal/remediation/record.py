"""The record of an incident: its status, changed through the pydantic model and written in
one merge patch per pass."""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable
from typing import Any

from gpuheal import crashpoints
from gpuheal.adapters.kube import Kube
from gpuheal.api.meta import ConditionStatus, find_condition, set_condition
from gpuheal.api.names import NREM_PLURAL, NremCondition
from gpuheal.api.noderemediation import NodeRemediation, NodeRemediationStatus, TimelineEntry

TIMELINE_KEEP = 200


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _no_later(at: dt.datetime) -> dt.datetime:
    """A time another clock gave (the bridge's, when Slurm acted), never after ours: a bridge
    whose clock runs ahead must not date a step in the future."""
    return min(at, _now())


class Recorder:
    """One pass's changes to a NodeRemediation's status.

    Written under the resourceVersion the object was read at: if a person or a new signal
    changed it meanwhile, the write is a 409 and the pass starts again from a fresh read.
    """

    def __init__(
        self,
        nrem: NodeRemediation,
        now: dt.datetime,
        *,
        written: Callable[[dict[str, Any]], None] = lambda body: None,
    ) -> None:
        self.name = nrem.metadata.name
        self.written = written  # gets the object as the API server stored it
        self.status = nrem.status.model_copy(deep=True)
        self.generation = nrem.metadata.generation
        self.resource_version = nrem.metadata.resource_version
        self.now = now
        self.dirty = False

    # ---- reading ------------------------------------------------------------------------
    def reason(self, type_: str) -> str | None:
        cond = find_condition(self.status.conditions, type_)
        return cond.reason if cond is not None else None

    def since(self, type_: str) -> dt.datetime | None:
        cond = find_condition(self.status.conditions, type_)
        return cond.last_transition_time if cond is not None else None

    def holds(self, type_: str) -> bool:
        cond = find_condition(self.status.conditions, type_)
        return cond is not None and cond.status is ConditionStatus.TRUE

    # ---- changing -----------------------------------------------------------------------
    def condition(
        self, type_: str, status: str, reason: str, message: str, at: dt.datetime | None = None
    ) -> None:
        """Set a condition; setting it to what it says already changes nothing (no write).
        ``at``: when it happened, if not now (e.g. when Slurm acted, as the bridge says)."""
        old = find_condition(self.status.conditions, type_)
        if old is not None and (old.status.value, old.reason, old.message) == (
            status,
            reason,
            message[:32768],
        ):
            return
        self.status.conditions = set_condition(
            self.status.conditions,
            type_=type_,
            status=ConditionStatus(status),
            reason=reason,
            message=message,
            now=_no_later(at) if at else self.now,
            observed_generation=self.generation,
        )
        self.dirty = True

    def clear_blocked(self) -> None:
        if self.holds(NremCondition.BLOCKED):
            self.condition(NremCondition.BLOCKED, "False", "NotBlocked", "")

    def event(self, step: str, message: str, at: dt.datetime | None = None) -> None:
        """A timeline entry, stamped with the wall clock (steps often take milliseconds), or
        with ``at``: when it happened (e.g. when Slurm acted, as the bridge says). Entries stay
        in time order: a step dated when Slurm acted may be recorded after a later one (the
        spare claimed meanwhile), and readers take the timeline as a history."""
        when = _no_later(at) if at else _now()
        entry = TimelineEntry(time=when, step=step[:64], message=message[:1024])
        entries = list(self.status.timeline)
        bisect.insort_right(entries, entry, key=lambda e: e.time)
        self.status.timeline = entries[-TIMELINE_KEEP:]
        self.dirty = True

    def set(self, **fields: Any) -> None:
        """Set status fields by their model names (``rung=``, ``slot_taken_at=``...)."""
        for key, value in fields.items():
            setattr(self.status, key, value)
        self.dirty = True

    def merge(self, fields: dict[str, Any]) -> None:
        """Merge wire-named fields a step produced: ownership is merged key by key and
        requeued jobs are added to the ones already recorded; the rest is replaced."""
        if not fields:
            return
        current = self.status.to_k8s()
        for key, value in fields.items():
            if key == "ownership":
                current["ownership"] = {**current.get("ownership", {}), **value}
            elif key == "requeuedJobs":
                known = {j.get("jobId") for j in current.get("requeuedJobs", [])}
                current["requeuedJobs"] = [
                    *current.get("requeuedJobs", []),
                    *(j for j in value if j.get("jobId") not in known),
                ]
            else:
                current[key] = value
        self.status = NodeRemediationStatus.model_validate(current)
        self.dirty = True

    async def write(self, kube: Kube) -> None:
        if not self.dirty:
            return
        self.status.observed_generation = self.generation
        crashpoints.at("status", "before")
        updated = await kube.patch_custom_status(
            NREM_PLURAL, self.name, self.status.to_k8s(), resource_version=self.resource_version
        )
        crashpoints.at("status", "after")
        self.resource_version = (updated.get("metadata") or {}).get("resourceVersion")
        self.dirty = False
        self.written(updated)
