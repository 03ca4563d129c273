"""xid_latency's choice of Slurm releases (GPUHEAL_BENCH_SLURM, bench/operator.py)."""

from __future__ import annotations

import pytest
from bench.operator import SLURM_ENV, _xid_releases


def test_unset_runs_both_releases_default_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLURM_ENV, raising=False)
    assert _xid_releases() == ["26.05", "22.05"]


@pytest.mark.parametrize(
    ("raw", "want"),
    [("22.05", ["22.05"]), (" 22.05 , 26.05 ", ["22.05", "26.05"]), ("26.05,", ["26.05"])],
)
def test_chosen_releases_in_the_given_order(
    monkeypatch: pytest.MonkeyPatch, raw: str, want: list[str]
) -> None:
    monkeypatch.setenv(SLURM_ENV, raw)
    assert _xid_releases() == want


@pytest.mark.parametrize("raw", ["24.11", "26.05,26.05", "22.05;26.05"])
def test_an_unknown_or_repeated_release_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(SLURM_ENV, raw)
    with pytest.raises(ValueError, match=SLURM_ENV):
        _xid_releases()
