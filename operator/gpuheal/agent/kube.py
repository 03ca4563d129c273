"""The agent's only contact with the API server (kubernetes_asyncio), and exactly the calls its
RBAC grants: get nodes; patch nodes/status (the condition and the GPU map annotation); create,
get and patch Events in one namespace. Bodies are plain dicts (`_preload_content=False`).
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuheal.kubeapi import JSON, MERGE_PATCH, STRATEGIC_PATCH, json_body, make_api_client


class AgentKube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # Typed as Any: with `_preload_content=False` the generated signatures are wrong.
        self.core: Any = client.CoreV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> AgentKube:
        """In-cluster credentials in a pod, else the kubeconfig (KUBECONFIG)."""
        return cls(await make_api_client(kubeconfig))

    async def close(self) -> None:
        await self.api.close()

    async def get_node(self, name: str) -> JSON | None:
        try:
            return await json_body(self.core.read_node(name, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_node_status(self, name: str, patch: JSON) -> JSON:
        """Strategic merge on the status subresource: `status.conditions` merge by type, and
        `metadata.annotations` (accepted by the Node status subresource) merge by key."""
        return await json_body(
            self.core.patch_node_status(
                name, patch, _content_type=STRATEGIC_PATCH, _preload_content=False
            )
        )

    async def create_event(self, namespace: str, body: JSON) -> bool:
        """True if created, False if an Event of that name exists already (409)."""
        try:
            await json_body(
                self.core.create_namespaced_event(namespace, body, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def get_event(self, namespace: str, name: str) -> JSON | None:
        try:
            return await json_body(
                self.core.read_namespaced_event(name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_event(self, namespace: str, name: str, patch: JSON) -> bool:
        """Merge patch; False if the Event is gone (expired by the API server's event TTL)."""
        try:
            await json_body(
                self.core.patch_namespaced_event(
                    name, namespace, patch, _content_type=MERGE_PATCH, _preload_content=False
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
