"""The trust decision over an Event's reporter (`policy.trust`): only Events whose every named
reporter is trusted may act; an untrusted one that a rule would have taken is worth a Warning
that names the reporter; the names are the sender's text and are shown quoted and cut."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.agent.detect import COMPONENT as AGENT_COMPONENT
from gpuheal.api.remediationpolicy import Rule
from gpuheal.cli.simulate import kernel_line, xid_event
from gpuheal.config import AGENT_REPORTER as CONFIG_AGENT_REPORTER
from gpuheal.config import OperatorConfig
from gpuheal.policy.inputs import NodeEvent, event_observations, node_event
from gpuheal.policy.trust import (
    AGENT_REPORTER,
    DEFAULT_TRUSTED_REPORTERS,
    Untrusted,
    judge_event,
)

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)
XID79 = Rule.model_validate(
    {
        "name": "fell-off",
        "signals": {"xids": [79]},
        "ladder": [{"name": "c", "steps": [{"action": "cordon"}]}],
    }
)


def xid_body(xid: int = 79, **over: Any) -> dict[str, Any]:
    body = xid_event({"metadata": {"name": "n1", "uid": "nu"}}, kernel_line(xid))
    body["metadata"].update(uid="e1", name="n1.forged")
    body.update(over)
    return body


def judge(
    body: dict[str, Any],
    trusted: frozenset[str] = DEFAULT_TRUSTED_REPORTERS,
    rules: tuple[Rule, ...] = (XID79,),
) -> Untrusted | None:
    ev = node_event(body)
    assert ev is not None
    return judge_event(ev, event_observations(ev, NOW), trusted, rules)


def test_the_agent_name_is_one_name_everywhere() -> None:
    assert AGENT_REPORTER == AGENT_COMPONENT == CONFIG_AGENT_REPORTER
    assert OperatorConfig().trusted_reporters == DEFAULT_TRUSTED_REPORTERS


def test_the_agents_event_is_trusted_by_default() -> None:
    body = xid_body(source={"component": "gpuheal-agent", "host": "n1"},
                    reportingComponent="gpuheal-agent")  # fmt: skip
    assert judge(body) is None


def test_another_reporter_is_not_trusted_by_default_and_the_warning_names_it() -> None:
    verdict = judge(xid_body())  # what node-problem-detector's kernel monitor posts
    assert verdict is not None
    assert verdict.matters  # XID 79 matches the rule: a Warning is due
    assert verdict.reporter == "'kernel-monitor'"
    assert verdict.message.startswith(
        "XID 79 on GPU 0000:3b:00: Event default/n1.forged from reporter 'kernel-monitor', "
        "not a trusted one (trusted: 'gpuheal-agent'); nothing done"
    )


def test_a_reporter_the_site_trusts_acts() -> None:
    assert judge(xid_body(), trusted=frozenset({"gpuheal-agent", "kernel-monitor"})) is None


def test_every_named_reporter_must_be_trusted_not_one_of_them() -> None:
    # A forger copies the agent's name into one field and its own into the other.
    body = xid_body(source={"component": "gpuheal-agent"}, reportingComponent="ci-bot")
    verdict = judge(body)
    assert verdict is not None
    assert verdict.reporter == "'ci-bot'"
    body = xid_body(source={"component": "ci-bot"}, reportingComponent="gpuheal-agent")
    assert judge(body) is not None


def test_an_event_naming_no_reporter_is_not_trusted() -> None:
    body = xid_body(source={}, reportingComponent="")
    verdict = judge(body, trusted=frozenset({"gpuheal-agent", ""}))
    assert verdict is not None
    assert verdict.reporter == "no reporter"
    assert "names no reporter" in verdict.message


def test_an_untrusted_event_no_rule_takes_is_dropped_without_a_warning() -> None:
    # The kubelet's own Warnings about nodes: nothing a policy acts on, nothing to report.
    kubelet = xid_body(reason="FreeDiskSpaceFailed", message="failed to garbage collect",
                       source={"component": "kubelet"}, reportingComponent="kubelet")  # fmt: skip
    verdict = judge(kubelet)
    assert verdict is not None
    assert not verdict.matters
    no_rule = judge(xid_body(xid=94))
    assert no_rule is not None
    assert not no_rule.matters
    # No policy governs the node: nothing matters there either.
    unmanaged = judge(xid_body(), rules=())
    assert unmanaged is not None
    assert not unmanaged.matters


def test_a_reporter_name_is_shown_quoted_cut_and_without_control_characters() -> None:
    body = xid_body(source={"component": "evil\n" + "x" * 500}, reportingComponent="")
    verdict = judge(body)
    assert verdict is not None
    assert "\n" not in verdict.message
    assert verdict.reporter == ascii("evil\n" + "x" * 58)


def test_node_event_keeps_every_name_once() -> None:
    ev = node_event(xid_body(source={"component": "a"}, reportingComponent="a"))
    assert ev is not None
    assert ev.reporters == ("a",)
    ev = node_event(xid_body(source={"component": "a"}, reportingComponent="b"))
    assert ev is not None
    assert (ev.reporters, ev.namespace, ev.name) == (("a", "b"), "default", "n1.forged")
    assert NodeEvent("u", "n", "R", "m", 1, NOW).reporters == ()


def test_trusted_reporters_flag_is_a_comma_separated_set() -> None:
    cfg = OperatorConfig(trusted_reporters="gpuheal-agent, kernel-monitor,")  # type: ignore[arg-type]
    assert cfg.trusted_reporters == frozenset({"gpuheal-agent", "kernel-monitor"})
    assert OperatorConfig(trusted_reporters="").trusted_reporters == frozenset()  # type: ignore[arg-type]


def judged(
    body: dict[str, Any],
    *,
    namespace: str | None = "default",
    node_uid: str = "nu",
    trusted: frozenset[str] = frozenset({"kernel-monitor"}),
) -> Untrusted | None:
    ev = node_event(body)
    assert ev is not None
    return judge_event(ev, event_observations(ev, NOW), trusted, (XID79,), namespace, node_uid)


def test_an_event_from_another_namespace_starts_nothing_whoever_sent_it() -> None:
    # The API server accepts an Event about a Node in any namespace whose involvedObject
    # names that namespace: a trusted reporter name there is still nothing.
    body = xid_body()
    body["metadata"]["namespace"] = body["involvedObject"]["namespace"] = "ci"
    verdict = judged(body)
    assert verdict is not None
    assert (verdict.why, verdict.matters) == ("wrong_namespace", True)
    assert verdict.message.startswith(
        "XID 79 on GPU 0000:3b:00: Event ci/n1.forged posted in namespace 'ci', not in "
        "'default' where gpuheal reads Events about Nodes; nothing done"
    )
    assert judged(body, namespace="ci") is None
    assert judged(body, namespace=None) is None  # not asked (a caller that reads one namespace)
    assert judged(xid_body()) is None


def test_an_event_naming_another_node_uid_starts_nothing() -> None:
    stale = xid_body()
    stale["involvedObject"]["uid"] = "uid-of-the-node-deleted-before"
    verdict = judged(stale)
    assert verdict is not None
    assert (verdict.why, verdict.matters) == ("wrong_uid", True)
    assert (
        "Event default/n1.forged is about node n1 with uid 'uid-of-the-node-deleted-before', "
        "not this Node's uid nu (an earlier Node of that name, or a made-up uid); nothing done"
    ) in verdict.message
    assert judged(stale, node_uid="") is None  # the Node's uid not known: nothing to compare


def test_an_event_naming_the_nodes_uid_or_none_is_judged_by_its_reporter() -> None:
    assert judged(xid_body()) is None  # involvedObject.uid "nu": the Node's
    # The kubelet and node-problem-detector write the node's *name* as its uid: no uid.
    by_name = xid_body()
    by_name["involvedObject"]["uid"] = "n1"
    assert judged(by_name) is None
    del by_name["involvedObject"]["uid"]
    assert judged(by_name) is None
    verdict = judged(by_name, trusted=frozenset())
    assert verdict is not None
    assert verdict.why == "untrusted"


def test_the_event_namespace_flag_is_one_namespace_default_by_default() -> None:
    assert OperatorConfig().event_namespace == "default"
    assert OperatorConfig(event_namespace="kube-system").event_namespace == "kube-system"
    with pytest.raises(ValidationError):
        OperatorConfig(event_namespace="")
    with pytest.raises(ValidationError):
        OperatorConfig(event_namespace="*")


def test_an_events_k8s_io_event_is_judged_by_its_reporting_controller() -> None:
    """An events.k8s.io/v1 Event as the operator's core/v1 watch reads it: the API server
    shows `reportingController` as reportingComponent and `deprecatedSource` as source, so
    both of its reporter fields are judged like a core/v1 Event's."""
    body = xid_body(source={}, reportingComponent="ci-bot", eventTime="2026-11-22T06:00:00.000000Z")
    body["involvedObject"]["uid"] = "nu"  # `regarding`
    verdict = judged(body, trusted=frozenset({"gpuheal-agent"}))
    assert verdict is not None
    assert (verdict.why, verdict.reporter) == ("untrusted", "'ci-bot'")
    body["source"] = {"component": "gpuheal-agent"}  # deprecatedSource naming the agent
    assert judged(body, trusted=frozenset({"gpuheal-agent"})) is not None  # ci-bot still named
    body["reportingComponent"] = "gpuheal-agent"
    assert judged(body, trusted=frozenset({"gpuheal-agent"})) is None
