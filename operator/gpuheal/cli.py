"""`gpuheal` command line: run the operator, inject faults, read XIDs, inspect incidents."""

from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    from gpuheal.inspect import add_explain_parser, add_status_parser
    from gpuheal.operator import add_run_parser
    from gpuheal.simulate import add_simulate_parser
    from gpuheal.xid.cli import add_parser as add_xid_parser

    parser = argparse.ArgumentParser(prog="gpuheal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    add_simulate_parser(sub)
    add_xid_parser(sub)
    add_status_parser(sub)
    add_explain_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "run":  # `run` sets up kopf's logging (plain or JSON) itself
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
