from __future__ import annotations

import pytest

from gpuheal.xid import CATALOGUE, FirstSight, XidClass, explain, lookup

REQUIRED = [
    13,
    31,
    32,
    38,
    43,
    45,
    48,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    119,
    120,
    121,
    136,
    140,
    143,
    *range(144, 151),
    154,
    155,
]


@pytest.mark.parametrize("code", REQUIRED)
def test_required_entries_exist_with_source(code: int) -> None:
    entry = CATALOGUE[code]
    assert entry.known
    assert entry.source.startswith("https://docs.nvidia.com/")
    assert entry.mnemonic
    assert entry.immediate_action
    assert entry.investigatory_action


@pytest.mark.parametrize(
    ("code", "action_class", "first_sight"),
    [
        (79, XidClass.FELL_OFF_BUS, FirstSight.ANY),
        (94, XidClass.CONTAINED_MEMORY, FirstSight.NO_REPLACE),
        (62, XidClass.GPU_RESET, FirstSight.ANY),
        (154, XidClass.RECOVERY_ACTION, FirstSight.ANY),
        (13, XidClass.APPLICATION, FirstSight.ALERT_ONLY),
        (31, XidClass.APPLICATION, FirstSight.ALERT_ONLY),
        (43, XidClass.APPLICATION, FirstSight.ALERT_ONLY),
        (74, XidClass.NVLINK, FirstSight.ANY),
        (63, XidClass.RESET_WHEN_IDLE, FirstSight.ANY),
        # generated families: an engine exception is the job's until it repeats
        (41, XidClass.APPLICATION, FirstSight.ALERT_ONLY),
        (135, XidClass.APPLICATION, FirstSight.ALERT_ONLY),
        (157, XidClass.INFORMATIONAL, FirstSight.ANY),
        (156, XidClass.GPU_RESET, FirstSight.ANY),
    ],
)
def test_defaults_from_the_issue(
    code: int, action_class: XidClass, first_sight: FirstSight
) -> None:
    assert (lookup(code).action_class, lookup(code).first_sight) == (action_class, first_sight)


def test_unknown_xid_alerts_only() -> None:
    entry = lookup(9999)
    assert entry.action_class is XidClass.UNKNOWN
    assert entry.first_sight is FirstSight.ALERT_ONLY
    assert not entry.known


def test_explain_names_meaning_and_source() -> None:
    text = explain(79)
    assert "fallen off the bus" in text
    assert "RESTART_BM" in text
    assert "docs.nvidia.com" in text


def test_generated_entries_carry_nvidias_mnemonics() -> None:
    assert lookup(41).mnemonic == "ROBUST_CHANNEL_CE2_ERROR"
    assert lookup(85).mnemonic == "ROBUST_CHANNEL_CE9_ERROR"
    assert lookup(126).mnemonic == "ROBUST_CHANNEL_CE10_ERROR"
    assert lookup(98).mnemonic == "ROBUST_CHANNEL_NVDEC7_ERROR"
    assert lookup(82).mnemonic == "ROBUST_CHANNEL_NVJPG0_ERROR"
    assert lookup(105).mnemonic == "ROBUST_CHANNEL_NVJPG7_ERROR"
    assert all(e.source.startswith("https://docs.nvidia.com/") for e in CATALOGUE.values())
