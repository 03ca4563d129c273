"""The generated CRDs on a real kube-apiserver: valid examples are accepted, every
`examples/invalid/*` object is rejected with the readable message its header promises.

Each invalid file starts with:
    # Invalid on purpose. Rule: <which rule>
    # expect: <text the API server's error must contain>
and optionally `# apply-first:` when the file holds two documents: the first is created
(valid), the second, an update of it, must be rejected (transition rules need an old object).
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
VALID = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))
FIELD_MANAGER = "gpuheal-crd-validation-test"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def crds(sandbox: Any) -> Any:
    """CRDs installed (server-side apply: idempotent if another test installed them too)."""
    for path in CRDS:
        sandbox.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager={FIELD_MANAGER}",
            "-f",
            str(path),
        )
    sandbox.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        *(
            f"crd/{p.name.removeprefix('gpuheal.io_').removesuffix('.yaml')}.gpuheal.io"
            for p in CRDS
        ),
    )
    return sandbox


def _expected(path: pathlib.Path) -> str:
    match = re.search(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no '# expect:' line"
    return match.group(1).strip()


def test_crds_are_established(crds: Any) -> None:
    out = crds.kubectl("get", "crd", "-o", "name").stdout
    for name in ("remediationpolicies", "reservepools", "noderemediations"):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}.gpuheal.io" in out


def test_short_names_work(crds: Any) -> None:
    for short in ("rp", "rsvp", "nrem"):
        result = crds.kubectl("get", short, check=False)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_accepted(crds: Any, path: pathlib.Path) -> None:
    result = crds.kubectl(
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={FIELD_MANAGER}",
        "-f",
        str(path),
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_rejected_with_its_message(crds: Any, path: pathlib.Path) -> None:
    expected = _expected(path)
    text = path.read_text()
    if "\n# apply-first:" in text:
        first, second = text.split("\n---\n", 1)
        crds.kubectl("delete", "-f", "-", "--ignore-not-found", input=first)
        crds.kubectl("create", "-f", "-", input=first)
        try:
            result = crds.kubectl("apply", "-f", "-", input=second, check=False)
        finally:
            crds.kubectl("delete", "-f", "-", "--ignore-not-found", input=first)
    else:
        result = crds.kubectl("create", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was accepted: {result.stdout}"
    assert expected in result.stderr, f"{path.name}: wanted {expected!r} in {result.stderr!r}"


TURN2_POOL = ROOT / "tests" / "data" / "reservepool-turn2.yaml"


def test_the_turn2_reserve_pool_with_partition_still_applies(crds: Any) -> None:
    """`promotion.slurm.partition` left the schema once (kubectl then said "strict decoding
    error: unknown field"); it is deprecated now: accepted as written, described so."""
    result = crds.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", str(TURN2_POOL), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "unknown field" not in result.stderr
    explained = crds.kubectl("explain", "reservepools.spec.promotion.slurm.partition").stdout
    assert "Deprecated: accepted and ignored" in explained


@pytest.mark.parametrize(
    ("field", "patch"),
    [
        ("spec.rules[0].escalation.window", {"rules": [{"escalation": {"window": "7d"}}]}),
        ("spec.safety.stormCooldown", {"safety": {"stormCooldown": "7d"}}),
        ("spec.history.retention", {"history": {"retention": "7d"}}),
    ],
    ids=["escalation.window", "stormCooldown", "history.retention"],
)
def test_a_duration_in_days_is_refused_naming_the_field_and_the_format(
    crds: Any, field: str, patch: dict[str, Any]
) -> None:
    """`7d` is not a duration CEL knows: the API server's answer names the field and the
    accepted format, and carries no CEL type conversion error."""
    policy: dict[str, Any] = {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": "duration-in-days"},
        "spec": {
            "nodeSelector": {},
            "safety": {"maxUnhealthy": 1},
            "rules": [
                {
                    "name": "fell-off-bus",
                    "signals": {"xids": [79]},
                    "escalation": {"occurrences": 2, "window": "24h"},
                    "ladder": [
                        {"name": "fence", "steps": [{"action": "cordon"}]},
                        {"name": "more", "steps": [{"action": "cordon"}, {"action": "alert"}]},
                    ],
                }
            ],
        },
    }
    spec = policy["spec"]
    for key, value in patch.items():
        if key == "rules":
            spec["rules"][0]["escalation"].update(value[0]["escalation"])
        else:
            spec.setdefault(key, {}).update(value)
    result = crds.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(policy), check=False
    )
    assert result.returncode != 0, result.stdout
    assert f'{field}: Invalid value: "7d": must be a duration such as 90s' in result.stderr
    assert "no days: 7d is 168h" in result.stderr
    assert "type conversion error" not in result.stderr, result.stderr
    assert "google.protobuf.Duration" not in result.stderr, result.stderr
