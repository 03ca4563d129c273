"""Settings of `gpuheal run`: one pydantic-settings model for the flags and the
``GPUHEAL_<FLAG>`` variables (``--bridge-url`` is also ``$GPUHEAL_BRIDGE_URL``; a flag wins).

The Helm chart sets the variables; keep the names.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpuheal import crashpoints

if TYPE_CHECKING:
    from gpuheal.api.remediationpolicy import NotifyEvent, NotifyFormat

SOURCES = ("conditions", "events", "dcgm")
DEFAULT_SOURCES = ("conditions", "events")  # dcgm needs --dcgm-namespace
ENV_PREFIX = "GPUHEAL_"
# Copies of API names (gpuheal.api.*), kept literal so that `gpuheal run --help` does not load
# the CRD models; tests/unit/test_slurm_clusters.py checks that they agree.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SLURM_CLUSTER_LABEL = "gpuheal.io/slurm-cluster"
NOTIFY_EVENTS = "Opened,Blocked,ApprovalPending,Completed,Failed,DomainOpened"
AGENT_REPORTER = "gpuheal-agent"  # gpuheal.policy.trust.AGENT_REPORTER


ListenPort = Annotated[int, Field(ge=0, le=65535)]
"""A port the operator serves on; 0: that endpoint is off."""


class OperatorConfig(BaseSettings):
    """gpuheal run: watch GPU nodes, remediate faults as RemediationPolicies say."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    metrics_port: ListenPort = Field(9090, description="Prometheus /metrics port (0: off)")
    health_port: ListenPort = Field(8080, description="liveness probe port, path /healthz (0: off)")
    ready_port: ListenPort = Field(
        0,
        description="readiness port, path /readyz: 503 with the reasons while a bridge refuses "
        "the token or cannot be reached, or the API server forbids a list/watch (0: off)",
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
    bridge_cluster: str = Field(
        "default",
        pattern=DNS_LABEL_PATTERN,
        description="name of the Slurm cluster --bridge-url serves (a node labelled with "
        "another name uses that cluster's bridge from --bridges-file)",
    )
    bridges_file: str | None = Field(
        None,
        description="YAML file naming more Slurm clusters and their bridges: clusters: {NAME: "
        "{url, tokenFile, caFile}}; a node's cluster is its --slurm-cluster-label label, "
        "else its policy's spec.slurmCluster, else --bridge-cluster",
    )
    slurm_cluster_label: str = Field(
        SLURM_CLUSTER_LABEL, description="node label that names the node's Slurm cluster"
    )
    notify_webhooks: str | None = Field(
        None,
        description="webhooks told when an incident opens, is blocked, needs approval, "
        "completes or fails, comma-separated: a URL or secret:NAME/KEY (the URL in that key "
        "of a Secret in --namespace, read at each send); 'slack:' before one sends "
        "Slack-compatible messages (a policy's spec.notifications adds its own)",
    )
    notify_events: str = Field(
        NOTIFY_EVENTS,
        description="which transitions --notify-webhooks receive, comma-separated",
    )
    notify_queue_size: int = Field(
        100, ge=1, le=100_000, description="messages queued per webhook; more are dropped"
    )
    notify_retries: int = Field(
        3, ge=0, le=10, description="retries of a message (connection error, 429, 5xx)"
    )
    notify_timeout: float = Field(5.0, gt=0, description="seconds allowed per webhook call")
    sources: Annotated[frozenset[str], NoDecode] = Field(
        frozenset(DEFAULT_SOURCES),
        description="detection sources, comma-separated: conditions,events,dcgm (dcgm needs "
        "--dcgm-namespace)",
    )
    trusted_reporters: Annotated[frozenset[str], NoDecode] = Field(
        frozenset({AGENT_REPORTER}),
        description="reporters (an Event's source.component / reportingComponent) whose Events "
        "may start a remediation, comma-separated; an Event naming any other starts nothing "
        "(a Warning names it). Trust only names an admission policy reserves: "
        "docs/security.md",
    )
    node_jobs_namespace: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="namespace of the Job hooks and checks whose policy names none (the "
        "chart's <release>-node-jobs: no Secrets there, and its admission policy admits only "
        "the chart's node Jobs from the operator)",
    )
    inline_job_templates: bool = Field(
        False,
        description="run Job hooks and checks a policy gives inline (hook.job.template); off: "
        "such a reset or reboot is skipped and such a check fails, no Job is created (an "
        "inline template lets a policy writer run any pod on a node: docs/security.md)",
    )
    event_namespace: str = Field(
        "default",
        pattern=DNS_LABEL_PATTERN,
        description="the one namespace whose Events about Nodes are read (where the kubelet, "
        "node-problem-detector and the agent post them); an Event about a Node in any other "
        "namespace starts nothing: docs/security.md",
    )
    dcgm_namespace: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description="namespace of the dcgm-exporter pods (required with the dcgm source)",
    )
    dcgm_daemonset: str = Field(
        "nvidia-dcgm-exporter",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="the DaemonSet in --dcgm-namespace whose pods are scraped (their "
        "controller); other pods with the label are ignored",
    )
    dcgm_selector: str = Field(
        "app=nvidia-dcgm-exporter", description="label selector of the dcgm-exporter pods"
    )
    dcgm_interval: float = Field(15.0, gt=0, description="seconds between dcgm-exporter scrapes")
    dcgm_port: int = Field(9400, ge=1, le=65535, description="dcgm-exporter's metrics port")
    dcgm_timeout: float = Field(5.0, gt=0, description="seconds allowed per scrape")
    dcgm_max_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="bytes a scrape may return; a bigger body is a failed scrape",
    )
    dcgm_scheme: Literal["http", "https"] = Field(
        "http", description="http, or https where the exporter serves TLS (--web-config-file)"
    )
    dcgm_ca_file: str | None = Field(
        None, description="CA bundle (PEM) of the exporters' TLS certificates (https)"
    )
    dcgm_server_name: str | None = Field(
        None,
        description="name the exporters' certificate must carry (https; a pod is reached by "
        "its address, which certificates seldom name)",
    )
    dcgm_token_file: str | None = Field(
        None,
        description="file holding a bearer token sent to the exporters (https only; e.g. a "
        "kube-rbac-proxy in front of them), read again when it changes",
    )
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
    crash_at: str | None = Field(
        None,
        description="TEST ONLY, never in production: exit hard (code 86) at this crash point, "
        "e.g. cordon.after or status.before:3 (docs/reliability.md)",
    )

    @field_validator("notify_webhooks")
    @classmethod
    def _webhooks(cls, value: str | None) -> str | None:
        if value is not None:
            parse_webhooks(value)
        return value

    @field_validator("notify_events")
    @classmethod
    def _events(cls, value: str) -> str:
        parse_events(value)
        return value

    @field_validator("crash_at")
    @classmethod
    def _crash_at(cls, value: str | None) -> str | None:
        if value:
            crashpoints.parse(value)
        return value or None

    @field_validator("trusted_reporters", mode="before")
    @classmethod
    def _trusted_reporters(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {r.strip() for r in value.split(",") if r.strip()}
        return frozenset(value)

    @model_validator(mode="after")
    def _dcgm(self) -> OperatorConfig:
        if "dcgm" in self.sources and not self.dcgm_namespace:
            raise ValueError(
                "--dcgm-namespace: required with the dcgm source (the namespace of the "
                "dcgm-exporter DaemonSet; a pod elsewhere with its label must not speak for a "
                "node)"
            )
        if self.dcgm_token_file and self.dcgm_scheme != "https":
            raise ValueError("--dcgm-token-file: only with --dcgm-scheme https")
        return self

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


#: ``secret:NAME/KEY`` in --notify-webhooks: the URL is that key of a Secret in --namespace.
_SECRET_ITEM = re.compile(r"^secret:([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/([-._a-zA-Z0-9]+)$")


def parse_webhooks(text: str) -> list[tuple[NotifyFormat, str]]:
    """``"slack:https://hooks.slack.com/x,secret:gpuheal-notify/ops"`` -> formats and URLs
    (or ``secret:NAME/KEY``: that key of a Secret in the operator's namespace).

    An item that is neither is named by its place, not by its text: it may be a credential."""
    from gpuheal.api.remediationpolicy import NotifyFormat

    out = []
    for place, item in enumerate((i.strip() for i in text.split(",")), start=1):
        if not item:
            continue
        fmt, url = NotifyFormat.GENERIC, item
        prefix, _, rest = item.partition(":")
        if prefix in ("slack", "generic"):
            fmt, url = NotifyFormat(prefix.capitalize()), rest
        if not (re.match(r"^https?://[^/\s]+", url) or _SECRET_ITEM.match(url)):
            raise ValueError(
                f"webhook {place} is neither an http(s) URL nor secret:NAME/KEY "
                "(optionally after 'slack:' or 'generic:')"
            )
        out.append((fmt, url))
    return out


def secret_item(url: str) -> tuple[str, str] | None:
    """``secret:NAME/KEY`` -> (NAME, KEY); None for a URL."""
    found = _SECRET_ITEM.match(url)
    return (found.group(1), found.group(3)) if found else None


def parse_events(text: str) -> frozenset[NotifyEvent]:
    from gpuheal.api.remediationpolicy import NotifyEvent

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in NotifyEvent._value2member_map_]
    if unknown:
        raise ValueError(
            f"unknown event(s) {unknown}; choose from {','.join(e.value for e in NotifyEvent)}"
        )
    return frozenset(NotifyEvent(n) for n in names)


