"""The nodes' fault history in the API: one FaultHistory object per node, written by a task
of its own so that no signal or step waits for it.

Callers queue entries (`signal`, `step`, `escalated`, `outcome`: no I/O, no await); the
writer coalesces a burst for a moment, then for each node reads its FaultHistory (or creates
it, without asking first, for a node with none the operator knows of), merges the entries
(trimmed to the retention of the node's policy, 30 days by default, and to the schema's cap),
summarises it per GPU (the GPU map from the node view) and writes the status under the
resourceVersion it read (a 409 reads again). What it wrote is also what the operator reads
back (`ClusterView.set_fault_history`), as does a restarted operator from the watch.

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
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports

log = logging.getLogger("gpuheal.history")

COALESCE = 0.2  # seconds a burst of entries is gathered before one write per node
PARALLEL = 8  # nodes written at once
SWEEP_EVERY = 3600.0  # seconds between looks for histories of nodes that are gone
RECORDED_RESULTS = frozenset({"incident", "attached", "alerted", "blocked"})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- what callers queue (no I/O) ---------------------------------------------------------------


def record(books: Bookkeeping, node: str, entries: Iterable[HistoryEntry]) -> None:
    queued = list(entries)
    if queued:
        books.history_queue.setdefault(node, []).extend(queued)
        books.history_wakeup.set()


def signal(
    cluster: ClusterView, books: Bookkeeping, node: str, obs: Observation, result: str
) -> None:
    """A signal the intake handled: every XID, and any signal a rule acted on."""
    if obs.xid is None and result not in RECORDED_RESULTS:
        return
    active = cluster.active_incident(node)
    incident = (
        active.name
        if active is not None and result in ("incident", "attached", "coalesced")
        else None
    )
    record(books, node, [fh.signal_entry(obs, incident=incident)])


def opened(books: Bookkeeping, node: str, incident: str, *, rule: str, rung: int, why: str) -> None:
    entry = fh.event_entry(EntryKind.INCIDENT, _now(), incident, message=why, rule=rule, rung=rung)
    record(books, node, [entry])


def step(books: Bookkeeping, nrem: NodeRemediation, action: str, rung: int, message: str) -> None:
    _about(books, nrem, EntryKind.ACTION, message, rung=rung, action=action)


def escalated(books: Bookkeeping, nrem: NodeRemediation, rung: int, why: str) -> None:
    _about(books, nrem, EntryKind.INCIDENT, why, rung=rung)


def outcome(books: Bookkeeping, nrem: NodeRemediation, result: str, message: str) -> None:
    _about(books, nrem, EntryKind.OUTCOME, message, rung=nrem.status.rung, outcome=result)


def _about(
    books: Bookkeeping,
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
    record(books, nrem.spec.node_name, [entry])


# ---- the writer -------------------------------------------------------------------------------


def retention(cluster: ClusterView, node: str) -> dt.timedelta:
    policy = cluster.policy_of(node)
    return parse_duration(policy.spec.history.retention) if policy else fh.DEFAULT_RETENTION


async def write_forever(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    swept = asyncio.get_running_loop().time()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(books.history_wakeup.wait(), timeout=SWEEP_EVERY)
        books.history_wakeup.clear()
        await asyncio.sleep(COALESCE)
        await write_queued(ports, cluster, books)
        if asyncio.get_running_loop().time() - swept > SWEEP_EVERY:
            swept = asyncio.get_running_loop().time()
            await sweep(ports, cluster)


async def write_queued(ports: Ports, cluster: ClusterView, books: Bookkeeping) -> None:
    """Write every node's queued entries (a failed node's entries go back in the queue)."""
    queue, books.history_queue = books.history_queue, {}
    limit = asyncio.Semaphore(PARALLEL)

    async def one(node: str, entries: list[HistoryEntry]) -> None:
        async with limit:
            try:
                await flush(ports, cluster, node, entries)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fault history of %s not written (%s); retrying", node, exc)
                books.history_queue.setdefault(node, [])[:0] = entries
                loop = asyncio.get_running_loop()
                loop.call_later(5.0, books.history_wakeup.set)

    await asyncio.gather(*(one(n, e) for n, e in queue.items()))


async def write_now(ports: Ports, cluster: ClusterView, books: Bookkeeping, node: str) -> None:
    """Write the node's queued entries at once (an incident's end: not on any hot path, and
    the last word on the node should not wait for the writer)."""
    entries = books.history_queue.pop(node, None)
    if not entries:
        return
    try:
        await flush(ports, cluster, node, entries)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the writer task tries again
        log.warning("fault history of %s not written (%s); queued again", node, exc)
        books.history_queue.setdefault(node, [])[:0] = entries
        books.history_wakeup.set()


async def flush(
    ports: Ports, cluster: ClusterView, node: str, entries: list[HistoryEntry]
) -> FaultHistory:
    """Merge `entries` into the node's FaultHistory (creating it) and write its status."""
    kube = ports.require_kube()
    for attempt in range(5):
        # A node with no FaultHistory we know of (listed at start, watched, written since:
        # a first fault, every node of a rack storm) gets one created without a GET that
        # would only say 404; one someone else made meanwhile answers 409 and is read.
        known = attempt > 0 or node in cluster.fault_history
        body = await kube.get_custom(HISTORY_PLURAL, node) if known else None
        if body is None:
            body = await kube.create_custom(HISTORY_PLURAL, _new(node)) or await kube.get_custom(
                HISTORY_PLURAL, node
            )
        if body is None:
            raise RuntimeError(f"FaultHistory {node} vanished while being written")
        current = FaultHistory.model_validate(body)
        now = _now()
        keep = retention(cluster, node)
        merged = fh.merge(current.status.entries, entries, now=now, retention=keep)
        status = fh.summarise(
            merged,
            previous=current.status,
            now=now,
            retention=keep,
            pci_of=_uuids(cluster, node),
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
        cluster.set_fault_history(node, history)
        return history
    raise Conflict(f"FaultHistory {node} kept changing while gpuheal wrote to it")


def _new(node: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node}
    if len(node) <= 63:
        meta["labels"] = {NODE_LABEL: node}
    return {"apiVersion": API_VERSION, "kind": HISTORY_KIND, "metadata": meta,
            "spec": {"nodeName": node}}  # fmt: skip


def _uuids(cluster: ClusterView, node: str) -> dict[str, str]:
    """UUID -> PCI address from the node's GPU map (the agent's annotation) as the node
    watch last saw it, if any: the map the engine reads too, and no GET per write."""
    view = cluster.nodes.get(node)
    return view.gpus.by_uuid if view is not None else {}


async def sweep(ports: Ports, cluster: ClusterView) -> None:
    """Delete the histories of nodes that are gone and whose newest entry is older than
    the default retention (a GPU that moved took its UUID's record along in the new
    node's history only from its next fault on; until then it is found here)."""
    cutoff = _now() - fh.DEFAULT_RETENTION
    for node, rec in list(cluster.fault_history.items()):
        if node in cluster.nodes:
            continue
        newest = max([o.time for o in rec.observations] + [rec.last_outcome_at or cutoff])
        if newest < cutoff:
            await ports.require_kube().delete_custom(HISTORY_PLURAL, node)
            cluster.set_fault_history(node, None)
