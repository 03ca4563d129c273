"""Idempotency keys: a retried POST with the same ``Idempotency-Key`` gets the stored answer.

Results are kept for a TTL in a small SQLite file under the state directory, so a bridge
restart does not requeue twice. A key is scoped by the caller (token name); reusing it for
a different request (method, path or body) is an error, not a replay. Only answers below
500 are stored: a 503 (slurmctld down) must be retried for real. Concurrent requests with
the same key are serialised, the second gets the first one's stored answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_MAX = 200
#: Set on an answer that is the stored one of an earlier request with the same key.
REPLAYED_HEADER = "Idempotency-Replayed"


class KeyMismatch(Exception):
    """The key was used before for a different request."""


@dataclass(frozen=True)
class Stored:
    status: int
    body: Any
    created: float


def fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


def valid_key(key: str) -> bool:
    return 0 < len(key) <= KEY_MAX and key.isascii() and key.isprintable()


class IdempotencyStore:
    def __init__(
        self, path: str | Path | None, ttl: float = 86400.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._path = str(path) if path else ":memory:"
        self._db_conn: sqlite3.Connection | None = None
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, (re)opened on use: an app's lifespan may end and start again."""
        if self._db_conn is None:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS results (scope TEXT, key TEXT, fingerprint TEXT, "
                "status INTEGER, body TEXT, created REAL, PRIMARY KEY (scope, key))"
            )
            self._db_conn = db
        return self._db_conn

    def lock(self, scope: str, key: str) -> asyncio.Lock:
        return self._locks[(scope, key)]

    def get(self, scope: str, key: str, fp: str) -> Stored | None:
        row = self._db.execute(
            "SELECT fingerprint, status, body, created FROM results WHERE scope=? AND key=?",
            (scope, key),
        ).fetchone()
        if row is None:
            return None
        if row[3] + self.ttl < self._clock():
            self._db.execute("DELETE FROM results WHERE scope=? AND key=?", (scope, key))
            return None
        if row[0] != fp:
            raise KeyMismatch(f"Idempotency-Key {key!r} was used for a different request")
        return Stored(status=row[1], body=json.loads(row[2]), created=row[3])

    def put(self, scope: str, key: str, fp: str, status: int, body: Any) -> None:
        if status >= 500:
            return
        self._db.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
            (scope, key, fp, status, json.dumps(body), self._clock()),
        )

    def purge(self) -> int:
        cur = self._db.execute("DELETE FROM results WHERE created < ?", (self._clock() - self.ttl,))
        for k in [k for k, lock in self._locks.items() if not lock.locked()]:
            del self._locks[k]
        return cur.rowcount

    def close(self) -> None:
        """Close the file (a later call reopens it; an in-memory store keeps its results)."""
        if self._db_conn is not None and self._path != ":memory:":
            self._db_conn.close()
            self._db_conn = None
