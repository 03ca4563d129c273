"""``gpuheal-slurm-bridge``: run the bridge (uvicorn) next to slurmctld.

Every flag has an environment variable (``GPUHEAL_BRIDGE_<FLAG>``, e.g.
``GPUHEAL_BRIDGE_LISTEN=0.0.0.0:8787``); flags win. Tokens come from ``--token-file``
(lines ``name:token``) and/or ``$GPUHEAL_BRIDGE_TOKENS``; the bridge refuses to start
without any.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuheal_bridge.backends.base import Backend
from gpuheal_bridge.backends.cli import CliBackend
from gpuheal_bridge.backends.rest import RestBackend
from gpuheal_bridge.nodemap import NodeMapper
from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from gpuheal_bridge.server.auth import load_tokens

ENV_PREFIX = "GPUHEAL_BRIDGE_"


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuheal-slurm-bridge",
        description="Authenticated HTTP API to drain/resume Slurm nodes and requeue their jobs.",
    )

    def opt(
        flag: str, help_: str, default: str | None = None, choices: list[str] | None = None
    ) -> None:
        name = flag.lstrip("-")
        p.add_argument(
            flag,
            default=_env(name, default),
            help=f"{help_} [${ENV_PREFIX}{name.upper().replace('-', '_')}]",
            choices=choices,
        )

    opt("--listen", "host:port to listen on", "127.0.0.1:8787")
    opt("--token-file", "file with bearer tokens, one 'name:token' per line")
    opt("--tls-cert", "TLS certificate (PEM); serve HTTPS when set with --tls-key")
    opt("--tls-key", "TLS private key (PEM)")
    opt("--backend", "cli or rest", "cli", choices=["cli", "rest"])
    opt("--slurm-conf", "slurm.conf for the Slurm commands (else $SLURM_CONF / default)")
    opt("--slurm-bin-dir", "directory of scontrol/squeue/scancel (else PATH)")
    opt("--slurm-timeout", "seconds allowed per Slurm call", "15")
    opt("--rest-url", "slurmrestd URL: http(s)://host:port or unix:/path/to.sock")
    opt("--rest-user", "X-SLURM-USER-NAME for JWT auth", "root")
    opt("--rest-token-file", "file holding the slurmrestd JWT")
    opt("--rest-api-version", "force an API version, e.g. v0.0.40 (default: newest offered)")
    opt(
        "--rest-write-fallback",
        "'cli': do what slurmrestd cannot with scontrol",
        "none",
        choices=["none", "cli"],
    )
    opt("--state-dir", "directory for the idempotency store", "/var/lib/gpuheal-bridge")
    opt("--audit-log", "JSON-lines audit log (default: STATE_DIR/audit.jsonl)")
    opt("--idempotency-ttl", "seconds to keep idempotent results", "86400")
    opt("--node-map-template", "Slurm name template, e.g. '{short}' (groups of the regex)")
    opt("--node-map-regex", "regex applied to the Kubernetes node name, e.g. '^(?P<short>[^.]+)'")
    opt("--node-map-table", "file: JSON object or 'k8s-name slurm-name' lines")
    opt("--node-map-table-only", "only names in the table are Slurm nodes ('1' to enable)", "0")
    opt("--expedite-timeout", "seconds to wait for PENDING/BeginTime before StartTime=now", "15")
    opt("--settle-timeout", "seconds to wait for a requeued job to leave COMPLETING", "30")
    opt("--log-level", "debug, info, warning", "info")
    return p


def build_backend(args: argparse.Namespace) -> Backend:
    timeout = float(args.slurm_timeout)
    cli = CliBackend(slurm_conf=args.slurm_conf, bin_dir=args.slurm_bin_dir, timeout=timeout)
    if args.backend == "cli":
        return cli
    if not args.rest_url:
        raise SystemExit("--backend rest needs --rest-url")
    token = Path(args.rest_token_file).read_text().strip() if args.rest_token_file else None
    return RestBackend(
        args.rest_url,
        user=args.rest_user,
        token=token,
        api_version=args.rest_api_version,
        timeout=timeout,
        fallback=cli if args.rest_write_fallback == "cli" else None,
    )


def build_settings(args: argparse.Namespace) -> BridgeSettings:
    tokens = load_tokens(args.token_file)
    if not tokens:
        raise SystemExit("no bearer tokens: set --token-file or $GPUHEAL_BRIDGE_TOKENS")
    backend = build_backend(args)
    state_dir = Path(args.state_dir)
    mapper = NodeMapper.from_files(
        template=args.node_map_template,
        regex=args.node_map_regex,
        table_file=args.node_map_table,
        table_only=args.node_map_table_only in ("1", "true", "yes"),
    )
    ops = Operations(
        backend,
        expedite_timeout=float(args.expedite_timeout),
        settle_timeout=float(args.settle_timeout),
    )
    return BridgeSettings(
        backend=backend,
        tokens=tokens,
        state_dir=state_dir,
        audit_log=Path(args.audit_log) if args.audit_log else state_dir / "audit.jsonl",
        node_mapper=mapper,
        idempotency_ttl=float(args.idempotency_ttl),
        operations=ops,
    )


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    host, _, port = args.listen.rpartition(":")
    app = create_app(build_settings(args))
    uvicorn.run(
        app,
        host=host.strip("[]") or "127.0.0.1",
        port=int(port),
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        log_level=args.log_level.lower(),
        access_log=False,  # the audit log records mutations; metrics count everything
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
