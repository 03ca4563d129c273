"""Settings of `gpuheal run`: one pydantic-settings model for the flags and the
``GPUHEAL_<FLAG>`` variables (``--bridge-url`` is also ``$GPUHEAL_BRIDGE_URL``; a flag wins).

The Helm chart sets the variables; keep the names.
"""

from __future__ import annotations

import argparse
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeFloat, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SOURCES = ("conditions", "events", "dcgm")
ENV_PREFIX = "GPUHEAL_"


class OperatorConfig(BaseSettings):
    """gpuheal run: watch GPU nodes, remediate faults as RemediationPolicies say."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    metrics_port: int = Field(9090, ge=0, le=65535, description="Prometheus /metrics port (0: off)")
    health_port: int = Field(
        8080, ge=0, le=65535, description="liveness probe port, path /healthz (0: off)"
    )
    bridge_url: str | None = Field(
        None, description="Slurm bridge base URL, e.g. https://slurm-bridge:8787 (none: no Slurm)"
    )
    bridge_token_file: str | None = Field(
        None, description="file holding the bearer token for the Slurm bridge"
    )
    bridge_ca_file: str | None = Field(
        None, description="CA bundle (PEM) that signed the bridge's TLS certificate"
    )
    sources: Annotated[frozenset[str], NoDecode] = Field(
        frozenset(SOURCES),
        description="detection sources, comma-separated: conditions,events,dcgm",
    )
    dcgm_namespace: str | None = Field(
        None, description="namespace of the dcgm-exporter pods (default: all namespaces)"
    )
    dcgm_selector: str = Field(
        "app=nvidia-dcgm-exporter", description="label selector of the dcgm-exporter pods"
    )
    dcgm_interval: float = Field(15.0, gt=0, description="seconds between dcgm-exporter scrapes")
    dcgm_port: int = Field(9400, ge=1, le=65535, description="dcgm-exporter's metrics port")
    log_format: Literal["json", "plain"] = Field("json", description="log lines as json or plain")
    namespace: str = Field(
        "gpuheal-system",
        description="namespace of the operator's own objects (the Lease of the active copy)",
    )
    kubeconfig: str | None = Field(
        None, description="kubeconfig file (default: in-cluster, else $KUBECONFIG)"
    )
    event_max_age: NonNegativeFloat = Field(
        3600.0,
        description="XID Events older than this (seconds) count for history but start nothing",
    )
    verbose: bool = Field(False, description="debug logs, kopf's included")
    retry_interval: float = Field(
        5.0,
        gt=0,
        description="seconds between looks at a step that waits (PDB, approval, breaker, "
        "hysteresis)",
    )
    signal_concurrency: int = Field(
        32,
        ge=1,
        le=1024,
        description="signals handled at once (each node's signals one after another, in order)",
    )
    lease_duration: NonNegativeFloat = Field(
        15.0,
        description="seconds of the Lease that keeps a second copy standing by (0: no Lease, "
        "for a one-off local run)",
    )

    @field_validator("sources", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {s.strip() for s in value.split(",") if s.strip()}
        unknown = set(value) - set(SOURCES)
        if unknown:
            raise ValueError(
                f"unknown source(s) {sorted(unknown)}; choose from {','.join(SOURCES)}"
            )
        return frozenset(value)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag per setting, with its help, its variable and its default."""
    for name, field in OperatorConfig.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        env = f"{ENV_PREFIX}{name.upper()}"
        default = field.default
        shown = ",".join(sorted(default)) if isinstance(default, frozenset) else default
        help_ = f"{field.description} [${env}; default: {shown}]"
        if field.annotation is bool:
            parser.add_argument(flag, action="store_const", const=True, default=None, help=help_)
        else:
            parser.add_argument(flag, default=None, metavar=name.upper(), help=help_)


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """Flags given, then ``GPUHEAL_*`` variables, then defaults; a bad value exits with the
    flag's name and the reason (as argparse does)."""
    given = {
        name: getattr(args, name)
        for name in OperatorConfig.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return OperatorConfig(**given)
    except ValidationError as exc:
        reasons = "; ".join(
            f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise SystemExit(f"gpuheal run: {reasons}") from None
