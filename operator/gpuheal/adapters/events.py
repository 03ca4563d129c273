"""Kubernetes Events posted off the critical path.

An Event is what a person reads in ``kubectl describe``; nothing gpuheal decides depends on
one. So a step or a new incident never waits for one: `EventOutbox.post` queues it (stamped
with the time it happened) and returns; a few workers post the queue in order of arrival,
retrying what the API server refuses for a while (429, 5xx, timeouts, connection errors).
An Event that cannot be posted after the retries, one that does not fit in the queue, and
the ones still queued at shutdown are logged at WARNING with their reason and message and
counted (``gpuheal_events_total{result="lost"}``): never lost silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from gpuheal.adapters.kube import ApiError, Kube

log = logging.getLogger("gpuheal.adapters.events")


@dataclass(frozen=True, slots=True)
class Notice:
    involved: dict[str, Any]
    reason: str
    message: str
    type_: str
    at: dt.datetime


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, aiohttp.ClientError | TimeoutError | OSError)


class EventOutbox:
    def __init__(
        self,
        kube: Kube,
        *,
        workers: int = 4,
        capacity: int = 10_000,
        attempts: int = 5,
        max_wait: float = 8.0,
        count: Callable[[str], None] = lambda result: None,
    ) -> None:
        self.kube = kube
        self.workers = workers
        self.attempts = attempts
        self.max_wait = max_wait
        self.count = count  # result: posted | lost | dropped
        self.queue: asyncio.Queue[Notice] = asyncio.Queue(maxsize=capacity)

    def post(
        self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal"
    ) -> None:
        """Queue an Event about ``involved``; returns at once. Past the object's Event
        budget it is dropped here (counted ``dropped``), before it takes a place in the queue."""
        if not self.kube.event_allowed(involved):
            self.count("dropped")
            return
        notice = Notice(involved, reason, message, type_, dt.datetime.now(dt.UTC))
        try:
            self.queue.put_nowait(notice)
        except asyncio.QueueFull:
            self._lost(notice, "the Event queue is full")

    async def run(self) -> None:
        """Post queued Events until cancelled (``workers`` at a time)."""
        await asyncio.gather(*(self._work() for _ in range(self.workers)))

    async def flush(self, within: float) -> None:
        """Wait (at most ``within`` seconds) for the queue to be posted; what is left is
        logged as lost. For shutdown, while `run` still runs."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), within)
        while not self.queue.empty():
            self._lost(self.queue.get_nowait(), "still queued at shutdown")
            self.queue.task_done()

    async def _work(self) -> None:
        while True:
            notice = await self.queue.get()
            try:
                await self._send(notice)
            except asyncio.CancelledError:
                self._lost(notice, "cancelled at shutdown")
                raise
            except Exception as exc:
                self._lost(notice, f"{type(exc).__name__}: {exc}")
            else:
                self.count("posted")
            finally:
                self.queue.task_done()

    async def _send(self, notice: Notice) -> None:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_transient),
            wait=wait_exponential_jitter(
                multiplier=min(0.5, self.max_wait), max=self.max_wait, jitter=self.max_wait / 8
            ),
            stop=stop_after_attempt(self.attempts),
            reraise=True,
        ):
            with attempt:
                await self.kube.send_event(
                    notice.involved,
                    reason=notice.reason,
                    message=notice.message,
                    type_=notice.type_,
                    at=notice.at,
                )

    def _lost(self, notice: Notice, why: str) -> None:
        self.count("lost")
        meta = notice.involved.get("metadata") or {}
        log.warning(
            "Event not posted (%s): %s %s on %s %s at %s: %s",
            why,
            notice.type_,
            notice.reason,
            notice.involved.get("kind", "Node"),
            meta.get("name"),
            notice.at.isoformat(),
            notice.message,
        )
