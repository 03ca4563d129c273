"""``python -m bench.api_count run ...``: ``gpuheal run`` with its Kubernetes API requests
counted, for the scale and latency benchmarks.

The apiserver's ``apiserver_request_total`` has no user or user-agent label, and kwok,
the scheduler and the controller manager talk to the same apiserver, so the count is taken
on the operator's side instead: every request kopf and kubernetes_asyncio send goes through
``aiohttp.ClientSession._request``, which this wrapper counts (one per request; a watch is one
request however long it streams) into ``gpuheal_bench_api_requests_total{verb,resource}`` on
the default Prometheus registry, which the operator's ``/metrics`` serves. The Slurm bridge
client (httpx) is not counted: it does not talk to the apiserver. Nothing else changes.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
from prometheus_client import Counter

from bench.opkit import classify_request

API_REQUESTS = Counter(
    "gpuheal_bench_api_requests_total",
    "Kubernetes API requests the operator sent (counted client-side by bench.api_count).",
    ["verb", "resource"],
)


def install() -> None:
    original = aiohttp.ClientSession._request

    async def counted(self: aiohttp.ClientSession, method: str, str_or_url: Any, **kw: Any) -> Any:
        url = str(str_or_url)
        params = kw.get("params")
        if params:
            from urllib.parse import urlencode

            url += ("&" if "?" in url else "?") + urlencode(params, doseq=True)
        verb, resource = classify_request(method, url)
        API_REQUESTS.labels(verb, resource).inc()
        return await original(self, method, str_or_url, **kw)

    aiohttp.ClientSession._request = counted  # type: ignore[method-assign]


def main() -> int:
    install()
    from gpuheal.cli import main as operator_main

    return operator_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
