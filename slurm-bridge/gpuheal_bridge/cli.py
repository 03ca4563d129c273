"""``gpuheal-slurm-bridge``: run the bridge (uvicorn) next to slurmctld.

Flags and ``GPUHEAL_BRIDGE_*`` variables are :class:`~gpuheal_bridge.config.BridgeConfig`;
this module turns them into a backend, the app's settings, and a running server. The
bridge refuses to start without a bearer token, or on an address off loopback without TLS
(unless told ``--insecure-http``). SIGHUP reads the tokens again (``--token-file`` and
``$GPUHEAL_BRIDGE_TOKENS``) without a restart; the slurmrestd JWT (``--rest-token-file``) is
read again whenever its file changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from gpuheal_bridge.backends.base import Backend
from gpuheal_bridge.backends.capabilities import Discovered, discover, refusal, summary
from gpuheal_bridge.backends.cli import CliBackend
from gpuheal_bridge.backends.rest import JwtFile, RestBackend
from gpuheal_bridge.config import BridgeConfig, listen_host, parse_config, reserve_reasons
from gpuheal_bridge.exclusions import ExclusionLedger
from gpuheal_bridge.nodemap import NodeMapper
from gpuheal_bridge.operations import Operations
from gpuheal_bridge.server.app import BridgeSettings, create_app
from gpuheal_bridge.server.auth import Token, load_tokens

log = logging.getLogger("gpuheal_bridge")


def build_backend(config: BridgeConfig) -> Backend:
    timeout = config.slurm_timeout
    cli = CliBackend(slurm_conf=config.slurm_conf, bin_dir=config.slurm_bin_dir, timeout=timeout)
    if config.backend == "cli":
        return cli
    assert config.rest_url is not None  # BridgeConfig refuses rest without --rest-url
    # Read again whenever the file changes (a rotated JWT needs no restart).
    token = JwtFile(config.rest_token_file) if config.rest_token_file else None
    return RestBackend(
        config.rest_url,
        user=config.rest_user,
        token=token,
        api_version=config.rest_api_version,
        timeout=timeout,
        fallback=cli if config.rest_write_fallback == "cli" else None,
    )


def build_settings(config: BridgeConfig) -> BridgeSettings:
    def read_tokens() -> dict[str, Token]:
        return load_tokens(config.token_file)

    tokens = read_tokens()
    if not tokens:
        raise SystemExit("no bearer tokens: set --token-file or $GPUHEAL_BRIDGE_TOKENS")
    backend = build_backend(config)
    mapper = NodeMapper.from_files(
        template=config.node_map_template,
        regex=config.node_map_regex,
        table_file=config.node_map_table,
        table_only=config.node_map_table_only,
        allowed=config.allowed_nodes,
    )
    if mapper.allowed is None:
        log.warning(
            "no --allowed-nodes: every node of the Slurm cluster may be drained, resumed, "
            "rebooted and have its jobs requeued by a token with the scope; give the nodes "
            "gpuheal manages (a Slurm hostlist, e.g. gpu-[01-64])"
        )
    else:
        log.info("allowed nodes: %s (%d)", config.allowed_nodes, len(mapper.allowed))
    ops = Operations(
        backend,
        expedite_timeout=config.expedite_timeout,
        settle_timeout=config.settle_timeout,
        exclusions=ExclusionLedger.in_dir(config.state_dir),
        reserve_reasons=reserve_reasons(config.reserve_reasons),
    )
    return BridgeSettings(
        backend=backend,
        tokens=tokens,
        state_dir=config.state_dir,
        audit_log=config.audit_log or config.state_dir / "audit.jsonl",
        node_mapper=mapper,
        idempotency_ttl=config.idempotency_ttl,
        operations=ops,
        remote_plain_http=config.insecure_http,
        health_interval=config.health_interval,
        reload_tokens=read_tokens,
    )


def check_capabilities(config: BridgeConfig) -> Discovered:
    """What the configured backend can do on its Slurm, logged in one line; exits with one
    line when it cannot requeue there (read with a backend of its own, closed after)."""

    async def read() -> Discovered:
        backend = build_backend(config)
        try:
            return await discover(backend)
        finally:
            await backend.aclose()

    found = asyncio.run(read())
    logging.getLogger("gpuheal_bridge").info("%s", summary(found))
    if (why := refusal(found)) is not None:
        raise SystemExit(f"gpuheal-slurm-bridge: {why}")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    config = parse_config(argv)
    for flag, path in (("--tls-cert", config.tls_cert), ("--tls-key", config.tls_key)):
        if path is not None and not os.access(path, os.R_OK):
            raise SystemExit(f"gpuheal-slurm-bridge: {flag} {path}: not a readable file")
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    _host, _, port = config.listen.rpartition(":")
    settings = build_settings(config)  # first: no tokens is refused before Slurm is asked
    check_capabilities(config)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=listen_host(config.listen),
        port=int(port),
        ssl_certfile=config.tls_cert,
        ssl_keyfile=config.tls_key,
        log_level=config.log_level.lower(),
        access_log=False,  # the audit log records mutations; metrics count everything
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
