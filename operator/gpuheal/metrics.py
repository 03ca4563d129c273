"""Prometheus metrics of the operator (prefix ``gpuheal_``, base units, bounded labels).

Label values come from small fixed sets (sources, steps, results, outcomes). Policy and pool
names appear only on gauges; node and incident names only on per-incident gauges whose series
are removed when the incident ends (what per-incident alerts need).
"""

from __future__ import annotations

import functools

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
        counter = functools.partial(Counter, registry=registry)
        gauge = functools.partial(Gauge, registry=registry)
        histogram = functools.partial(Histogram, registry=registry, buckets=_STEP_BUCKETS)
        self.signals = counter(
            "gpuheal_signals_total",
            "Signals seen, by source (events, conditions, dcgm) and what became of them "
            "(incident, attached, alerted, duplicate, stale, pending, ignored, blocked; "
            "untrusted: an Event from a reporter not in --trusted-reporters; wrong_namespace: "
            "an Event outside --event-namespace; wrong_uid: an Event naming another Node uid; "
            "none of these is handed on; dcgm: mismatched, a series whose Hostname is not the "
            "exporter pod's node, or a pod not of --dcgm-daemonset).",
            ["source", "result"],
        )
        self.incidents = counter(
            "gpuheal_incidents_total",
            "NodeRemediations created, by trigger (xid, condition) and source.",
            ["trigger", "source"],
        )
        self.incidents_completed = counter(
            "gpuheal_incidents_completed_total",
            "Incidents that ended, by outcome (returned, replaced, remediated, failed, dryrun).",
            ["outcome"],
        )
        self.active_incidents = gauge("gpuheal_active_incidents", "Open NodeRemediations.")
        self.incident_blocked = gauge(
            "gpuheal_incident_blocked",
            "1 while an open incident is held back (its Blocked condition), by reason.",
            ["incident", "node", "reason"],
        )
        self.incident_progress = gauge(
            "gpuheal_incident_last_progress_timestamp_seconds",
            "Unix time of an open incident's last completed step (Detected at first).",
            ["incident", "node"],
        )
        self.steps = counter(
            "gpuheal_steps_total",
            "Remediation steps run, by step and result (done, wait, failed).",
            ["step", "result"],
        )
        self.step_duration = histogram(
            "gpuheal_step_duration_seconds", "Time one attempt of a step took.", ["step"]
        )
        self.detection_to_step = histogram(
            "gpuheal_detection_to_step_seconds",
            "Time from the signal's detection to a step's completion (e.g. XID -> cordon).",
            ["step"],
        )
        self.blocked = counter(
            "gpuheal_blocked_total",
            "Steps or incidents held back, by reason (CircuitBreakerOpen, RateLimited, "
            "Paused, OptedOut, ApprovalPending, DryRun, PodDisruptionBudget, ...).",
            ["reason"],
        )
        self.breaker_open = gauge(
            "gpuheal_breaker_open",
            "1 while the policy's maxUnhealthy circuit breaker is open.",
            ["policy"],
        )
        self.unhealthy_nodes = gauge(
            "gpuheal_unhealthy_nodes",
            "Nodes selected by the policy that are unhealthy or being remediated.",
            ["policy"],
        )
        self.pool_nodes = gauge(
            "gpuheal_reserve_pool_nodes",
            "Nodes in a reserve pool by state (available, claimed, total).",
            ["pool", "state"],
        )
        self.pool_min_available = gauge(
            "gpuheal_reserve_pool_min_available", "The pool's spec.minAvailable.", ["pool"]
        )
        self.evictions = counter(
            "gpuheal_evictions_total",
            "Pod eviction attempts by result (evicted, pdb_blocked, gone, forced).",
            ["result"],
        )
        self.bridge_calls = counter(
            "gpuheal_bridge_calls_total",
            "Calls to the Slurm bridge by operation and result (ok, error, unavailable).",
            ["operation", "result"],
        )
        self.bridge_up = gauge(
            "gpuheal_bridge_up",
            "1 while a Slurm cluster's bridge answers /readyz (slurmctld reachable), 0 "
            "otherwise, by cluster (--bridge-cluster, or a name from --bridges-file).",
            ["cluster"],
        )
        self.notifications = counter(
            "gpuheal_notifications_total",
            "Incident notifications by event (Opened, Blocked, ApprovalPending, Completed, "
            "Failed) and result (sent, rejected, failed after retries, dropped: queue full).",
            ["event", "result"],
        )
        self.source_up = gauge(
            "gpuheal_source_up",
            "1 while a detection source is read successfully, 0 while it is blind.",
            ["source"],
        )
        self.source_errors = counter(
            "gpuheal_source_errors_total",
            "Failed reads of a detection source (watch errors, dcgm-exporter scrapes).",
            ["source"],
        )
        self.events = counter(
            "gpuheal_events_total",
            "Kubernetes Events gpuheal posted (posted), or gave up on after retries, at a full "
            "queue or at shutdown (lost; each is logged at WARNING with its message), or dropped "
            "past an object's budget (dropped: 25, then one per 10 s; the status says the same).",
            ["result"],
        )
        self.nodes_watched = gauge(
            "gpuheal_nodes_watched", "Nodes in the operator's compact node view."
        )

    def incident_over(self, incident: str, node: str) -> None:
        """Drop an ended incident's series (bounded cardinality)."""
        for gauge in (self.incident_blocked, self.incident_progress):
            for labels in list(gauge._metrics):
                if labels[:2] == (incident, node):
                    gauge.remove(*labels)
