"""The benchmark harness: registry, context, statistics, JSON output, machine facts.

A benchmark is one function registered with :func:`benchmark`; it gets a :class:`Context`
(where to put scratch files, how many runs, a ``progress`` printer) and returns a
:class:`Result` whose ``series`` map a variant name to its samples. The runner adds the machine
facts, computes the statistics, writes ``<out>/<name>.json`` and draws ``<out>/<name>.png``
(the default plot shows every sample per variant with its median; pass ``plot=`` for another).

    @benchmark("fault_to_running", title="Fault -> job RUNNING from checkpoint", budget_s=300)
    def fault_to_running(ctx: Context) -> Result:
        n = ctx.runs(10)                      # --runs overrides the default
        samples = []
        for i in range(n):
            samples.append(measure_one())
            ctx.sample("scontrol", i, n, samples[-1])
        return Result(series={"scontrol": samples}, unit="s")

Modules holding benchmarks are listed in ``bench.MODULES``; importing them registers them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "gpuheal-bench/1"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """What a benchmark measured. ``series``: variant -> samples (in ``unit``); ``params``: the
    knobs it ran with; ``runs``: per-run details (any JSON); ``notes``: caveats for readers."""

    series: dict[str, list[float]]
    unit: str = "s"
    params: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: optional: a second set of series shown next to the main one (e.g. a breakdown)
    extra_series: dict[str, dict[str, list[float]]] = field(default_factory=dict)


PlotFn = Callable[[dict[str, Any], Path], None]


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    fn: Callable[[Context], Result]
    description: str
    budget_s: float  # expected wall time with default runs, for the runner's estimate
    plot: PlotFn | None = None
    needs: tuple[str, ...] = ()  # e.g. ("slurm",); the runner checks what it can


REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    *,
    title: str,
    budget_s: float,
    plot: PlotFn | None = None,
    needs: Sequence[str] = (),
) -> Callable[[Callable[[Context], Result]], Callable[[Context], Result]]:
    """Register ``fn`` as benchmark ``name`` (its docstring is the description)."""

    def register(fn: Callable[[Context], Result]) -> Callable[[Context], Result]:
        if name in REGISTRY:
            raise ValueError(f"benchmark {name!r} registered twice")
        REGISTRY[name] = Benchmark(
            name=name,
            title=title,
            fn=fn,
            description=(fn.__doc__ or "").strip(),
            budget_s=budget_s,
            plot=plot,
            needs=tuple(needs),
        )
        return fn

    return register


class Context:
    """What a benchmark gets: scratch space, run counts, progress output."""

    def __init__(
        self,
        name: str,
        *,
        out_dir: Path,
        runs: int | None,
        scratch: Path,
        echo: Callable[[str], None] = print,
    ) -> None:
        self.name = name
        self.out_dir = out_dir
        self.runs_override = runs
        self.scratch = scratch
        self._echo = echo
        self._t0 = time.monotonic()

    def runs(self, default: int) -> int:
        """``--runs`` when given, else the benchmark's default."""
        return self.runs_override or default

    def progress(self, msg: str) -> None:
        self._echo(f"  [{self.name} {time.monotonic() - self._t0:6.1f}s] {msg}")

    def sample(self, variant: str, i: int, n: int, value: float, detail: str = "") -> None:
        self.progress(f"{variant}: run {i + 1}/{n}: {value:.3f} s {detail}".rstrip())

    def tmpdir(self, prefix: str) -> Path:
        """A fresh short directory (Slurm roots must be short: unix socket paths)."""
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.scratch))


# ---- statistics -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]), NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, Any]:
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "samples": []}
    return {
        "n": len(vals),
        "median": statistics.median(vals),
        "mean": statistics.fmean(vals),
        "min": min(vals),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
        "max": max(vals),
        "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "samples": vals,
    }


# ---- machine facts --------------------------------------------------------------------------


def _first_line(cmd: Sequence[str]) -> str | None:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if out.returncode == 0 and text else None


def _proc_field(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    mem = _proc_field("/proc/meminfo", "MemTotal")
    commit = _first_line(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = _first_line(["git", "-C", str(REPO), "status", "--porcelain", "--", "bench"])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name"),
        "memory_total_mib": int(mem.split()[0]) // 1024 if mem else None,
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],  # per benchmark
        "kernel": platform.release(),
        "os": _os_name() or platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "numpy": _version("numpy"),
            "matplotlib": _version("matplotlib"),
            "kopf": _version("kopf"),
            "fastapi": _version("fastapi"),
            "uvicorn": _version("uvicorn"),
            # Slurm clients need a config even for --version: ask the package manager
            "slurm": _first_line(["dpkg-query", "-W", "-f", "${Version}", "slurm-client"]),
        },
        "gpuheal_commit": commit,
        "bench_dirty": bool(dirty),
        # uncommitted changes to the code under test (others work in the same tree)
        "operator_dirty": _dirty_paths("operator", "slurm-bridge"),
    }


