"""`gpuheal-dev sandbox up|status|down` from separate processes, as a person would use it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuheal_dev.sandbox._proc import pid_alive

pytestmark = pytest.mark.integration


def _gpuheal_dev(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuheal_dev.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_up_status_down_across_processes() -> None:
    # Short: Slurm's unix socket paths under the root must stay within 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="ghcli-", dir="/tmp"))
    up = _gpuheal_dev("sandbox", "up", "--dir", str(root), "--nodes", "2", "--spares", "0")
    assert up.returncode == 0, up.stderr
    pids = json.loads((root / "k8s" / "control-plane.json").read_text())["pids"]
    assert len(pids) == 5
    try:
        assert f"export KUBECONFIG={root}/k8s/admin.kubeconfig" in up.stdout
        assert f"export SLURM_CONF={root}/slurm/etc/slurm.conf" in up.stdout
        assert "  slurm 26.05 from " in up.stdout  # the default release, from its own root

        status = _gpuheal_dev("sandbox", "status", "--dir", str(root))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "kube-apiserver" in status.stdout
        assert "STOPPED" not in status.stdout
        # the bring-up's own time, as `up` printed it, not a fresh object's 0.0 s
        took = re.search(r"up in ([0-9.]+)s", up.stdout)
        assert took is not None, up.stdout
        assert f"(up in {took.group(1)}s)" in status.stdout
        assert float(took.group(1)) > 0

        again = _gpuheal_dev("sandbox", "up", "--dir", str(root))
        assert again.returncode == 1
        assert "is running" in again.stderr
    finally:
        down = _gpuheal_dev("sandbox", "down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    assert not [name for name, pid in pids.items() if pid_alive(pid)]
    state = json.loads((root / "k8s" / "control-plane.json").read_text())
    assert state["pids"] == {}
    status = _gpuheal_dev("sandbox", "status", "--dir", str(root))
    assert status.returncode == 1
    assert "control plane: stopped" in status.stdout
    assert "slurm: stopped" in status.stdout


@pytest.mark.parametrize(
    ("release", "version"),
    [("26.05", "slurm-wlm 26.05.5"), ("22.05", "slurm-wlm 22.05.8")],
    ids=["s26.05", "s22.05"],
)
def test_up_with_slurm_26_prints_the_path_of_its_own_clients(release: str, version: str) -> None:
    """`sandbox up --slurm 26.05` (or the host's 22.05): the printed PATH and SLURM_CONF give
    that Slurm's own scontrol/sbatch from the host; `down` from another process stops its
    daemons."""
    root = Path(tempfile.mkdtemp(prefix="ghcli26-", dir="/tmp"))
    up = _gpuheal_dev(
        "sandbox", "up", "--dir", str(root), "--nodes", "1", "--spares", "0", "--slurm", release
    )
    assert up.returncode == 0, up.stderr
    try:
        exports = [line.strip() for line in up.stdout.splitlines() if "export " in line]
        script = "; ".join([*exports, "scontrol --version", "sinfo -h -o '%N %T'"])
        shell = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
        assert shell.returncode == 0, shell.stderr
        assert shell.stdout.split("\n")[:2] == [version, "gpu-node-0 idle"]
        status = _gpuheal_dev("sandbox", "status", "--dir", str(root))
        assert "slurmd@gpu-node-0        running" in status.stdout
    finally:
        down = _gpuheal_dev("sandbox", "down", "--dir", str(root))
    assert down.returncode == 0, down.stderr
    status = _gpuheal_dev("sandbox", "status", "--dir", str(root))
    assert "slurm: stopped" in status.stdout
