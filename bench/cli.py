"""Start-up of the ``gpuheal`` command and what the operator's process imports.

``cli_start``: wall time and peak RSS of each subcommand from exec to exit, against the
interpreter's own start (``python -c pass``), and the RSS the operator's process pays for its
imports with kopf as it comes (importing every Kubernetes client it finds) and as ``gpuheal
run`` imports it (one client: kopf's transport).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, Context, Result, benchmark

TIME = "/usr/bin/time"  # GNU time (Debian package `time`)
KERNEL_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"

#: (variant, argv after the interpreter, stdin file or None)
COMMANDS: tuple[tuple[str, list[str], bool], ...] = (
    ("python -c pass (floor)", ["-c", "pass"], False),
    ("gpuheal xid explain 79", ["-m", "gpuheal", "xid", "explain", "79"], False),
    ("gpuheal xid parse < kern.log", ["-m", "gpuheal", "xid", "parse"], True),
    ("gpuheal status --help", ["-m", "gpuheal", "status", "--help"], False),
    ("gpuheal explain --help", ["-m", "gpuheal", "explain", "--help"], False),
    ("gpuheal simulate --help", ["-m", "gpuheal", "simulate", "--help"], False),
    ("gpuheal run --help", ["-m", "gpuheal", "run", "--help"], False),
)

#: The operator's imports, RSS after them (VmRSS, MiB).
IMPORTS = {
    "kopf as it comes (imports kubernetes + kubernetes_asyncio)": "import kopf",
    "kopf, generated clients hidden (what gpuheal run does)": (
        "from gpuheal.cli.run import hide_unused_clients; hide_unused_clients(); import kopf"
    ),
    "gpuheal run's modules, as gpuheal run imports them": (
        "from gpuheal.cli.run import hide_unused_clients; hide_unused_clients(); "
        "import gpuheal.handlers.lifecycle, gpuheal.remediation.service"
    ),
    "gpuheal run's modules with both generated clients loaded": (
        "import kubernetes.client, kubernetes_asyncio.client; "
        "import gpuheal.handlers.lifecycle, gpuheal.remediation.service"
    ),
}
RSS_PROBE = (
    "; print(next(int(l.split()[1]) for l in open('/proc/self/status') "
    "if l.startswith('VmRSS')) / 1024)"
)


def _run(argv: list[str], stdin: Path | None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one run. The peak comes from GNU time (``%M``): a
    child forked from this process would count this process's pages until its exec."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    with open(stdin or os.devnull, "rb") as inp:
        out = subprocess.run(
            [TIME, "-f", "%M", sys.executable, *argv],
            stdin=inp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
            check=True,
        )
    wall = time.perf_counter() - t0
    return wall, int(out.stderr.split()[-1]) / 1024


def _bytecode() -> dict[str, Any]:
    """Does the venv hold compiled bytecode (`uv sync --compile-bytecode`)?"""
    import kopf

    pkg = Path(kopf.__file__).parent
    return {
        "kopf_pyc_files": len(list(pkg.rglob("*.pyc"))),
        "kopf_py_files": len(list(pkg.rglob("*.py"))),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
    }


@benchmark("cli_start", title="gpuheal CLI start and the operator's import RSS", budget_s=60)
def cli_start(ctx: Context) -> Result:
    """Each subcommand started ``runs`` times (exec -> exit, ``os.wait4`` for peak RSS), with
    ``PYTHONDONTWRITEBYTECODE=1`` as on our machines and in the image: only bytecode compiled
    at install time (``uv sync --compile-bytecode``) helps. Then VmRSS after the operator's
    imports, with kopf as it comes and as ``gpuheal run`` imports it."""
    n = ctx.runs(10)
    series: dict[str, list[float]] = {}
    rss: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "kern.log"
        log.write_text(KERNEL_LINE * 50)
        for variant, argv, with_stdin in COMMANDS:
            _run(argv, log if with_stdin else None)  # warm the page cache
            for i in range(n):
                wall, peak = _run(argv, log if with_stdin else None)
                series.setdefault(variant, []).append(round(wall, 4))
                rss.setdefault(variant, []).append(round(peak, 1))
                if i == n - 1:
                    ctx.sample(variant, i, n, statistics.median(series[variant]),
                               f"(median), peak RSS {peak:.0f} MiB")  # fmt: skip
    imports: dict[str, list[float]] = {}
    for variant, code in IMPORTS.items():
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c", code + RSS_PROBE],
                capture_output=True,
                text=True,
                check=True,
                cwd=REPO,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
            imports.setdefault(variant, []).append(round(float(out.stdout.split()[-1]), 1))
        ctx.progress(f"{variant}: {statistics.median(imports[variant]):.1f} MiB")
    return Result(
        series=series,
        unit="s",
        extra_series={"peak RSS of the command (MiB)": rss, "RSS after imports (MiB)": imports},
        params={"bytecode": _bytecode(), "targets": {"cli_start_s": 0.5}},
        notes=[
            "Wall time from exec to exit on this machine; the floor is the interpreter itself.",
            "`gpuheal status|explain|simulate` load the `kubernetes` client when they talk to "
            "the cluster; their --help shows the start-up cost without a cluster.",
        ],
    )
