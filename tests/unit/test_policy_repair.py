"""What proves a repair (`policy.repair`): table tests, no cluster."""

from __future__ import annotations

import datetime as dt

import pytest

from gpuheal.policy.repair import reboot_proof, reset_proof
from gpuheal.policy.types import Observation
from gpuheal.xid.identity import GpuMap, GpuReport

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
A, B = "0000:3b:00", "0000:5e:00"
UA = "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
UB = "GPU-00000000-0000-0000-0000-000000000001"
UC = "GPU-00000000-0000-0000-0000-0000000000cc"
BEFORE = {A: UA, B: UB}


@pytest.mark.parametrize(
    ("before", "now", "verdict", "says"),
    [
        ("b-1", "b-2", True, "bootID b-1 -> b-2"),
        ("b-1", "b-1", None, "bootID unchanged (b-1)"),
        ("b-1", "", None, "bootID unchanged (b-1)"),
        (None, "b-2", False, "no boot ID was recorded before the reboot"),
    ],
)
def test_a_reboot_is_a_new_boot_id(
    before: str | None, now: str, verdict: bool | None, says: str
) -> None:
    got, message = reboot_proof(before, now)
    assert got is verdict
    assert says in message


def report(at: dt.datetime, gpus: dict[str, str]) -> GpuReport:
    return GpuReport(at=at, gpus=GpuMap(gpus))


def xid_at(at: dt.datetime) -> Observation:
    return Observation(time=at, xid=62, gpu=A)


@pytest.mark.parametrize(
    ("seen", "observations", "now", "verdict", "says"),
    [
        # every GPU back, same UUIDs, reported after the reset, quiet for the settle period
        (report(T0 + 5 * S, BEFORE), [], T0 + 70 * S, True, "2 of 2 GPUs reported again"),
        # ...not quiet long enough yet
        (report(T0 + 5 * S, BEFORE), [], T0 + 30 * S, None, "no XID for 25s of 1m"),
        # the agent's report predates the reset: it says nothing about after it
        (report(T0 - 5 * S, BEFORE), [], T0 + 70 * S, None, "is not after the reset"),
        (None, [], T0 + 70 * S, None, "has not reported the GPUs"),
        # a GPU missing: not back (yet)
        (report(T0 + 5 * S, {A: UA}), [], T0 + 70 * S, None, "1 of 2 GPUs (missing 0000:5e:00)"),
        # another GPU at the address: not a reset of this one
        (report(T0 + 5 * S, {A: UA, B: UC}), [], T0 + 70 * S, False, "another GPU"),
        # an XID after the reset: it did not hold
        (report(T0 + 5 * S, BEFORE), [xid_at(T0 + 9 * S)], T0 + 70 * S, False, "XID 62 at"),
        # an XID before the reset is the fault it repaired
        (report(T0 + 5 * S, BEFORE), [xid_at(T0 - 9 * S)], T0 + 70 * S, True, "same UUIDs"),
    ],
)
def test_a_reset_is_the_same_gpus_reported_again_and_quiet(
    seen: GpuReport | None,
    observations: list[Observation],
    now: dt.datetime,
    verdict: bool | None,
    says: str,
) -> None:
    got, message = reset_proof(
        BEFORE, seen, reset_at=T0, want_count=2, observations=observations,
        settle=dt.timedelta(minutes=1), now=now,
    )  # fmt: skip
    assert (got, says in message) == (verdict, True), message


def test_a_reset_cannot_be_proven_without_a_gpu_map_before_it_or_below_the_gpu_count() -> None:
    got, message = reset_proof(
        {}, report(T0 + S, BEFORE), reset_at=T0, want_count=2, observations=[],
        settle=dt.timedelta(), now=T0 + 9 * S,
    )  # fmt: skip
    assert (got, "no GPU map was recorded") == (False, message[: len("no GPU map was recorded")])
    short, said = reset_proof(
        BEFORE, report(T0 + S, BEFORE), reset_at=T0, want_count=8, observations=[],
        settle=dt.timedelta(), now=T0 + 9 * S,
    )  # fmt: skip
    assert (short, "2 of 8 GPUs" in said) == (None, True)
