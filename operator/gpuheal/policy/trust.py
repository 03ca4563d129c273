"""Which Events may start a remediation: the trust decision over signal reporters, pure.

Anyone allowed to create an Event can write any reporter into it: `source.component`,
`reportingComponent` (events.k8s.io: `reportingController`) are free text, and the stored
Event keeps no trace of the user who created it. The operator therefore judges an Event by the
reporter it names, and only the API server's admission can make a name mean something: the
chart's ValidatingAdmissionPolicy lets only the node agent's ServiceAccount, with a token bound
to a pod on node X, post Events naming `gpuheal-agent` about node X. A name no admission
policy reserves is only as trustworthy as everyone who may create Events (docs/security.md).

So: an Event acts only when every reporter it names is trusted (``--trusted-reporters``,
default `gpuheal-agent`); an Event that names none, or any other, starts nothing. When such
an Event would have matched a rule of the node's policy, the operator says so (a Warning on
the Node naming the reporter); otherwise it is dropped quietly (kubelet's own Warnings, say).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from gpuheal.api.remediationpolicy import Rule
from gpuheal.policy.inputs import NodeEvent
from gpuheal.policy.select import rule_matches
from gpuheal.policy.types import Observation

AGENT_REPORTER = "gpuheal-agent"
"""The node agent's reporter name (`gpuheal.agent.detect.COMPONENT`): the one the chart's
admission policy reserves for the agent on the Event's own node."""
DEFAULT_TRUSTED_REPORTERS = frozenset({AGENT_REPORTER})
_SHOWN = 63  # a reporter name is the sender's text: shown cut and quoted, never as is


@dataclasses.dataclass(frozen=True, slots=True)
class Untrusted:
    """An Event that may not start anything, and why."""

    reporter: str  # the names it gives, quoted ('kernel-monitor'), or "no reporter"
    matters: bool  # it matches a rule of the node's policy: a forged fault, or a reporter
    # the site forgot to trust (worth a Warning either way)
    message: str


def shown(names: Iterable[str]) -> str:
    """Reporter names for a message: quoted, cut, control characters escaped."""
    quoted = [ascii(n[:_SHOWN]) for n in names]
    return ", ".join(quoted) if quoted else "no reporter"


def judge_event(
    ev: NodeEvent,
    observations: Iterable[Observation],
    trusted: Collection[str],
    rules: Iterable[Rule] = (),
) -> Untrusted | None:
    """None when the Event may act (every reporter it names is trusted); else why not.

    Every name must be trusted, not one of them: an Event whose source.component says one
    reporter and whose reportingComponent another is judged by the one it may not use.
    ``rules``: the rules of the policy governing the node (none: nobody governs it)."""
    stranger = [r for r in ev.reporters if r not in trusted]
    if ev.reporters and not stranger:
        return None
    who = shown(stranger)
    found = list(observations)
    matched = [o for o in found if any(rule_matches(r, o) for r in rules)]
    what = (matched or found)[0].what if found else f"event {ev.reason}"
    where = f"{ev.namespace}/{ev.name}" if ev.name else ev.uid
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
