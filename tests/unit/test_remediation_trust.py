"""The Event watch's handler with the trust decision (`sources.handle_event`): a trusted
reporter's Event reaches the intake; any other never does, is counted, and is reported with at
most one Warning per node in ten minutes, whatever the forger varies."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.api.meta import ObjectMeta
from gpuheal.api.remediationpolicy import RemediationPolicy
from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal.config import OperatorConfig
from gpuheal.metrics import Metrics
from gpuheal.policy.types import NodeView, Observation
from gpuheal.remediation import intake, sources
from gpuheal.remediation.state import Bookkeeping, ClusterView, Ports, Runtime


class Kube:
    component = "gpuheal"


class Outbox:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, involved: dict[str, Any], *, reason: str, message: str, type_: str) -> None:
        self.posted.append((involved["metadata"]["name"], reason, message))


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> tuple[Runtime, list[Observation], Outbox]:
    runtime = Runtime(OperatorConfig(), Metrics(CollectorRegistry()))
    runtime.ports.kube = Kube()  # type: ignore[assignment]
    outbox = Outbox()
    runtime.ports.events = outbox  # type: ignore[assignment]
    runtime.view.nodes["n1"] = NodeView(name="n1", uid="nu")
    runtime.view.policies["p"] = RemediationPolicy(
        metadata=ObjectMeta(name="p"),
        spec={  # type: ignore[arg-type]
            "nodeSelector": {},
            "safety": {"maxUnhealthy": 1},
            "rules": [
                {
                    "name": "xid79",
                    "signals": {"xids": [79]},
                    "ladder": [{"name": "c", "steps": [{"action": "cordon"}]}],
                },
            ],
        },
    )
    runtime.view.assignment["n1"] = "p"
    submitted: list[Observation] = []

    async def submit(
        _ports: Ports, _cluster: ClusterView, _books: Bookkeeping, node: str, obs: Observation
    ) -> None:
        submitted.append(obs)

    monkeypatch.setattr(intake, "submit", submit)
    return runtime, submitted, outbox


def event(reporter: str, xid: int = 79, uid: str = "e1", **over: Any) -> dict[str, Any]:
    body = xid_event({"metadata": {"name": "n1", "uid": "nu"}}, kernel_line(xid))
    body["metadata"].update(uid=uid, name=f"n1.{uid}")
    body["source"]["component"] = body["reportingComponent"] = reporter
    body.update(over)
    return body


def untrusted(runtime: Runtime) -> float:
    value = runtime.ports.metrics.signals.labels("events", "untrusted")._value.get()
    return float(value)


async def test_the_agents_event_reaches_the_intake(
    rt: tuple[Runtime, list[Observation], Outbox],
) -> None:
    runtime, submitted, outbox = rt
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, event("gpuheal-agent"))
    assert [o.xid for o in submitted] == [79]
    assert outbox.posted == []


async def test_a_forged_event_never_reaches_the_intake_and_one_warning_names_it(
    rt: tuple[Runtime, list[Observation], Outbox],
) -> None:
    runtime, submitted, outbox = rt
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, event("kernel-monitor"))
    assert submitted == []
    ((node, reason, message),) = outbox.posted
    assert (node, reason) == ("n1", "UntrustedSignal")
    assert "XID 79 on GPU 0000:3b:00: Event default/n1.e1 from reporter 'kernel-monitor'" in message
    # A flood, each Event naming another reporter: counted, no more Warnings, no more memory.
    for i in range(50):
        await sources.handle_event(
            runtime.ports, runtime.view, runtime.books, event(f"forger-{i}", uid=f"f{i}")
        )
    assert submitted == []
    assert len(outbox.posted) == 1
    assert untrusted(runtime) == 51
    assert list(runtime.books.untrusted_warned) == ["n1"]
    # Ten minutes on, the next one is reported again.
    runtime.books.untrusted_warned["n1"] -= sources.UNTRUSTED_WARN_EVERY
    await sources.handle_event(
        runtime.ports, runtime.view, runtime.books, event("ci-bot", uid="later")
    )
    assert len(outbox.posted) == 2


async def test_untrusted_events_no_rule_takes_or_old_ones_are_dropped_quietly(
    rt: tuple[Runtime, list[Observation], Outbox],
) -> None:
    runtime, submitted, outbox = rt
    await sources.handle_event(
        runtime.ports, runtime.view, runtime.books, event("kernel-monitor", xid=94)
    )  # no rule for 94
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await sources.handle_event(
        runtime.ports,
        runtime.view,
        runtime.books,
        event("kernel-monitor", uid="old", lastTimestamp=old),
    )
    runtime.view.nodes["n2"] = NodeView(name="n2")  # no policy governs it
    elsewhere = event("kernel-monitor", uid="n2")
    elsewhere["involvedObject"] = {"kind": "Node", "name": "n2"}
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, elsewhere)
    assert submitted == []
    assert outbox.posted == []
    assert untrusted(runtime) == 3


async def test_an_event_about_another_node_uid_never_reaches_the_intake(
    rt: tuple[Runtime, list[Observation], Outbox],
) -> None:
    """The agent's Event about an earlier Node of the same name (deleted and created again):
    counted as wrong_uid, one Warning that says so, the same budget as untrusted reporters."""
    runtime, submitted, outbox = rt
    stale = event("gpuheal-agent")
    stale["involvedObject"]["uid"] = "old-uid"
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, stale)
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, event("ci-bot", uid="x"))
    assert submitted == []
    ((node, reason, message),) = outbox.posted
    assert (node, reason) == ("n1", "UntrustedSignal")
    assert "is about node n1 with uid 'old-uid', not this Node's uid nu" in message
    wrong = runtime.ports.metrics.signals.labels("events", "wrong_uid")._value.get()
    assert (wrong, untrusted(runtime)) == (1, 1)
    await sources.handle_event(runtime.ports, runtime.view, runtime.books, event("gpuheal-agent"))
    assert [o.xid for o in submitted] == [79]  # the Node's own uid: acts
