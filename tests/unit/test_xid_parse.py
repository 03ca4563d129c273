"""XID parsers on real-world line shapes, plus fuzzing: they never raise, never misread.

Sources of the sample lines:
[gpud]  leptonai/gpud components/accelerator/nvidia/error/xid/README.md (dmesg -T output)
[nvrm]  NVIDIA open-gpu-kernel-modules, comment on the contained-error format (MIG GPU-I)
[nvsen] NVIDIA/NVSentinel syslog-health-monitor gpufallen_handler_test.go (multi-line)
[forum] forums.developer.nvidia.com "Xid 62 / Xid 154 GSP PMU halt crash" (154 text)
[xiddoc] docs.nvidia.com/deploy/xid-errors (older driver line without "PCI:")
[plexus] plexus.company/guides/gpu-xid-errors/119 (pid='N/A')
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.xid import (
    KernelLogScanner,
    RecoveryAction,
    SxidEvent,
    XidEvent,
    dcgm_xid_events,
    format_kernel_line,
    normalize_pci,
    parse_dcgm_metrics,
    parse_event,
    parse_kernel_line,
    parse_kernel_text,
    parse_sxid_line,
)

UTC = dt.UTC


@pytest.mark.parametrize(
    ("line", "xid", "pci", "pid", "process"),
    [
        (  # [gpud] dmesg -T, pid='<unknown>'
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
            "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal "
            "Instruction Parameter",
            13,
            "0000:cb:00",
            None,
            None,
        ),
        (  # [gpud]
            "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
            "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
            109,
            "0000:cb:00",
            1797828,
            "pt_main_thread",
        ),
        (  # the canonical example
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
            79,
            "0000:3b:00",
            1234,
            "python",
        ),
        (  # [xiddoc] older driver, no "PCI:", dmesg monotonic prefix
            "[  123.456789] NVRM: Xid (0000:03:00): 14, Channel 00000001",
            14,
            "0000:03:00",
            None,
            None,
        ),
        (  # [nvrm] MIG attribution, no name=
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel "
            "(0x9). RST: No, D-RST: No",
            94,
            "0000:01:00",
            7194,
            None,
        ),
        (  # MIG with compute instance, journald short prefix
            "Mar 29 15:38:59 gpu-3 kernel: NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 31, "
            "pid=42, name=train.py, Ch 00000010, intr 00000000. MMU Fault",
            31,
            "0000:3b:00",
            42,
            "train.py",
        ),
        (  # [plexus] pid='N/A'
            "NVRM: Xid (PCI:0000:65:00): 119, pid='N/A', Timeout waiting for RPC from GSP",
            119,
            "0000:65:00",
            None,
            None,
        ),
        (  # /dev/kmsg record prefix
            "4,1234,5678901234,-;NVRM: Xid (PCI:0000:b3:00): 48, pid=99, name=a, An "
            "uncorrectable double bit error",
            48,
            "0000:b3:00",
            99,
            "a",
        ),
        (  # [forum] 62 with hex words, no pid
            "Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 "
            "00000000 20662342",
            62,
            "0000:01:00",
            None,
            None,
        ),
    ],
)
def test_kernel_line_shapes(
    line: str, xid: int, pci: str, pid: int | None, process: str | None
) -> None:
    event = parse_kernel_line(line)
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.pid, event.process) == (xid, pci, pid, process)


def test_mig_instances_are_recorded() -> None:
    event = parse_kernel_line("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 31, pid=1, x")
    assert event is not None
    assert (event.gpu_instance, event.compute_instance) == (1, 2)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, x",
            dt.datetime(2024, 8, 30, 11, 43, 9, tzinfo=UTC),
        ),
        (
            "2024-08-30T11:43:14,123456+0000 host kernel: NVRM: Xid (PCI:0000:cb:00): 13, x",
            dt.datetime(2024, 8, 30, 11, 43, 14, 123456, tzinfo=UTC),
        ),
        (
            "2024-08-30T13:43:14.5+02:00 host kernel: NVRM: Xid (PCI:0000:cb:00): 13, x",
            dt.datetime(2024, 8, 30, 11, 43, 14, 500000, tzinfo=UTC),
        ),
        ("[ 1843.308145] NVRM: Xid (PCI:0000:cb:00): 13, x", None),  # monotonic: no wall time
        ("Aug 30 11:43:09 host kernel: NVRM: Xid (PCI:0000:cb:00): 13, x", None),  # no year
    ],
)
def test_timestamps(line: str, expected: dt.datetime | None) -> None:
    event = parse_kernel_line(line)
    assert event is not None
    assert event.timestamp == expected


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("from 0x0 (None) to 0x1 (GPU Reset Required)", RecoveryAction.GPU_RESET),
        ("from 0x0 (None) to 0x2 (Node Reboot Required)", RecoveryAction.NODE_REBOOT),
        ("from 0x1 (GPU Reset Required) to 0x0 (None)", RecoveryAction.NONE),
        ("from 0x0 (None) to 0x3 (Drain P2P)", RecoveryAction.DRAIN_P2P),
        ("from 0x0 (None) to 0x4 (Drain and Reset)", RecoveryAction.DRAIN_AND_RESET),
        ("from 0x0 to 0x2", RecoveryAction.NODE_REBOOT),  # no text: the code decides
    ],
)
def test_xid_154_recovery_action(text: str, action: RecoveryAction) -> None:
    # [forum] "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None)
    # to 0x1 (GPU Reset Required)"
    event = parse_kernel_line(
        f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed {text}"
    )
    assert event is not None
    assert event.recovery_action is action


def test_recovery_action_only_read_for_154() -> None:
    event = parse_kernel_line(
        "NVRM: Xid (PCI:0000:01:00): 62, recovery action changed from 0x0 to 0x2"
    )
    assert event is not None
    assert event.recovery_action is None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: GPU at PCI:0000:3b:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 13 egress "
        "non-posted PRIV error (First)",  # NVSwitch, not a GPU XID
        "user wrote: NVRM: Xid happened yesterday, see ticket 79",
        "NVRM: Xid (PCI:0000:3b:00): seventy-nine, bad",
        "NVRM: Xid (PCI:0000:3b:00) 79 missing colon",
        "NVRM: Xid (PCI:0000:3b:00): 79000000, too large",
        "kernel: nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context",
        "NVRM: Xid (PCI:0000:3b:00): ٧٩, unicode digits are not an XID",
        "",
    ],
)
def test_not_an_xid(line: str) -> None:
    assert parse_kernel_line(line) is None


def test_sxid_recognised_as_nvswitch() -> None:
    line = "[ 55.1] nvidia-nvswitch2: SXid (PCI:0000:87:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
    sxid = parse_sxid_line(line)
    assert sxid == SxidEvent(
        sxid=20034, pci_bus_id="0000:87:00", severity="Fatal", message="Link 30 LTSSM Fault Up"
    )
    assert parse_kernel_line(line) is None


def test_multiline_fallen_off_the_bus_without_xid() -> None:
    # [nvsen] gpufallen_handler_test.go
    text = (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
    )
    events = parse_kernel_text(text)
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, XidEvent)
    assert (event.xid, event.pci_bus_id) == (79, "0000:b3:00")


def test_fallen_off_message_and_xid_79_count_once() -> None:
    text = (
        "NVRM: GPU at PCI:0000:b3:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7\n"
        "NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "NVRM: installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands.\n"
        "NVRM: Xid (PCI:0000:b3:00): 79, pid=12345, GPU has fallen off the bus.\n"
    )
    events = parse_kernel_text(text)
    assert len(events) == 1
    assert isinstance(events[0], XidEvent)
    assert events[0].gpu_uuid == "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"


def test_tail_without_head_is_not_an_event() -> None:
    assert parse_kernel_text("NVRM: fallen off the bus and is not responding to commands.") == []


def test_scanner_fills_uuid_from_gpu_map_line() -> None:
    scanner = KernelLogScanner()
    assert (
        scanner.feed("NVRM: GPU at PCI:0000:3b:00: GPU-12345678-1234-1234-1234-123456789abc")
        is None
    )
    event = scanner.feed("NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=x, Contained")
    assert isinstance(event, XidEvent)
    assert event.gpu_uuid == "GPU-12345678-1234-1234-1234-123456789abc"
    assert event.gpu_key == event.gpu_uuid


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:03:00.1", "0000:03:00"),
    ],
)
def test_normalize_pci(raw: str, expected: str) -> None:
    assert normalize_pci(raw) == expected


# --- Events ----------------------------------------------------------------------------


def test_simulated_event_round_trips() -> None:
    """`gpuheal simulate xid` writes format_kernel_line(...) with reason GpuXid."""
    message = format_kernel_line(
        79, "0000:3b:00.0", "GPU has fallen off the bus.", pid=7, process="py"
    )
    event = parse_event("GpuXid", message)
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.pid, event.process) == (79, "0000:3b:00", 7, "py")


@pytest.mark.parametrize(
    ("reason", "message", "xid"),
    [
        ("KernelOops", "kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE", 48),  # NPD
        ("NVIDIAXid", "XID 94 on GPU-12345678-1234-1234-1234-123456789abc", 94),
        ("XidError", "xid=62 pci=0000:3b:00", 62),
        ("GpuXid", "Xid error 154: GPU recovery action changed from 0x0 (None) to 0x2", 154),
    ],
)
def test_event_messages(reason: str, message: str, xid: int) -> None:
    event = parse_event(reason, message)
    assert event is not None
    assert event.xid == xid


def test_loose_xid_needs_an_xid_reason() -> None:
    assert parse_event("NodeNotReady", "restarted after XID 79 drill") is None
    assert parse_event("SXidError", "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, x") is None


# --- dcgm-exporter ---------------------------------------------------------------------

_LABELS = 'gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0"'
SCRAPE_0 = (
    "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
    f'DCGM_FI_DEV_XID_ERRORS{{{_LABELS},device="nvidia0",Hostname="n1"}} 0\n'
    f'DCGM_EXP_XID_ERRORS_COUNT{{{_LABELS},xid="94",window_size_in_ms="300000"}} 1\n'
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 40\n'
)


def _scrape(gauge: int, count94: int) -> str:
    return SCRAPE_0.replace("} 0\n", f"}} {gauge}\n", 1).replace(
        'window_size_in_ms="300000"} 1', f'window_size_in_ms="300000"}} {count94}'
    )


def test_dcgm_first_scrape_is_a_baseline() -> None:
    now = dt.datetime(2025, 1, 1, tzinfo=UTC)
    events, state = dcgm_xid_events(None, parse_dcgm_metrics(SCRAPE_0), now)
    assert events == []
    assert len(state) == 2


def test_dcgm_counter_rise_is_an_event_and_wins_over_gauge() -> None:
    now = dt.datetime(2025, 1, 1, tzinfo=UTC)
    _, state = dcgm_xid_events(None, parse_dcgm_metrics(SCRAPE_0), now)
    events, state = dcgm_xid_events(state, parse_dcgm_metrics(_scrape(94, 2)), now)
    assert [(e.xid, e.gpu_uuid, e.pci_bus_id) for e in events] == [(94, "GPU-a", "0000:3b:00")]
    # Same values again: nothing new. A gauge that keeps 94 hides a repeat; the counter not.
    events, state = dcgm_xid_events(state, parse_dcgm_metrics(_scrape(94, 2)), now)
    assert events == []
    events, _ = dcgm_xid_events(state, parse_dcgm_metrics(_scrape(94, 3)), now)
    assert [e.xid for e in events] == [94]


def test_dcgm_gauge_change_alone_is_an_event() -> None:
    now = dt.datetime(2025, 1, 1, tzinfo=UTC)
    _, state = dcgm_xid_events(None, parse_dcgm_metrics(_scrape(0, 1)), now)
    events, _ = dcgm_xid_events(state, parse_dcgm_metrics(_scrape(79, 1)), now)
    assert [e.xid for e in events] == [79]


def test_dcgm_window_falling_is_not_an_event() -> None:
    now = dt.datetime(2025, 1, 1, tzinfo=UTC)
    _, state = dcgm_xid_events(None, parse_dcgm_metrics(_scrape(0, 3)), now)
    events, _ = dcgm_xid_events(state, parse_dcgm_metrics(_scrape(0, 1)), now)
    assert events == []


def test_dcgm_garbage_is_skipped() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0"} NaN\nDCGM_EXP_XID_ERRORS_COUNT{oops 3\n\x00\xff'
    assert parse_dcgm_metrics(text) == []


# --- fuzzing -----------------------------------------------------------------------------

_XIDISH = st.one_of(
    st.text(max_size=300),
    st.builds(
        lambda a, b, c: f"{a}NVRM: Xid {b}{c}",
        st.text(max_size=40),
        st.text(alphabet="(PCI:0123456789abcdefGPU-I )", max_size=40),
        st.text(max_size=80),
    ),
    st.builds(lambda a, b: f"{a}SXid {b}", st.text(max_size=30), st.text(max_size=80)),
)


@settings(max_examples=400, deadline=None)
@given(_XIDISH)
def test_parsers_never_raise(line: str) -> None:
    event = parse_kernel_line(line)
    assert event is None or (isinstance(event, XidEvent) and event.xid >= 0)
    parse_sxid_line(line)
    parse_event(line[:20], line)
    parse_kernel_text(line + "\n" + line)
    parse_dcgm_metrics(line)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200).filter(lambda s: "NVRM: Xid (" not in s))
def test_no_xid_without_the_nvrm_marker(line: str) -> None:
    """Text that merely mentions 'Xid' or 'NVRM' is never read as a kernel XID line."""
    assert parse_kernel_line(f"{line} Xid NVRM {line}") is None


def test_very_long_line_is_cut_not_crashed() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, " + "A" * 5_000_000
    event = parse_kernel_line(line)
    assert event is not None
    assert event.xid == 79
    assert len(event.message) < 70_000


def test_two_xid_79_lines_are_two_records_and_a_pair_is_consumed_once() -> None:
    """A fallen-off message and an XID 79 next to it are one fault; XID 79 lines repeated are
    repeats (the agent counts them on one Event), and a report after a pair is a new one."""
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."
    fallen = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    assert len(parse_kernel_text(f"{xid}\n{xid}")) == 2
    assert len(parse_kernel_text(f"{fallen}\n{xid}\n{xid}")) == 2
    assert len(parse_kernel_text(f"{xid}\n{fallen}\n{fallen}")) == 1
    far = "\n".join(["kernel: unrelated"] * 25)
    assert len(parse_kernel_text(f"{fallen}\n{far}\n{xid}")) == 2  # not next to each other
