"""dcgm-exporter's /metrics, read over HTTP from each exporter pod."""

from __future__ import annotations

import httpx


class ScrapeFailed(Exception):
    """The exporter could not be read (unreachable, non-2xx)."""


class DcgmScraper:
    def __init__(self, *, port: int, timeout: float = 5.0) -> None:
        self.port = port
        self.http = httpx.AsyncClient(timeout=timeout)

    async def scrape(self, pod_ip: str) -> str:
        url = f"http://{pod_ip}:{self.port}/metrics"
        try:
            resp = await self.http.get(url)
            resp.raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            raise ScrapeFailed(f"{url}: {exc}") from exc
        return resp.text

    async def close(self) -> None:
        await self.http.aclose()
