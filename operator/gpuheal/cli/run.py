"""`gpuheal run`: the operator. Every flag also reads ``GPUHEAL_<FLAG>`` from the
environment (the Helm chart sets those)."""

from __future__ import annotations

import argparse
from typing import Any

from gpuheal.config import add_run_arguments, config_from_args


def _run(args: argparse.Namespace) -> int:
    from gpuheal.handlers.lifecycle import configure_logging, run

    cfg = config_from_args(args)
    configure_logging(cfg.log_format, cfg.verbose)
    run(cfg)
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run the operator (kopf) against the current cluster",
        description=__doc__,
    )
    add_run_arguments(parser)
    parser.set_defaults(func=_run)
    return parser
