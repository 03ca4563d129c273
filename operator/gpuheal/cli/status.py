"""`gpuheal status`: incidents (NodeRemediations), their state, steps and durations; as a
table, with timelines (-o wide), as JSON or YAML, once or as they change (-w); and the domain
incidents of policies with `spec.domains` (faults on several nodes of one rack, NVLink clique
or switch), each with its members, as the operator groups them (`policy.domains`)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuheal.api.meta import parse_time
from gpuheal.api.names import NODE_LABEL, NREM_PLURAL, POLICY_PLURAL
from gpuheal.cli._common import CliError, add_cluster_flags, add_output_flag, dump

if TYPE_CHECKING:  # the models load only when a domain is listed: status starts fast
    from gpuheal.policy.domains import DomainIncident


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
        ts = parse_time(e.get("time"))
        if ts is None:
            continue
        first = first or ts
        out.append((str(e.get("step")), (ts - first).total_seconds(),
                    (ts - (prev or ts)).total_seconds()))  # fmt: skip
        prev = ts
    return out


def incident_summary(obj: Mapping[str, Any], *, now: dt.datetime) -> dict[str, Any]:
    """What `gpuheal status -o json|yaml` prints per incident: the table's columns as data,
    and each timeline step with its time since the first and since the one before."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    signals = spec.get("signals") or [{}]
    timeline = status.get("timeline") or []
    durations = step_durations(timeline)
    created = parse_time(obj["metadata"].get("creationTimestamp"))
    return {
        "name": obj["metadata"]["name"],
        "node": spec.get("nodeName", ""),
        "policy": (spec.get("policyRef") or {}).get("name"),
        "rule": spec.get("rule", ""),
        "xid": signals[0].get("xid"),
        "condition": signals[0].get("conditionType"),
        "rung": status.get("rung", 0),
        "state": incident_state(obj),
        "replacement": status.get("replacementNode"),
        "tookSeconds": round(durations[-1][1], 3) if durations else None,
        "created": obj["metadata"].get("creationTimestamp"),
        "ageSeconds": int((now - created).total_seconds()) if created else None,
        "steps": [
            {
                "step": step,
                "sinceFirstSeconds": round(since, 3),
                "sincePreviousSeconds": round(delta, 3),
                "message": str(e.get("message", "")),
            }
            for (step, since, delta), e in zip(durations, timeline, strict=False)
        ],
    }


HEADER = ("NAME", "NODE", "RULE", "XID", "RUNG", "STATE", "REPLACEMENT", "TOOK", "AGE")


def table_row(obj: Mapping[str, Any], *, now: dt.datetime) -> tuple[str, ...]:
    s = incident_summary(obj, now=now)
    created = parse_time(obj["metadata"].get("creationTimestamp"))
    return (
        s["name"], s["node"], s["rule"], str(s["xid"] or s["condition"] or "-"), str(s["rung"]),
        s["state"], s["replacement"] or "-",
        f"{s['tookSeconds']:.2f}s" if s["tookSeconds"] is not None else "-", _age(created, now),
    )  # fmt: skip


def timeline_lines(obj: Mapping[str, Any]) -> list[str]:
    """`-o wide`: the incident's timeline, each step with its times."""
    status = obj.get("status") or {}
    lines = [f"\n{obj['metadata']['name']}:"]
    msgs = [str(e.get("message", "")) for e in status.get("timeline") or []]
    for (step, since, delta), msg in zip(
        step_durations(status.get("timeline") or []), msgs, strict=False
    ):
        lines.append(f"  +{since:8.3f}s ({delta:7.3f}s)  {step:<22} {msg}")
    return lines


def columns(rows: Sequence[Sequence[str]], widths: Sequence[int] | None = None) -> list[str]:
    widths = widths or [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _ordered(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(items, key=lambda o: o["metadata"].get("creationTimestamp", ""))


def status_table(items: Sequence[Mapping[str, Any]], *, now: dt.datetime, wide: bool) -> str:
    ordered = _ordered(items)
    lines = columns([HEADER, *(table_row(o, now=now) for o in ordered)])
    if wide:
        for obj in ordered:
            lines += timeline_lines(obj)
    return "\n".join(lines)


def domains_of(
    policies: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    incidents: Sequence[Mapping[str, Any]],
    *,
    node: str | None = None,
) -> list[DomainIncident]:
    """The open domain incidents (`policy.domains`, grouped as the operator groups them):
    for each policy's domain key, its incidents on the nodes sharing a value of that label
    (``node``: only those it is a member of). Objects that do not parse are left out, as
    the operator leaves them."""
    from pydantic import ValidationError

    from gpuheal.api.noderemediation import NodeRemediation
    from gpuheal.api.remediationpolicy import RemediationPolicy
    from gpuheal.policy.domains import domain_incidents
    from gpuheal.policy.inputs import incident_summary as summarise

    labels = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}) for n in nodes}
    summaries = []
    for obj in incidents:
        try:
            summaries.append(summarise(NodeRemediation.model_validate(obj)))
        except ValidationError:
            continue
    out = []
    for body in policies:
        try:
            policy = RemediationPolicy.model_validate(body)
        except ValidationError:
            continue
        mine = [i for i in summaries if i.policy == policy.metadata.name]
        for domain in policy.spec.domains:
            by_value: dict[str, list[Any]] = {}
            for i in mine:
                value = labels.get(i.node, {}).get(domain.key)
                if value is not None:
                    by_value.setdefault(value, []).append(i)
            for value, members in sorted(by_value.items()):
                out += [
                    g
                    for g in domain_incidents(policy.metadata.name, domain, value, members)
                    if g.active and (node is None or g.place(node) is not None)
                ]
    return sorted(out, key=lambda g: (g.opened_at, g.name))


