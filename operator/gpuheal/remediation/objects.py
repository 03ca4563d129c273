"""The operator's views of the cluster's objects, kept current from watch events: Nodes
(our own list+watch, `sources.watch_nodes`), and policies, pools and incidents (kopf
``on.event`` handlers, which write nothing back)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from gpuheal.api.names import APPROVE_ANNOTATION
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy.inputs import incident_summary, node_view
from gpuheal.remediation import intake
from gpuheal.remediation.driver import ensure_driver, stop_driver
from gpuheal.remediation.state import Runtime

log = logging.getLogger("gpuheal.objects")


def node_changed(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    """A Node was listed, added, modified or deleted. Costs one dict reduction and a few
    comparisons, and no API call while nothing is wrong."""
    name = (body.get("metadata") or {}).get("name")
    if not name:
        return
    if type_ == "DELETED":
        rt.drop_node(name)
    else:
        view = node_view(body)
        rt.set_node(view)
        if "conditions" in rt.config.sources:
            intake.check_conditions(rt, view)
    rt.metrics.nodes_watched.set(len(rt.nodes))


def policy_changed(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.drop_policy(name)
        return
    try:
        policy = RemediationPolicy.model_validate(body)
    except ValidationError as exc:
        log.error("RemediationPolicy %s does not parse; ignoring it: %s", name, exc)
        rt.drop_policy(name)
        return
    rt.set_policy(policy)
    if "conditions" in rt.config.sources:
        for view in list(rt.nodes.values()):
            if rt.assignment.get(view.name) == name:
                intake.check_conditions(rt, view)


def pool_changed(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.pools.pop(name, None)
        return
    try:
        rt.pools[name] = ReservePool.model_validate(body)
    except ValidationError as exc:
        log.error("ReservePool %s does not parse; ignoring it: %s", name, exc)


def incident_changed(rt: Runtime, type_: str | None, body: dict[str, Any]) -> None:
    """Keep the incident's summary current; an open incident gets a driver."""
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        rt.incidents.pop(name, None)
        rt.incident_marks.pop(name, None)
        stop_driver(rt, name)
        return
    try:
        nrem = NodeRemediation.model_validate(body)
    except ValidationError as exc:
        log.error("NodeRemediation %s does not parse; ignoring it: %s", name, exc)
        return
    summary = incident_summary(nrem)
    rt.incidents[name] = summary
    # A person (approval) or a new signal changed it: worth a look now, unlike our own writes.
    mark = (nrem.metadata.generation, nrem.metadata.annotations.get(APPROVE_ANNOTATION))
    changed = rt.incident_marks.get(name) != mark
    rt.incident_marks[name] = mark
    if summary.holds_slot or not summary.active:
        rt.release_slot(name)  # recorded on the incident now (or over): no local slot needed
    rt.metrics.active_incidents.set(rt.incidents.open_count)
    if summary.active:
        ensure_driver(rt, name, wake_up=changed)
