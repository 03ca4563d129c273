"""`gpuheal status`: incidents (NodeRemediations), their state, steps and durations."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gpuheal.api.meta import parse_time
from gpuheal.api.names import NODE_LABEL, NREM_PLURAL


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


def status_table(items: Sequence[Mapping[str, Any]], *, now: dt.datetime, wide: bool) -> str:
    rows = [("NAME", "NODE", "RULE", "XID", "RUNG", "STATE", "REPLACEMENT", "TOOK", "AGE")]
    details: list[str] = []
    for obj in sorted(items, key=lambda o: o["metadata"].get("creationTimestamp", "")):
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        signals = spec.get("signals") or [{}]
        durations = step_durations(status.get("timeline") or [])
        took = f"{durations[-1][1]:.2f}s" if durations else "-"
        created = parse_time(obj["metadata"].get("creationTimestamp"))
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


def _run(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import api, list_custom

    kw = {"label_selector": f"{NODE_LABEL}={args.node}"} if args.node else {}
    items = list_custom(api(args.kubeconfig), NREM_PLURAL, **kw)
    print(status_table(items, now=dt.datetime.now(dt.UTC), wide=args.wide))
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="incidents (NodeRemediations) with their steps and durations"
    )
    p.add_argument("--node", help="only this node's incidents")
    p.add_argument("-w", "--wide", action="store_true", help="also each incident's timeline")
    p.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig file to use"
    )
    p.set_defaults(func=_run)
    return p
