"""`gpuheal-dev sandbox up|status|down` from separate processes, as a person would use it."""

from __future__ import annotations

import json
import os
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

        status = _gpuheal_dev("sandbox", "status", "--dir", str(root))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "kube-apiserver" in status.stdout
        assert "STOPPED" not in status.stdout

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
