"""`gpuheal explain NODE`: why gpuheal does what it does about a node. Every line is the
decision engine's own answer, asked the way the operator asks it (`policy.reading`), from one
read of every Node, policy, pool, incident and FaultHistory and of the node's Events."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from collections.abc import Collection, Iterable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.meta import describe_errors
from gpuheal.api.names import HISTORY_PLURAL, NREM_PLURAL, POLICY_PLURAL, POOL_PLURAL
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.api.reservepool import ReservePool
from gpuheal.cli._common import CliError, add_cluster_flags, add_output_flag, dump
from gpuheal.policy.explain import Verdict, describe, explain
from gpuheal.policy.inputs import (
    event_observations,
    is_completed,
    kept_conditions,
    node_event,
    node_view,
)
from gpuheal.policy.reading import open_incident, scan, summaries_of
from gpuheal.policy.trust import (
    DEFAULT_EVENT_NAMESPACE,
    DEFAULT_TRUSTED_REPORTERS,
    judge_event,
)


def explain_node(
    node: dict[str, Any],
    policies: list[RemediationPolicy],
    events: list[dict[str, Any]],
    incidents: list[NodeRemediation],
    *,
    now: dt.datetime,
    max_signal_age: dt.timedelta | None = None,
    histories: Iterable[FaultHistory] = (),
    nodes: Iterable[dict[str, Any]] = (),
    pools: Iterable[ReservePool] = (),
    blind: Collection[str] = (),
    blind_nodes: Mapping[str, Collection[str]] | None = None,
    readable_since: Mapping[str, dt.datetime] | None = None,
    trusted: Collection[str] = DEFAULT_TRUSTED_REPORTERS,
    event_namespace: str = DEFAULT_EVENT_NAMESPACE,
) -> tuple[list[str], list[Verdict]]:
    """The lines `gpuheal explain` prints, from the objects it read (pure), and the engine's
    verdicts behind them, asked as the operator asks (`policy.reading`). ``nodes``: every
    Node read (with the incidents, the breaker's slots are counted from them as the operator
    counts them); ``histories``: every FaultHistory (a GPU that moved brings its record);
    ``blind``, ``blind_nodes``, ``readable_since``: the sources that could not be read.
    Events from reporters not ``trusted`` (the operator's --trusted-reporters), from another
    namespace than ``event_namespace`` or about another Node uid count for nothing, as in the
    operator; those a rule would have taken are named first."""
    keep = kept_conditions(p.spec for p in policies)
    view = node_view(node, keep)
    views = {view.name: view}
    for body in nodes:
        other = node_view(body, keep)
        views.setdefault(other.name, other)
    rules = [r for p in policies for r in p.spec.rules]
    observations = []
    distrusted = []
    for body in events:
        ev = node_event(body)
        if ev is None or ev.node != view.name:
            continue
        found = event_observations(ev, now, view.gpus)
        verdict = (
            judge_event(ev, found, trusted, rules, event_namespace, view.uid) if found else None
        )
        if verdict is None:
            observations.extend(found)
        elif verdict.matters:
            distrusted.append(f"untrusted: {verdict.message}")
    read = scan(
        views.values(),
        policies,
        incidents,
        histories=histories,
        signals={view.name: observations},
        pools=pools,
        blind=blind,
        blind_nodes=blind_nodes,
        readable_since=readable_since,
    )
    if read.governs.get(view.name) is None:
        # The operator's intake ignores the signals of a node no policy governs (it neither
        # remembers nor records them): they count for nothing, even for an open incident.
        read = dataclasses.replace(read, signals={})
    lines, verdicts = explain(
        read,
        view.name,
        incident=open_incident(incidents, view.name),
        episodes=summaries_of(incidents, view.name),
        now=now,
        max_signal_age=max_signal_age,
    )
    for n in incidents:
        if n.spec.node_name == view.name:
            state = "open" if not is_completed(n) else "closed"
            lines.append(f"incident {n.metadata.name} ({state}, rule {n.spec.rule})")
    return [*distrusted, *lines], verdicts


M = TypeVar("M", RemediationPolicy, NodeRemediation, FaultHistory, ReservePool)


def _parsed(items: list[dict[str, Any]], model: type[M]) -> list[M]:
    """The objects that parse; the others are named (the operator ignores them too)."""
    out = []
    for item in items:
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            print(
                f"({item.get('kind', 'object')} {item['metadata']['name']} does not parse, "
                f"ignored: {describe_errors(exc)})",
                file=sys.stderr,
            )
    return out


def _run(args: argparse.Namespace) -> int:
    from kubernetes import client

    from gpuheal.cli._cluster import TIMEOUT, api, list_custom, list_nodes, patiently, said_plainly

    api_client = api(args.kubeconfig, args.context)
    core = client.CoreV1Api(api_client)
    with said_plainly(f"node {args.node}"):
        node = api_client.sanitize_for_serialization(
            patiently(lambda: core.read_node(args.node, _request_timeout=TIMEOUT))
        )  # type: ignore[no-untyped-call]
    # Every Node, incident and FaultHistory: the breaker's slots are counted from them as
    # the operator counts them, and a GPU that moved brings its record from its old node.
    nodes = list_nodes(api_client)
    policies = _parsed(list_custom(api_client, POLICY_PLURAL)["items"], RemediationPolicy)
    pools = _parsed(list_custom(api_client, POOL_PLURAL)["items"], ReservePool)
    selector = f"involvedObject.kind=Node,involvedObject.name={args.node}"
    blind: list[str] = []
    events: list[dict[str, Any]] = []
    try:
        with said_plainly("events"):
            listed = patiently(
                lambda: core.list_event_for_all_namespaces(
                    field_selector=selector, _request_timeout=TIMEOUT
                )
            ).items
        events = api_client.sanitize_for_serialization(listed)  # type: ignore[no-untyped-call]
    except CliError as exc:
        # As the operator whose Event watch fails: the source is blind, which starts and
        # ends nothing; said, and the rest is still explained.
        print(f"(the events source cannot be read, so it is blind: {exc})", file=sys.stderr)
        blind.append("events")
    incidents = _parsed(list_custom(api_client, NREM_PLURAL)["items"], NodeRemediation)
    histories = _parsed(list_custom(api_client, HISTORY_PLURAL)["items"], FaultHistory)
    max_age = dt.timedelta(seconds=args.event_max_age)
    now = dt.datetime.now(dt.UTC)
    lines, verdicts = explain_node(
        node,
        policies,
        events,
        incidents,
        now=now,
        max_signal_age=max_age,
        histories=histories,
        nodes=nodes,
        pools=pools,
        blind=blind,
        trusted=frozenset(r.strip() for r in args.trusted_reporters.split(",") if r.strip()),
        event_namespace=args.event_namespace,
    )
    if args.output == "text":
        print("\n".join(lines))
    else:
        print(dump(explanation(args.node, lines, verdicts, now=now), args.output))
    return 0


def explanation(
    node: str, lines: list[str], verdicts: list[Verdict], *, now: dt.datetime
) -> dict[str, Any]:
    """`-o json|yaml`: the same answers as data: each question asked of the engine, its
    decision (kind Act, Wait, Blocked or Idle, with every field) and the phrase for it."""
    return {
        "node": node,
        "time": now,
        "verdicts": [
            {"about": v.about, "says": describe(v.decision, now), "decision": v.decision}
            for v in verdicts
        ],
        "lines": lines,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", help="the node's name")
    add_output_flag(p, ("text", "json", "yaml"), "output format")
    p.add_argument(
        "--event-max-age",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="seconds after which an Event starts nothing (the operator's --event-max-age)",
    )
    p.add_argument(
        "--trusted-reporters",
        default=",".join(sorted(DEFAULT_TRUSTED_REPORTERS)),
        metavar="NAMES",
        help="Event reporters whose Events count, comma-separated (the operator's "
        "--trusted-reporters; default: %(default)s)",
    )
    p.add_argument(
        "--event-namespace",
        default=DEFAULT_EVENT_NAMESPACE,
        metavar="NAMESPACE",
        help="the namespace whose Events count (the operator's --event-namespace; default: "
        "%(default)s)",
    )
    add_cluster_flags(p)
    p.set_defaults(func=_run)
