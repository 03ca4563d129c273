"""`gpuheal history`: repeat offenders. Nodes (or, with --gpus, GPUs) by their faults in a
window, read from the FaultHistory objects the operator keeps (`kubectl get faulthistories`
shows the same per node); `--node N` prints that node's record entry by entry."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from typing import Any

from gpuheal.api.faulthistory import FaultHistory
from gpuheal.api.meta import DurationError, parse_duration
from gpuheal.api.names import HISTORY_PLURAL
from gpuheal.cli._common import add_cluster_flags
from gpuheal.policy.faultrecord import Offender, offenders


def parse_window(text: str) -> dt.timedelta:
    """`7d`, `168h`, `90m`: days are accepted here (not in the CRDs, which speak Go)."""
    if text.endswith("d") and text[:-1].isdigit():
        return dt.timedelta(days=int(text[:-1]))
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _age(ts: dt.datetime | None, now: dt.datetime) -> str:
    if ts is None:
        return "-"
    s = int((now - ts).total_seconds())
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h" if s < 172800 else f"{s // 86400}d"


def offenders_table(rows: Sequence[Offender], *, now: dt.datetime, by_gpu: bool) -> str:
    head = ("NODE", "GPU", "PCI") if by_gpu else ("NODE",)
    table = [(*head, "FAULTS", "XIDS", "INCIDENTS", "LAST FAULT", "LAST OUTCOME")]
    for r in rows:
        xids = ",".join(f"{x}x{n}" if n > 1 else str(x) for x, n in r.xids.most_common()) or "-"
        who = (r.node, r.gpu or "-", r.pci_bus_id or "-") if by_gpu else (r.node,)
        table.append((*who, str(r.faults), xids, str(r.incidents), _age(r.last_fault, now),
                      r.last_outcome or "-"))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines)


def node_record(history: FaultHistory, *, since: dt.datetime) -> str:
    """One node's entries in the window, oldest first."""
    st = history.status
    lines = [f"node {history.spec.node_name}: {st.summary or 'no summary'}"]
    for g in st.gpus:
        slot = f" (PCI {g.pci_bus_id})" if g.pci_bus_id and g.pci_bus_id != g.id else ""
        xids = ", ".join(map(str, g.xids)) or "-"
        lines.append(f"  GPU {g.id}{slot}: {g.faults} fault(s), XIDs {xids}")
    for e in st.entries:
        if e.time < since:
            continue
        what = {
            "Signal": f"XID {e.xid}" if e.xid else (e.event_reason or e.condition_type or "signal"),
            "Incident": f"incident rule {e.rule} rung {e.rung}",
            "Action": f"{e.action} (rung {e.rung})",
            "Outcome": f"outcome {e.outcome}",
        }[e.kind.value]
        where = f" on {e.gpu}" if e.gpu else ""
        inc = f" [{e.incident}]" if e.incident else ""
        lines.append(f"  {e.time.isoformat()}  {e.kind.value:<8} {what}{where}{inc}  {e.message}")
    return "\n".join(lines)


def _parsed(items: list[dict[str, Any]]) -> list[FaultHistory]:
    out = []
    for item in items:
        try:
            out.append(FaultHistory.model_validate(item))
        except ValueError as exc:
            print(f"(FaultHistory {item['metadata']['name']} does not parse: {exc})")
    return out


def _run(args: argparse.Namespace) -> int:
    from gpuheal.cli._cluster import api, list_custom

    now = dt.datetime.now(dt.UTC)
    since = now - args.window
    histories = _parsed(list_custom(api(args.kubeconfig, args.context), HISTORY_PLURAL)["items"])
    if args.node:
        mine = [h for h in histories if h.spec.node_name == args.node]
        print(node_record(mine[0], since=since) if mine else f"no history for {args.node}")
        return 0
    rows = [r for r in offenders(histories, since=since, by_gpu=args.gpus) if r.faults >= args.min]
    print(offenders_table(rows[: args.limit], now=now, by_gpu=args.gpus))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--window", type=parse_window, default=dt.timedelta(days=7),
        help="how far back (7d, 168h, 90m; default 7d)",
    )  # fmt: skip
    p.add_argument("--gpus", action="store_true", help="one row per GPU instead of per node")
    p.add_argument("--min", type=int, default=1, help="only rows with at least this many faults")
    p.add_argument("--limit", type=int, default=50, help="at most this many rows")
    p.add_argument("--node", help="print this node's record entry by entry")
    add_cluster_flags(p)
    p.set_defaults(func=_run)
