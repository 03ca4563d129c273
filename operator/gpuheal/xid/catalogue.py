"""NVIDIA XID catalogue as data, with gpuheal's default action class per entry.

Sources (checked 2025):
- [catalog] NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer),
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html - mnemonics and the
  "Resolution Bucket" immediate / investigatory actions quoted below (RESTART_APP, RESET_GPU,
  RESTART_BM, WORKFLOW_*, CONTACT_SUPPORT, IGNORE ...).
- [xid-doc] NVIDIA, "Xid Errors", https://docs.nvidia.com/deploy/xid-errors/ - meanings.
- [mem] NVIDIA, "A100/H100 GPU memory error management" (row remapping, 63/64/94/95) and
  "Dynamic page retirement" (48/63/64), https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
- [nvml] nvmlDeviceGpuRecoveryAction_t (XID 154 recovery actions).
- [nvsentinel] NVIDIA/NVSentinel xiderrorsmapping.csv, used to cross-check mnemonics and
  immediate actions against the catalogue spreadsheet.
Beyond the entries written out one by one, the engine-exception families (copy engines,
video and JPEG decoders, optical flow, SEC2: RESTART_APP) and the entries NVIDIA files under
IGNORE are generated from their mnemonics (`_FAMILIES`). NVIDIA's unused and display-only
codes are left out. Entries not listed here resolve to an `Unknown` entry: alert, never
disrupt.
"""

from __future__ import annotations

import dataclasses

from gpuheal.xid.types import FirstSight, XidClass

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
MEM_URL = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"


@dataclasses.dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    meaning: str
    immediate_action: str  # NVIDIA's resolution bucket (immediate)
    investigatory_action: str  # NVIDIA's resolution bucket / guidance (investigatory)
    action_class: XidClass  # gpuheal's default
    first_sight: FirstSight = FirstSight.ANY
    source: str = CATALOG_URL
    notes: str = ""

    @property
    def known(self) -> bool:
        return self.action_class is not XidClass.UNKNOWN


def _e(  # noqa: PLR0917 - table rows read best positionally
    code: int,
    mnemonic: str,
    meaning: str,
    immediate: str,
    investigatory: str,
    action_class: XidClass,
    *,
    first_sight: FirstSight = FirstSight.ANY,
    source: str = CATALOG_URL,
    notes: str = "",
) -> XidEntry:
    return XidEntry(
        code,
        mnemonic,
        meaning,
        immediate,
        investigatory,
        action_class,
        first_sight,
        source,
        notes,
    )


_APP = XidClass.APPLICATION
_RESET = XidClass.GPU_RESET
_NVL = XidClass.NVLINK
_INFO = XidClass.INFORMATIONAL
_ALERT_FIRST = FirstSight.ALERT_ONLY

