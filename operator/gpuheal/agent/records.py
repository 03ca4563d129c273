"""Kernel-log records: `/dev/kmsg` (one record per read) and text logs (one line per record).

`/dev/kmsg` gives every record with its sequence number; a record printed with inner newlines
(the driver's multi-line "fallen off the bus" message) is one record whose newlines read `\\x0a`,
followed by ` KEY=value` dictionary lines. Text logs (`dmesg`, `dmesg -T`, `journalctl -k`,
`/var/log/kern.log`, or a saved copy of /dev/kmsg) give one line per record; the line number is
its position. A position only grows within one *stream*: a boot (its boot id) for /dev/kmsg, a
file (the digest of its first line) for a text log.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import hashlib
import os
import re
import stat
from pathlib import Path

from gpuheal.xid.parse import parse_timestamp, unescape_kmsg

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
MAX_RECORD = 16 * 1024
_KMSG_RE = re.compile(
    r"^(?P<prio>[0-9]{1,4}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20}),[^;]{0,64};"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    position: int  # kmsg sequence number, or line number (1-based) in a text log
    text: str  # the message, unescaped; may hold several lines
    time: dt.datetime | None = None  # wall-clock time when the record says


def parse_kmsg_record(raw: str, boot_time: dt.datetime | None = None) -> Record | None:
    """`6,1234,5678901234,-;text\\n KEY=value...` -> Record; None if it is not a kmsg record."""
    m = _KMSG_RE.match(raw)
    if m is None:
        return None
    body = raw[m.end() :].split("\n", 1)[0]  # dictionary lines follow the first newline
    when = None
    if boot_time is not None:
        when = boot_time + dt.timedelta(microseconds=int(m.group("usec")))
    return Record(position=int(m.group("seq")), text=unescape_kmsg(body[:MAX_RECORD]), time=when)


def text_record(lineno: int, line: str, boot_time: dt.datetime | None = None) -> Record | None:
    """One line of a text log -> Record (a saved kmsg record is read as one); None for the
    dictionary continuation lines of a saved /dev/kmsg dump."""
    line = line.rstrip("\r\n")[:MAX_RECORD]
    kmsg = parse_kmsg_record(line, boot_time)
    if kmsg is not None:
        return dataclasses.replace(kmsg, position=lineno)
    if line.startswith(" ") and "=" in line and " " not in line.strip():
        return None  # " SUBSYSTEM=pci" after a saved kmsg record
    return Record(position=lineno, text=line, time=parse_timestamp(line))


def read_boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def boot_time(now: dt.datetime) -> dt.datetime | None:
    """Wall-clock time of boot (kmsg timestamps count microseconds from it)."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return now - dt.timedelta(seconds=uptime)


def is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


class KmsgDevice:
    """`/dev/kmsg`, non-blocking: `read_available()` returns the records buffered so far."""

    def __init__(self, path: Path, boot: dt.datetime | None) -> None:
        self.path = path
        self.boot = boot
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.lost = 0  # records overwritten before we read them (EPIPE)

    def read_available(self, limit: int = 10_000) -> list[Record]:
        out: list[Record] = []
        while len(out) < limit:
            try:
                raw = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring buffer wrapped past us: go on
                    self.lost += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than our buffer
                    continue
                raise
            if not raw:
                break
            record = parse_kmsg_record(raw.decode("utf-8", "replace"), self.boot)
            if record is not None:
                out.append(record)
        return out

    def close(self) -> None:
        os.close(self.fd)


class TextLog:
    """A text log read from its start; with `follow`, new lines as they are appended, and the
    new file after rotation (inode changed or truncated)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("rb")
        self._ino = os.fstat(self._fh.fileno()).st_ino
        self._partial = b""
        self.lineno = 0
        self.first_line: str | None = None
        self.rotated = False

    def read_available(self, *, final: bool = False) -> list[tuple[int, str]]:
        """Complete lines appended since the last call (with `final`, a last unterminated
        line too)."""
        data = self._fh.read()
        if not data and not final and self._rotated():
            self._reopen()
            data = self._fh.read()
        buf = self._partial + data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        out: list[tuple[int, str]] = []
        for raw in lines:
            self.lineno += 1
            line = raw.decode("utf-8", "replace")
            if self.first_line is None:
                self.first_line = line
            out.append((self.lineno, line))
        return out

    def _rotated(self) -> bool:
        try:
            st = self.path.stat()
        except OSError:
            return False
        return st.st_ino != self._ino or st.st_size < self._fh.tell()

    def _reopen(self) -> None:
        self._fh.close()
        self._fh = self.path.open("rb")
        self._ino = os.fstat(self._fh.fileno()).st_ino
        self._partial = b""
        self.lineno = 0
        self.first_line = None
        self.rotated = True

    def close(self) -> None:
        self._fh.close()


def text_stream_id(first_line: str) -> str:
    """A text log's stream: the digest of its first line (a rotated or other file differs)."""
    return "file-" + hashlib.sha256(first_line.encode("utf-8", "replace")).hexdigest()[:16]


def boot_stream_id(boot_id: str) -> str:
    return "boot-" + re.sub(r"[^0-9a-f]", "", boot_id.lower())[:32]
