"""The nodes' fault history in the API: one FaultHistory object per node, written by a task
of its own so that no signal or step waits for it.

Callers queue entries (`signal`, `step`, `escalated`, `outcome`: no I/O, no await); the
writer coalesces a burst for a moment, then for each node reads its FaultHistory (created
on first use), merges the entries (trimmed to the retention of the node's policy, 30 days
by default, and to the schema's cap), summarises it per GPU and writes the status under
the resourceVersion it read (a 409 reads again). What it wrote is also what the operator
reads back (`Runtime.set_fault_history`), as does a restarted operator from the watch.

A write that fails keeps its entries queued and is tried again: a crash in between loses
at most the entries of the last moment, and those are also on the NodeRemediation (signals)
or replayed by their source (Events).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Iterable
from typing import Any

from gpuheal.adapters.kube import Conflict
from gpuheal.api.faulthistory import EntryKind, FaultHistory, HistoryEntry
from gpuheal.api.meta import parse_duration
from gpuheal.api.names import API_VERSION, HISTORY_KIND, HISTORY_PLURAL, NODE_LABEL
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.policy import faultrecord as fh
from gpuheal.policy.types import Observation
from gpuheal.remediation.state import Runtime
from gpuheal.xid.identity import GPU_MAP_ANNOTATION, parse_gpu_map

log = logging.getLogger("gpuheal.history")

COALESCE = 0.2  # seconds a burst of entries is gathered before one write per node
PARALLEL = 8  # nodes written at once
SWEEP_EVERY = 3600.0  # seconds between looks for histories of nodes that are gone
RECORDED_RESULTS = frozenset({"incident", "attached", "alerted", "blocked"})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- what callers queue (no I/O) ---------------------------------------------------------------


def record(rt: Runtime, node: str, entries: Iterable[HistoryEntry]) -> None:
    queued = list(entries)
    if queued:
        rt.history_queue.setdefault(node, []).extend(queued)
        rt.history_wakeup.set()


def signal(rt: Runtime, node: str, obs: Observation, result: str) -> None:
    """A signal the intake handled: every XID, and any signal a rule acted on."""
    if obs.xid is None and result not in RECORDED_RESULTS:
        return
    active = rt.active_incident(node)
    incident = (
        active.name
        if active is not None and result in ("incident", "attached", "coalesced")
        else None
    )
    record(rt, node, [fh.signal_entry(obs, incident=incident)])


def opened(rt: Runtime, node: str, incident: str, *, rule: str, rung: int, why: str) -> None:
    entry = fh.event_entry(EntryKind.INCIDENT, _now(), incident, message=why, rule=rule, rung=rung)
    record(rt, node, [entry])


def step(rt: Runtime, nrem: NodeRemediation, action: str, rung: int, message: str) -> None:
    _about(rt, nrem, EntryKind.ACTION, message, rung=rung, action=action)


def escalated(rt: Runtime, nrem: NodeRemediation, rung: int, why: str) -> None:
    _about(rt, nrem, EntryKind.INCIDENT, why, rung=rung)


def outcome(rt: Runtime, nrem: NodeRemediation, result: str, message: str) -> None:
    _about(rt, nrem, EntryKind.OUTCOME, message, rung=nrem.status.rung, outcome=result)


def _about(
    rt: Runtime,
    nrem: NodeRemediation,
    kind: EntryKind,
    message: str,
    *,
    rung: int,
    action: str | None = None,
    outcome: str | None = None,
) -> None:
    """An entry about one incident (its rule and rung), queued for its node's history."""
    entry = fh.event_entry(
        kind,
        _now(),
        nrem.metadata.name,
        message=message,
        rule=nrem.spec.rule,
        rung=rung,
        action=action,
        outcome=outcome,
    )
    record(rt, nrem.spec.node_name, [entry])


# ---- the writer -------------------------------------------------------------------------------


def retention(rt: Runtime, node: str) -> dt.timedelta:
    policy = rt.policy_of(node)
    return parse_duration(policy.spec.history.retention) if policy else fh.DEFAULT_RETENTION


