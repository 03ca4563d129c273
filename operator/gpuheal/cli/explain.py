"""`gpuheal explain NODE`: why gpuheal does what it does about a node. Every line is the
decision engine's own answer, asked with the inputs the operator builds from the same
objects (the policy's counts as its status last reported them)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Collection
from typing import Any, TypeVar

from pydantic import ValidationError

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.meta import describe_errors
from gpuheal.api.names import APPROVE_ANNOTATION, HISTORY_PLURAL, NREM_PLURAL, POLICY_PLURAL
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.cli._common import add_cluster_flags, add_output_flag, dump
from gpuheal.policy import faultrecord as fault_history
from gpuheal.policy.explain import Verdict, describe, explain
from gpuheal.policy.inputs import (
    event_observations,
    incident_summary,
    incident_view,
    kept_conditions,
    merge_observations,
    node_event,
    node_view,
    policy_counts,
    recorded_observations,
)
from gpuheal.policy.trust import DEFAULT_TRUSTED_REPORTERS, judge_event


def explain_node(
    node: dict[str, Any],
    policies: list[RemediationPolicy],
    events: list[dict[str, Any]],
    incidents: list[NodeRemediation],
    *,
    now: dt.datetime,
    max_signal_age: dt.timedelta | None = None,
    history: FaultHistory | None = None,
    trusted: Collection[str] = DEFAULT_TRUSTED_REPORTERS,
) -> tuple[list[str], list[Verdict]]:
    """The lines `gpuheal explain` prints, from the objects it read (pure), and the engine's
    verdicts behind them. Events from reporters not ``trusted`` (the operator's
    --trusted-reporters) count for nothing, as in the operator; those a rule would have taken
    are named first."""
    view = node_view(node, kept_conditions(p.spec for p in policies))
    rules = [r for p in policies for r in p.spec.rules]
    observations = []
    distrusted = []
    for body in events:
        ev = node_event(body)
        if ev is None:
            continue
        found = event_observations(ev, now, view.gpus)
        verdict = judge_event(ev, found, trusted, rules) if found else None
        if verdict is None:
            observations.extend(found)
        elif verdict.matters:
            distrusted.append(f"untrusted: {verdict.message}")
    open_ = next((n for n in incidents if n.spec.node_name == view.name and not _done(n)), None)
    summaries = [incident_summary(n) for n in incidents]
    recorded = [
        o for n in incidents if n.spec.node_name == view.name for o in recorded_observations(n)
    ]
    lines, verdicts = explain(
        view,
        policies,
        merge_observations(
            recorded, observations, fault_history.observations(history) if history else ()
        ),
        incident=incident_view(open_, approve_annotation=APPROVE_ANNOTATION) if open_ else None,
        episodes=[s for s in summaries if s.node == view.name],
        counts={p.metadata.name: policy_counts(p, summaries) for p in policies},
        now=now,
        max_signal_age=max_signal_age,
    )
    for n in incidents:
        if n.spec.node_name == view.name:
            state = "open" if not _done(n) else "closed"
            lines.append(f"incident {n.metadata.name} ({state}, rule {n.spec.rule})")
    return [*distrusted, *lines], verdicts


def _done(nrem: NodeRemediation) -> bool:
    return incident_summary(nrem).completed_at is not None


M = TypeVar("M", RemediationPolicy, NodeRemediation, FaultHistory)


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

    from gpuheal.cli._cluster import TIMEOUT, api, list_custom, patiently, said_plainly

    api_client = api(args.kubeconfig, args.context)
    core = client.CoreV1Api(api_client)
    with said_plainly(f"node {args.node}"):
        node = api_client.sanitize_for_serialization(
            patiently(lambda: core.read_node(args.node, _request_timeout=TIMEOUT))
        )  # type: ignore[no-untyped-call]
    policies = _parsed(list_custom(api_client, POLICY_PLURAL)["items"], RemediationPolicy)
    selector = f"involvedObject.kind=Node,involvedObject.name={args.node}"
    with said_plainly("events"):
        listed = patiently(
            lambda: core.list_event_for_all_namespaces(
                field_selector=selector, _request_timeout=TIMEOUT
            )
        ).items
    events = api_client.sanitize_for_serialization(listed)  # type: ignore[no-untyped-call]
    incidents = _parsed(list_custom(api_client, NREM_PLURAL)["items"], NodeRemediation)
    histories = [
        h
        for h in _parsed(list_custom(api_client, HISTORY_PLURAL)["items"], FaultHistory)
        if h.spec.node_name == args.node
    ]
    max_age = dt.timedelta(seconds=args.event_max_age)
    now = dt.datetime.now(dt.UTC)
    lines, verdicts = explain_node(
        node,
        policies,
        events,
        incidents,
        now=now,
        max_signal_age=max_age,
        history=histories[0] if histories else None,
        trusted=frozenset(r.strip() for r in args.trusted_reporters.split(",") if r.strip()),
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


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "explain", help="why gpuheal does what it does about a node", description=__doc__
    )
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
    add_cluster_flags(p)
    p.set_defaults(func=_run)
    return p
