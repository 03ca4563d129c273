"""Settings of ``gpuheal-slurm-bridge``: its flags and ``GPUHEAL_BRIDGE_*`` variables.

pydantic-settings reads both from one model: ``--token-file`` is also
``$GPUHEAL_BRIDGE_TOKEN_FILE``, and a flag wins over its variable. The helm chart passes
flags, the systemd unit sets variables. Bearer tokens come from ``--token-file`` and/or
``$GPUHEAL_BRIDGE_TOKENS`` (read by :func:`gpuheal_bridge.server.auth.load_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, PositiveFloat, ValidationError, model_validator
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from gpuheal_bridge.hostlist import expand
from gpuheal_bridge.server.auth import is_loopback

ENV_PREFIX = "GPUHEAL_BRIDGE_"


class BridgeConfig(BaseSettings):
    """Drain/resume Slurm nodes, requeue their jobs. --a-flag is also $GPUHEAL_BRIDGE_A_FLAG."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",  # GPUHEAL_BRIDGE_TOKENS is read by the token loader, not here
        cli_prog_name="gpuheal-slurm-bridge",
        cli_kebab_case=True,
        cli_avoid_json=True,
        cli_hide_none_type=True,
    )

    listen: str = Field(
        "127.0.0.1:8787",
        description="host:port to listen on (loopback by default; another address needs TLS "
        "or --insecure-http)",
    )
    token_file: Path | None = Field(
        None,
        description="bearer tokens, one 'name:token' or 'name:token:scope,scope' a line (no "
        "scopes: every scope but admin); read again on SIGHUP",
    )
    allowed_nodes: str | None = Field(
        None,
        description="the Slurm nodes the bridge may act on, a hostlist (e.g. gpu-[01-64]); "
        "any other is refused (403). Unset: every node (a warning at start)",
    )
    reserve_reasons: str = Field(
        "reserve pool",
        description="the drain reasons of reserve pools' spares, '|'-separated (each a "
        "ReservePool's promotion.slurm.reserveReason): resume with a reserve_reason lifts only "
        "these, reserve sets only these (any other: 403)",
    )
    tls_cert: Path | None = Field(None, description="TLS certificate (PEM): HTTPS with --tls-key")
    tls_key: Path | None = Field(None, description="TLS private key (PEM)")
    insecure_http: bool = Field(
        False,
        description="serve plain HTTP to clients that are not on loopback (only behind a "
        "proxy that terminates TLS; 1/true/yes)",
    )
    health_interval: PositiveFloat = Field(
        15.0,
        description="seconds between the bridge's own slurmctld checks "
        "(gpuheal_bridge_slurmctld_up)",
    )
    backend: Literal["cli", "rest"] = Field("cli", description="cli or rest")
    slurm_conf: str | None = Field(
        None, description="slurm.conf for the Slurm commands (else $SLURM_CONF / default)"
    )
    slurm_bin_dir: str | None = Field(None, description="scontrol/squeue/scancel here (else PATH)")
    slurm_timeout: PositiveFloat = Field(15.0, description="seconds allowed per Slurm call")
    rest_url: str | None = Field(
        None, description="slurmrestd URL: http(s)://host:port or unix:/path/to.sock"
    )
    rest_user: str = Field("root", description="X-SLURM-USER-NAME for JWT auth")
    rest_token_file: Path | None = Field(
        None, description="file holding the slurmrestd JWT; read again whenever it changes"
    )
    rest_api_version: str | None = Field(
        None, description="force an API version, e.g. v0.0.40 (default: newest offered)"
    )
    rest_write_fallback: Literal["none", "cli"] = Field(
        "none", description="'cli': do what slurmrestd cannot with scontrol"
    )
    state_dir: Path = Field(
        Path("/var/lib/gpuheal-bridge"),
        description="directory for the idempotency store and the exclusions the bridge added",
    )
    audit_log: Path | None = Field(
        None, description="JSON-lines audit log (default: STATE_DIR/audit.jsonl)"
    )
    idempotency_ttl: PositiveFloat = Field(
        86400.0, description="seconds to keep idempotent results"
    )
    node_map_template: str | None = Field(
        None, description="Slurm name template, e.g. '{short}' (groups of the regex)"
    )
    node_map_regex: str | None = Field(
        None, description="regex applied to the Kubernetes node name, e.g. '^(?P<short>[^.]+)'"
    )
    node_map_table: Path | None = Field(
        None, description="file: JSON object or 'k8s-name slurm-name' lines"
    )
    node_map_table_only: bool = Field(
        False, description="only names in the table are Slurm nodes (1/true/yes)"
    )
    expedite_timeout: PositiveFloat = Field(
        15.0, description="seconds to wait for PENDING/BeginTime before StartTime=now"
    )
    settle_timeout: PositiveFloat = Field(
        30.0, description="seconds to wait for a requeued job to leave COMPLETING"
    )
    log_level: str = Field("info", description="debug, info, warning")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.backend == "rest" and not self.rest_url:
            raise ValueError("--backend rest needs --rest-url")
        if self.allowed_nodes is not None:
            try:
                nodes = expand(self.allowed_nodes)
            except ValueError as exc:
                raise ValueError(f"--allowed-nodes {self.allowed_nodes!r}: {exc}") from None
            if not nodes:
                raise ValueError("--allowed-nodes is empty: give a hostlist, or leave it unset")
        if not reserve_reasons(self.reserve_reasons):
            raise ValueError("--reserve-reasons is empty: give the reserve pools' drain reasons")
        host = listen_host(self.listen)
        if self.tls_cert is None and not self.insecure_http and not is_loopback(host):
            raise ValueError(
                f"--listen {self.listen} is not a loopback address: serving it plain HTTP "
                "would send bearer tokens in clear; give --tls-cert/--tls-key (or "
                "--insecure-http behind a proxy that terminates TLS)"
            )
        return self


def reserve_reasons(text: str) -> frozenset[str]:
    """``"reserve pool|spares (rack 7)"`` -> both (a Slurm reason may hold a comma)."""
    return frozenset(r.strip() for r in text.split("|") if r.strip())


def listen_host(listen: str) -> str:
    """``"[::1]:8787"`` -> ``"::1"``; ``"0.0.0.0:8787"`` -> ``"0.0.0.0"``; no host: loopback."""
    host, _, _port = listen.rpartition(":")
    return host.strip("[]") or "127.0.0.1"


def parse_config(argv: Sequence[str] | None = None) -> BridgeConfig:
    """Flags (``argv``, else ``sys.argv[1:]``) over ``GPUHEAL_BRIDGE_*`` over defaults;
    a bad value exits with the reason, as argparse does."""
    try:
        return CliApp.run(BridgeConfig, cli_args=None if argv is None else list(argv))
    except ValidationError as exc:
        reasons = "; ".join(_reason(e["loc"], e["msg"]) for e in exc.errors())
        raise SystemExit(f"gpuheal-slurm-bridge: {reasons}") from None


def _reason(loc: tuple[int | str, ...], msg: str) -> str:
    """``("slurm_timeout",), "Input should be ..."`` -> ``--slurm-timeout: Input should be ...``"""
    msg = msg.removeprefix("Value error, ")
    flags = [f"--{str(x).replace('_', '-')}" for x in loc]
    return f"{'.'.join(flags)}: {msg}" if flags else msg
