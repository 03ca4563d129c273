"""`gpuheal xid parse` (kernel log lines in, one JSON per XID out) and
`gpuheal xid explain CODE` (the catalogue entry). No cluster needed."""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

from gpuheal.cli._common import CliError
from gpuheal.xid.catalogue import explain
from gpuheal.xid.parse import KernelLogScanner
from gpuheal.xid.types import XidEvent

PARSE_HELP = """\
Read kernel log lines and print one JSON object per NVIDIA XID found, in order:
  xid, pci (the GPU's PCI bus id), pid and process (when the driver names them),
  uuid (when an earlier line of the same log tied the bus id to a GPU UUID),
  recoveryAction (XID 154), timestamp (when the line carries a full date), line.
The driver's multi-line "GPU has fallen off the bus" report without an XID line counts as
XID 79 (once, even when a real XID 79 line for the same GPU stands next to it).
Any log format works: dmesg (with or without -T), journalctl -k (short, short-iso),
/var/log/kern.log and syslog files, /dev/kmsg records. Lines that are not XIDs are
skipped; undecodable bytes (a log cut by a crash) are replaced, never fatal.
This is the parser the node agent and the operator use."""

PARSE_EXAMPLES = """\
examples:
  dmesg | gpuheal xid parse
  journalctl -k -o short-iso --since -1d | gpuheal xid parse
  gpuheal xid parse /var/log/kern.log /var/log/kern.log.2.gz
  gpuheal xid parse kern.log | jq -r .xid | sort -n | uniq -c     # XIDs by count"""

EXPLAIN_HELP = """\
Print gpuheal's catalogue entry for an XID: NVIDIA's meaning and its immediate and
investigatory actions, the class gpuheal files it under (the class a policy rule can
name instead of codes), and what gpuheal does at its first sight. An XID that is not in
the catalogue is class Unknown: alerted on, never acted upon."""


def add_arguments(xid: argparse.ArgumentParser) -> None:
    """`gpuheal xid parse` and `gpuheal xid explain`."""
    sub = xid.add_subparsers(dest="xid_command", required=True, metavar="WHAT")
    parse_p = sub.add_parser(
        "parse",
        help="read kernel log lines (files or stdin), print one JSON per XID",
        description=PARSE_HELP,
        epilog=PARSE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parse_p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="kernel log files, read in order (.gz decompressed); none or '-': stdin",
    )
    explain_p = sub.add_parser(
        "explain",
        help="print the catalogue entry of an XID",
        description=EXPLAIN_HELP,
        epilog="example:\n  gpuheal xid explain 79",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain_p.add_argument("code", type=int, help="the XID number, e.g. 79")
    xid.set_defaults(func=run)


def parse_stream(lines: Iterable[str], out: TextIO) -> int:
    """One JSON object per recognised XID line: {"xid", "pci", "pid", "line", ...}.
    Returns how many were found."""
    scanner = KernelLogScanner()
    found_n = 0
    for line in lines:
        text = line.rstrip("\r\n")
        found = scanner.feed(text)
        if isinstance(found, XidEvent):
            record = {
                "xid": found.xid,
                "pci": found.pci_bus_id,
                "pid": found.pid,
                "line": text,
                "uuid": found.gpu_uuid,
                "process": found.process,
                "recoveryAction": found.recovery_action.value if found.recovery_action else None,
                "timestamp": found.timestamp.isoformat() if found.timestamp else None,
            }
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            found_n += 1
    return found_n


@contextmanager
def _opened(path: str) -> Iterator[Iterable[str]]:
    """A log file's lines as text whatever its bytes (a log cut by a crash has NULs and
    half-written characters)."""
    if path == "-":  # bytes: a strict UTF-8 locale would stop at the first bad byte
        stdin = getattr(sys.stdin, "buffer", None)
        yield sys.stdin if stdin is None else (b.decode("utf-8", "replace") for b in stdin)
        return
    try:
        raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    with raw:
        try:
            yield (line.decode("utf-8", "replace") for line in raw)
        except (OSError, EOFError) as exc:  # a truncated or corrupt .gz
            raise CliError(f"cannot read {path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.xid_command == "parse":
        for path in args.files or ["-"]:
            with _opened(path) as lines:
                parse_stream(lines, sys.stdout)
        return 0
    print(explain(args.code))
    return 0
