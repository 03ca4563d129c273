"""Notification webhooks, as HTTP: one JSON POST, its status code back (or `Unreachable`).

The header ``Idempotency-Key`` names the message (incident, transition, reason), so a
receiver can drop a repeat (a retry after a lost answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from gpuheal.api.meta import scrub_url


class Unreachable(Exception):
    """The receiver could not be reached (connect error, timeout)."""


class WebhookSender:
    """One HTTP client for every notification webhook (connections are reused)."""

    def __init__(self, timeout: float) -> None:
        self._http = httpx.AsyncClient(
            timeout=timeout, headers={"User-Agent": "gpuheal-notifier"}, follow_redirects=False
        )

    async def post(self, url: str, payload: Mapping[str, Any], *, key: str) -> int:
        try:
            resp = await self._http.post(url, json=dict(payload), headers={"Idempotency-Key": key})
        except httpx.HTTPError as exc:
            # httpx names the URL in some errors (an invalid one, a redirect): not in a log.
            raise Unreachable(scrub_url(f"{type(exc).__name__}: {exc}", url)) from None
        return resp.status_code

    async def aclose(self) -> None:
        await self._http.aclose()