def domain_summary(group: DomainIncident, *, now: dt.datetime) -> dict[str, Any]:
    """What `gpuheal status -o json|yaml` prints per domain incident."""
    return {
        "domain": group.name,
        "key": group.key,
        "value": group.value,
        "policy": group.policy,
        "openedAt": group.opened_at.isoformat(),
        "ageSeconds": int((now - group.opened_at).total_seconds()),
        "window": group.window,
        "maxNodeActions": group.max_node_actions,
        "members": [
            {
                "node": m.node,
                "incident": m.incident,
                "faultedAt": m.at.isoformat(),
                "open": m.active,
                "replacement": "held" if m.node in group.held else "runs",
            }
            for m in group.members
        ],
    }


DOMAIN_HEADER = ("DOMAIN", "POLICY", "NODES", "AGE", "MEMBERS (replacement held*)")


def domain_lines(groups: Sequence[DomainIncident], *, now: dt.datetime) -> list[str]:
    """The domain incidents as a table: each with its members in the order they faulted,
    those whose replacement is held marked *."""
    rows = [
        (
            g.name, g.policy, str(len(g.members)), _age(g.opened_at, now),
            ", ".join(m.node + ("*" if m.node in g.held else "") for m in g.members),
        )
        for g in groups
    ]  # fmt: skip
    return ["", "Domain incidents:", *columns([DOMAIN_HEADER, *rows])]


def render(
    items: Sequence[Mapping[str, Any]],
    fmt: str,
    *,
    now: dt.datetime,
    domains: Sequence[DomainIncident] = (),
) -> str:
    """The whole listing in ``fmt`` (table, wide, json, yaml)."""
    if fmt in ("json", "yaml"):
        listing: dict[str, Any] = {
            "kind": "IncidentList",
            "items": [incident_summary(o, now=now) for o in _ordered(items)],
        }
        if domains:
            listing["domains"] = [domain_summary(g, now=now) for g in domains]
        return dump(listing, fmt)
    if not items:
        return ""
    table = status_table(items, now=now, wide=fmt == "wide")
    return "\n".join([table, *domain_lines(domains, now=now)]) if domains else table


def _domains(api_client: Any, items: Sequence[Mapping[str, Any]], node: str | None) -> list[Any]:
    """The open domain incidents, read only when a policy names domains (Nodes are read for
    their labels then). One that cannot be read is said on stderr; the incidents still are."""
    from gpuheal.cli._cluster import list_nodes

    try:
        policies = list_custom_items(api_client, POLICY_PLURAL)
        if not any((p.get("spec") or {}).get("domains") for p in policies):
            return []
        incidents = list_custom_items(api_client, NREM_PLURAL) if node else items
        return domains_of(policies, list_nodes(api_client), incidents, node=node)
    except CliError as exc:
        print(f"(domain incidents not shown: {exc})", file=sys.stderr, flush=True)
        return []


def list_custom_items(api_client: Any, plural: str) -> list[dict[str, Any]]:
    from gpuheal.cli._cluster import list_custom

    return list(list_custom(api_client, plural)["items"])


def _run(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import api, list_custom

    kw = {"label_selector": f"{NODE_LABEL}={args.node}"} if args.node else {}
    api_client = api(args.kubeconfig, args.context)
    listing = list_custom(api_client, NREM_PLURAL, **kw)
    items = listing["items"]
    domains = _domains(api_client, items, args.node) if items else []
    out = render(items, args.output, now=dt.datetime.now(dt.UTC), domains=domains)
    if out:
        print(out, flush=True)
    else:  # as kubectl says it: on stderr, so a pipe sees nothing
        print("No incidents found.", file=sys.stderr, flush=True)
    if args.watch:
        _watch(api_client, args, listing["metadata"].get("resourceVersion", ""), items, kw)
    return 0


def _watch(
    api_client: Any,
    args: argparse.Namespace,
    version: str,
    items: Sequence[Mapping[str, Any]],
    kw: dict[str, Any],
) -> None:
    """As `kubectl get -w`: after the listing, one more row (or object) per change, until
    interrupted. A deleted incident is printed once more as it was last."""
    from gpuheal.cli._cluster import list_custom, watch_custom

    now = dt.datetime.now(dt.UTC)
    widths = [max(len(r[i]) for r in [HEADER, *(table_row(o, now=now) for o in items)])
              for i in range(len(HEADER))]  # fmt: skip
    while True:
        for type_, obj in watch_custom(api_client, NREM_PLURAL, version, **kw):
            if type_ == "ERROR":  # 410 Gone: the version is too old; list again
                version = ""
                break
            version = obj["metadata"].get("resourceVersion", version)
            now = dt.datetime.now(dt.UTC)
            if args.output in ("json", "yaml"):
                summary = incident_summary(obj, now=now) | {"change": type_}
                out = dump(summary, args.output)
                print(out if args.output == "json" else f"---\n{out}", flush=True)
                continue
            row = table_row(obj, now=now)
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
            print(columns([row], widths)[0], flush=True)
            if args.output == "wide":
                print("\n".join(timeline_lines(obj)), flush=True)
        if not version:
            version = list_custom(api_client, NREM_PLURAL, **kw)["metadata"]["resourceVersion"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", metavar="NODE", help="only this node's incidents")
    add_output_flag(
        p, ("table", "wide", "json", "yaml"),
        "output format (wide adds each incident's timeline)",
    )  # fmt: skip
    p.add_argument(
        "-w", "--watch", action="store_true",
        help="after the listing, print each change as it happens (until interrupted)",
    )  # fmt: skip
    add_cluster_flags(p)
    p.set_defaults(func=_run)
