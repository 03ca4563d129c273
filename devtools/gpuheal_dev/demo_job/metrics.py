"""The job's JSON-lines metrics file: one object per line, appended across restarts.

Every record has ``event`` and ``time`` (Unix seconds, ``time.time()`` on the node), ``host``
(``SLURMD_NODENAME``), ``restart`` (``SLURM_RESTART_COUNT``) and ``job_id``. Events:

- ``start``: the process started; ``resume_step`` (0 = fresh), ``checkpoint`` (path or null),
  ``proc_start`` (time the interpreter began importing this package), ``steps`` (target);
- ``step``: ``step``, ``loss`` (minibatch loss), ``lr``;
- ``checkpoint``: ``step``, ``reason`` (``interval``, ``SIGUSR1``, ``SIGTERM``, ...),
  ``seconds`` (write time);
- ``signal``: ``signal`` and the ``step`` it arrived after;
- ``exit``: ``step``, ``reason`` (left early on a signal, after checkpointing);
- ``done``: ``step``, ``loss`` and ``accuracy`` on the whole dataset, ``model`` path.

A line cut short by SIGKILL is skipped on reading.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

Record = dict[str, Any]


class MetricsWriter:
    """Appends records, one ``write`` + flush each (a reader sees whole lines)."""

    def __init__(self, path: Path, common: Record) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.common = common
        self._f: TextIO = path.open("a", encoding="utf-8")

    def write(self, event: str, at: float, **fields: Any) -> None:
        record = {"event": event, "time": round(at, 6), **self.common, **fields}
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def parse_records(lines: Iterable[str]) -> list[Record]:
    out = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by SIGKILL
        if isinstance(rec, dict) and "event" in rec and "time" in rec:
            out.append(rec)
    return out


def read_records(path: Path) -> list[Record]:
    """All whole records of ``path`` ([] when it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return parse_records(text.splitlines())


class MetricsTail:
    """Follow the metrics file: ``poll()`` returns the whole records appended since the last
    call (a line still being written is kept for the next one). For live progress output."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[Record]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        return parse_records(line.decode("utf-8", "replace") for line in lines)


def describe(rec: Record) -> str:
    """One line for a live display, e.g. ``step 120 loss 0.512 on gpu-node-1 (restart 0)``."""
    ev = rec["event"]
    resume = rec.get("resume_step") or 0
    if ev == "step":
        what = f"step {rec['step']} loss {float(rec['loss']):.3f}"
    elif ev == "start":
        what = f"started from step {resume}" if resume else "started fresh"
    elif ev == "checkpoint":
        what = f"checkpoint at step {rec['step']} ({rec.get('reason')})"
    elif ev == "signal":
        what = f"got {rec.get('signal')} after step {rec.get('step')}"
    elif ev == "exit":
        what = f"exited on {rec.get('reason')} at step {rec.get('step')}"
    elif ev == "done":
        what = f"finished at step {rec['step']}, loss {float(rec.get('loss', 'nan')):.3f}"
    else:
        what = str(ev)
    return f"{what} on {rec.get('host')} (restart {rec.get('restart', 0)})"


@dataclass(frozen=True)
class Run:
    """One process lifetime of the job (a ``start`` record and what followed it)."""

    restart: int
    host: str
    start: Record
    steps: list[Record]
    checkpoints: list[Record]
    end: Record | None  # exit / done, None when killed without one

    @property
    def resume_step(self) -> int:
        return int(self.start.get("resume_step", 0))

    @property
    def last_step(self) -> int:
        return int(self.steps[-1]["step"]) if self.steps else self.resume_step


def split_runs(records: Iterable[Record]) -> list[Run]:
    """Group records by process lifetime (each ``start`` opens a new run)."""
    runs: list[Run] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        if cur is not None:
            runs.append(Run(**cur))

    for rec in records:
        ev = rec["event"]
        if ev == "start":
            close()
            cur = {
                "restart": int(rec.get("restart", 0)),
                "host": str(rec.get("host", "")),
                "start": rec,
                "steps": [],
                "checkpoints": [],
                "end": None,
            }
        elif cur is None:
            continue
        elif ev == "step":
            cur["steps"].append(rec)
        elif ev == "checkpoint":
            cur["checkpoints"].append(rec)
        elif ev in ("exit", "done"):
            cur["end"] = rec
    close()
    return runs


def steps_lost(runs: list[Run]) -> list[int]:
    """For each restart, how many steps the previous run did that the next one redid."""
    return [max(0, prev.last_step - nxt.resume_step) for prev, nxt in itertools.pairwise(runs)]