_ENTRIES: tuple[XidEntry, ...] = (
    _e(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "GPU stopped processing",
        "RESTART_APP",
        "CONTACT_SUPPORT",
        _APP,
        first_sight=_ALERT_FIRST,
    ),
    _e(
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "Invalid or corrupted push buffer stream",
        "RESTART_APP",
        "CHECK_APP/CUDA",
        _APP,
        first_sight=_ALERT_FIRST,
    ),
    _e(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "Graphics Engine Exception (e.g. illegal instruction, out-of-range address in a kernel)",
        "RESTART_APP",
        "WORKFLOW_XID_13",
        _APP,
        first_sight=_ALERT_FIRST,
        notes="Usually a bug in the job (run it under compute-sanitizer). Repeats on the same "
        "GPU across different jobs point at hardware: that is what escalation counts.",
    ),
    _e(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault (MMU fault)",
        "RESTART_APP",
        "CHECK_APP/CUDA (illegal address access)",
        _APP,
        first_sight=_ALERT_FIRST,
        notes="Almost always an application bug; act only on repeats on the same GPU.",
    ),
    _e(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "Invalid or corrupted push buffer stream (PBDMA)",
        "RESTART_APP",
        "CONTACT_SUPPORT (driver, system memory corruption, bus, thermal)",
        _APP,
        first_sight=_ALERT_FIRST,
    ),
    _e(
        38,
        "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT",
        "Driver firmware error (FECS watchdog timeout)",
        "IGNORE",
        "UPDATE_SWFW if recurring",
        _INFO,
        source=f"{CATALOG_URL} (cross-checked with NVSentinel xiderrorsmapping.csv)",
    ),
    _e(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing (the channel of a faulting application was reset)",
        "IGNORE",
        "CHECK_APP/CUDA",
        _APP,
        first_sight=_ALERT_FIRST,
        notes="Follows an application fault (13/31); the GPU keeps serving other jobs.",
    ),
    _e(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup, due to previous errors "
        "(or the process was killed while using the GPU)",
        "WORKFLOW_XID_45",
        "Look at the XIDs just before it",
        _INFO,
        notes="A consequence, not a cause: the XID before it decides the remediation.",
    ),
    _e(
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "GPU stopped processing (GPU timeout)",
        "RESET_GPU",
        "CONTACT_SUPPORT",
        _RESET,
    ),
    _e(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "Double Bit ECC Error (uncorrectable DBE)",
        "WORKFLOW_XID_48",
        "Reset the GPU; run field diagnostics if thresholds are exceeded",
        _RESET,
        source=f"{CATALOG_URL}; {MEM_URL}",
        notes="With 63/64 on the same GPU: drain and reset; retired pages/remapped rows take "
        "effect after the reset.",
    ),
    _e(
        61,
        "PMU_BREAKPOINT",
        "Internal micro-controller breakpoint/warning",
        "CONTACT_SUPPORT",
        "Watch for 62 on the same GPU",
        _INFO,
        notes="Often followed by 62 (halt), which is the actionable one.",
    ),
    _e(
        62,
        "PMU_HALT_ERROR",
        "Internal micro-controller halt",
        "RESET_GPU",
        "CONTACT_SUPPORT on recurrence",
        _RESET,
        notes="Newer drivers follow it with 154 'GPU Reset Required'.",
    ),
    _e(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "ECC page retirement or row remapping recording event (row remap pending)",
        "IGNORE",
        "Reset the GPU when convenient so the remap takes effect",
        XidClass.RESET_WHEN_IDLE,
        source=f"{CATALOG_URL}; {MEM_URL}",
    ),
    _e(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "ECC page retirement or row remapper recording failure",
        "RESET_GPU",
        "RMA criterion when row remapping fails (see RMA thresholds)",
        _RESET,
        source=f"{CATALOG_URL}; {MEM_URL}",
    ),
    _e(
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "NVDEC0 exception (video decoder)",
        "RESTART_APP",
        "CONTACT_SUPPORT",
        _APP,
        first_sight=_ALERT_FIRST,
    ),
    _e(
        69,
        "ROBUST_CHANNEL_GR_CLASS_ERROR",
        "Graphics Engine class error",
        "RESTART_APP",
        "CONTACT_SUPPORT",
        _APP,
        first_sight=_ALERT_FIRST,
    ),
    _e(
        74,
        "NVLINK_ERROR",
        "NVLink error",
        "WORKFLOW_NVLINK_ERR",
        "Decode the link error; reset the GPU, reboot, check cabling/baseboard",
        _NVL,
    ),
    _e(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        "RESTART_BM",
        "CONTACT_SUPPORT on recurrence (PCIe, power, thermal, hardware)",
        XidClass.FELL_OFF_BUS,
        notes="The GPU is unreachable: no in-band reset is possible. One power-cycle is worth "
        "trying; a second 79 in the window means replace.",
    ),
    _e(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "High single-bit ECC error rate",
        "IGNORE",
        "Watch for DBEs (48) and row-remap events on the same GPU",
        _INFO,
    ),
    _e(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "Contained ECC error: the faulting application "
        "was stopped, other work on the GPU is unaffected",
        "RESTART_APP",
        "Reset the GPU when convenient (row remap pending)",
        XidClass.CONTAINED_MEMORY,
        first_sight=FirstSight.NO_REPLACE,
        source=f"{CATALOG_URL}; {MEM_URL}",
        notes="Never a reason to replace on first sight; repeats on the same GPU escalate.",
    ),
    _e(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "Uncontained ECC error: all applications on the GPU are affected",
        "RESET_GPU",
        "Reset before restarting work; CONTACT_SUPPORT on recurrence",
        _RESET,
        source=f"{CATALOG_URL}; {MEM_URL}",
    ),
    _e(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "Context switch timeout error",
        "RESET_GPU",
        "CONTACT_SUPPORT (can also be an application hang)",
        _RESET,
    ),
    _e(110, "SEC_FAULT_ERROR", "Security fault error", "RESET_GPU", "CONTACT_SUPPORT", _RESET),
    _e(
        119,
        "GSP_RPC_TIMEOUT",
        "GSP RPC timeout",
        "RESET_GPU",
        "Power-cycle if persistent; update driver/firmware",
        _RESET,
    ),
    _e(
        120,
        "GSP_ERROR",
        "GSP error (firmware exception)",
        "RESET_GPU",
        "Power-cycle if persistent; update driver/firmware",
        _RESET,
    ),
    _e(
        121,
        "C2C_ERROR",
        "C2C link corrected error (Grace Hopper/Blackwell chip-to-chip)",
        "IGNORE",
        "CONTACT_SUPPORT if the rate is high",
        _INFO,
    ),
    _e(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink link training (ALI) failure",
        "RESET_GPU",
        "Check NVLink cabling/baseboard on recurrence",
        _NVL,
    ),
    _e(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "Unrecovered ECC error",
        "RESET_GPU",
        "CONTACT_SUPPORT on recurrence",
        _RESET,
    ),
    _e(
        143,
        "GPU_INIT_ERROR",
        "GPU initialization failure",
        "RESET_GPU",
        "CONTACT_SUPPORT on recurrence",
        _RESET,
    ),
    _e(
        144,
        "NVLINK_SAW_ERROR",
        "NVLink SAW error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        145,
        "NVLINK_RLW_ERROR",
        "NVLink RLW error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        146,
        "NVLINK_TLW_ERROR",
        "NVLink TLW error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        147,
        "NVLINK_TREX_ERROR",
        "NVLink TREX error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLink NVLPW control error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        149,
        "NVLINK_NETIR_ERROR",
        "NVLink NETIR error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        150,
        "NVLINK_MSE_ERROR",
        "NVLink MSE error",
        "WORKFLOW_NVLINK5_ERR",
        "Decode subcode/intrinfo per the NVLink5 workflow",
        _NVL,
    ),
    _e(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU recovery action changed: the driver states "
        "what recovery the GPU needs (None, GPU Reset Required, Node Reboot Required, Drain "
        "P2P, Drain and Reset)",
        "Follow the stated recovery action",
        "Follow guidance for the XID that preceded it",
        XidClass.RECOVERY_ACTION,
        source=f"{CATALOG_URL}; nvmlDeviceGpuRecoveryAction_t (NVML)",
        notes="Policies match it with signals.recoveryActions; 'None' means recovered.",
    ),
    _e(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "NVLink software-defined error",
        "RESET_GPU",
        "CONTACT_SUPPORT on recurrence",
        _NVL,
    ),
)


