"""A valid but questionable policy says so on its status (condition Warnings), on the real
operator, and stops saying so once the cluster has what it missed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from gpuheal_dev.sandbox import Sandbox
from tests.integration.operator_harness import (
    REPO,
    Objects,
    OperatorProcess,
    condition,
    node_events,
    policy,
    pool,
    wait_for,
    xid79_rule,
)

pytestmark = pytest.mark.integration


def _condition_is(
    store: Objects, plural: str, name: str, type_: str, status: str
) -> Callable[[], dict[str, Any] | None]:
    """For wait_for: the object's condition ``type_`` once it has ``status``."""

    def check() -> dict[str, Any] | None:
        c = condition(store.get(plural, name), type_)
        return c if c and c["status"] == status else None

    return check


def test_a_missing_reserve_pool_is_a_warning_until_it_exists(
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    pname, spares = f"p-{cid}", f"spares-{cid}"
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [xid79_rule(spares)]))
    run_operator()

    warned = wait_for(
        _condition_is(objects, "remediationpolicies", pname, "Warnings", "True"), "Warnings=True"
    )
    assert warned["reason"] == "PolicyWarnings"
    assert f"ReservePool {spares} does not exist" in warned["message"]
    objects.apply("reservepools", pool(spares, f"{cid}-spare"))
    cleared = wait_for(
        _condition_is(objects, "remediationpolicies", pname, "Warnings", "False"),
        "Warnings=False once the pool exists",
    )
    assert cleared["reason"] == "NoWarnings"


def test_a_policy_whose_selector_matches_no_node_says_so_until_it_does(
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    pname = f"p-{cid}"
    fence = {"name": "fence", "steps": [{"action": "cordon"}]}
    typo = policy(
        pname, f"{cid}-wrok", [{"name": "gone", "signals": {"xids": [79]}, "ladder": [fence]}]
    )
    objects.apply("remediationpolicies", typo)
    run_operator()

    warned = wait_for(
        _condition_is(objects, "remediationpolicies", pname, "Warnings", "True"), "Warnings=True"
    )
    assert "nodeSelector matches no node" in warned["message"]
    objects.patch(
        "remediationpolicies",
        pname,
        {"spec": {"nodeSelector": {"matchLabels": {"gpuheal.io/case": f"{cid}-work"}}}},
    )
    assert wait_for(
        _condition_is(objects, "remediationpolicies", pname, "Warnings", "False"),
        "Warnings=False once it matches",
    )


@contextmanager
def _crd_without_reserve_reason_rules(sandbox: Sandbox) -> Iterator[None]:
    """The ReservePool CRD as it was before reserveReason had rules (an upgrade's past):
    what was stored then stays stored after the rules arrive."""
    path = REPO / "crds" / "gpuheal.io_reservepools.yaml"
    crd = yaml.safe_load(path.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    slurm = props["spec"]["properties"]["promotion"]["properties"]["slurm"]
    slurm["properties"]["reserveReason"].pop("x-kubernetes-validations")
    sandbox.kubectl("apply", "-f", "-", input=json.dumps(crd))
    try:
        yield
    finally:
        sandbox.kubectl("apply", "-f", str(path))


def _stored(store: Objects, body: dict[str, Any]) -> bool:
    try:
        store.apply("reservepools", body)
    except ApiException as exc:
        if exc.status == 422:
            return False  # the API server has not taken the looser schema in yet
        raise
    return True


def test_a_stored_pool_the_operator_cannot_read_says_so_until_fixed(
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    sandbox: Sandbox,
) -> None:
    case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    pname, spares = f"p-{cid}", f"spares-{cid}"
    bad = pool(spares, f"{cid}-spare")
    bad["spec"]["promotion"]["slurm"] = {"reserveReason": "gpuheal: spare"}
    with _crd_without_reserve_reason_rules(sandbox):
        wait_for(lambda: _stored(objects, bad), "the pool stored under the older schema")
    probes = count()

    def refused_again() -> bool:  # a new name each time: an update would be ratcheted
        probe = pool(f"probe-{cid}-{next(probes)}", f"{cid}-spare")
        probe["spec"]["promotion"]["slurm"] = {"reserveReason": "gpuheal: spare"}
        return not _stored(objects, probe)

    wait_for(refused_again, "the rules back in the API server")
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [xid79_rule(spares)]))
    run_operator()

    refused = wait_for(
        _condition_is(objects, "reservepools", spares, "Ready", "False"), "the pool's Ready=False"
    )
    assert refused["reason"] == "InvalidSpec"
    assert "spec.promotion.slurm.reserveReason" in refused["message"]
    assert "gpuheal:" in refused["message"]

    warned = _condition_is(objects, "remediationpolicies", pname, "Warnings", "True")
    assert (
        f"ReservePool {spares} is ignored, its spec does not parse"
        in wait_for(warned, "the policy's warning")["message"]
    )
    objects.patch(
        "reservepools", spares, {"spec": {"promotion": {"slurm": {"reserveReason": "spare"}}}}
    )
    assert (
        wait_for(
            _condition_is(objects, "reservepools", spares, "Ready", "True"), "Ready=True once fixed"
        )["reason"]
        == "Active"
    )


def test_the_turn2_pool_with_partition_applies_and_its_status_says_what_to_do(
    sandbox: Sandbox,
    case: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
) -> None:
    """The ReservePool as written against the first CRDs (`promotion.slurm.partition`,
    removed later) still applies on the real API server, and the operator says on its
    status that the field is deprecated, ignored, what to do instead and when it goes."""
    case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    turn2 = yaml.safe_load((REPO / "tests" / "data" / "reservepool-turn2.yaml").read_text())
    turn2["metadata"]["name"] = name = f"spares-turn2-{cid}"
    turn2["spec"]["nodeSelector"] = {"matchLabels": {"gpuheal.io/case": f"{cid}-spare"}}
    objects.apply("reservepools", turn2)  # refused before: strict decoding, unknown field
    stored = objects.get("reservepools", name)
    assert stored is not None
    assert stored["spec"]["promotion"]["slurm"]["partition"] == "main"
    run_operator()

    warned = wait_for(
        _condition_is(objects, "reservepools", name, "Warnings", "True"), "Warnings=True"
    )
    assert warned["reason"] == "DeprecatedFields"
    assert warned["message"].startswith(
        "spec.promotion.slurm.partition is deprecated: accepted and ignored"
    )
    assert "slurm.conf" in warned["message"]
    assert "gpuheal.io/v1beta1" in warned["message"]
    ready = condition(objects.get("reservepools", name), "Ready")
    assert ready is not None
    assert ready["status"] == "True"
    [event] = wait_for(
        lambda: [
            e
            for e in node_events(sandbox.core_v1(), name, kind="ReservePool")
            if e.reason == "DeprecatedFields"
        ],
        "a DeprecatedFields Warning Event on the pool",
    )
    assert event.type == "Warning"
    assert event.message == warned["message"]
