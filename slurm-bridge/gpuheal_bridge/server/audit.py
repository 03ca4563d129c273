"""Append-only audit log: one JSON object per line (who, what, on what, result).

What a line holds of a request and its answer is bounded (:func:`bounded`, :func:`summary`):
a hostile body or name must not make one line megabytes long."""

from __future__ import annotations

import json
import os
import time
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
