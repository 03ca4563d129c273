"""Telling people: an incident opened, is blocked (and why), waits for an approval, ended,
or failed, posted to webhooks (generic JSON or Slack-compatible).

Configured globally (``gpuheal run --notify-webhooks``) and per policy
(``spec.notifications``). A URL is written there or read from a Secret key in the operator's
namespace at each send (``secretRef``; ``secret:NAME/KEY`` in ``--notify-webhooks``): a webhook
URL is often a credential in itself (Slack's), so logs name a target by its Secret or by its
scheme and host only, never by its URL.

The driver calls `Ports.announce` after the transition is recorded in status, and it
returns at once: each receiver has its own bounded queue and one sender task
(messages to a receiver keep their order; a slow or dead receiver holds up only its own
queue, never a remediation). A full queue drops the new message and counts it. A send is
retried with jittered backoff on connection errors, 429 and 5xx; any other answer is final.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from gpuheal.adapters.kube import ApiError, Kube
from gpuheal.adapters.notify import Unreachable
from gpuheal.api.meta import redact_url, rfc3339, scrub_url
from gpuheal.api.remediationpolicy import Notifications, NotifyEvent, NotifyFormat

log = logging.getLogger("gpuheal.notify")

Send = Callable[[str, Mapping[str, Any], str], Awaitable[int]]


@dataclasses.dataclass(frozen=True, slots=True)
class Notice:
    """One incident transition, as people are told about it."""

    event: NotifyEvent
    incident: str
    node: str
    policy: str
    rule: str
    reason: str
    message: str
    time: dt.datetime
    xid: int | None = None
    dry_run: bool = False

    @property
    def key(self) -> str:
        """Names the message: the same transition sent again has the same key."""
        return f"{self.incident}-{self.event.value}-{self.reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class SecretUrl:
    """Where a target's URL is kept: a key of a Secret."""

    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"Secret {self.namespace}/{self.name} key {self.key}"


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    url: str | None  # None: read from `secret` at each send
    format: NotifyFormat = NotifyFormat.GENERIC
    events: frozenset[NotifyEvent] = frozenset()  # empty: every event
    secret: SecretUrl | None = None

    def wants(self, event: NotifyEvent) -> bool:
        return not self.events or event in self.events

    @property
    def ident(self) -> str:
        """One receiver, one queue: the URL, or the Secret key it is read from."""
        return self.url if self.url is not None else f"secret:{self.secret}"

    @property
    def where(self) -> str:
        """The target as logs may name it: never the URL (often a credential in itself)."""
        return str(self.secret) if self.url is None else redact_url(self.url)


class UrlUnavailable(Exception):
    """A target's URL could not be read (its Secret or key missing, or not readable)."""


async def secret_url(kube: Kube, ref: SecretUrl) -> str:
    """The URL kept in ``ref``, read now (a changed Secret counts from the next send)."""
    try:
        value = await kube.get_secret_value(ref.namespace, ref.name, ref.key)
    except ApiError as exc:
        raise UrlUnavailable(f"{ref}: cannot read it ({exc.status} {exc.reason})") from None
    if value is None:
        raise UrlUnavailable(f"{ref}: no such Secret or key")
    url = value.strip()
    if not url.startswith(("http://", "https://")):
        raise UrlUnavailable(f"{ref}: not an http(s) URL")
    return url


_HEADLINE = {
    NotifyEvent.OPENED: "opened",
    NotifyEvent.BLOCKED: "blocked",
    NotifyEvent.APPROVAL_PENDING: "needs approval",
    NotifyEvent.COMPLETED: "completed",
    NotifyEvent.FAILED: "FAILED",
    NotifyEvent.DOMAIN_OPENED: "domain incident opened",
}
_EMOJI = {
    NotifyEvent.OPENED: ":rotating_light:",
    NotifyEvent.BLOCKED: ":no_entry:",
    NotifyEvent.APPROVAL_PENDING: ":raised_hand:",
    NotifyEvent.COMPLETED: ":white_check_mark:",
    NotifyEvent.FAILED: ":x:",
    NotifyEvent.DOMAIN_OPENED: ":rotating_light:",
}


def generic_payload(n: Notice) -> dict[str, Any]:
    return {
        "source": "gpuheal",
        "event": n.event.value,
        "incident": n.incident,
        "node": n.node,
        "policy": n.policy,
        "rule": n.rule,
        "reason": n.reason,
        "message": n.message,
        "xid": n.xid,
        "dryRun": n.dry_run,
        "time": rfc3339(n.time),
    }


def slack_payload(n: Notice) -> dict[str, Any]:
    """Slack's incoming-webhook body (``text``, mrkdwn), which Mattermost, Rocket.Chat and
    Teams' Slack-compatible connectors also read."""
    xid = f" XID {n.xid}" if n.xid is not None else ""
    dry = " (dry run)" if n.dry_run else ""
    text = (
        f"{_EMOJI[n.event]} gpuheal incident `{n.incident}` on `{n.node}`{xid}: "
        f"*{_HEADLINE[n.event]}*{dry} ({n.reason})\n{n.message}\n"
        f"policy `{n.policy}`, rule `{n.rule}`; `kubectl describe nrem {n.incident}`"
    )
    return {"text": text}


