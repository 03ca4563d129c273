"""The Lease rule (gpuheal.policy.lease): a standby times how long it has seen the record
unchanged on its own clock; wall-clock times in the record never decide."""

from __future__ import annotations

from typing import Any

from gpuheal.policy.lease import (
    Sighting,
    may_take,
    must_give_up,
    record_of,
    renewal_budget,
    sight,
)


def lease(rv: str, renew: str, holder: str | None = "a", duration: int = 15) -> dict[str, Any]:
    return {
        "metadata": {"resourceVersion": rv},
        "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration},
    }


def watch(reads: list[tuple[float, dict[str, Any]]], me: str = "b") -> list[bool]:
    """A standby reading the Lease at each (monotonic time, object): may it take it?"""
    seen: Sighting | None = None
    out = []
    for now, obj in reads:
        seen = sight(seen, record_of(obj), now)
        out.append(may_take(obj["spec"], me, seen, now, 15.0))
    return out


def test_a_renewing_holder_is_never_taken_whatever_its_renew_time_says() -> None:
    # renewTime an hour in the past (the holder's clock, or ours, is off): it still renews.
    reads = [(t, lease(str(t // 5), f"2020-01-01T00:00:{t // 5:02d}.000000Z"))
             for t in range(0, 120)]  # fmt: skip
    assert not any(watch(reads))


def test_taken_only_after_the_duration_of_no_change_on_the_standbys_clock() -> None:
    frozen = lease("7", "2099-01-01T00:00:00.000000Z")  # renewTime in the future: ignored too
    assert watch([(100.0, frozen), (110.0, frozen), (114.9, frozen), (115.0, frozen)]) == [
        False, False, False, True,
    ]  # fmt: skip


def test_any_change_of_the_record_restarts_the_wait() -> None:
    a, b = lease("7", "x"), lease("8", "x")  # same spec, a new write (resourceVersion)
    assert watch([(0.0, a), (14.0, b), (28.0, b), (29.0, b)]) == [False, False, False, True]
    holder_changed = lease("7", "x", holder="c")
    assert watch([(0.0, a), (14.0, holder_changed), (16.0, holder_changed)]) == [False] * 3


def test_the_holders_own_duration_counts() -> None:
    short = lease("7", "x", duration=3)
    assert watch([(0.0, short), (2.9, short), (3.0, short)]) == [False, False, True]


def test_free_or_mine_at_once() -> None:
    assert watch([(0.0, lease("7", "x", holder=None))]) == [True]
    assert watch([(0.0, lease("7", "x", holder="b"))]) == [True]


def test_a_sighting_keeps_its_start_while_unchanged() -> None:
    first = sight(None, record_of(lease("1", "x")), 5.0)
    assert sight(first, record_of(lease("1", "x")), 9.0) is first
    assert sight(first, record_of(lease("2", "x")), 9.0).since == 9.0


def test_the_holder_gives_up_at_its_renew_deadline_before_a_standby_may_take() -> None:
    # Renewal began at 100 on the holder's clock; a standby sees that write at 100 at the
    # earliest and may take it at 115; the holder stops at 110 (two thirds of 15).
    assert not must_give_up(100.0, 109.9, 15.0)
    assert must_give_up(100.0, 110.0, 15.0)
    assert must_give_up(None, 0.0, 15.0)
    assert renewal_budget(100.0, 105.0, 15.0) == 5.0
    assert renewal_budget(100.0, 111.0, 15.0) == 0.0
    assert renewal_budget(None, 0.0, 15.0) == 0.0
