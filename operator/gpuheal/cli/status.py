"""`gpuheal status`: incidents (NodeRemediations), their state, steps and durations; as a
table, with timelines (-o wide), as JSON or YAML, once or as they change (-w)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuheal.api.meta import parse_time
from gpuheal.api.names import NODE_LABEL, NREM_PLURAL
from gpuheal.cli._common import add_cluster_flags, add_output_flag, dump


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


def render(items: Sequence[Mapping[str, Any]], fmt: str, *, now: dt.datetime) -> str:
    """The whole listing in ``fmt`` (table, wide, json, yaml)."""
    if fmt in ("json", "yaml"):
        listing = {
            "kind": "IncidentList",
            "items": [incident_summary(o, now=now) for o in _ordered(items)],
        }
        return dump(listing, fmt)
    return status_table(items, now=now, wide=fmt == "wide") if items else ""


def _run(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import api, list_custom

    kw = {"label_selector": f"{NODE_LABEL}={args.node}"} if args.node else {}
    api_client = api(args.kubeconfig, args.context)
    listing = list_custom(api_client, NREM_PLURAL, **kw)
    items = listing["items"]
    out = render(items, args.output, now=dt.datetime.now(dt.UTC))
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
