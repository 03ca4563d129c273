"""What is questionable about a valid policy: said on its status (condition `Warnings`), never
a reason to refuse it.

The CRD refuses what is wrong whatever the cluster looks like (a rule that can never fire, a
signal a job cannot catch, a label the API server would refuse). What is here may be meant,
or depends on the cluster: a ReservePool that is not created yet, a breaker limit that lets
no node out for the nodes selected today, a rung that only a person's repair can reach, a
catalogue guard that holds the first step back. Pure: the policy, the pool names and the
number of selected nodes in, sentences out.
"""

from __future__ import annotations

from collections.abc import Collection

from gpuheal.api.remediationpolicy import (
    DISRUPTIVE_ACTIONS,
    Action,
    EscalationScope,
    RemediationPolicySpec,
    Rule,
    Rung,
)
from gpuheal.policy.safety import allowed_unhealthy
from gpuheal.xid.catalogue import CATALOGUE, lookup
from gpuheal.xid.parse import XID_EVENT_REASON
from gpuheal.xid.types import FirstSight, XidClass

RECOVERY_XID = 154


def policy_warnings(
    spec: RemediationPolicySpec,
    pools: Collection[str],
    selected: int,
    *,
    unreadable: Collection[str] = (),
    matched: int | None = None,
) -> list[str]:
    """Every warning about `spec`, in rule order, the safety limits last. ``selected``: the
    nodes it governs; ``matched``: the nodes its nodeSelector matches, whichever policy
    governs them (given when it governs none); ``unreadable``: pools that exist but that
    the operator ignores (their spec does not parse)."""
    out: list[str] = []
    if selected == 0 and matched is not None:
        out.append(_governs_none(matched))
    for index, rule in enumerate(spec.rules):
        out += _rule_warnings(rule, pools, unreadable)
        out += _takes_xid_events(spec.rules, index)
    allowed = allowed_unhealthy(spec.safety, selected)
    if selected > 0 and allowed == 0 and not spec.safety.dry_run:
        limit = (
            f"maxUnhealthy {spec.safety.max_unhealthy}"
            if spec.safety.max_unhealthy is not None
            else f"minHealthy {spec.safety.min_healthy}"
        )
        out.append(
            f"safety: {limit} lets none of the {selected} selected nodes out of service: "
            "every incident waits with CircuitBreakerOpen (to record plans without acting, "
            "use dryRun)"
        )
    return out


def _governs_none(matched: int) -> str:
    """A selector that matches nothing is the commonest slip (a label key or value spelt
    unlike the nodes'); one that matches only nodes another policy wins may be meant."""
    if matched == 0:
        return (
            "nodeSelector matches no node: this policy acts on nothing (compare it with "
            "`kubectl get nodes --show-labels`)"
        )
    return (
        f"nodeSelector matches {matched} node(s) but governs none: a policy of higher "
        "priority governs them, or a tie at the same priority leaves them to neither (see "
        "Overlapping)"
    )


