"""An incident's ladder snapshot keeps a webhook hook's URL as scheme and host only
(`gpuheal.policy.snapshot`, issue 23): whoever reads NodeRemediations does not read the
credential in it; the step reads the whole URL from the policy, only from the same step."""

from __future__ import annotations

from typing import Any

from gpuheal.api.remediationpolicy import Rule, Step
from gpuheal.policy.snapshot import calls_webhook, policy_step, snapshot_rung
from gpuheal.policy.vet import ladder_of

SLACKISH = "https://hooks.example.com/services/T0/B1/s3cr3t?sig=abc"


def _rule(reset_url: str = SLACKISH, reboot_url: str = "http://bmc:8080/reboot/tok") -> Rule:
    def hook(url: str) -> dict[str, Any]:
        return {"hook": {"type": "Webhook", "webhook": {"url": url, "timeout": "10s"}}}

    return Rule.model_validate({
        "name": "r",
        "signals": {"xids": [62]},
        "escalation": {"occurrences": 2, "window": "1h"},
        "ladder": [
            {"name": "reset", "steps": [
                {"action": "cordon"}, {"action": "reset", "reset": hook(reset_url)},
            ]},
            {"name": "reboot", "steps": [
                {"action": "reboot", "reboot": hook(reboot_url)},
                {"action": "reset", "reset": {"hook": {"type": "Job", "job": {
                    "templateFrom": {"name": "gpuheal-node-jobs", "key": "gpu-reset"}}}}},
            ]},
        ],
    })  # fmt: skip


def test_the_snapshot_keeps_scheme_and_host_of_each_webhook_only() -> None:
    rule = _rule()
    ladder = [snapshot_rung(r) for r in rule.ladder]
    text = "".join(r.model_dump_json() for r in ladder)
    assert "s3cr3t" not in text
    assert "tok" not in text
    reset = ladder[0].steps[1]
    assert reset.reset is not None
    assert reset.reset.hook.webhook is not None
    assert reset.reset.hook.webhook.url == "https://hooks.example.com/..."
    assert reset.reset.hook.webhook.timeout == "10s"
    # Everything else as it was: a cordon, a Job hook.
    assert ladder[0].steps[0] == rule.ladder[0].steps[0]
    assert ladder[1].steps[1] == rule.ladder[1].steps[1]
    assert calls_webhook(reset)
    assert not calls_webhook(ladder[1].steps[1])


def test_a_snapshot_is_its_rules_ladder_and_reads_the_url_from_the_policy() -> None:
    rule = _rule()
    ladder = [snapshot_rung(r) for r in rule.ladder]
    assert ladder_of(ladder, rule)  # the vetting before the first step
    assert ladder_of(rule.ladder, rule)  # an incident opened before: its whole URLs
    reset = ladder[0].steps[1]
    found = policy_step(reset, "reset", rule)
    assert found is not None
    assert found.reset is not None
    assert found.reset.hook.webhook is not None
    assert found.reset.hook.webhook.url == SLACKISH
    reboot = policy_step(ladder[1].steps[0], "reboot", rule)
    assert reboot is not None
    assert reboot.reboot is not None
    assert reboot.reboot.hook.webhook is not None
    assert reboot.reboot.hook.webhook.url == "http://bmc:8080/reboot/tok"
    # A rotated token in the path: read from the policy, still the same step.
    rotated = _rule(reset_url="https://hooks.example.com/services/T0/B1/n3w")
    again = policy_step(reset, "reset", rotated)
    assert again is not None
    assert again.reset is not None
    assert again.reset.hook.webhook is not None
    assert again.reset.hook.webhook.url.endswith("/n3w")


def test_no_step_when_the_hook_moved_to_another_host_or_the_rule_is_gone() -> None:
    reset = snapshot_rung(_rule().ladder[0]).steps[1]
    assert policy_step(reset, "reset", _rule(reset_url="https://elsewhere.example/x")) is None
    assert policy_step(reset, "reset", None) is None
    other = Step.model_validate({"action": "reset", "reset": {"hook": {
        "type": "Webhook", "webhook": {"url": SLACKISH, "timeout": "99s"}}}})  # fmt: skip
    assert policy_step(other, "reset", _rule()) is None  # other options: not this step
    moved = _rule(reset_url="https://elsewhere.example/x")
    assert not ladder_of([snapshot_rung(r) for r in _rule().ladder], moved)