class BridgeTarget(BaseModel):
    """One Slurm cluster's bridge: where it is, the token it accepts, the CA that signed it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    url: str = Field(pattern=r"^https?://", description="the bridge's base URL")
    token_file: str | None = Field(None, description="file holding the bearer token")
    ca_file: str | None = Field(None, description="CA bundle (PEM) of its TLS certificate")


class BridgesFile(BaseModel):
    """``--bridges-file``: ``clusters: {NAME: {url, tokenFile, caFile}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: dict[str, BridgeTarget] = Field(default_factory=dict)

    @field_validator("clusters")
    @classmethod
    def _names(cls, value: dict[str, BridgeTarget]) -> dict[str, BridgeTarget]:
        bad = [n for n in value if not re.fullmatch(DNS_LABEL_PATTERN, n)]
        if bad:
            raise ValueError(f"cluster names must be DNS labels: {', '.join(map(repr, bad))}")
        return value


def bridge_targets(cfg: OperatorConfig) -> dict[str, BridgeTarget]:
    """Every Slurm cluster the operator serves, by name: ``--bridge-url`` as
    ``--bridge-cluster``, then those of ``--bridges-file`` (a name in both is refused)."""
    targets: dict[str, BridgeTarget] = {}
    if cfg.bridge_url:
        targets[cfg.bridge_cluster] = BridgeTarget(
            url=cfg.bridge_url, token_file=cfg.bridge_token_file, ca_file=cfg.bridge_ca_file
        )
    if cfg.bridges_file:
        import yaml

        try:
            doc = yaml.safe_load(Path(cfg.bridges_file).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(str(exc)) from None
        more = BridgesFile.model_validate(doc).clusters
        twice = sorted(set(more) & set(targets))
        if twice:
            raise ValueError(f"cluster {twice[0]!r} is --bridge-cluster and in the file")
        targets.update(more)
    return targets


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
        cfg = OperatorConfig(**given)
    except ValidationError as exc:
        reasons = "; ".join(
            (f"--{str(e['loc'][0]).replace('_', '-')}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()  # a rule over several flags names them itself
        )
        raise SystemExit(f"error: {reasons}") from None
    try:
        bridge_targets(cfg)
    except ValidationError as exc:
        why = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise SystemExit(f"error: --bridges-file {cfg.bridges_file}: {why}") from None
    except (OSError, ValueError) as exc:
        why = " ".join(str(exc).split())
        raise SystemExit(f"error: --bridges-file {cfg.bridges_file}: {why}") from None
    return cfg
