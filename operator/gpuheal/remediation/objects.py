"""The operator's views of the cluster's objects, kept current from watch events: Nodes
(our own list+watch, `sources.watch_nodes`), and policies, pools and incidents (kopf
``on.event`` handlers, which write nothing back)."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.meta import describe_errors
from gpuheal.api.names import POLICY_PLURAL, POOL_PLURAL
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy.inputs import node_view
from gpuheal.remediation import intake
from gpuheal.remediation.driver import ensure_driver, stop_driver
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports, Unparsed, take_in

_M = TypeVar("_M", bound=BaseModel)

log = logging.getLogger("gpuheal.objects")


def node_changed(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, type_: str | None, body: dict[str, Any]
) -> None:
    """A Node was listed, added, modified or deleted. Costs one dict reduction and a few
    comparisons, and no API call while nothing is wrong."""
    name = (body.get("metadata") or {}).get("name")
    if not name:
        return
    if type_ == "DELETED":
        cluster.drop_node(name)
    else:
        view = node_view(body, cluster.kept_conditions)
        cluster.set_node(view)
        if "conditions" in ports.config.sources:
            intake.check_conditions(ports, cluster, books, view)
    ports.metrics.nodes_watched.set(len(cluster.nodes))


def policy_changed(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, type_: str | None, body: dict[str, Any]
) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        cluster.unparsed.pop((POLICY_PLURAL, name), None)
        cluster.drop_policy(name)
        return
    try:
        policy = RemediationPolicy.model_validate(body)
    except ValidationError as exc:
        _unparsed(cluster, POLICY_PLURAL, body, exc)
        cluster.drop_policy(name)
        return
    cluster.unparsed.pop((POLICY_PLURAL, name), None)
    old = cluster.policies.get(name)
    cluster.set_policy(policy)
    if old is not None and old.metadata.generation == policy.metadata.generation:
        return  # a status write (the operator's own report, mostly): no new rules to apply
    if "conditions" in ports.config.sources:
        for view in list(cluster.nodes.values()):
            if cluster.assignment.get(view.name) == name:
                intake.check_conditions(ports, cluster, books, view)


def pool_changed(cluster: ClusterView, type_: str | None, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        cluster.unparsed.pop((POOL_PLURAL, name), None)
        cluster.pools.pop(name, None)
        return
    try:
        cluster.pools[name] = ReservePool.model_validate(body)
    except ValidationError as exc:
        _unparsed(cluster, POOL_PLURAL, body, exc)
        cluster.pools.pop(name, None)
        return
    cluster.unparsed.pop((POOL_PLURAL, name), None)


def _unparsed(
    cluster: ClusterView, plural: str, body: dict[str, Any], exc: ValidationError
) -> None:
    """Ignore an object the API server stored but this operator cannot read (stored before
    a rule was added, or by a newer CRD): logged once per generation, and its status says
    Ready=False (report.unparsed_status) instead of the last good object's Active."""
    meta = body["metadata"]
    generation = meta.get("generation")
    key = (plural, meta["name"])
    known = cluster.unparsed.get(key)
    if known is not None and known.generation == generation:
        return  # a status write (ours, mostly): same spec, said already
    why = describe_errors(exc)
    log.error("%s %s does not parse; ignoring it: %s", body.get("kind", plural), key[1], why)
    status = body.get("status")
    status = status if isinstance(status, dict) else {}
    conditions = status.get("conditions")
    observed = status.get("observedGeneration")
    cluster.unparsed[key] = Unparsed(
        generation=generation,
        why=why,
        conditions=[c for c in conditions if isinstance(c, dict)]
        if isinstance(conditions, list)
        else [],
        observed_generation=observed if isinstance(observed, int) else None,
    )


def history_changed(cluster: ClusterView, type_: str | None, body: dict[str, Any]) -> None:
    """A node's FaultHistory (ours, a restore from a backup, a back-dated import)."""
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        cluster.set_fault_history(name, None)
        return
    history = _parsed_or_logged(FaultHistory, body)
    if history is not None:
        cluster.set_fault_history(history.spec.node_name, history)


def incident_changed(
    ports: Ports, cluster: ClusterView, books: Bookkeeping, type_: str | None, body: dict[str, Any]
) -> None:
    """Keep the incident's summary current; an open incident gets a driver. The echo of
    the operator's own write (same resourceVersion as its answer, taken in already) costs
    a dict lookup: no parse, no wake-up."""
    name = body["metadata"]["name"]
    if type_ == "DELETED":
        cluster.incident_gone(name)
        stop_driver(cluster, books, name)
        return
    held = cluster.latest.get(name)
    if held is not None and held.metadata.resource_version == body["metadata"].get(
        "resourceVersion"
    ):
        return
    nrem = _parsed_or_logged(NodeRemediation, body)
    if nrem is None:
        return
    # A person (approval) or a new signal changed it: worth a look now, unlike our own writes.
    changed = take_in(ports, cluster, nrem)
    if cluster.incidents[name].active:
        ensure_driver(ports, cluster, books, name, wake_up=changed)


def _parsed_or_logged(model: type[_M], body: dict[str, Any]) -> _M | None:
    """The object as ``model``; None (and an error logged) for one that does not parse,
    which the operator ignores."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        name = body["metadata"]["name"]
        log.error("%s %s does not parse; ignoring it: %s", model.__name__, name, exc)
        return None
