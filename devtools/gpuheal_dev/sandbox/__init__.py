"""The local sandbox: a real Kubernetes control plane with fake GPU nodes (kwok) and a real
Slurm cluster whose node names equal the Kubernetes node names.

Used by ``make demo``, ``gpuheal-dev sandbox up|down|status``, the integration tests and the
benchmarks. Everything lives under one directory and is stopped by PID.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuheal_dev.sandbox.kube import ControlPlane, cluster_bin_dir
from gpuheal_dev.sandbox.process import SandboxError
from gpuheal_dev.sandbox.slurmroot import DEFAULT_SLURM

__all__ = ["Sandbox", "SandboxConfig", "SandboxError", "default_root"]

log = logging.getLogger("gpuheal_dev.sandbox")


def default_root() -> Path:
    return Path(os.environ.get("GPUHEAL_SANDBOX_DIR", Path.cwd() / ".sandbox"))


@dataclass(frozen=True)
class SandboxConfig:
    root: Path = field(default_factory=default_root)
    gpu_nodes: int = 4
    spare_nodes: int = 1
    slurm: bool = True
    slurm_restd: bool = False
    gpus_per_node: int = 8
    #: the API server's audit log (`ControlPlane.audit`), for tests only
    audit: bool = False
    #: one more GPU node run by a real kubelet + containerd (``realnode.RealNode``)
    real_node: bool = False
    #: image tars imported into the real node's containerd at start
    real_node_images: tuple[Path, ...] = ()

    @property
    def real_node_names(self) -> list[str]:
        from gpuheal_dev.sandbox.realnode import REAL_NODE_NAME

        return [REAL_NODE_NAME] if self.real_node else []

    #: Slurm release (``slurmroot.SLURM_VERSIONS``): 26.05 in its own root, or the host's 22.05
    slurm_version: str = DEFAULT_SLURM

    @property
    def node_names(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.gpu_nodes)]

    @property
    def spare_names(self) -> list[str]:
        return [f"gpu-spare-{i}" for i in range(self.spare_nodes)]


@dataclass
class Sandbox:
    config: SandboxConfig
    control_plane: ControlPlane
    slurm: Any = None  # gpuheal_dev.sandbox.slurm.SlurmCluster when config.slurm
    real_node: Any = None  # gpuheal_dev.sandbox.realnode.RealNode when config.real_node
    started_at: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.config.root

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.control_plane.kubectl(*args, input=input, check=check)

    def core_v1(self) -> Any:
        """A sync ``kubernetes.client.CoreV1Api`` authenticated as the sandbox admin."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A sync ``kubernetes.client.ApiClient`` for ``kubeconfig`` (default: admin)."""
        from kubernetes import config

        load: Any = config.new_client_from_config  # untyped in the client's stubs
        return load(config_file=str(kubeconfig or self.kubeconfig))

    @classmethod
    def up(cls, config: SandboxConfig | None = None) -> Sandbox:
        """Start everything, create the GPU nodes, return when all are ready."""
        from gpuheal_dev.sandbox.nodes import create_gpu_nodes, wait_nodes_ready

        config = config or SandboxConfig()
        t0 = time.monotonic()
        bins = cluster_bin_dir()
        cp = ControlPlane(root=config.root / "k8s", bin_dir=bins, audit=config.audit)
        sandbox = cls(config=config, control_plane=cp, started_at=time.time())
        cp.start()  # refuses when one runs there already; nothing to clean up then
        try:
            sandbox.timings["control_plane_s"] = time.monotonic() - t0
            core = sandbox.core_v1()
            create_gpu_nodes(core, config.node_names, gpus=config.gpus_per_node)
            if config.spare_names:
                create_gpu_nodes(
                    core,
                    config.spare_names,
                    gpus=config.gpus_per_node,
                    pool="reserve",
                    rack="rack-spares",
                )
            wait_nodes_ready(core, config.node_names + config.spare_names)
            sandbox.timings["nodes_ready_s"] = time.monotonic() - t0
            log.info(
                "[sandbox %5.1fs] %d GPU nodes + %d spares Ready (kwok)",
                time.monotonic() - t0,
                len(config.node_names),
                len(config.spare_names),
            )
            if config.real_node:
                from gpuheal_dev.sandbox.realnode import RealNode, RealNodeLayout

                t_node = time.monotonic()
                sandbox.real_node = RealNode(RealNodeLayout(config.root / "realnode"))
                sandbox.real_node.start(
                    cp, images=config.real_node_images, gpus=config.gpus_per_node
                )
                sandbox.timings["real_node_ready_s"] = time.monotonic() - t_node
                log.info(
                    "[sandbox %5.1fs] real node %s Ready (kubelet + containerd, %.1fs)",
                    time.monotonic() - t0,
                    sandbox.real_node.name,
                    sandbox.timings["real_node_ready_s"],
                )
            if config.slurm:
                from gpuheal_dev.sandbox.slurm import SlurmCluster

                sandbox.slurm = SlurmCluster(
                    config.root / "slurm",
                    config.node_names + config.spare_names + config.real_node_names,
                    restd=config.slurm_restd,
                    gpus_per_node=config.gpus_per_node,
                    slurm=config.slurm_version,
                )
                sandbox.slurm.start()
                log.info("[sandbox %5.1fs] Slurm up", time.monotonic() - t0)
            sandbox.timings["total_s"] = time.monotonic() - t0
            sandbox._save()
        except BaseException:
            sandbox.down()
            raise
        return sandbox

    @classmethod
    def load(cls, root: Path | None = None) -> Sandbox | None:
        root = root or default_root()
        state = root / "sandbox.json"
        cp = ControlPlane.load(root / "k8s")
        if cp is None:
            return None
        data: dict[str, Any] = json.loads(state.read_text()) if state.exists() else {}
        saved = dict(data.get("config", {}))
        saved["real_node_images"] = tuple(map(Path, saved.get("real_node_images", ())))
        config = SandboxConfig(root=root, **saved)
        sandbox = cls(config=config, control_plane=cp, started_at=data.get("started_at", 0.0))
        sandbox.timings.update(data.get("timings", {}))
        if config.real_node:
            from gpuheal_dev.sandbox.realnode import RealNode

            sandbox.real_node = RealNode.attach(root / "realnode")
        if config.slurm and (root / "slurm").exists():
            from gpuheal_dev.sandbox.slurm import SlurmCluster

            sandbox.slurm = SlurmCluster.attach(root / "slurm")
        return sandbox

    def _save(self) -> None:
        c = self.config
        data = {
            "config": {
                "gpu_nodes": c.gpu_nodes,
                "spare_nodes": c.spare_nodes,
                "slurm": c.slurm,
                "slurm_restd": c.slurm_restd,
                "gpus_per_node": c.gpus_per_node,
                "real_node": c.real_node,
                "real_node_images": [str(p) for p in c.real_node_images],
                "slurm_version": c.slurm_version,
            },
            "started_at": self.started_at,
            "timings": self.timings,
            "kubeconfig": str(self.kubeconfig),
            "slurm_conf": str(self.slurm.conf_path) if self.slurm is not None else None,
        }
        (self.root / "sandbox.json").write_text(json.dumps(data, indent=2))

    def env(self) -> dict[str, str]:
        """Environment for tools talking to this sandbox (KUBECONFIG, SLURM_CONF, PATH)."""
        slurm_bin = self.slurm.bin_dir if self.slurm is not None else None
        path = [str(p) for p in (slurm_bin, self.control_plane.bin_dir) if p is not None]
        env = {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": ":".join([*path, os.environ.get("PATH", "")]),
        }
        if self.slurm is not None:
            env.update(self.slurm.env)
        return env

    def load_image(self, tar: Path) -> None:
        """Import an image tar into the real node's containerd (no registry needed)."""
        if self.real_node is None:
            raise SandboxError("load_image: this sandbox has no real node (`up --real-node`)")
        self.real_node.load_image(tar)

    def pod_url(self, url: str) -> str:
        """``url`` of a host daemon on 127.0.0.1 (e.g. ``slurm.restd_url``) as the real node's
        pods reach it: at the node's bridge address (``RealNode.expose_host_port``)."""
        from urllib.parse import urlsplit

        if self.real_node is None:
            raise SandboxError("pod_url: this sandbox has no real node (`up --real-node`)")
        parts = urlsplit(url)
        if parts.hostname != "127.0.0.1" or parts.port is None:
            raise SandboxError(f"pod_url: {url} is not a 127.0.0.1:<port> URL")
        address = self.real_node.expose_host_port(parts.port)
        return parts._replace(netloc=address).geturl()

    def down(self) -> None:
        # the real node first: its kubelet would otherwise log the apiserver's absence
        if self.real_node is not None:
            self.real_node.stop()
        if self.slurm is not None:
            self.slurm.stop()
        self.control_plane.stop()