async def write_forever(rt: Runtime) -> None:
    swept = asyncio.get_running_loop().time()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rt.history_wakeup.wait(), timeout=SWEEP_EVERY)
        rt.history_wakeup.clear()
        await asyncio.sleep(COALESCE)
        await write_queued(rt)
        if asyncio.get_running_loop().time() - swept > SWEEP_EVERY:
            swept = asyncio.get_running_loop().time()
            await sweep(rt)


async def write_queued(rt: Runtime) -> None:
    """Write every node's queued entries (a failed node's entries go back in the queue)."""
    queue, rt.history_queue = rt.history_queue, {}
    limit = asyncio.Semaphore(PARALLEL)

    async def one(node: str, entries: list[HistoryEntry]) -> None:
        async with limit:
            try:
                await flush(rt, node, entries)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fault history of %s not written (%s); retrying", node, exc)
                rt.history_queue.setdefault(node, [])[:0] = entries
                loop = asyncio.get_running_loop()
                loop.call_later(5.0, rt.history_wakeup.set)

    await asyncio.gather(*(one(n, e) for n, e in queue.items()))


async def write_now(rt: Runtime, node: str) -> None:
    """Write the node's queued entries at once (an incident's end: not on any hot path, and
    the last word on the node should not wait for the writer)."""
    entries = rt.history_queue.pop(node, None)
    if not entries:
        return
    try:
        await flush(rt, node, entries)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the writer task tries again
        log.warning("fault history of %s not written (%s); queued again", node, exc)
        rt.history_queue.setdefault(node, [])[:0] = entries
        rt.history_wakeup.set()


async def flush(rt: Runtime, node: str, entries: list[HistoryEntry]) -> FaultHistory:
    """Merge `entries` into the node's FaultHistory (creating it) and write its status."""
    kube = rt.require_kube()
    for _ in range(5):
        body = await kube.get_custom(HISTORY_PLURAL, node)
        if body is None:
            body = await kube.create_custom(HISTORY_PLURAL, _new(node)) or await kube.get_custom(
                HISTORY_PLURAL, node
            )
        if body is None:
            raise RuntimeError(f"FaultHistory {node} vanished while being written")
        current = FaultHistory.model_validate(body)
        now = _now()
        keep = retention(rt, node)
        merged = fh.merge(current.status.entries, entries, now=now, retention=keep)
        status = fh.summarise(
            merged, previous=current.status, now=now, retention=keep, pci_of=await _uuids(rt, node)
        )
        status.observed_generation = current.metadata.generation
        try:
            written = await kube.patch_custom_status(
                HISTORY_PLURAL,
                node,
                status.to_k8s(),
                resource_version=current.metadata.resource_version,
            )
        except Conflict:
            continue  # a person (or an old copy) wrote meanwhile: read again
        history = FaultHistory.model_validate(written)
        rt.set_fault_history(node, history)
        return history
    raise Conflict(f"FaultHistory {node} kept changing while gpuheal wrote to it")


def _new(node: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node}
    if len(node) <= 63:
        meta["labels"] = {NODE_LABEL: node}
    return {"apiVersion": API_VERSION, "kind": HISTORY_KIND, "metadata": meta,
            "spec": {"nodeName": node}}  # fmt: skip


async def _uuids(rt: Runtime, node: str) -> dict[str, str]:
    """UUID -> PCI address from the node's GPU map (the agent's annotation), if any."""
    body = await rt.require_kube().get_node(node)
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return parse_gpu_map(annotations.get(GPU_MAP_ANNOTATION)).by_uuid


async def sweep(rt: Runtime) -> None:
    """Delete the histories of nodes that are gone and whose newest entry is older than
    the default retention (a GPU that moved took its UUID's record along in the new
    node's history only from its next fault on; until then it is found here)."""
    cutoff = _now() - fh.DEFAULT_RETENTION
    for node, rec in list(rt.fault_history.items()):
        if node in rt.nodes:
            continue
        newest = max([o.time for o in rec.observations] + [rec.last_outcome_at or cutoff])
        if newest < cutoff:
            await rt.require_kube().delete_custom(HISTORY_PLURAL, node)
            rt.set_fault_history(node, None)
