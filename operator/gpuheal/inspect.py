"""`gpuheal status` (incidents, their steps and durations) and `gpuheal explain <node>` (why
the engine decided what it did), read from the cluster with the sync client."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config
from pydantic import ValidationError

from gpuheal import incident as inc
from gpuheal import plan
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.xid.parse import parse_event


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _age(ts: dt.datetime | None, now: dt.datetime) -> str:
    if ts is None:
        return "?"
    s = int((now - ts).total_seconds())
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def incident_state(obj: Mapping[str, Any]) -> str:
    conds = (obj.get("status") or {}).get("conditions") or []
    by = {c.get("type"): c for c in conds}
    done = by.get("Completed")
    if done and done.get("status") == "True":
        return str(done.get("reason"))
    blocked = by.get("Blocked")
    if blocked and blocked.get("status") == "True":
        return f"Blocked:{blocked.get('reason')}"
    timeline = (obj.get("status") or {}).get("timeline") or []
    return f"after {timeline[-1]['step']}" if timeline else "Detected"


def step_durations(timeline: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float]]:
    """(step, seconds since the first entry, seconds since the previous entry) per entry."""
    out = []
    first = prev = None
    for e in timeline:
        ts = inc.parse_time(e.get("time"))
        if ts is None:
            continue
        first = first or ts
        out.append((str(e.get("step")), (ts - first).total_seconds(),
                    (ts - (prev or ts)).total_seconds()))  # fmt: skip
        prev = ts
    return out


def status_table(items: Sequence[Mapping[str, Any]], *, now: dt.datetime, wide: bool) -> str:
    rows = [("NAME", "NODE", "RULE", "XID", "RUNG", "STATE", "REPLACEMENT", "TOOK", "AGE")]
    details: list[str] = []
    for obj in sorted(items, key=lambda o: o["metadata"].get("creationTimestamp", "")):
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        signals = spec.get("signals") or [{}]
        durations = step_durations(status.get("timeline") or [])
        took = f"{durations[-1][1]:.2f}s" if durations else "-"
        created = inc.parse_time(obj["metadata"].get("creationTimestamp"))
        rows.append((
            obj["metadata"]["name"], spec.get("nodeName", ""), spec.get("rule", ""),
            str(signals[0].get("xid") or signals[0].get("conditionType") or "-"),
            str(status.get("rung", 0)), incident_state(obj), status.get("replacementNode") or "-",
            took, _age(created, now),
        ))  # fmt: skip
        if wide:
            details.append(f"\n{obj['metadata']['name']}:")
            msgs = [str(e.get("message", "")) for e in status.get("timeline") or []]
            for (step, since, delta), msg in zip(durations, msgs, strict=False):
                details.append(f"  +{since:8.3f}s ({delta:7.3f}s)  {step:<22} {msg}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + details)


def explain_node(  # noqa: PLR0912
    node: Mapping[str, Any],
    policies: Sequence[RemediationPolicy],
    events: Sequence[Mapping[str, Any]],
    incidents: Sequence[Mapping[str, Any]],
    *,
    now: dt.datetime,
) -> list[str]:
    """Why gpuheal does what it does with this node, as lines of text (pure)."""
    view = inc.node_view(node)
    out = [f"node {view.name}: {'Ready' if view.ready else 'NOT Ready'}"
           + (", cordoned" if view.unschedulable else "")
           + (f" (by gpuheal incident {view.cordoned_by})" if view.cordoned_by
              else " (not by gpuheal)" if view.unschedulable else "")]  # fmt: skip
    choice = plan.choose_policy(policies, view.labels)
    if choice.policy is None:
        if choice.overlapping:
            out.append(f"policies {', '.join(choice.overlapping)} tie at the top priority: "
                       "none acts on this node (Overlapping)")  # fmt: skip
        else:
            out.append("no RemediationPolicy selects this node: gpuheal does nothing here")
        return out
    p = choice.policy
    safety = p.spec.safety
    out.append(
        f"policy {p.metadata.name} (priority {p.spec.priority}) selects it"
        + (" [PAUSED]" if safety.paused else "")
        + (" [DRY RUN]" if safety.dry_run else "")
    )
    if safety.opt_out_label in view.labels:
        out.append(f"the node carries {safety.opt_out_label}: gpuheal starts nothing here")
    for type_, bad in plan.watched_conditions(p):
        cond = view.condition(type_)
        need = plan.held_for(p, type_, bad)
        if cond is None:
            out.append(f"condition {type_}: absent (watched for {type_}={bad})")
        elif cond.status != bad:
            out.append(f"condition {type_}={cond.status}: healthy")
        else:
            held = now - (cond.since or now)
            verdict = "signal" if need is None or held >= need else f"waits for {need}"
            out.append(f"condition {type_}={bad} held {held}: {verdict}")
    history: list[plan.Signal] = []
    for body in sorted(events, key=lambda e: e.get("lastTimestamp") or ""):
        ev = inc.node_event(body)
        if ev is None:
            continue
        xe = parse_event(ev.reason, ev.message)
        if xe is None:
            continue
        signal = plan.Signal("events", ev.dedupe_key, ev.last_seen or now, xid=xe.xid,
                             gpu=xe.gpu_key, recovery_action=xe.recovery_action,
                             event_reason=ev.reason, message=ev.message)  # fmt: skip
        rule = plan.match_rule(p, signal)
        if rule is None:
            out.append(f"XID {xe.xid} at {ev.last_seen}: no rule matches (ignored)")
        else:
            count = plan.occurrences(rule, signal, history, signal.time)
            rung = plan.rung_for(rule, count)
            actions = ", ".join(s.action.value for s in rule.ladder[rung].steps)
            window = rule.escalation_or_default().window
            out.append(
                f"XID {xe.xid} on GPU {xe.gpu_key} at {ev.last_seen}: rule {rule.name}, "
                f"occurrence {count} within {window} -> rung {rule.ladder[rung].name} ({actions})"
            )
        history.append(signal)
    for obj in incidents:
        out.append(f"incident {obj['metadata']['name']}: {incident_state(obj)}")
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Blocked" and c.get("status") == "True":
                out.append(f"  blocked: {c.get('reason')}: {c.get('message')}")
    for c in p.status.conditions:
        if c.type == "CircuitBreakerOpen" and c.status.value == "True":
            out.append(f"circuit breaker OPEN for {p.metadata.name}: {c.message}")
    return out


def _api(kubeconfig: str | None) -> client.ApiClient:
    k8s_config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _list(api: client.ApiClient, plural: str, **kw: Any) -> list[dict[str, Any]]:
    custom: Any = client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = custom.list_cluster_custom_object(
        inc.GROUP, inc.VERSION, plural, **kw
    )["items"]
    return items


def _run_status(args: argparse.Namespace) -> int:
    api = _api(args.kubeconfig)
    kw = {"label_selector": f"{inc.NODE_LABEL}={args.node}"} if args.node else {}
    print(status_table(_list(api, inc.NREM_PLURAL, **kw), now=_now(), wide=args.wide))
    return 0


def _run_explain(args: argparse.Namespace) -> int:
    api = _api(args.kubeconfig)
    core = client.CoreV1Api(api)
    node = api.sanitize_for_serialization(core.read_node(args.node))  # type: ignore[no-untyped-call]
    policies = []
    for item in _list(api, inc.POLICY_PLURAL):
        try:
            policies.append(RemediationPolicy.model_validate(item))
        except ValidationError as exc:
            print(f"(policy {item['metadata']['name']} does not parse: {exc})")
    selector = f"involvedObject.kind=Node,involvedObject.name={args.node}"
    listed = core.list_event_for_all_namespaces(field_selector=selector).items
    events = api.sanitize_for_serialization(listed)  # type: ignore[no-untyped-call]
    incidents = _list(api, inc.NREM_PLURAL, label_selector=f"{inc.NODE_LABEL}={args.node}")
    for line in explain_node(node, policies, events, incidents, now=_now()):
        print(line)
    return 0


def add_status_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="incidents (NodeRemediations) with their steps and durations"
    )
    p.add_argument("--node", help="only this node's incidents")
    p.add_argument("-w", "--wide", action="store_true", help="also each incident's timeline")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.set_defaults(func=_run_status)
    return p


def add_explain_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "explain", help="why gpuheal decided what it did about a node"
    )
    p.add_argument("node")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.set_defaults(func=_run_explain)
    return p