def _engine(code: int, engine: str, what: str) -> XidEntry:
    """An engine's exception (copy, video, JPEG, optical flow, security engine): NVIDIA's
    immediate action is restarting the application; a repeat on one GPU is the hardware's."""
    return _e(
        code,
        f"ROBUST_CHANNEL_{engine}_ERROR",
        f"{engine} exception ({what})",
        "RESTART_APP",
        "CONTACT_SUPPORT if it recurs on the same GPU",
        _APP,
        first_sight=_ALERT_FIRST,
        source=f"{CATALOG_URL} (cross-checked with NVSentinel xiderrorsmapping.csv)",
    )


def _note(code: int, mnemonic: str, meaning: str) -> XidEntry:
    """An entry NVIDIA's catalogue files under IGNORE: recorded, never acted upon alone."""
    return _e(
        code,
        mnemonic,
        meaning,
        "IGNORE",
        "none on its own; look at the XIDs next to it",
        _INFO,
        source=f"{CATALOG_URL} (cross-checked with NVSentinel xiderrorsmapping.csv)",
    )


_COPY = "copy engine"
_FAMILIES: tuple[XidEntry, ...] = (
    *(_engine(c, f"CE{n}", _COPY) for c, n in ((39, 0), (40, 1), (41, 2), (70, 3), (71, 4),
                                               (72, 5), (75, 6), (76, 7), (77, 8), (85, 9))),
    *(_engine(126 + n, f"CE{10 + n}", _COPY) for n in range(10)),
    *(_engine(c, f"NVDEC{n}", "video decoder") for c, n in ((83, 1), (84, 2), (88, 3),
                                                          (89, 4), (96, 5), (97, 6), (98, 7))),
    *(_engine(c, f"NVJPG{n}", "JPEG decoder") for c, n in ((82, 0), *((99 + k, 1 + k)
                                                                     for k in range(7)))),
    _engine(86, "OFA0", "optical flow accelerator"),
    _engine(139, "OFA1", "optical flow accelerator"),
    _engine(60, "SEC2", "security engine"),
    _e(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Graphics engine illegal notify", "RESTART_APP",
       "CHECK_APP/CUDA", _APP, first_sight=_ALERT_FIRST),
    _e(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Push buffer CRC mismatch (PBDMA)", "RESTART_APP",
       "CONTACT_SUPPORT if it recurs on the same GPU", _APP, first_sight=_ALERT_FIRST),
    _e(156, "RESOURCE_RETIREMENT_EVENT", "A GPU resource was retired; takes effect on reset",
       "RESET_GPU", "CONTACT_SUPPORT if it recurs", _RESET),
    _e(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", "RESET_GPU",
       "CONTACT_SUPPORT if it recurs", _RESET),
    _note(14, "ROBUST_CHANNEL_FAKE_ERROR", "Injected test error"),
    _note(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error "
          "(unimplemented firmware method)"),
    _note(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics engine fault during a "
          "context switch"),
    _note(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Driver firmware error "
          "(register access violation)"),
    _note(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Driver firmware error "
          "(verification violation)"),
    _note(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "InfoROM erase limit exceeded"),
    _note(106, "SMBPBI_TEST_MESSAGE", "SMBPBI test message"),
    _note(107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI silent test message"),
    _note(137, "NVLINK_FLA_PRIV_ERR", "NVLink FLA privilege error"),
    _note(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "Fast path error"),
    _note(157, "RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure"),
    _note(161, "CHANNEL_RETIREMENT_FAILURE", "Channel retirement failure"),
)  # fmt: skip

CATALOGUE: dict[int, XidEntry] = {entry.code: entry for entry in (*_ENTRIES, *_FAMILIES)}
assert len(CATALOGUE) == len(_ENTRIES) + len(_FAMILIES), "an XID listed twice"


def lookup(code: int) -> XidEntry:
    """The catalogue entry for `code`; unknown codes get an entry of class `Unknown`."""
    entry = CATALOGUE.get(code)
    if entry is not None:
        return entry
    return XidEntry(
        code=code,
        mnemonic="UNKNOWN",
        meaning="Not in gpuheal's catalogue",
        immediate_action="Look it up in NVIDIA's Xid catalog",
        investigatory_action="CONTACT_SUPPORT",
        action_class=XidClass.UNKNOWN,
        first_sight=FirstSight.ALERT_ONLY,
        notes="gpuheal alerts and takes no disruptive action for XIDs it does not know.",
    )


def codes_of_class(action_class: XidClass) -> frozenset[int]:
    return frozenset(e.code for e in _ENTRIES if e.action_class is action_class)


def explain(code: int) -> str:
    """Human-readable text of one entry (`gpuheal xid explain 79`)."""
    e = lookup(code)
    lines = [
        f"XID {e.code}: {e.meaning}",
        f"  mnemonic:             {e.mnemonic}",
        f"  NVIDIA immediate:     {e.immediate_action}",
        f"  NVIDIA investigatory: {e.investigatory_action}",
        f"  gpuheal class:        {e.action_class.value}",
        f"  first sight:          {e.first_sight.value}",
    ]
    if e.notes:
        lines.append(f"  notes:                {e.notes}")
    lines.append(f"  source:               {e.source}")
    return "\n".join(lines)
