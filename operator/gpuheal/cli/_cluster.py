"""The CLI's reads from the cluster (the sync client: a one-shot command needs no loop)."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config

from gpuheal.api.names import GROUP, VERSION


def api(kubeconfig: str | None) -> client.ApiClient:
    k8s_config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return client.ApiClient()


def list_custom(api_client: client.ApiClient, plural: str, **kw: Any) -> list[dict[str, Any]]:
    custom: Any = client.CustomObjectsApi(api_client)
    items: list[dict[str, Any]] = custom.list_cluster_custom_object(GROUP, VERSION, plural, **kw)[
        "items"
    ]
    return items
