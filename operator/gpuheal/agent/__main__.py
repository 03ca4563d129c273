"""`python -m gpuheal.agent ...`: the agent without the rest of the CLI (no kopf import), which
is how the chart's DaemonSet starts it; `gpuheal agent ...` takes the same flags."""

from __future__ import annotations

import argparse
import logging
import sys

from gpuheal.agent.run import add_agent_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuheal")
    add_agent_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
