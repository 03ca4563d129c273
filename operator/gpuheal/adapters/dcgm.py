"""dcgm-exporter's /metrics, read over HTTP(S) from each exporter pod.

A scrape is bounded: ``timeout`` seconds for the whole call, at most ``max_bytes`` of body
(announced or read; a bigger one is a failed scrape, not a truncated one). Where the exporter
is served over TLS (its ``--web-config-file``, or a kube-rbac-proxy in front of it), the
certificate is checked against ``ca_file`` and ``server_name`` (a pod is reached by its
address, which a certificate seldom names), and ``token_file``'s bearer token, read again
when the file changes, is sent; never over plain HTTP (config refuses that).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable

import httpx

from gpuheal.adapters.slurm import TokenFile

DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class ScrapeFailed(Exception):
    """The exporter could not be read (unreachable, non-2xx, too slow, too big)."""


async def read_capped(chunks: AsyncIterator[bytes], cap: int) -> bytes:
    """The bytes of ``chunks`` joined; `ScrapeFailed` as soon as they pass ``cap``."""
    got = bytearray()
    async for chunk in chunks:
        got += chunk
        if len(got) > cap:
            raise ScrapeFailed(f"body over {cap} bytes (--dcgm-max-bytes): not read further")
    return bytes(got)


class DcgmScraper:
    def __init__(
        self,
        *,
        port: int,
        timeout: float = 5.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        scheme: str = "http",
        ca_file: str | None = None,
        server_name: str | None = None,
        token_file: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.port = port
        self.scheme = scheme
        self.max_bytes = max_bytes
        self.server_name = server_name
        self.token: Callable[[], str] | None = TokenFile(token_file) if token_file else None
        verify: ssl.SSLContext | bool = True
        if scheme == "https" and ca_file:
            verify = ssl.create_default_context(cafile=ca_file)
        self.http = httpx.AsyncClient(
            timeout=timeout,
            verify=verify,
            transport=transport,
            follow_redirects=False,
            headers={"User-Agent": "gpuheal"},
        )

    async def scrape(self, pod_ip: str) -> str:
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"{self.scheme}://{host}:{self.port}/metrics"
        headers = {"Authorization": f"Bearer {self.token()}"} if self.token else {}
        extensions = {"sni_hostname": self.server_name} if self.server_name else {}
        try:
            async with self.http.stream("GET", url, headers=headers, extensions=extensions) as resp:
                resp.raise_for_status()
                announced = resp.headers.get("Content-Length", "")
                if announced.isdigit() and int(announced) > self.max_bytes:
                    raise ScrapeFailed(
                        f"{url}: body of {announced} bytes, over {self.max_bytes} "
                        "(--dcgm-max-bytes): not read"
                    )
                body = await read_capped(resp.aiter_bytes(), self.max_bytes)
        except ScrapeFailed as exc:
            raise ScrapeFailed(str(exc) if str(exc).startswith(url) else f"{url}: {exc}") from None
        except (httpx.HTTPError, OSError, ssl.SSLError) as exc:
            raise ScrapeFailed(f"{url}: {type(exc).__name__}: {exc}") from exc
        return body.decode(errors="replace")

    async def close(self) -> None:
        await self.http.aclose()
