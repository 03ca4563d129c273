"""`gpuheal run`: the operator. Every flag also reads ``GPUHEAL_<FLAG>`` from the
environment (the Helm chart sets those)."""

from __future__ import annotations

import argparse
import sys

from gpuheal.config import add_run_arguments, config_from_args

#: Kubernetes client libraries the distribution installs for other commands (`gpuheal status`
#: and `explain` use `kubernetes`, `gpuheal agent` uses `kubernetes_asyncio`). kopf imports
#: every one it finds installed, only to recognise their model objects, which the operator
#: never hands it; the operator's own client is kopf's transport (`gpuheal.adapters.kube`).
#: Hidden from this process they cost nothing: 56 MiB less RSS (README "Speed and memory").
UNUSED_CLIENTS = ("kubernetes", "kubernetes_asyncio")


def hide_unused_clients() -> None:
    """Make ``import kubernetes`` / ``import kubernetes_asyncio`` fail in this process (kopf
    then skips them). Only before anything imported them."""
    for name in UNUSED_CLIENTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def _run(args: argparse.Namespace) -> int:
    hide_unused_clients()
    from gpuheal.handlers.lifecycle import configure_logging, run

    cfg = config_from_args(args)
    configure_logging(cfg.log_format, cfg.verbose)
    run(cfg)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.set_defaults(func=_run)
