"""gpuheal benchmarks: ``python -m bench`` (``make bench``) runs them, writes ``bench/out/``.

Add a benchmark: write a function ``(ctx: Context) -> Result`` decorated with
``@benchmark(name, title=..., budget_s=...)`` in a module listed in ``MODULES`` (see
``bench/harness.py`` and ``bench/README.md``).
"""

#: Modules whose import registers benchmarks, in the order they run.
MODULES = (
    "bench.cli",
    "bench.recovery",
    "bench.bridge",
    "bench.operator",
    "bench.demo",
    "bench.faults",
)
