"""Which nodes the bridge added to which job's ``ExcNodeList``, so that they can be lifted
once the node is back in service.

A requeue excludes the faulty node (defence in depth: the node is drained too, but a drain
can be lifted by someone else). Left there, the exclusion outlives the repair: a long job hit
by many faults over weeks would exclude every node that ever failed under it, repaired or not,
until it no longer fits the cluster. So each node the bridge adds (one the job did not exclude
already: a user's own exclusion is never lifted) is recorded here, and when the bridge resumes
the node, its exclusions are lifted:

- at once from jobs still pending (Slurm takes ``ExcNodeList`` updates only then);
- from the others at their next requeue (the record is marked *returned* until then).

Records live in a small SQLite file in the bridge's state directory (a restart remembers
them; without a state directory, in memory) and expire after ``ttl`` (a job gone by then has
nothing left to lift).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

DEFAULT_TTL = 60 * 24 * 3600.0  # 60 days: longer than any training job runs


class ExclusionLedger:
    def __init__(
        self,
        path: Path | None = None,
        *,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # one event loop uses it, but tests and the ASGI test client may create it elsewhere
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path), isolation_level=None, check_same_thread=False
        )
        if path is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            # a write sits in a requeue's path: no fsync per commit (WAL stays consistent; a
            # power loss may forget the last records, which costs a lift, never a wrong one)
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS exclusions (job INTEGER NOT NULL, node TEXT NOT NULL, "
            "returned INTEGER NOT NULL DEFAULT 0, at REAL NOT NULL, PRIMARY KEY (job, node))"
        )
        self._ttl = ttl
        self._clock = clock

    @classmethod
    def in_dir(cls, state_dir: Path | None) -> ExclusionLedger:
        """The bridge's ledger: ``exclusions.sqlite3`` in its state directory (expired
        records dropped), or in memory without one."""
        if state_dir is None:
            return cls()
        state_dir.mkdir(parents=True, exist_ok=True)
        ledger = cls(state_dir / "exclusions.sqlite3")
        ledger.purge()
        return ledger

    def added(self, job_id: int, nodes: Iterable[str]) -> None:
        """The bridge excluded ``nodes`` from the job (out of service again if returned)."""
        now = self._clock()
        self._db.executemany(
            "INSERT INTO exclusions (job, node, returned, at) VALUES (?, ?, 0, ?) "
            "ON CONFLICT (job, node) DO UPDATE SET returned = 0, at = excluded.at",
            [(job_id, node, now) for node in nodes],
        )

    def node_returned(self, node: str) -> list[int]:
        """The node is back in service: mark its records; the jobs they name, oldest first."""
        self._db.execute("UPDATE exclusions SET returned = 1 WHERE node = ?", (node,))
        rows = self._db.execute(
            "SELECT job FROM exclusions WHERE node = ? ORDER BY at, job", (node,)
        )
        return [job for (job,) in rows]

    def returned_for(self, job_id: int) -> set[str]:
        """Nodes the bridge excluded from the job that are back in service since."""
        rows = self._db.execute(
            "SELECT node FROM exclusions WHERE job = ? AND returned = 1", (job_id,)
        )
        return {node for (node,) in rows}

    def forget(self, job_id: int, nodes: Iterable[str]) -> None:
        self._db.executemany(
            "DELETE FROM exclusions WHERE job = ? AND node = ?", [(job_id, n) for n in nodes]
        )

    def purge(self) -> int:
        cur = self._db.execute("DELETE FROM exclusions WHERE at < ?", (self._clock() - self._ttl,))
        return cur.rowcount

    def close(self) -> None:
        self._db.close()
