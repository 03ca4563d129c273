"""May the operator drive this NodeRemediation? Asked once, before its first step.

gpuheal creates NodeRemediations itself, but anyone allowed to create one can write one by
hand, naming any node, policy, rule and ladder (a ladder is a snapshot: it may carry a reset
hook's Job template). The operator drives such an incident only if it is one gpuheal could
have opened: the policy exists and governs the node now, the rule is the policy's, the ladder
is that rule's (a rung may be the catalogue-guarded form the engine opens with), the node has
no older open incident, and a dry-run policy's incident is a dry run. Anything else is
refused, says why, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuheal.api.noderemediation import NodeRemediationSpec
from gpuheal.api.remediationpolicy import Action, RemediationPolicy, Rule, Rung, Step
from gpuheal.policy.snapshot import snapshot_rung
from gpuheal.policy.types import IncidentSummary


def refusal(  # noqa: PLR0911 - one exit per reason reads best
    name: str,
    spec: NodeRemediationSpec,
    policy: RemediationPolicy | None,
    governing: str | None,
    incidents: Iterable[IncidentSummary],
) -> str | None:
    """Why the incident `name` must not be driven, or None. `governing`: the policy that
    governs `spec.node_name` now (None: none does, or the node is unknown)."""
    node, wanted = spec.node_name, spec.policy_ref.name
    if policy is None:
        return f"RemediationPolicy {wanted} does not exist"
    if governing != wanted:
        return f"RemediationPolicy {wanted} does not govern node {node}" + (
            f" (RemediationPolicy {governing} does)" if governing else ""
        )
    other = _open_on(node, name, incidents)
    if other is not None:
        return f"node {node} already has an open incident, {other}"
    rule = next((r for r in policy.spec.rules if r.name == spec.rule), None)
    if rule is None:
        return f"RemediationPolicy {wanted} has no rule {spec.rule}"
    if not ladder_of(spec.ladder, rule):
        return f"its ladder is not rule {spec.rule}'s: gpuheal runs only the steps a policy names"
    if policy.spec.safety.dry_run and not spec.dry_run:
        return f"RemediationPolicy {wanted} is in dry run and the incident is not"
    return None


def _open_on(node: str, name: str, incidents: Iterable[IncidentSummary]) -> str | None:
    """Another open incident on the node that passed its own first look (one not looked at
    yet looks at this one in turn: whichever is looked at first is the node's incident)."""
    return next(
        (i.name for i in incidents if i.node == node and i.active and i.started and i.name != name),
        None,
    )


def ladder_of(ladder: Sequence[Rung], rule: Rule) -> bool:
    """Is `ladder` the rule's, rung for rung (a rung may be the engine's guarded form of it:
    some of its steps in order, or a lone alert)? Compared as snapshots (webhook URLs cut to
    scheme and host, `policy.snapshot`): the step reads the whole URL from the policy."""
    if len(ladder) != len(rule.ladder):
        return False
    return all(
        mine.name == theirs.name
        and _guarded_form(snapshot_rung(mine).steps, snapshot_rung(theirs).steps)
        for mine, theirs in zip(ladder, rule.ladder, strict=True)
    )


def _guarded_form(mine: Sequence[Step], theirs: Sequence[Step]) -> bool:
    if list(mine) == [Step(action=Action.ALERT)]:
        return True
    rest = iter(theirs)
    return all(any(step == other for other in rest) for step in mine)