def payload(n: Notice, fmt: NotifyFormat) -> dict[str, Any]:
    return slack_payload(n) if fmt is NotifyFormat.SLACK else generic_payload(n)


def policy_targets(notifications: Notifications | None, namespace: str) -> list[Target]:
    """A policy's receivers; a ``secretRef`` names a Secret in ``namespace`` (the
    operator's own: a policy, cluster-scoped, cannot point the operator at other
    namespaces' Secrets)."""
    if notifications is None:
        return []
    return [
        Target(
            w.url,
            w.format,
            frozenset(w.events),
            SecretUrl(namespace, w.secret_ref.name, w.secret_ref.key) if w.secret_ref else None,
        )
        for w in notifications.webhooks
    ]


def merge_targets(*groups: Iterable[Target]) -> list[Target]:
    """One send per (url or Secret key, format): a receiver named globally and in the
    policy gets the message once if either wants it."""
    merged: dict[tuple[str, NotifyFormat], Target] = {}
    for target in (t for g in groups for t in g):
        key = (target.ident, target.format)
        seen = merged.get(key)
        if seen is None:
            merged[key] = target
        elif seen.events and target.events:
            merged[key] = dataclasses.replace(seen, events=seen.events | target.events)
        else:
            merged[key] = dataclasses.replace(seen, events=frozenset())
    return list(merged.values())


class Notifier:
    def __init__(
        self,
        send: Send,
        *,
        queue_size: int = 100,
        retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        on_result: Callable[[NotifyEvent, str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        resolve: Callable[[SecretUrl], Awaitable[str]] | None = None,
    ) -> None:
        self._send = send
        self._resolve = resolve
        self._queue_size = queue_size
        self._retrying = AsyncRetrying(
            stop=stop_after_attempt(retries + 1),
            wait=wait_random_exponential(multiplier=backoff, max=max_backoff),
            retry=retry_if_exception_type(_Again),
            sleep=sleep,
            reraise=True,
        )
        self._on_result = on_result or (lambda event, result: None)
        self._queues: dict[str, asyncio.Queue[tuple[Target, Notice]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    def notify(self, notice: Notice, targets: Sequence[Target]) -> None:
        """Queue ``notice`` for every target that wants it; never waits."""
        for target in targets:
            if not target.wants(notice.event):
                continue
            queue = self._queues.get(target.ident)
            if queue is None:
                queue = self._queues[target.ident] = asyncio.Queue(self._queue_size)
                self._workers[target.ident] = asyncio.create_task(
                    self._work(queue), name=f"notify:{target.where}"
                )
            try:
                queue.put_nowait((target, notice))
            except asyncio.QueueFull:
                self._on_result(notice.event, "dropped")
                log.warning("notification queue of %s full: dropped %s", target.where, notice.key)

    async def _work(self, queue: asyncio.Queue[tuple[Target, Notice]]) -> None:
        while True:
            target, notice = await queue.get()
            try:
                result = await self._deliver(target, notice)
            except Exception:  # a bug must not end the receiver's queue
                log.exception("notification %s to %s", notice.key, target.where)
                result = "failed"
            self._on_result(notice.event, result)
            queue.task_done()

    async def _deliver(self, target: Target, notice: Notice) -> str:
        body = payload(notice, target.format)

        async def attempt() -> int:
            url = target.url
            try:
                if url is None:
                    if target.secret is None or self._resolve is None:
                        raise UrlUnavailable(f"{target.where}: no URL and no way to read one")
                    url = await self._resolve(target.secret)
                code = await self._send(url, body, notice.key)
            except UrlUnavailable as exc:  # a Secret not there yet may be made in a moment
                raise _Again(str(exc)) from None
            except Unreachable as exc:
                raise _Again(scrub_url(str(exc), url or "")) from None
            if code == 429 or code >= 500:
                raise _Again(f"HTTP {code}")
            return code

        try:
            code: int = await self._retrying.copy()(attempt)
        except _Again as exc:
            log.warning("notification %s to %s not delivered: %s", notice.key, target.where, exc)
            return "failed"
        if 200 <= code < 300:
            return "sent"
        log.warning("notification %s to %s refused: HTTP %s", notice.key, target.where, code)
        return "rejected"

    async def flush(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every queue to empty."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(q.join() for q in self._queues.values())), seconds
            )

    async def close(self, grace: float = 2.0) -> None:
        """Give queued messages ``grace`` seconds, then stop the senders."""
        await self.flush(grace)
        for task in self._workers.values():
            task.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)


class _Again(Exception):
    """Worth another try (unreachable, 429, 5xx)."""
