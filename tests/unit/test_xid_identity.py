"""One GPU, one key: the PCI <-> UUID map the agent publishes and every source goes through."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.xid import (
    GpuMap,
    canonical_gpu_key,
    format_gpu_map,
    parse_dcgm_metrics,
    parse_event,
    parse_gpu_map,
)

UUID_A = "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
UUID_B = "GPU-0b6b7808-c002-f593-ac86-cd8e57757b94"
MAP = GpuMap().learn([("0000:3b:00", UUID_A), ("00000000:86:00.0", UUID_B)])


@pytest.mark.parametrize(
    ("pci", "uuid", "key"),
    [
        ("0000:3b:00", None, "0000:3b:00"),  # kernel line
        ("00000000:3B:00.0", UUID_A, "0000:3b:00"),  # dcgm-exporter, both labels
        (None, UUID_A, "0000:3b:00"),  # a UUID-only source, mapped
        (None, UUID_A.upper().replace("GPU-", "GPU-"), "0000:3b:00"),  # case does not matter
        ("PCI:0000:86:00", None, "0000:86:00"),
        (
            None,
            "GPU-11111111-2222-3333-4444-555555555555",
            "GPU-11111111-2222-3333-4444-555555555555",
        ),
        (None, None, None),
        ("not a pci", "not a uuid", None),
    ],
)
def test_canonical_key(pci: str | None, uuid: str | None, key: str | None) -> None:
    assert MAP.key(pci, uuid) == key
    assert canonical_gpu_key(pci, uuid, MAP) == key


def test_same_xid_from_two_sources_is_one_gpu() -> None:
    """The dedupe the operator needs: an agent Event (PCI, UUID in its identity line) and a
    dcgm-exporter sample (UUID and pci_bus_id labels) name the same GPU."""
    event = parse_event(
        "GpuXid",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
        f"NVRM: GPU at PCI:0000:3b:00: {UUID_A}",
    )
    scrape = (
        f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{UUID_A}",'
        'pci_bus_id="00000000:3B:00.0",xid="79"} 1\n'
    )
    (sample,) = parse_dcgm_metrics(scrape)
    old_dcgm = parse_dcgm_metrics(
        f'DCGM_EXP_XID_ERRORS_COUNT{{gpu="0",UUID="{UUID_A}",xid="79"}} 1\n'
    )[0]
    assert event is not None
    assert event.gpu_uuid == UUID_A
    keys = {
        canonical_gpu_key(event.pci_bus_id, event.gpu_uuid, MAP),
        canonical_gpu_key(sample.pci_bus_id, sample.uuid, MAP),
        canonical_gpu_key(old_dcgm.pci_bus_id, old_dcgm.uuid, MAP),  # no pci label: via map
    }
    assert keys == {"0000:3b:00"}
    # Without the map, an exporter that has no pci_bus_id label cannot be joined.
    assert canonical_gpu_key(old_dcgm.pci_bus_id, old_dcgm.uuid) == UUID_A


def test_annotation_round_trip_and_garbage() -> None:
    text = format_gpu_map(MAP)
    assert text == f'{{"0000:3b:00":"{UUID_A}","0000:86:00":"{UUID_B}"}}'
    assert parse_gpu_map(text) == MAP
    for bad in (None, "", "[]", "{", '{"0000:3b:00": 5}', '{"x": "GPU-1"}', "x" * 70_000):
        assert parse_gpu_map(bad) == GpuMap()


def test_learn_overwrites_and_is_bounded() -> None:
    newer = MAP.learn([("0000:3b:00", UUID_B)])
    assert newer.uuid_of("0000:3b:00") == UUID_B
    assert MAP.uuid_of("0000:3b:00") == UUID_A  # immutable
    many = GpuMap().learn(
        (f"0000:{i // 256:02x}:{i % 256:02x}", f"GPU-{i:08x}-0000-0000-0000-000000000000")
        for i in range(1000)
    )
    assert len(many.by_pci) == 256


_HEX = "0123456789abcdef"


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.builds(
            lambda b, d: f"0000:{b}:{d}",
            st.text(_HEX, min_size=2, max_size=2),
            st.text(_HEX, min_size=2, max_size=2),
        ),
        st.builds(
            lambda a, b, c, d, e: f"GPU-{a}-{b}-{c}-{d}-{e}",
            st.text(_HEX, min_size=8, max_size=8),
            st.text(_HEX, min_size=4, max_size=4),
            st.text(_HEX, min_size=4, max_size=4),
            st.text(_HEX, min_size=4, max_size=4),
            st.text(_HEX, min_size=12, max_size=12),
        ),
        max_size=16,
    )
)
def test_map_round_trips_and_keys_agree(pairs: dict[str, str]) -> None:
    gpu_map = parse_gpu_map(format_gpu_map(pairs))
    assert gpu_map.by_pci == pairs
    for pci, uuid in pairs.items():
        if list(pairs.values()).count(uuid) == 1:
            assert gpu_map.key(None, uuid) == gpu_map.key(pci, None) == pci


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_gpu_map_never_raises(text: str) -> None:
    assert isinstance(parse_gpu_map(text), GpuMap)
