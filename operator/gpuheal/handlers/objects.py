"""RemediationPolicies and ReservePools through kopf ``on.event`` handlers (they never write
kopf bookkeeping on the objects). Nodes, Events and NodeRemediations come through watches of
our own (`gpuheal.remediation.sources`): kopf's Node LIST is one un-paginated GET of every
body, and kopf deep-copies and diffs every event, which for NodeRemediations are mostly the
echoes of the operator's own status writes."""

from __future__ import annotations

from typing import Any

import kopf

from gpuheal.api.names import GROUP, HISTORY_PLURAL, POLICY_PLURAL, POOL_PLURAL, VERSION
from gpuheal.remediation import objects
from gpuheal.remediation.state import Runtime


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL)
async def policy_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    objects.policy_changed(rt.ports, rt.view, rt.books, type, dict(body))


@kopf.on.event(GROUP, VERSION, POOL_PLURAL)
async def pool_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    objects.pool_changed(rt.view, type, dict(body))


@kopf.on.event(GROUP, VERSION, HISTORY_PLURAL)
async def history_event(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    rt: Runtime = memo.runtime
    objects.history_changed(rt.view, type, dict(body))
