"""The Python side of the CRDs' checks for policies written in a hurry (the CEL side runs on
the real API server: tests/integration/test_crd_validation.py and test_crd_cost.py)."""

from __future__ import annotations

import datetime as dt
import pathlib
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpuheal.api import RemediationPolicy, parse_duration
from gpuheal.api.meta import DurationError, is_label_key, is_label_value
from gpuheal.api.policylint import SPEC_CHECKS, class_of
from gpuheal.api.remediationpolicy import webhook_url_ok
from gpuheal.xid.types import XidClass

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("pool", True),
        ("gpuheal.io/pool", True),
        ("nvidia.com/gpu.product", True),
        ("a_b.c-d", True),
        ("a" * 63, True),
        ("example.com/" + "a" * 63, True),
        ("a" * 64, False),  # the name part has at most 63 characters
        ("example.com/" + "a" * 64, False),
        ("a" * 254 + "/b", False),  # the prefix at most 253
        ("gpu type", False),
        ("a/b/c", False),
        ("/x", False),
        ("x/", False),
        ("Example.com/x", False),  # the prefix is a lower-case DNS subdomain
        ("-a", False),
        ("", False),
    ],
)
def test_label_keys_as_the_api_server_checks_them(key: str, ok: bool) -> None:
    assert is_label_key(key) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("", True), ("a", True), ("A100-SXM4_80GB.v2", True), ("a" * 63, True), ("a" * 64, False),
     ("A100 80GB", False), ("-a", False), ("a-", False)],
)  # fmt: skip
def test_label_values_as_the_api_server_checks_them(value: str, ok: bool) -> None:
    assert is_label_value(value) is ok


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("604800s", 604800), ("1h30m15s250ms", 5415.25), ("999999h", 999999 * 3600), ("0.5s", 0.5)],
)
def test_durations_in_order_with_up_to_six_digits(text: str, seconds: float) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["1h1h", "30s1m", "1000000h", "99999999h", "1.1234567890s"])
def test_durations_that_could_overflow_or_read_ambiguously_are_refused(text: str) -> None:
    with pytest.raises(DurationError, match="must be a duration such as 90s"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("url", "ok"),
    [("https://bmc.example/reset", True), ("http://10.0.0.1:8080", True),
     ("https:///reset", False), ("ftp://bmc.example", False), ("bmc.example/reset", False)],
)  # fmt: skip
def test_webhook_urls_need_http_and_a_host(url: str, ok: bool) -> None:
    assert webhook_url_ok(url) is ok


def test_class_of_follows_the_catalogue() -> None:
    assert class_of(79) is XidClass.FELL_OFF_BUS
    assert class_of(94) is XidClass.CONTAINED_MEMORY
    assert class_of(99) is XidClass.APPLICATION  # NVJPG1: an engine exception
    assert class_of(999) is XidClass.UNKNOWN


def _policy(*rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {"nodeSelector": {}, "safety": {"maxUnhealthy": 1}, "rules": list(rules)},
    }


def _rule(name: str, **signals: Any) -> dict[str, Any]:
    return {"name": name, "signals": signals,
            "ladder": [{"name": "fence", "steps": [{"action": "cordon"}]}]}  # fmt: skip


def test_the_shipped_policies_pass_every_check() -> None:
    chart = ROOT / "deploy" / "helm" / "gpuheal" / "files"
    for path in (ROOT / "examples" / "default-policy.yaml", chart / "default-policy.yaml"):
        spec = RemediationPolicy.model_validate(yaml.safe_load(path.read_text())).spec
        for check in SPEC_CHECKS:
            assert list(check.problems(spec.rules)) == [], (path.name, check.name)


def test_the_first_problem_is_reported_by_rule_order() -> None:
    """What the API server reports first (the first rule with a problem, its first item)."""
    doc = _policy(
        _rule("a", xids=[79, 48]),
        _rule("b", xids=[48, 79]),
        _rule("c", xids=[79]),
    )
    with pytest.raises(ValidationError, match="XID 48 is listed by rules a and b"):
        RemediationPolicy.model_validate(doc)


def test_an_xid_may_override_its_class_below_it_but_not_above() -> None:
    """A rule for one XID above the rule for its class is the intended override."""
    RemediationPolicy.model_validate(
        _policy(_rule("one", xids=[48]), _rule("family", xidClasses=["GpuReset"]))
    )
    with pytest.raises(ValidationError, match="XID 48 of rule one is in class GpuReset"):
        RemediationPolicy.model_validate(
            _policy(_rule("family", xidClasses=["GpuReset"]), _rule("one", xids=[48]))
        )


def test_xid154_rules_with_disjoint_recovery_actions_and_a_catch_all_last_are_fine() -> None:
    RemediationPolicy.model_validate(
        _policy(
            _rule("reboot", xids=[154], recoveryActions=["NodeReboot"]),
            _rule("reset", xidClasses=["RecoveryAction"], recoveryActions=["GpuReset"]),
            _rule("rest", xids=[154]),
        )
    )


def test_events_with_different_message_parts_and_a_catch_all_last_are_fine() -> None:
    RemediationPolicy.model_validate(
        _policy(
            _rule("fatal", events=[{"reason": "NvSwitchSxid", "messageContains": "Fatal"}]),
            _rule("other", events=[{"reason": "NvSwitchSxid", "messageContains": "Non-fatal"}]),
            _rule("rest", events=[{"reason": "NvSwitchSxid"}]),
        )
    )


def test_the_same_condition_with_another_status_is_another_signal() -> None:
    RemediationPolicy.model_validate(
        _policy(
            _rule("false", conditions=[{"type": "Ready", "status": "False", "for": "5m"}]),
            _rule("unknown", conditions=[{"type": "Ready", "status": "Unknown", "for": "5m"}]),
        )
    )
