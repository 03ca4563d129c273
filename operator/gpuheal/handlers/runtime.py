"""What the handlers share (kopf's memo holds one `Runtime`): clients, compact views, locks.

Views are filled by kopf ``on.event`` handlers (no writes) and hold only what gpuheal reads.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpuheal.adapters.kube import Kube
from gpuheal.adapters.lease import Lease
from gpuheal.adapters.slurm import SlurmPort
from gpuheal.config import OperatorConfig
from gpuheal.incident import NodeView
from gpuheal.metrics import Metrics
from gpuheal.plan import Signal


@dataclass(frozen=True, slots=True)
class IncidentView:
    """What gpuheal keeps of a NodeRemediation."""

    name: str
    node: str
    policy: str
    active: bool
    holds_slot: bool  # counts against maxUnhealthy (cordoned or about to be)
    trigger_keys: frozenset[str]
    replacement: str | None = None
    started: dt.datetime | None = None  # when it took its maxUnhealthy slot (cordon)


@dataclass
class Runtime:
    config: OperatorConfig
    metrics: Metrics
    kube: Kube | None = None
    lease: Lease | None = None
    slurm: SlurmPort | None = None
    nodes: dict[str, NodeView] = field(default_factory=dict)
    policies: dict[str, Any] = field(default_factory=dict)  # name -> RemediationPolicy
    pools: dict[str, Any] = field(default_factory=dict)  # name -> ReservePool
    incidents: dict[str, IncidentView] = field(default_factory=dict)
    history: dict[str, deque[Signal]] = field(default_factory=dict)
    seen_keys: dict[str, dt.datetime] = field(default_factory=dict)
    drivers: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    # maxUnhealthy slots taken by incidents of this process not yet visible in `incidents`.
    slots: dict[str, set[str]] = field(default_factory=dict)
    slot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    breaker_open: dict[str, bool] = field(default_factory=dict)
    blind: set[str] = field(default_factory=set)  # sources that cannot be read right now
    breaker_closed_at: dict[str, dt.datetime] = field(default_factory=dict)
    node_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    condition_timers: dict[tuple[str, str], asyncio.TimerHandle] = field(default_factory=dict)
    started: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def forget_before(self, cutoff: dt.datetime) -> None:
        """Drop dedupe keys and history older than ``cutoff`` (bounded memory)."""
        for key in [k for k, t in self.seen_keys.items() if t < cutoff]:
            del self.seen_keys[key]
        for node in list(self.history):
            kept = deque((s for s in self.history[node] if s.time >= cutoff), maxlen=256)
            if kept:
                self.history[node] = kept
            else:
                del self.history[node]

    def node_lock(self, node: str) -> asyncio.Lock:
        return self.node_locks.setdefault(node, asyncio.Lock())

    def remember(self, node: str, obs: Signal, *, keep: int = 256) -> bool:
        """Add to the node's history; False if this dedupe key was seen already."""
        if obs.key in self.seen_keys:
            return False
        self.seen_keys[obs.key] = obs.time
        self.history.setdefault(node, deque(maxlen=keep)).append(obs)
        return True

    def active_incident(self, node: str) -> IncidentView | None:
        return next((i for i in self.incidents.values() if i.node == node and i.active), None)

    def require_kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the Kubernetes client is not set up (startup did not run)")
        return self.kube
