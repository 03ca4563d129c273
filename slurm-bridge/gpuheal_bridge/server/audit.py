"""Append-only audit log: one JSON object per line (who, what, on what, result).

What a line holds of a request and its answer is bounded (:func:`bounded`, :func:`summary`):
a hostile body or name must not make one line megabytes long."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEXT_MAX = 2048


class AuditLog:
    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: Any) -> None:
        if self.path is None:
            return
        record = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **record}
        line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
        # O_APPEND: each write lands at the end even with several writers; one write per line.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class RefusalThrottle:
    """At most one audit line per source and kind of refusal (a 401, a 403) every
    ``interval`` seconds: a flood of bad tokens from one address must not fill the disk. The
    line written when a source's interval has passed carries how many were left out since its
    last line (``suppressed``); the metrics still count every request.

    At most ``max_sources`` sources are tracked: past that, those whose interval ended are
    forgotten (their count of left-out lines with them), then the oldest."""

    def __init__(
        self,
        interval: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = 4096,
    ) -> None:
        self.interval, self.clock, self.max_sources = interval, clock, max_sources
        # source -> [when its last line was written, refusals left out since]
        self._seen: dict[tuple[str, int], list[float]] = {}

    def admit(self, peer: str | None, status: int) -> int | None:
        """None: leave this refusal's line out (counted); else write it, with the number left
        out since the source's previous line."""
        now, key = self.clock(), (peer or "unknown", status)
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            seen[1] += 1
            return None
        suppressed = int(seen[1]) if seen is not None else 0
        self._seen.pop(key, None)
        if len(self._seen) >= self.max_sources:
            self._forget(now)
        self._seen[key] = [now, 0]
        return suppressed

    def _forget(self, now: float) -> None:
        for key in [k for k, (t, _) in self._seen.items() if now - t >= self.interval]:
            del self._seen[key]
        while len(self._seen) >= self.max_sources:
            del self._seen[next(iter(self._seen))]  # dicts keep insertion order: the oldest


def bounded(value: Any) -> Any:
    """``value``, or the start of its JSON text when that is long (a hostile body or name)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= TEXT_MAX:
        return value
    return f"{text[:TEXT_MAX]}... ({len(text)} characters)"


def summary(out: Any) -> Any:
    """What an audit line keeps of an answer: its outcome or error, and each job's."""
    if not isinstance(out, dict):
        return out
    keys = ("outcome", "error", "message", "owner", "job_id", "detail", "restart_count")
    kept = {k: out[k] for k in keys if k in out}
    if "jobs" in out:
        kept["jobs"] = [
            {k: j.get(k) for k in ("job_id", "outcome", "restart_count")} for j in out["jobs"]
        ]
    return kept
