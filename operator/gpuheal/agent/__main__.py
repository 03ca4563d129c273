"""`python -m gpuheal.agent ...`: the agent without the rest of the CLI (no kopf import), which
is how the chart's DaemonSet starts it; `gpuheal agent ...` takes the same flags."""

from __future__ import annotations

import argparse
import logging
import sys

from gpuheal.agent import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuheal agent", description=run.__doc__)
    run.add_agent_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
