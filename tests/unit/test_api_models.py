"""Examples validate against the models; each invalid example is rejected locally too."""

from __future__ import annotations

import datetime as dt
import pathlib
import re
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from gpuheal.api import (
    LabelSelector,
    NodeRemediation,
    RemediationPolicy,
    ReservePool,
    parse_duration,
    scaled_value,
    set_condition,
)
from gpuheal.api.meta import ConditionStatus, DurationError
from gpuheal.api.reservepool import SlurmPromotion, deprecations

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))
MODELS: dict[str, type[BaseModel]] = {
    "RemediationPolicy": RemediationPolicy,
    "ReservePool": ReservePool,
    "NodeRemediation": NodeRemediation,
}
# Rules only the API server can check (transition rules need the stored object).
SERVER_ONLY = {"nrem-node-name-immutable.yaml"}


def _docs(path: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"default-policy.yaml", "reservepool.yaml"}
    assert len(INVALID) >= 15


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_valid_examples_parse(path: pathlib.Path) -> None:
    for doc in _docs(path):
        model = MODELS[doc["kind"]]
        obj = model.model_validate(doc)
        # Round trip: what the operator writes back (`to_k8s`) reads back as the same object.
        assert model.model_validate(obj.to_k8s()) == obj  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_examples_say_why(path: pathlib.Path) -> None:
    text = path.read_text()
    assert "# Invalid on purpose. Rule: " in text
    assert "\n# expect: " in text


@pytest.mark.parametrize(
    "path", [p for p in INVALID if p.name not in SERVER_ONLY], ids=lambda p: p.name
)
def test_invalid_examples_rejected_by_models(path: pathlib.Path) -> None:
    """Local files fail the same way as on the API server: with the message the header
    promises (`# expect-local:` where the schema's own wording differs from pydantic's)."""
    text = path.read_text()
    local = re.search(r"^# expect-local: (.+)$", text, re.MULTILINE) or re.search(
        r"^# expect: (.+)$", text, re.MULTILINE
    )
    assert local is not None
    doc = _docs(path)[-1]
    with pytest.raises(ValidationError) as caught:
        MODELS[doc["kind"]].model_validate(doc)
    assert local.group(1).strip() in str(caught.value)


def test_default_policy_encodes_catalogue_defaults() -> None:
    policy = RemediationPolicy.model_validate(_docs(ROOT / "examples" / "default-policy.yaml")[0])
    rules = {r.name: r for r in policy.spec.rules}
    fell = rules["fell-off-bus"]
    assert [s.action.value for s in fell.ladder[0].steps] == [
        "cordon",
        "slurmDrain",
        "drain",
        "reboot",
    ]
    assert fell.ladder[-1].steps[-1].action.value == "replace"
    ecc = rules["contained-ecc"]
    assert all(s.action.value != "replace" for s in ecc.ladder[0].steps)
    assert ecc.escalation is not None
    assert ecc.escalation.occurrences == 3
    app = rules["application-fault"]
    assert [s.action.value for s in app.ladder[0].steps] == ["alert"]
    assert policy.spec.rules[0].name == "fell-off-bus"  # most severe first


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0s", 0), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("250ms", 0.25)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "10", "1d", "10 m", "-5s", "m", "1h" * 20])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "total", "round_up", "expected"),
    [
        (3, 100, False, 3),
        ("10%", 45, False, 4),
        ("10%", 45, True, 5),
        ("0%", 9, True, 0),
        ("100%", 7, False, 7),
    ],
)
def test_scaled_value(value: int | str, total: int, round_up: bool, expected: int) -> None:
    assert scaled_value(value, total, round_up=round_up) == expected


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        (
            {"matchExpressions": [{"key": "p", "operator": "NotIn", "values": ["reserve"]}]},
            {},
            True,
        ),
        (
            {"matchExpressions": [{"key": "p", "operator": "NotIn", "values": ["reserve"]}]},
            {"p": "reserve"},
            False,
        ),
        ({"matchExpressions": [{"key": "p", "operator": "In", "values": ["x"]}]}, {}, False),
        ({"matchExpressions": [{"key": "p", "operator": "Exists"}]}, {"p": ""}, True),
        ({"matchExpressions": [{"key": "p", "operator": "DoesNotExist"}]}, {"p": ""}, False),
    ],
)
def test_label_selector(selector: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is matches


def test_set_condition_keeps_transition_time_when_status_unchanged() -> None:
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(minutes=5)
    conds = set_condition(
        [], type_="Ready", status=ConditionStatus.TRUE, reason="Active", message="", now=t0
    )
    conds = set_condition(
        conds, type_="Ready", status=ConditionStatus.TRUE, reason="Active", message="x", now=t1
    )
    assert conds[0].last_transition_time == t0
    assert conds[0].message == "x"
    conds = set_condition(
        conds, type_="Ready", status=ConditionStatus.FALSE, reason="Broken", message="", now=t1
    )
    assert conds[0].last_transition_time == t1
    assert len(conds) == 1


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("gpuheal: spares", "must not start with 'gpuheal:'"),
        ("spares\nready", "one line"),
        ("spares [x]", "'[' or ']'"),
    ],
)
def test_a_pools_slurm_reason_is_one_plain_line_not_gpuheals(reason: str, why: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(why)):
        SlurmPromotion(reserve_reason=reason)
    assert SlurmPromotion(reserve_reason="spares (rack 7)").reserve_reason == "spares (rack 7)"


TURN2_POOL = ROOT / "tests" / "data" / "reservepool-turn2.yaml"


def test_the_turn2_pool_with_partition_still_parses_and_says_it_is_deprecated() -> None:
    pool = ReservePool.model_validate(yaml.safe_load(TURN2_POOL.read_text()))
    assert pool.spec.promotion.slurm is not None
    assert pool.spec.promotion.slurm.partition == "main"
    [warning] = deprecations(pool.spec)
    assert warning.startswith("spec.promotion.slurm.partition is deprecated: accepted and ignored")
    assert "slurm.conf" in warning
    assert "gpuheal.io/v1beta1" in warning


def test_a_duration_in_days_is_refused_with_the_accepted_format() -> None:
    with pytest.raises(DurationError, match=r"'7d' must be a duration such as 90s.*7d is 168h"):
        parse_duration("7d")
