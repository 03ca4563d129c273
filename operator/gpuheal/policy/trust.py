"""Which Events may start a remediation: the trust decision over signal reporters, pure.

Anyone allowed to create an Event can write any reporter into it: `source.component`,
`reportingComponent` (events.k8s.io: `reportingController`) are free text, and the stored
Event keeps no trace of the user who created it. The operator therefore judges an Event by the
reporter it names, and only the API server's admission can make a name mean something: the
chart's ValidatingAdmissionPolicy lets only the node agent's ServiceAccount, with a token bound
to a pod on node X, post Events naming `gpuheal-agent` about node X. A name no admission
policy reserves is only as trustworthy as everyone who may create Events (docs/security.md).

So: an Event acts only when every reporter it names is trusted (``--trusted-reporters``,
default `gpuheal-agent`); an Event that names none, or any other, starts nothing. Before the
reporter, where the Event is and what it is about: it must be in the namespace the operator
reads (``--event-namespace``, default `default`, where the kubelet and the agent post; the API
server also accepts an Event about a Node in any other namespace), and the Node uid it names,
if it names one, must be the Node's (an Event about an earlier Node of the same name, deleted
and created again, or a made-up uid, is about no Node gpuheal knows). When such an Event would
have matched a rule of the node's policy, the operator says so (a Warning on the Node naming
why); otherwise it is dropped quietly (kubelet's own Warnings, say).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from gpuheal.api.remediationpolicy import Rule
from gpuheal.policy.inputs import NodeEvent
from gpuheal.policy.select import rule_matches
from gpuheal.policy.types import Observation
from gpuheal.xid.parse import DcgmSample

AGENT_REPORTER = "gpuheal-agent"
"""The node agent's reporter name (`gpuheal.agent.detect.COMPONENT`): the one the chart's
admission policy reserves for the agent on the Event's own node."""
DEFAULT_TRUSTED_REPORTERS = frozenset({AGENT_REPORTER})
DEFAULT_EVENT_NAMESPACE = "default"
"""Where the kubelet, node-problem-detector and gpuheal's agent post Events about Nodes."""
_SHOWN = 63  # a reporter name is the sender's text: shown cut and quoted, never as is


@dataclasses.dataclass(frozen=True, slots=True)
class Untrusted:
    """An Event that may not start anything, and why."""

    reporter: str  # the names it gives, quoted ('kernel-monitor'), or "no reporter"
    matters: bool  # it matches a rule of the node's policy: a forged fault, or a reporter
    # the site forgot to trust (worth a Warning either way)
    message: str
    why: str = "untrusted"  # the metric's result: untrusted (its reporter), wrong_namespace,
    # wrong_uid


def shown(names: Iterable[str]) -> str:
    """Reporter names for a message: quoted, cut, control characters escaped."""
    quoted = [ascii(n[:_SHOWN]) for n in names]
    return ", ".join(quoted) if quoted else "no reporter"


def judge_event(  # noqa: PLR0917
    ev: NodeEvent,
    observations: Iterable[Observation],
    trusted: Collection[str],
    rules: Iterable[Rule] = (),
    namespace: str | None = DEFAULT_EVENT_NAMESPACE,
    node_uid: str = "",
) -> Untrusted | None:
    """None when the Event may act; else why not.

    In this order: the Event must be in ``namespace`` (the operator's --event-namespace;
    None: any), it must name no Node uid or ``node_uid`` (the Node's as the operator knows it;
    "": not known, not checked), and every reporter it names must be trusted, not one of them:
    an Event whose source.component says one reporter and whose reportingComponent another is
    judged by the one it may not use. ``rules``: the rules of the policy governing the node
    (none: nobody governs it)."""
    found = list(observations)
    matched = [o for o in found if any(rule_matches(r, o) for r in rules)]
    what = (matched or found)[0].what if found else f"event {ev.reason}"
    where = f"{ev.namespace}/{ev.name}" if ev.name else ev.uid
    who = shown(ev.reporters)
    if namespace is not None and ev.namespace != namespace:
        return Untrusted(
            reporter=who,
            matters=bool(matched),
            message=(
                f"{what}: Event {where} posted in namespace {shown([ev.namespace])}, not in "
                f"{namespace!r} where gpuheal reads Events about Nodes; nothing done. See "
                "docs/security.md"
            ),
            why="wrong_namespace",
        )
    if node_uid and ev.about_uid is not None and ev.about_uid != node_uid:
        return Untrusted(
            reporter=who,
            matters=bool(matched),
            message=(
                f"{what}: Event {where} is about node {ev.node} with uid "
                f"{shown([ev.about_uid])}, not this Node's uid {node_uid} (an earlier Node of "
                "that name, or a made-up uid); nothing done. See docs/security.md"
            ),
            why="wrong_uid",
        )
    stranger = [r for r in ev.reporters if r not in trusted]
    if ev.reporters and not stranger:
        return None
    who = shown(stranger)
    told = "names no reporter" if not ev.reporters else f"from reporter {who}"
    return Untrusted(
        reporter=who,
        matters=bool(matched),
        message=(
            f"{what}: Event {where} {told}, not a trusted one "
            f"(trusted: {shown(sorted(trusted))}); nothing done. A reporter name is the "
            "sender's own text: see docs/security.md"
        ),
    )


# --- dcgm-exporter ---------------------------------------------------------------------------


def exporter_pod_refusal(pod: Mapping[str, Any], *, namespace: str, daemonset: str) -> str | None:
    """None when ``pod`` may be scraped as the dcgm-exporter of its node: in ``namespace``
    (--dcgm-namespace), its controller the DaemonSet ``daemonset`` (--dcgm-daemonset), placed
    on a node and given an address; else why not, for a log line.

    A label is anyone's to write on a pod they create; an owner reference too, but the
    garbage collector deletes a pod whose owner uid is not the DaemonSet's, and the
    DaemonSet's controller deletes a pod of its own that it did not want on that node, so a
    forged one does not last. What this keeps out is every other pod with the label."""
    meta = pod.get("metadata") or {}
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("namespace") != namespace:
        return f"pod {where} is not in the namespace {namespace}"
    owner = next(
        (
            o
            for o in meta.get("ownerReferences") or []
            if isinstance(o, Mapping) and o.get("controller")
        ),
        None,
    )
    ours = (
        owner is not None
        and owner.get("kind") == "DaemonSet"
        and str(owner.get("apiVersion", "")).split("/")[0] == "apps"
        and owner.get("name") == daemonset
    )
    if not ours:
        held = f"{owner.get('kind')} {owner.get('name')}" if owner is not None else "nothing"
        return (
            f"pod {where} is not a pod of the DaemonSet {namespace}/{daemonset} (its "
            f"controller: {shown([held])})"
        )
    return None


def samples_of_node(samples: Sequence[DcgmSample], node: str) -> tuple[list[DcgmSample], int]:
    """The samples whose ``Hostname`` label names ``node``, the node the exporter pod was
    placed on, and how many others there were: a series that names another node (or none:
    dcgm-exporter's --no-hostname) is no evidence about this one. A scrape reaches a pod by
    its address, and an address is reused; the label is what the exporter says it reads."""
    kept = [s for s in samples if s.hostname == node]
    return kept, len(samples) - len(kept)
