"""When a ReservePool asks its refill provider for more spares: pure, the clock passed in."""

from __future__ import annotations

import dataclasses
import datetime as dt

from gpuheal.api.meta import parse_duration
from gpuheal.api.reservepool import RefillProvider, RefillStatus, ReservePoolSpec

REFUSED = "Refused"


@dataclasses.dataclass(frozen=True, slots=True)
class RefillAsk:
    """Ask the provider for `wanted` spares; `key` is the same for one shortfall."""

    wanted: int
    since: dt.datetime
    key: str


def refill_due(
    pool: str,
    spec: ReservePoolSpec,
    available: int,
    *,
    low_since: dt.datetime | None,
    last: RefillStatus | None,
    now: dt.datetime,
) -> RefillAsk | None:
    """A new shortfall (the pool went below minAvailable at `low_since`, or more spares
    are missing than last asked for) is asked for at once; the same shortfall again after
    `refill.webhook.interval`, unless the provider refused it (4xx: a person looks)."""
    webhook = spec.refill.webhook
    wanted = spec.min_available - available
    if spec.refill.provider is RefillProvider.NONE or webhook is None or wanted <= 0:
        return None
    since = low_since or now
    ask = RefillAsk(wanted, since, f"{pool}-{int(since.timestamp())}-{wanted}")
    if last is None or last.since != since or last.wanted < wanted:
        return ask
    if last.result == REFUSED:
        return None
    if now - last.requested_at >= parse_duration(webhook.interval):
        return ask
    return None
