"""`make integration` relies on `--dist loadgroup` to keep each `xdist_group` on one worker: the
real-node modules share the host's /dev/kmsg, and the e2e module's sandbox is built once per
worker that runs one of its tests. pytest 9.2 renamed the attribute pytest-xdist 3.8 rewrites to
tag a test with its group, and grouping stopped without an error (each e2e test then built its
own sandbox and installed the chart, a minute each). This runs a small grouped suite the way the
Makefile does and asserts the grouping holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = """
import os, time, pytest
pytestmark = [pytest.mark.xdist_group("shared")]

@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.2)
    with open(os.environ["WORKERS_SEEN"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

LOOSE = """
import time, pytest

@pytest.mark.parametrize("i", range(4))
def test_loose(i):
    time.sleep(0.2)
"""


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    seen = tmp_path / "workers"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
         "-p", "no:cacheprovider", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**_env(), "WORKERS_SEEN": str(seen)},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    workers = seen.read_text().split()
    assert len(workers) == 4
    assert len(set(workers)) == 1, f"one xdist_group ran on several workers: {workers}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env
