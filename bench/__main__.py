"""``python -m bench [NAME ...] [--runs N] [--list] [--out DIR]``: run benchmarks, write
``<out>/<name>.json`` and ``<out>/<name>.png`` for each (default: all, ``bench/out``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import MODULES
from bench.harness import REGISTRY, run_benchmarks

DEFAULT_OUT = Path(__file__).resolve().parent / "out"


def main(argv: Sequence[str] | None = None) -> int:
    for module in MODULES:
        importlib.import_module(module)
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all): {list(REGISTRY)}")
    p.add_argument("--runs", type=int, help="runs per variant instead of each default")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--keep-scratch", action="store_true", help="keep temporary directories")
    args = p.parse_args(argv)
    if args.list:
        for name, b in REGISTRY.items():
            print(f"{name:<24} ~{b.budget_s:>4.0f} s  {b.title}")
        return 0
    unknown = [n for n in args.names if n not in REGISTRY]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; known: {list(REGISTRY)}")
    names = args.names or list(REGISTRY)
    docs = run_benchmarks(
        names,
        out_dir=args.out,
        runs=args.runs,
        echo=lambda m: print(m, flush=True),
        keep_scratch=args.keep_scratch,
    )
    return 0 if len(docs) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