def _rule_warnings(rule: Rule, pools: Collection[str], unreadable: Collection[str]) -> list[str]:
    out: list[str] = []
    name = rule.name
    alert_only = _alert_only_on_first_sight(rule)
    first = rule.ladder[0].steps
    if alert_only and any(s.action in DISRUPTIVE_ACTIONS for s in first):
        out.append(
            f"rule {name}: {alert_only} only alerts the first time it is seen on a GPU "
            f"(NVIDIA files it as an application fault); rung {rule.ladder[0].name} acts from "
            "the second on the same GPU"
        )
    for at, rung in enumerate(rule.ladder):
        for step in rung.steps:
            cycle = step.reboot
            if cycle is not None and cycle.power_cycle and not cycle.asks_power_cycle:
                out.append(
                    f"rule {name}, rung {rung.name}: reboot.powerCycle is ignored with a "
                    f"{cycle.hook.type} hook (it cannot power-cycle a node): use a Job or "
                    "Webhook hook that drives the BMC (Redfish, IPMI)"
                )
            pool = step.replace.reserve_pool_ref.name if step.replace is not None else None
            if pool is not None and pool not in pools:
                missing = (
                    "is ignored, its spec does not parse (see its Ready condition); replace "
                    "waits with PoolNotFound until it is fixed"
                    if pool in unreadable
                    else "does not exist; replace waits with PoolNotFound until it does"
                )
                out.append(f"rule {name}, rung {rung.name}: ReservePool {pool} {missing}")
        out += _repair_under_work(name, rung)
        replaced = [
            r.name for r in rule.ladder[:at] if any(s.action is Action.REPLACE for s in r.steps)
        ]
        if replaced:
            out.append(
                f"rule {name}: rung {rung.name} comes after rung {replaced[0]}, which "
                "replaces the node; a replaced node stays out of service, so it runs only if "
                "a person returns the node"
            )
    signals = rule.signals
    takes_154 = RECOVERY_XID in signals.xids or XidClass.RECOVERY_ACTION in signals.xid_classes
    if takes_154 and not signals.recovery_actions:
        out.append(
            f"rule {name} takes every XID 154, also recovery action None (the GPU recovered); "
            "list the recoveryActions it is for"
        )
    no_gpu = not signals.xids and not signals.xid_classes
    if (
        no_gpu
        and len(rule.ladder) > 1
        and rule.escalation_or_default().scope is EscalationScope.GPU
    ):
        out.append(
            f"rule {name} counts repeats per GPU, but its conditions and Events name no GPU: "
            "they are counted per node (say scope: Node)"
        )
    return out


def _repair_under_work(rule: str, rung: Rung) -> list[str]:
    """A reset or reboot with no slurmDrain before it in its rung: on a Slurm node nothing
    keeps new jobs off and the step waits for running ones to end by themselves (or, with
    whenIdle false, kills them)."""
    out: list[str] = []
    drained = False
    for step in rung.steps:
        drained = drained or step.action is Action.SLURM_DRAIN
        opts = step.reset if step.action is Action.RESET else step.reboot
        if step.action not in (Action.RESET, Action.REBOOT) or opts is None:
            continue
        what = f"rule {rule}, rung {rung.name}: {step.action.value}"
        if not opts.when_idle:
            out.append(
                f"{what} has whenIdle: false: it runs at once, under any Slurm job or pod "
                "still on the node"
            )
        elif not drained:
            out.append(
                f"{what} has no slurmDrain before it: on a Slurm node new jobs still land "
                "there and the step waits (WaitingForSlurmJobs) until none runs; add "
                "slurmDrain (requeue: none lets running jobs finish)"
            )
    return out


def _alert_only_on_first_sight(rule: Rule) -> str:
    """The first XID (or class) of the rule that the catalogue only alerts on first sight."""
    for xid in rule.signals.xids:
        if lookup(xid).first_sight is FirstSight.ALERT_ONLY:
            return f"XID {xid}"
    for cls in rule.signals.xid_classes:
        codes = [e for e in CATALOGUE.values() if e.action_class is cls]
        if cls is XidClass.UNKNOWN or (
            codes and all(e.first_sight is FirstSight.ALERT_ONLY for e in codes)
        ):
            return f"class {cls.value}"
    return ""


def _takes_xid_events(rules: list[Rule], index: int) -> list[str]:
    """A rule matching XID Events by reason, above rules that match XIDs: those rules see
    only XIDs from other sources (dcgm-exporter)."""
    rule = rules[index]
    catch = [
        e for e in rule.signals.events if e.reason == XID_EVENT_REASON and not e.message_contains
    ]
    below = [r.name for r in rules[index + 1 :] if r.signals.xids or r.signals.xid_classes]
    if not catch or not below:
        return []
    return [
        f"rule {rule.name} takes every {XID_EVENT_REASON} Event (matched by reason), so "
        f"rules below it ({', '.join(below[:5])}) see XIDs from dcgm-exporter only"
    ]