def _dirty_paths(*paths: str) -> list[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", *paths],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.splitlines() if line.strip()]


def _os_name() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        return None
    return None


# ---- running ------------------------------------------------------------------------------


def result_document(
    bench: Benchmark, result: Result, started: float, duration: float, machine: dict[str, Any]
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "name": bench.name,
        "title": bench.title,
        "description": bench.description,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_seconds": round(duration, 2),
        "machine": machine,
        "unit": result.unit,
        "params": result.params,
        "series": {k: summarize(v) for k, v in result.series.items()},
        "extra_series": {
            group: {k: summarize(v) for k, v in series.items()}
            for group, series in result.extra_series.items()
        },
        "runs": result.runs,
        "notes": result.notes,
    }


def run_benchmarks(
    names: Sequence[str],
    *,
    out_dir: Path,
    runs: int | None = None,
    echo: Callable[[str], None] = print,
    keep_scratch: bool = False,
) -> list[dict[str, Any]]:
    """Run the named benchmarks in order; write JSON + PNG for each; return the documents.

    A benchmark that raises is reported and skipped (its previous output is left alone);
    the others still run.
    """
    from bench.plots import default_plot

    out_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    echo(
        f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_total_mib']} MiB, load {machine['load_avg_at_start']}, "
        f"{machine['versions']['slurm']}, commit {str(machine['gpuheal_commit'])[:10]}"
    )
    total = sum(REGISTRY[n].budget_s for n in names)
    echo(f"running {len(names)} benchmark(s): {', '.join(names)} (about {total / 60:.0f} min)")
    docs: list[dict[str, Any]] = []
    failed: list[str] = []
    for k, name in enumerate(names, 1):
        bench = REGISTRY[name]
        echo(f"[{k}/{len(names)}] {name}: {bench.title} (about {bench.budget_s:.0f} s)")
        scratch = Path(tempfile.mkdtemp(prefix=f"ghb-{name[:8]}-"))
        ctx = Context(name, out_dir=out_dir, runs=runs, scratch=scratch, echo=echo)
        started, t0 = time.time(), time.monotonic()
        load = [round(x, 2) for x in os.getloadavg()]
        try:
            result = bench.fn(ctx)
        except Exception as exc:  # report, keep going with the others
            echo(f"[{k}/{len(names)}] {name} FAILED: {type(exc).__name__}: {exc}")
            echo(f"  scratch kept for inspection: {scratch}")
            failed.append(name)
            continue
        duration = time.monotonic() - t0
        doc = result_document(
            bench,
            result,
            started,
            duration,
            {
                **machine,
                "load_avg_at_start": load,
                "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            },
        )
        json_path = out_dir / f"{name}.json"
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
        png_path = out_dir / f"{name}.png"
        (bench.plot or default_plot)(doc, png_path)
        echo(f"[{k}/{len(names)}] {name} done in {duration:.0f} s -> {json_path}, {png_path}")
        for variant, s in doc["series"].items():
            if s["n"]:
                echo(
                    f"    {variant:<40} n={s['n']:<3} median {s['median']:.3f} "
                    f"max {s['max']:.3f} {doc['unit']}"
                )
        docs.append(doc)
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = write_summary(out_dir)
    echo(f"summary of every benchmark in {out_dir}: {summary}")
    if failed:
        echo(f"FAILED: {', '.join(failed)}")
    return docs


def summary_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """A Markdown table per benchmark document: variant, n, median, p90, max (+ extras)."""
    out = []
    for doc in docs:
        m = doc["machine"]
        out.append(f"### {doc['title']} (`{doc['name']}`)\n")
        out.append(
            f"{doc['started_at']}, {m['nproc']} CPUs ({m.get('cpu_model')}), "
            f"{m.get('memory_total_mib')} MiB, load at start {m.get('load_avg_at_start')}, "
            f"Slurm {m['versions'].get('slurm')}, commit `{str(m.get('gpuheal_commit'))[:10]}`. "
            f"Unit: {doc['unit']}.\n"
        )
        extras = list(doc.get("extra_series", {}))
        head = ["variant", "n", "median", "p90", "max", *(f"{e} median" for e in extras)]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for variant, s in doc["series"].items():
            if not s.get("n"):
                continue
            row = [variant, str(s["n"]), f"{s['median']:.2f}", f"{s['p90']:.2f}", f"{s['max']:.2f}"]
            for e in extras:
                es = doc["extra_series"][e].get(variant, {})
                row.append(f"{es['median']:.2f}" if es.get("n") else "")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out.extend(f"- {note}" for note in doc.get("notes", []))
        out.append(f"\n![{doc['name']}](out/{doc['name']}.png)\n")
    return "\n".join(out)


def write_summary(out_dir: Path) -> Path:
    """``<out_dir>/SUMMARY.md`` from every ``*.json`` result there."""
    docs = []
    for path in sorted(out_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("schema") == SCHEMA:
            docs.append(doc)
    target = out_dir / "SUMMARY.md"
    target.write_text("# Benchmark results\n\n" + summary_markdown(docs))
    return target
