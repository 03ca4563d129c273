"""`make demo`: the sandbox with GPU nodes and Slurm, shown, then torn down.

The remediation story (XID injected, node cordoned and drained, job requeued onto a spare)
joins this once the operator and the bridge land.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from gpuheal.sandbox import Sandbox, SandboxConfig


def _show(title: str, cmd: list[str], env: dict[str, str]) -> None:
    print(f"\n# {title}\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, env={**os.environ, **env}, check=False)


def run_demo(root: Path) -> int:
    t0 = time.monotonic()
    print("== gpuheal demo: local sandbox (real kube-apiserver + kwok GPU nodes + real Slurm) ==")
    sandbox = Sandbox.up(SandboxConfig(root=root, gpu_nodes=4, spare_nodes=1))
    try:
        env = sandbox.env()
        kubectl = str(sandbox.control_plane.bin_dir / "kubectl")
        _show("Kubernetes version", [kubectl, "version"], env)
        _show(
            "GPU nodes (kwok plays their kubelets)",
            [
                kubectl,
                "get",
                "nodes",
                "-L",
                "nvidia.com/gpu.product,nvidia.com/gpu.count,gpuheal.io/pool",
            ],
            env,
        )
        _show("Slurm partitions", ["sinfo"], env)
        _show("Slurm nodes", ["sinfo", "-N", "-o", "%N %T %G %E"], env)
        print("\n# operator + Slurm bridge + XID injection: not yet (issues 5 and 7)")
    finally:
        sandbox.down()
    print(f"\n== demo done in {time.monotonic() - t0:.1f}s; sandbox stopped ==")
    return 0
