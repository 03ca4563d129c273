"""Plain kopf baselines, what kopf alone costs and achieves next to gpuheal.

- memory (default): one ``@kopf.on.event('nodes')`` handler that keeps nothing (kopf still
  lists, parses and hands over every full Node body). ``KUBECONFIG=...
  BENCH_EXPECT_NODES=1000 python -m bench.kopf_baseline`` prints ``baseline: saw N nodes``
  once it has handled an event for ``BENCH_EXPECT_NODES`` nodes.
- cordon (``BENCH_MODE=cordon``): one ``@kopf.on.event('events')`` handler that cordons the
  Node of every ``GpuXid`` Event (kubernetes_asyncio PATCH, as a kopf operator typically
  writes it): no incident record, no policy, no ownership, no safety gate; the floor for
  "XID -> cordon" with kopf watching Events (kopf cannot pass a field selector).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import kopf

EXPECT = int(os.environ.get("BENCH_EXPECT_NODES", "0"))
MODE = os.environ.get("BENCH_MODE", "memory")
_seen: set[str] = set()
_t0 = time.monotonic()


@kopf.on.login()
def login(**kwargs: Any) -> Any:
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING


if MODE == "memory":

    @kopf.on.event("", "v1", "nodes")
    def node_event(name: str | None, **_: Any) -> None:
        if name and name not in _seen:
            _seen.add(name)
            if len(_seen) == EXPECT:
                print(f"baseline: saw {EXPECT} nodes after {time.monotonic() - _t0:.2f} s",
                      flush=True)  # fmt: skip

else:
    _api: list[Any] = []

    @kopf.on.startup()
    async def client(**_: Any) -> None:
        from kubernetes_asyncio import client as k8s
        from kubernetes_asyncio import config

        _api.append(k8s.CoreV1Api(await config.new_client_from_config()))
        print("baseline: cordon handler ready", flush=True)

    @kopf.on.event("", "v1", "events")
    async def xid_event(body: kopf.Body, **_: Any) -> None:
        ref = body.get("involvedObject") or {}
        if body.get("reason") != "GpuXid" or ref.get("kind") != "Node" or not _api:
            return
        await _api[0].patch_node(ref["name"], {"spec": {"unschedulable": True}})


def main() -> None:
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.configure(verbose=False)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(clusterwide=True, standalone=True)


if __name__ == "__main__":
    main()
