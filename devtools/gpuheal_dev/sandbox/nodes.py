"""Fake GPU nodes: Node objects labelled the way NVIDIA's GPU operator labels real ones, with
kwok acting as their kubelet (Ready condition, lease heartbeats, pods Running)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuheal_dev.sandbox.kube import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from gpuheal_dev.sandbox.process import SandboxError

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_RESOURCE = "nvidia.com/gpu"
SANDBOX_LABEL = "gpuheal.io/sandbox"
RACK_LABEL = "topology.kubernetes.io/rack"
"""Where a site says which rack a node is in (sites choose the key; policies name it in
`spec.domains`). The sandbox's GPU nodes share one rack, its spares another."""


def gpu_node_manifest(
    name: str,
    *,
    gpus: int = 8,
    product: str = GPU_PRODUCT,
    labels: dict[str, str] | None = None,
    pool: str = "training",
    rack: str = "rack-0",
) -> dict[str, Any]:
    """A Node as a GPU node with the NVIDIA GPU operator's labels would look (capacity included:
    the apiserver keeps status on Node create, the way a kubelet registers)."""
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SANDBOX_LABEL: "true",
        "gpuheal.io/pool": pool,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/cuda.driver.major": "570",
        "node.kubernetes.io/instance-type": f"gpu-{gpus}x-h100",
        RACK_LABEL: rack,
        **(labels or {}),
    }
    capacity = {
        "cpu": "96",
        "memory": "1024Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kernelVersion": "6.1.0-sandbox",
                "osImage": "kwok fake GPU node",
                "containerRuntimeVersion": "fake",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                # A kubelet reports a new random boot ID each boot; kwok leaves it as set,
                # and a test "reboots" the node by writing another (what proves a reboot).
                "bootID": str(uuid.uuid4()),
            },
        },
    }


def create_gpu_nodes(
    core: client.CoreV1Api,
    names: Sequence[str],
    *,
    workers: int = 8,
    **manifest_args: Any,
) -> None:
    """Create the nodes in parallel (1,000 in a few seconds); existing ones are left alone."""

    def create(name: str) -> None:
        try:
            # The client sends plain dicts as they are; a V1Node would only be converted back.
            core.create_node(cast(client.V1Node, gpu_node_manifest(name, **manifest_args)))
        except ApiException as exc:
            if exc.status != 409:
                raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, names))


def delete_nodes(core: client.CoreV1Api, names: Iterable[str]) -> None:
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def wait_nodes_ready(core: client.CoreV1Api, names: Sequence[str], timeout: float = 120) -> None:
    """Wait until kwok reports every named node Ready."""
    wanted = set(names)
    deadline = time.monotonic() + timeout
    while True:
        ready = {
            name
            for n in core.list_node(label_selector=f"{SANDBOX_LABEL}=true").items
            if (name := n.metadata.name if n.metadata else None) in wanted and _is_ready(n)
        }
        if ready == wanted:
            return
        if time.monotonic() > deadline:
            missing = sorted(wanted - ready)
            raise SandboxError(
                f"{len(missing)} nodes not Ready after {timeout:.0f}s: {missing[:5]}..."
            )
        time.sleep(0.25)


def _is_ready(node: client.V1Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
