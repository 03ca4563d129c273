"""A fake DRA driver for the sandbox's kwok GPU nodes: one ResourceSlice per node with its GPUs
as NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes them, and its DeviceClass.

What the real driver's kubelet plugin writes (cmd/gpu-kubelet-plugin/deviceinfo.go): driver
``gpu.nvidia.com``, one pool per node named after the node, devices ``gpu-<minor>`` (the
GPU's index lives in the name) with the attributes ``type`` ("gpu"), ``uuid``, ``pcieBusID``
(``0000:3b:00.0``), ``productName``, ``brand``, ``architecture``, ``driverVersion``,
``cudaDriverVersion``, ``cudaComputeCapability`` and the capacity ``memory``. The apiserver,
the scheduler that allocates claims against these slices and kube-controller-manager that
evicts on a device taint are the real ones; only the node-side plugin is missing (kwok marks
pods Running without preparing anything).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
GROUP, VERSION = "resource.k8s.io", "v1"
PRODUCT = "NVIDIA H100 80GB HBM3"


def sandbox_gpus(count: int = 8) -> dict[str, str]:
    """PCI address -> UUID of a sandbox node's GPUs (what its fake agent reports too)."""
    return {
        f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(count)
    }


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def gpu_slice(node: str, gpus: Mapping[str, str]) -> dict[str, Any]:
    """The ResourceSlice of ``node``: ``gpus`` (PCI address -> UUID) in PCI order, gpu-0..."""

    def text(value: str) -> dict[str, str]:
        return {"string": value}

    def version(value: str) -> dict[str, str]:
        return {"version": value}

    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": text("gpu"),
                "uuid": text(uuid),
                "pcieBusID": text(f"{pci}.0"),
                "productName": text(PRODUCT),
                "brand": text("Nvidia"),
                "architecture": text("Hopper"),
                "driverVersion": version("570.133.20"),
                "cudaDriverVersion": version("12.8.0"),
                "cudaComputeCapability": version("9.0.0"),
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i, (pci, uuid) in enumerate(sorted(gpus.items()))
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class() -> dict[str, Any]:
    """The class NVIDIA's chart installs for whole GPUs (``gpu.nvidia.com``)."""
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _create(api: client.CustomObjectsApi, plural: str, body: dict[str, Any]) -> None:
    try:
        api.create_cluster_custom_object(GROUP, VERSION, plural, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def publish_gpu_slices(
    api_client: client.ApiClient, nodes: Sequence[str], gpus: Mapping[str, str] | None = None
) -> None:
    """Publish the DeviceClass and one ResourceSlice per node (existing ones left alone), as
    the driver's kubelet plugin does when it starts on each node."""
    api = client.CustomObjectsApi(api_client)
    _create(api, "deviceclasses", device_class())
    for node in nodes:
        _create(api, "resourceslices", gpu_slice(node, gpus or sandbox_gpus()))


def withdraw_gpu_slices(api_client: client.ApiClient, nodes: Sequence[str]) -> None:
    """Delete the nodes' ResourceSlices (the plugin gone from them)."""
    api = client.CustomObjectsApi(api_client)
    for node in nodes:
        try:
            api.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_name(node))
        except ApiException as exc:
            if exc.status != 404:
                raise


def gpu_claim(name: str, uuid: str) -> dict[str, Any]:
    """A ResourceClaim for the one GPU with ``uuid`` (a test's pod holds a known device)."""
    expression = f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }
