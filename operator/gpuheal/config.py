"""Settings of `gpuheal run`: flags, each also an environment variable ``GPUHEAL_<FLAG>``.

The Helm chart is written against these names; keep them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

SOURCES = ("conditions", "events", "dcgm")


@dataclass(frozen=True)
class OperatorConfig:
    metrics_port: int = 9090
    health_port: int = 8080
    bridge_url: str | None = None
    bridge_token_file: str | None = None
    bridge_ca_file: str | None = None
    sources: frozenset[str] = frozenset(SOURCES)
    dcgm_namespace: str | None = None
    dcgm_selector: str = "app=nvidia-dcgm-exporter"
    dcgm_interval: float = 15.0
    dcgm_port: int = 9400
    log_format: str = "json"
    namespace: str = "gpuheal-system"
    kubeconfig: str | None = None
    event_max_age: float = 3600.0
    verbose: bool = False
    # Seconds between looks at a step that waits (PDB, approval, breaker, hysteresis).
    retry_interval: float = 5.0
    # Lease of the single active copy (seconds; 0: no Lease, e.g. a one-off local run).
    lease_duration: float = 15.0
    extra: dict[str, Any] = field(default_factory=dict)


def _env(name: str, default: Any) -> Any:
    return os.environ.get(f"GPUHEAL_{name.upper().replace('-', '_')}", default)


def _sources(text: str) -> frozenset[str]:
    chosen = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = chosen - set(SOURCES)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown source(s) {sorted(unknown)}; choose from {','.join(SOURCES)}"
        )
    return chosen


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    d = OperatorConfig()
    a = parser.add_argument
    a(
        "--metrics-port",
        type=int,
        default=int(_env("metrics_port", d.metrics_port)),
        help="Prometheus /metrics port (0: off)",
    )
    a(
        "--health-port",
        type=int,
        default=int(_env("health_port", d.health_port)),
        help="liveness probe port, path /healthz (0: off)",
    )
    a("--bridge-url", default=_env("bridge_url", None), help="Slurm bridge base URL")
    a("--bridge-token-file", default=_env("bridge_token_file", None))
    a("--bridge-ca-file", default=_env("bridge_ca_file", None))
    a(
        "--sources",
        type=_sources,
        default=_sources(_env("sources", ",".join(SOURCES))),
        help="detection sources, comma-separated: conditions,events,dcgm",
    )
    a(
        "--dcgm-namespace",
        default=_env("dcgm_namespace", None),
        help="namespace of the dcgm-exporter pods (default: all)",
    )
    a("--dcgm-selector", default=_env("dcgm_selector", d.dcgm_selector))
    a("--dcgm-interval", type=float, default=float(_env("dcgm_interval", d.dcgm_interval)))
    a("--dcgm-port", type=int, default=int(_env("dcgm_port", d.dcgm_port)))
    a("--log-format", choices=["json", "plain"], default=_env("log_format", d.log_format))
    a(
        "--namespace",
        default=_env("namespace", d.namespace),
        help="namespace of the operator's own objects (Events about cluster objects, Lease)",
    )
    a("--kubeconfig", default=_env("kubeconfig", os.environ.get("KUBECONFIG")))
    a(
        "--event-max-age",
        type=float,
        default=float(_env("event_max_age", d.event_max_age)),
        help="XID Events older than this (seconds) count for history but start nothing",
    )
    a("--retry-interval", type=float, default=float(_env("retry_interval", d.retry_interval)))
    a(
        "--lease-duration",
        type=float,
        default=float(_env("lease_duration", d.lease_duration)),
        help="seconds of the Lease that keeps a second copy idle (0: no Lease)",
    )
    a("--verbose", action="store_true", default=_env("verbose", "") in ("1", "true"))


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        bridge_url=args.bridge_url,
        bridge_token_file=args.bridge_token_file,
        bridge_ca_file=args.bridge_ca_file,
        sources=args.sources,
        dcgm_namespace=args.dcgm_namespace,
        dcgm_selector=args.dcgm_selector,
        dcgm_interval=args.dcgm_interval,
        dcgm_port=args.dcgm_port,
        log_format=args.log_format,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        event_max_age=args.event_max_age,
        retry_interval=args.retry_interval,
        lease_duration=args.lease_duration,
        verbose=args.verbose,
    )
