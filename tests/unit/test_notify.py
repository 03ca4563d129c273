"""The notifier against a real HTTP server on loopback (the operator's own sender, httpx):
what receivers get, retries, a dead receiver that holds up nothing, the bounded queue."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuheal.adapters.notify import WebhookSender
from gpuheal.api.meta import redact_url, scrub_url
from gpuheal.api.remediationpolicy import Notifications, NotifyEvent, NotifyFormat
from gpuheal.config import parse_events, parse_webhooks
from gpuheal.remediation.notify import (
    Notice,
    Notifier,
    SecretUrl,
    Target,
    UrlUnavailable,
    merge_targets,
    policy_targets,
)
from tests.integration.operator_harness import free_port

NOW = dt.datetime(2026, 11, 22, 6, 0, 0, tzinfo=dt.UTC)


class Receiver:
    """A webhook receiver on loopback: records every POST, answers from a script."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.answers: list[int] = []  # status codes to answer, in order; then 200
        self.delay = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(receiver.delay)
                receiver.got.append((self.path, dict(self.headers), body))
                code = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str | None = None) -> list[dict[str, Any]]:
        return [b for p, _, b in self.got if path is None or p == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def notice(event: NotifyEvent = NotifyEvent.BLOCKED, reason: str = "CircuitBreakerOpen") -> Notice:
    return Notice(
        event=event, incident="nrem-gpu-1-abc", node="gpu-1", policy="p", rule="fell-off-bus",
        reason=reason, message="3 of 3 allowed unhealthy", time=NOW, xid=79,
    )  # fmt: skip


async def _no_sleep(_: float) -> None:
    return None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_receivers_get_generic_json_and_slack_text(receiver: Receiver) -> None:
    async def go() -> None:
        sender = WebhookSender(timeout=5)
        results: list[tuple[NotifyEvent, str]] = []
        n = Notifier(
            lambda u, b, k: sender.post(u, b, key=k), on_result=lambda e, r: results.append((e, r))
        )
        n.notify(
            notice(),
            [
                Target(f"{receiver.url}/generic"),
                Target(f"{receiver.url}/slack", NotifyFormat.SLACK),
            ],
        )
        await n.close(grace=10)
        await sender.aclose()
        assert sorted(results) == [(NotifyEvent.BLOCKED, "sent")] * 2

    run(go())
    (generic,) = receiver.bodies("/generic")
    assert generic == {
        "source": "gpuheal", "event": "Blocked", "incident": "nrem-gpu-1-abc", "node": "gpu-1",
        "policy": "p", "rule": "fell-off-bus", "reason": "CircuitBreakerOpen",
        "message": "3 of 3 allowed unhealthy", "xid": 79, "dryRun": False,
        "time": "2026-11-22T06:00:00Z",
    }  # fmt: skip
    (slack,) = receiver.bodies("/slack")
    assert set(slack) == {"text"}
    assert slack["text"].startswith(
        ":no_entry: gpuheal incident `nrem-gpu-1-abc` on `gpu-1` XID 79: *blocked* "
        "(CircuitBreakerOpen)\n3 of 3 allowed unhealthy"
    )
    keys = {h["Idempotency-Key"] for _, h, _ in receiver.got}
    assert keys == {"nrem-gpu-1-abc-Blocked-CircuitBreakerOpen"}


def test_retries_on_5xx_and_429_then_gives_up_and_never_retries_a_4xx(receiver: Receiver) -> None:
    async def go() -> list[str]:
        sender = WebhookSender(timeout=5)
        results: list[str] = []
        n = Notifier(
            lambda u, b, k: sender.post(u, b, key=k), retries=3, sleep=_no_sleep,
            on_result=lambda e, r: results.append(r),
        )  # fmt: skip
        target = [Target(f"{receiver.url}/x")]
        receiver.answers = [503, 429, 200]  # third time lucky
        n.notify(notice(NotifyEvent.OPENED, "SignalMatched"), target)
        await n.flush(10)
        receiver.answers = [500, 502, 503, 504]  # 1 + 3 retries, all failed
        n.notify(notice(NotifyEvent.COMPLETED, "Replaced"), target)
        await n.flush(10)
        receiver.answers = [404]
        n.notify(notice(NotifyEvent.FAILED, "DrainTimedOut"), target)
        await n.close(grace=10)
        await sender.aclose()
        return results

    assert run(go()) == ["sent", "failed", "rejected"]
    events = [b["event"] for b in receiver.bodies()]
    assert events == ["Opened"] * 3 + ["Completed"] * 4 + ["Failed"]


def test_a_dead_receiver_holds_up_nobody_and_its_queue_is_bounded(receiver: Receiver) -> None:
    dead = f"http://127.0.0.1:{free_port()}/nobody-listens"

    async def go() -> list[tuple[str, str]]:
        sender = WebhookSender(timeout=2)
        results: list[tuple[str, str]] = []
        slow_retry = asyncio.Event()

        async def wait_forever(_: float) -> None:
            await slow_retry.wait()  # the dead receiver's retry never comes back in this test

        n = Notifier(
            lambda u, b, k: sender.post(u, b, key=k), queue_size=2, retries=5,
            sleep=wait_forever, on_result=lambda e, r: results.append((e.value, r)),
        )  # fmt: skip
        targets = [Target(dead), Target(f"{receiver.url}/alive")]
        t0 = time.monotonic()
        for event in (NotifyEvent.OPENED, NotifyEvent.BLOCKED, NotifyEvent.APPROVAL_PENDING,
                      NotifyEvent.COMPLETED):  # fmt: skip
            n.notify(notice(event, event.value), targets)
            await asyncio.sleep(0.05)  # the dead queue's worker takes its first message
        assert time.monotonic() - t0 < 1.0  # notify() never waited on a receiver
        for _ in range(500):  # the live receiver gets all four meanwhile
            if len(receiver.bodies("/alive")) == 4:
                break
            await asyncio.sleep(0.02)
        await n.close(grace=0.1)
        await sender.aclose()
        return results

    results = run(go())
    assert [b["event"] for b in receiver.bodies("/alive")] == [
        "Opened", "Blocked", "ApprovalPending", "Completed"]  # fmt: skip
    # the dead receiver: one message in its (stuck) worker, two queued, the fourth dropped
    assert ("Completed", "dropped") in results
    assert results.count(("Completed", "sent")) == 1


def test_targets_from_flags_and_policies() -> None:
    assert parse_webhooks("slack:https://hooks.slack.com/services/T/B/x, https://ops/hook") == [
        (NotifyFormat.SLACK, "https://hooks.slack.com/services/T/B/x"),
        (NotifyFormat.GENERIC, "https://ops/hook"),
    ]
    assert parse_webhooks("generic:http://127.0.0.1:9/x") == [
        (NotifyFormat.GENERIC, "http://127.0.0.1:9/x")
    ]
    assert parse_webhooks("slack:secret:gpuheal-notify/slack,secret:ops/url") == [
        (NotifyFormat.SLACK, "secret:gpuheal-notify/slack"),
        (NotifyFormat.GENERIC, "secret:ops/url"),
    ]
    for bad in ("ftp://x", "slack:", "hooks.slack.com/x", "teams:https://x", "secret:Bad/k"):
        with pytest.raises(ValueError, match="webhook 1 is neither an http") as caught:
            parse_webhooks(bad)
        assert "/" not in bad or bad not in str(caught.value)  # not shown: it may be a secret
    assert parse_events("Opened, Failed") == {NotifyEvent.OPENED, NotifyEvent.FAILED}
    with pytest.raises(ValueError, match="unknown event"):
        parse_events("Opened,Exploded")
    from_policy = policy_targets(
        Notifications.model_validate(
            {
                "webhooks": [
                    {"url": "https://a/x", "events": ["Failed"]},
                    {"url": "https://a/x", "format": "Slack"},
                    {"secretRef": {"name": "hooks", "key": "ops"}},
                ]
            }
        ),
        "gpuheal-system",
    )
    assert from_policy == [
        Target("https://a/x", NotifyFormat.GENERIC, frozenset({NotifyEvent.FAILED})),
        Target("https://a/x", NotifyFormat.SLACK),
        Target(None, secret=SecretUrl("gpuheal-system", "hooks", "ops")),
    ]
    glob = [Target("https://a/x", events=frozenset({NotifyEvent.OPENED}))]
    merged = merge_targets(glob, from_policy)
    assert merged[0].events == {NotifyEvent.OPENED, NotifyEvent.FAILED}  # sent once, either wants
    assert merged[1].wants(NotifyEvent.BLOCKED)
    assert not merged[0].wants(NotifyEvent.BLOCKED)
    assert merge_targets(glob, [Target("https://a/x")])[0].events == frozenset()  # all
    assert len(merge_targets(from_policy, from_policy[2:])) == 3  # one Secret key, one send
    for both_or_neither in ({}, {"url": "https://a/x", "secretRef": {"name": "h", "key": "k"}}):
        with pytest.raises(ValueError, match="exactly one of url and secretRef"):
            Notifications.model_validate({"webhooks": [both_or_neither]})


def test_a_url_from_a_secret_is_read_at_each_send_and_never_logged(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    ref = SecretUrl("gpuheal-system", "hooks", "ops")
    secret = {"url": f"{receiver.url}/T0KEN-one"}

    async def resolve(asked: SecretUrl) -> str:
        assert asked == ref
        if not secret:
            raise UrlUnavailable(f"{asked}: no such Secret or key")
        return secret["url"]

    async def go() -> list[str]:
        sender = WebhookSender(timeout=5)
        results: list[str] = []
        n = Notifier(
            lambda u, b, k: sender.post(u, b, key=k), retries=1, sleep=_no_sleep,
            on_result=lambda e, r: results.append(r), resolve=resolve,
        )  # fmt: skip
        target = [Target(None, secret=ref)]
        n.notify(notice(NotifyEvent.OPENED, "SignalMatched"), target)
        await n.flush(10)
        secret["url"] = f"{receiver.url}/T0KEN-two"  # the Secret changed: the next send uses it
        n.notify(notice(NotifyEvent.COMPLETED, "Replaced"), target)
        await n.flush(10)
        receiver.answers = [500, 503]
        n.notify(notice(NotifyEvent.BLOCKED, "Paused"), target)
        await n.flush(10)
        dead = f"http://user:PASSW0RD@127.0.0.1:{free_port()}/T0KEN-dead?sig=S1GNATURE"
        n.notify(notice(NotifyEvent.FAILED, "DrainTimedOut"), [Target(dead)])
        await n.flush(10)
        secret.clear()
        n.notify(notice(NotifyEvent.FAILED, "DrainTimedOut"), target)
        await n.close(grace=10)
        await sender.aclose()
        return results

    with caplog.at_level(logging.DEBUG, logger="gpuheal.notify"):
        results = run(go())
    assert results == ["sent", "sent", "failed", "failed", "failed"]
    assert [p for p, _, _ in receiver.got][:2] == ["/T0KEN-one", "/T0KEN-two"]
    logged = caplog.text
    assert "Secret gpuheal-system/hooks key ops" in logged
    assert "http://127.0.0.1:" in logged  # a plain URL is named by its scheme and host
    for secret_part in ("T0KEN", "PASSW0RD", "S1GNATURE", "user"):
        assert secret_part not in logged


def test_redacted_urls_keep_scheme_and_host_only() -> None:
    assert redact_url("https://hooks.slack.com/services/T/B/x") == "https://hooks.slack.com/..."
    assert redact_url("http://u:p@[::1]:8080/a?b=c") == "http://[::1]:8080/..."
    assert redact_url("not a url") == "<unparseable URL>"
    url = "https://u:pw@h.example/hook/abc?token=zz"
    said = scrub_url(f"Redirect for url '{url}'; path /hook/abc; token=zz", url)
    assert said == "Redirect for url 'https://h.example/...'; path ...; ..."


def test_httpx_request_lines_show_no_url_past_the_host() -> None:
    from gpuheal.handlers.lifecycle import _redact_request_url

    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, 'HTTP Request: %s %s "%s %d %s"',
        ("POST", "https://hooks.slack.com/services/T0/B0/S3CRET", "HTTP/1.1", 200, "OK"), None,
    )  # fmt: skip
    assert _redact_request_url(record)
    assert record.getMessage() == 'HTTP Request: POST https://hooks.slack.com/... "HTTP/1.1 200 OK"'


def test_every_log_line_shows_urls_by_scheme_and_host_only() -> None:
    """Whatever writes it (a traceback naming a request, aiohttp, kopf), a URL in a log line
    keeps its scheme and host: the root handlers' filter (`configure_logging`)."""
    from gpuheal.api.meta import redact_urls
    from gpuheal.handlers.lifecycle import RedactUrls

    assert redact_urls("to https://hooks.slack.com/services/T0/B0/S3CRET: 404") == (
        "to https://hooks.slack.com/...: 404")  # fmt: skip
    assert redact_urls("GET http://u:pw@10.0.0.7:9400/metrics?x=1 'https://h/a'") == (
        "GET http://10.0.0.7:9400/... 'https://h/...'")  # fmt: skip
    assert (
        redact_urls("bridge https://slurm-bridge:8787 up") == "bridge https://slurm-bridge:8787 up"
    )
    assert redact_urls("bridges=a=https://h:1,b=https://k:2/x/y,c=http://m:3/") == (
        "bridges=a=https://h:1,b=https://k:2/...,c=http://m:3/...")  # fmt: skip
    # user info is a secret even without a path
    assert redact_urls("POST https://bot:S3CRET@hooks.example.com:8443 failed") == (
        "POST https://hooks.example.com:8443/... failed")  # fmt: skip
    try:
        raise ValueError("refused: https://hooks.slack.com/services/T0/B0/S3CRET")
    except ValueError:
        record = logging.LogRecord(
            "gpuheal.notify", logging.ERROR, __file__, 1, "posting %s",
            ("https://example.com/hook?token=S3CRET",), sys.exc_info(),
        )  # fmt: skip
    assert RedactUrls().filter(record)
    shown = logging.Formatter().format(record)
    assert "S3CRET" not in shown
    assert "posting https://example.com/..." in shown
    assert "ValueError: refused: https://hooks.slack.com/..." in shown
