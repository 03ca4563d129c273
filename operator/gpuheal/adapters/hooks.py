"""The reset/reboot webhook contract, as HTTP: one POST, its status code back.

``POST url`` with ``{"action", "node", "incident", "xid"}`` and the header
``Idempotency-Key: <incident>-<action>``: the receiver must treat a repeated key as the same
request (a restart of gpuheal may send it again).
"""

from __future__ import annotations

import httpx

from gpuheal.api.meta import scrub_url


class HookUnreachable(Exception):
    """The receiver could not be reached (connect error, timeout)."""


async def post_webhook(
    url: str,
    *,
    action: str,
    node: str,
    incident: str,
    xid: int | None,
    wait_s: float,
    power_cycle: bool = False,
    gpu: str | None = None,
) -> int:
    """POST the request; the HTTP status code, or `HookUnreachable`. ``power_cycle``: the
    reboot must be a cold power cycle (``"powerCycle": true``; absent otherwise). ``gpu``:
    the PCI address of the one GPU the incident quarantined (``"gpu"``; absent otherwise)."""
    payload: dict[str, object] = {"action": action, "node": node, "incident": incident, "xid": xid}
    if power_cycle:
        payload["powerCycle"] = True
    if gpu:
        payload["gpu"] = gpu
    try:
        async with httpx.AsyncClient(timeout=wait_s) as http:
            resp = await http.post(
                url, json=payload, headers={"Idempotency-Key": f"{incident}-{action}"}
            )
    except httpx.HTTPError as exc:
        # The message lands in a status condition and an Event: never the URL's secret parts.
        raise HookUnreachable(scrub_url(f"{type(exc).__name__}: {exc}", url)) from None
    return resp.status_code
