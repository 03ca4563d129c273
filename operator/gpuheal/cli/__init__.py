"""`gpuheal`: run the operator, inject faults, read XIDs, see what it did and why.

Also a kubectl plugin: installed, ``kubectl-gpuheal`` makes ``kubectl gpuheal status`` work.
Each subcommand imports only what it needs, when it runs: `gpuheal xid parse` never loads a
Kubernetes client. A mistake or a cluster that cannot be used is one ``error: ...`` line on
stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

# (name, "module:function", help): the function adds the subcommand's arguments to the parser
# made here, whose description is the module's docstring.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("run", "gpuheal.cli.run:add_arguments", "run the operator (kopf) against the current cluster"),
    (
        "agent",
        "gpuheal.agent.run:add_agent_arguments",
        "node agent: kernel log (and NVML) -> GPU fault Events and condition on this node",
    ),
    (
        "simulate",
        "gpuheal.cli.simulate:add_arguments",
        "inject GPU faults the way real producers do",
    ),
    ("xid", "gpuheal.cli.xid:add_arguments", "parse kernel logs for XIDs, explain an XID"),
    (
        "status",
        "gpuheal.cli.status:add_arguments",
        "incidents (NodeRemediations) with their steps and durations",
    ),
    ("explain", "gpuheal.cli.explain:add_arguments", "why gpuheal does what it does about a node"),
    (
        "history",
        "gpuheal.cli.history:add_arguments",
        "repeat offenders: nodes and GPUs by faults in a window",
    ),
)


def build_parser(argv: list[str] | None = None, prog: str = "gpuheal") -> argparse.ArgumentParser:
    """The parser; with `argv`, only the subcommand it names is imported (the others are
    listed by name for --help)."""
    import importlib

    from gpuheal.cli._common import Parser

    parser = Parser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    known = {c[0] for c in _COMMANDS}
    chosen = next((a for a in argv or () if not a.startswith("-")), None)
    for name, target, help_ in _COMMANDS:
        version_only = chosen is None and "--version" in (argv or ())
        if (chosen not in known and not version_only) or chosen == name:
            module_name, _, function = target.partition(":")
            module = importlib.import_module(module_name)
            add: Callable[[argparse.ArgumentParser], None] = getattr(module, function)
            add(sub.add_parser(name, help=help_, description=module.__doc__))
        else:
            sub.add_parser(name, help=help_)  # listed in --help, not loaded
    return parser


class _Version(argparse.Action):
    """``--version``, looked up only when asked (reading the package metadata takes time)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuheal")
    except PackageNotFoundError:  # run from a source tree
        return "unknown"


def main(argv: list[str] | None = None, prog: str = "gpuheal") -> int:
    from gpuheal.cli._common import CliError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv, prog).parse_args(argv)
    if args.command != "run":  # `run` sets up kopf's logging (plain or JSON) itself
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        rc: int = args.func(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C ends a watch: no traceback
        return 130
    except BrokenPipeError:  # `gpuheal status -w | head`
        sys.stderr.close()
        return 0
    return rc


def kubectl_main() -> int:
    """``kubectl-gpuheal``: the same commands, as ``kubectl gpuheal ...``."""
    return main(prog="kubectl gpuheal")


if __name__ == "__main__":
    sys.exit(main())
