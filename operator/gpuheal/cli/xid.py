"""`gpuheal xid parse` (kernel log lines on stdin, one JSON per XID out) and
`gpuheal xid explain CODE` (the catalogue entry). No cluster needed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from gpuheal.xid.catalogue import explain
from gpuheal.xid.parse import KernelLogScanner
from gpuheal.xid.types import XidEvent


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `xid parse` / `xid explain` on the main CLI's subparsers object."""
    xid = subparsers.add_parser(
        "xid", help="parse kernel logs for XIDs, explain an XID", description=__doc__
    )
    sub = xid.add_subparsers(dest="xid_command", required=True, metavar="WHAT")
    sub.add_parser("parse", help="read kernel log lines on stdin, print one JSON per XID")
    explain_p = sub.add_parser("explain", help="print the catalogue entry of an XID")
    explain_p.add_argument("code", type=int, help="the XID number, e.g. 79")
    xid.set_defaults(func=run)
    return xid  # type: ignore[no-any-return]


def parse_stream(lines: TextIO, out: TextIO) -> int:
    """One JSON object per recognised XID line: {"xid", "pci", "pid", "line", ...}."""
    scanner = KernelLogScanner()
    for line in lines:
        found = scanner.feed(line.rstrip("\n"))
        if isinstance(found, XidEvent):
            record = {
                "xid": found.xid,
                "pci": found.pci_bus_id,
                "pid": found.pid,
                "line": line.rstrip("\n"),
                "uuid": found.gpu_uuid,
                "process": found.process,
                "recoveryAction": found.recovery_action.value if found.recovery_action else None,
                "timestamp": found.timestamp.isoformat() if found.timestamp else None,
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.xid_command == "parse":
        return parse_stream(sys.stdin, sys.stdout)
    print(explain(args.code))
    return 0
