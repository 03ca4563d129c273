"""`gpuheal`: run the operator, inject faults, read XIDs, see what it did and why.

Each subcommand imports only what it needs, when it runs: `gpuheal xid parse` never loads a
Kubernetes client.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

# (name, "module:function", help): the function registers the subcommand on `subparsers`.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("run", "gpuheal.cli.run:add_parser", "run the operator (kopf) against the current cluster"),
    ("agent", "gpuheal.agent.run:add_agent_parser", "the node agent: kernel log -> Events"),
    ("simulate", "gpuheal.cli.simulate:add_parser", "inject a fault the way a real producer would"),
    ("xid", "gpuheal.cli.xid:add_parser", "parse kernel logs for XIDs, explain an XID"),
    ("status", "gpuheal.cli.status:add_parser", "incidents (NodeRemediations) with their steps"),
    ("explain", "gpuheal.cli.explain:add_parser", "why gpuheal does what it does about a node"),
    ("history", "gpuheal.cli.history:add_parser", "repeat offenders: nodes and GPUs by faults"),
)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the subcommand it names is imported (the others are
    listed by name for --help)."""
    import importlib

    parser = argparse.ArgumentParser(prog="gpuheal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    known = {c[0] for c in _COMMANDS}
    chosen = next((a for a in argv or () if not a.startswith("-")), None)
    for name, target, help_ in _COMMANDS:
        if chosen not in known or chosen == name:
            module, _, function = target.partition(":")
            add: Callable[[Any], argparse.ArgumentParser] = getattr(
                importlib.import_module(module), function
            )
            add(sub)
        else:
            sub.add_parser(name, help=help_)  # listed in --help, not loaded
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    if args.command != "run":  # `run` sets up kopf's logging (plain or JSON) itself
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
