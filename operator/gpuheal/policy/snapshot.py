"""What an incident keeps of its rule's ladder (``spec.ladder``), and what it reads back.

A webhook hook's URL is often a credential (Slack's and many fleet tools' carry a token in the
path or query), and whoever may read NodeRemediations is not always whoever may read
RemediationPolicies. So the snapshot holds a reset or reboot webhook's URL as `redact_url`
writes it (scheme and host only); the step reads the whole URL from the same rung of the
policy when it calls the hook, and only from a step that is the snapshot's once redacted
(same action, same host, same options). An incident opened before keeps its whole URL: it
reads the same way.
"""

from __future__ import annotations

from gpuheal.api.meta import redact_url
from gpuheal.api.remediationpolicy import Action, HookType, Rule, Rung, Step


def snapshot_rung(rung: Rung) -> Rung:
    """``rung`` as an incident keeps it: its webhook hooks' URLs redacted."""
    return rung.model_copy(update={"steps": [snapshot_step(s) for s in rung.steps]})


def snapshot_step(step: Step) -> Step:
    """``step`` with its reset or reboot webhook's URL cut to scheme and host."""
    for field in ("reset", "reboot"):
        opts = getattr(step, field)
        if opts is None or opts.hook.type is not HookType.WEBHOOK or opts.hook.webhook is None:
            continue
        webhook = opts.hook.webhook.model_copy(update={"url": redact_url(opts.hook.webhook.url)})
        hook = opts.hook.model_copy(update={"webhook": webhook})
        step = step.model_copy(update={field: opts.model_copy(update={"hook": hook})})
    return step


def calls_webhook(step: Step) -> bool:
    opts = step.reset if step.action is Action.RESET else step.reboot
    return opts is not None and opts.hook.type is HookType.WEBHOOK


def policy_step(step: Step, rung_name: str, rule: Rule | None) -> Step | None:
    """The step of ``rule`` that ``step`` (from an incident's snapshot) is, with its whole
    webhook URL: looked for in the rung ``rung_name`` first, then in the others; None when
    the policy has no such step any more (its hook moved to another host, or changed)."""
    if rule is None:
        return None
    rungs = sorted(rule.ladder, key=lambda r: r.name != rung_name)  # stable: that rung first
    want = snapshot_step(step)
    return next((s for r in rungs for s in r.steps if snapshot_step(s) == want), None)
