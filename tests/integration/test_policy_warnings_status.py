"""A valid but questionable policy says so on its status (condition Warnings), on the real
operator, and stops saying so once the cluster has what it missed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.integration.operator_harness import Objects, OperatorProcess, condition, wait_for
from tests.integration.test_operator_k8s import (  # noqa: F401 - fixtures
    case,
    gpuheal_crds,
    objects,
    policy,
    pool,
    run_operator,
    xid79_rule,
)

pytestmark = pytest.mark.integration


def test_a_missing_reserve_pool_is_a_warning_until_it_exists(
    case: Callable[..., list[str]],  # noqa: F811
    objects: Objects,  # noqa: F811
    run_operator: Callable[..., OperatorProcess],  # noqa: F811
) -> None:
    case(1)
    cid = case.case_id  # type: ignore[attr-defined]
    pname, spares = f"p-{cid}", f"spares-{cid}"
    objects.apply("remediationpolicies", policy(pname, f"{cid}-work", [xid79_rule(spares)]))
    run_operator()

    def warnings(status: str) -> dict[str, str] | None:
        c = condition(objects.get("remediationpolicies", pname), "Warnings")
        return c if c and c["status"] == status else None

    warned = wait_for(lambda: warnings("True"), "Warnings=True")
    assert warned["reason"] == "PolicyWarnings"
    assert f"ReservePool {spares} does not exist" in warned["message"]
    objects.apply("reservepools", pool(spares, f"{cid}-spare"))
    cleared = wait_for(lambda: warnings("False"), "Warnings=False once the pool exists")
    assert cleared["reason"] == "NoWarnings"
