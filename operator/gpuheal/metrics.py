"""Prometheus metrics of the operator (prefix ``gpuheal_``, base units, bounded labels).

Label values come from small fixed sets (sources, steps, results, outcomes); policy and pool
names appear only on gauges, and node names never do.
"""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

# `_created` series double every counter's cardinality and nobody alerts on them.
disable_created_metrics()  # type: ignore[no-untyped-call]

_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class Metrics:
    """All operator metrics on one registry (the default one in production, a fresh one in
    tests so that two operators in one process do not collide)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.signals = Counter(
            "gpuheal_signals_total",
            "Signals seen, by source (events, conditions, dcgm) and what became of them "
            "(incident, attached, duplicate, stale, ignored, blocked).",
            ["source", "result"],
            registry=registry,
        )
        self.incidents = Counter(
            "gpuheal_incidents_total",
            "NodeRemediations created, by trigger (xid, condition) and source.",
            ["trigger", "source"],
            registry=registry,
        )
        self.incidents_completed = Counter(
            "gpuheal_incidents_completed_total",
            "Incidents that ended, by outcome (returned, replaced, retired, failed, dry_run).",
            ["outcome"],
            registry=registry,
        )
        self.active_incidents = Gauge(
            "gpuheal_active_incidents",
            "NodeRemediations not finished yet.",
            registry=registry,
        )
        self.steps = Counter(
            "gpuheal_steps_total",
            "Remediation steps run, by step and result (done, blocked, retry, failed).",
            ["step", "result"],
            registry=registry,
        )
        self.step_duration = Histogram(
            "gpuheal_step_duration_seconds",
            "Time one attempt of a remediation step took.",
            ["step"],
            buckets=_STEP_BUCKETS,
            registry=registry,
        )
        self.detection_to_step = Histogram(
            "gpuheal_detection_to_step_seconds",
            "Time from the signal's detection to a step's completion (e.g. XID -> cordon).",
            ["step"],
            buckets=_STEP_BUCKETS,
            registry=registry,
        )
        self.blocked = Counter(
            "gpuheal_blocked_total",
            "Steps or incidents held back, by reason (CircuitBreakerOpen, RateLimited, "
            "Paused, OptedOut, ApprovalPending, DryRun, PodDisruptionBudget, ...).",
            ["reason"],
            registry=registry,
        )
        self.breaker_open = Gauge(
            "gpuheal_breaker_open",
            "1 while the policy's maxUnhealthy circuit breaker is open.",
            ["policy"],
            registry=registry,
        )
        self.unhealthy_nodes = Gauge(
            "gpuheal_unhealthy_nodes",
            "Nodes selected by the policy that are unhealthy or being remediated.",
            ["policy"],
            registry=registry,
        )
        self.pool_nodes = Gauge(
            "gpuheal_reserve_pool_nodes",
            "Nodes in a reserve pool by state (available, claimed, total).",
            ["pool", "state"],
            registry=registry,
        )
        self.evictions = Counter(
            "gpuheal_evictions_total",
            "Pod eviction attempts by result (evicted, pdb_blocked, gone, forced, error).",
            ["result"],
            registry=registry,
        )
        self.bridge_calls = Counter(
            "gpuheal_bridge_calls_total",
            "Calls to the Slurm bridge by operation and result (ok, error, unavailable).",
            ["operation", "result"],
            registry=registry,
        )
        self.source_up = Gauge(
            "gpuheal_source_up",
            "1 while a detection source is read successfully, 0 while it is blind.",
            ["source"],
            registry=registry,
        )
        self.source_errors = Counter(
            "gpuheal_source_errors_total",
            "Failed reads of a detection source (watch errors, dcgm-exporter scrapes).",
            ["source"],
            registry=registry,
        )
        self.nodes_watched = Gauge(
            "gpuheal_nodes_watched",
            "Nodes in the operator's compact node view.",
            registry=registry,
        )
