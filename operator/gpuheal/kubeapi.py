"""The few lines every kubernetes_asyncio user here shares (the operator's adapters and the
node agent): credentials, and calls made with ``_preload_content=False`` read as plain dicts
(the generated models cost memory and time at thousands of nodes)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


async def make_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG)."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return client.ApiClient()
        except config.ConfigException:
            pass
    return await config.new_client_from_config(config_file=kubeconfig)


async def json_body(coro: Any) -> JSON:
    """Await a call made with ``_preload_content=False``; its JSON body, or ApiException."""
    resp = await coro
    try:
        raw = await resp.read()
    finally:
        resp.release()
    if not 200 <= resp.status <= 299:
        exc = ApiException(status=resp.status, reason=resp.reason)
        exc.body = raw.decode(errors="replace")
        raise exc
    data: JSON = json.loads(raw)
    return data


async def unless(status: int, coro: Any) -> JSON | None:
    """The call's body, or None when the API answers `status` (404: absent, 409: exists)."""
    try:
        return await json_body(coro)
    except ApiException as exc:
        if exc.status == status:
            return None
        raise
