"""Optional NVML probe: GPU identity (UUID, serial), memory health counters and the GPU count.

`nvidia-ml-py` (module `pynvml`) is imported only when NVML is asked for, and a node without
the driver library (or a container without it mounted) is skipped with one log line: the
kernel log still works. Reading is a pure function of an NVML-like object, so the unit tests
pass a fake one; the findings are edges (a counter rose, a flag became set, a GPU went
missing), reported with the reasons below and counted like any other finding.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from gpuheal.xid.identity import normalize_uuid
from gpuheal.xid.parse import normalize_pci

from .detect import Finding, identity_line

log = logging.getLogger("gpuheal.agent.nvml")

# Event reasons (Warning Events on the Node; a policy rule matches them with
# `signals.events: [{reason: ...}]`).
REASON_COUNT = "GpuCountDropped"
REASON_REMAP_FAILURE = "GpuRowRemapFailure"
REASON_REMAP_PENDING = "GpuRowRemapPending"
REASON_RETIRED_PENDING = "GpuRetiredPagesPending"
REASON_RETIRED_LIMIT = "GpuRetiredPagesLimit"
REASON_ECC_DBE = "GpuEccUncorrectable"

RETIRED_PAGES_LIMIT = 60
"""NVIDIA's RMA threshold for retired pages (pre-Ampere GPUs retire pages; Ampere and later
remap rows instead)."""


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    index: int
    pci: str
    uuid: str | None = None
    serial: str | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_dbe: int | None = None
    retired_pending: bool | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None


@dataclasses.dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuInfo, ...] = ()
    driver: str | None = None

    @property
    def by_pci(self) -> dict[str, GpuInfo]:
        return {g.pci: g for g in self.gpus}

    @property
    def uuids(self) -> dict[str, str]:
        return {g.pci: g.uuid for g in self.gpus if g.uuid}


def load_nvml() -> Any | None:
    """`pynvml` initialised, or None (not installed, no driver library, no GPU visible)."""
    try:
        import pynvml
    except ImportError:
        log.info("NVML: nvidia-ml-py is not installed; kernel log only")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("NVML: not available here (%s); kernel log only", exc)
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _call(fn: Any, *args: Any) -> Any:
    """An NVML query that a GPU may not support (NVMLError_NotSupported): None then."""
    try:
        return fn(*args)
    except Exception:
        return None


def read_inventory(nvml: Any) -> Inventory:
    """One pass over the GPUs NVML sees. Never raises for one GPU's missing feature."""
    count = int(nvml.nvmlDeviceGetCount())
    gpus: list[GpuInfo] = []
    for i in range(count):
        handle = _call(nvml.nvmlDeviceGetHandleByIndex, i)
        if handle is None:
            continue
        pci_info = _call(nvml.nvmlDeviceGetPciInfo, handle)
        bus = _text(getattr(pci_info, "busId", "")) if pci_info is not None else ""
        if not bus:
            continue
        uuid = _call(nvml.nvmlDeviceGetUUID, handle)
        serial = _call(nvml.nvmlDeviceGetSerial, handle)
        ecc = _call(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        retired = _call(
            nvml.nvmlDeviceGetRetiredPages,
            handle,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remap = _call(nvml.nvmlDeviceGetRemappedRows, handle)
        gpus.append(
            GpuInfo(
                index=i,
                pci=normalize_pci(bus),
                uuid=normalize_uuid(_text(uuid)) if uuid is not None else None,
                serial=_text(serial) if serial is not None else None,
                ecc_uncorrected_volatile=int(ecc) if ecc is not None else None,
                retired_pages_dbe=len(retired) if retired is not None else None,
                retired_pending=bool(pending) if pending is not None else None,
                remap_uncorrectable=int(remap[1]) if remap is not None else None,
                remap_pending=bool(remap[2]) if remap is not None else None,
                remap_failure=bool(remap[3]) if remap is not None else None,
            )
        )
    driver = _call(nvml.nvmlSystemGetDriverVersion)
    return Inventory(tuple(gpus), _text(driver) if driver is not None else None)


def _gpu_finding(reason: str, gpu: GpuInfo, what: str, now: dt.datetime) -> Finding:
    name = f"{gpu.pci} ({gpu.uuid})" if gpu.uuid else gpu.pci
    message = f"NVML: GPU {name}: {what}"
    if gpu.uuid:
        message += "\n" + identity_line(gpu.pci, gpu.uuid)
    return Finding(
        reason=reason,
        key=f"nvml/{reason}/{gpu.pci}",
        message=message,
        pci=gpu.pci,
        uuid=gpu.uuid,
        time=now,
        position=0,  # one Event per boot and finding: a restart reconciles, never re-posts
    )


def _rose(before: int | None, after: int | None) -> bool:
    return after is not None and after > (before or 0)


def _set(before: bool | None, after: bool | None) -> bool:
    return bool(after) and not before


def health_findings(
    previous: Inventory | None,
    current: Inventory,
    now: dt.datetime,
    *,
    expected_gpus: int | None = None,
    retired_limit: int = RETIRED_PAGES_LIMIT,
) -> list[Finding]:
    """What changed for the worse between two probes (the first probe compares with nothing:
    a flag already set at start is reported once, deduped across restarts by its Event name).
    """
    out: list[Finding] = []
    before = previous.by_pci if previous is not None else {}
    for gpu in current.gpus:
        old = before.get(gpu.pci)
        prev = old or GpuInfo(index=gpu.index, pci=gpu.pci)
        if _set(prev.remap_failure, gpu.remap_failure):
            out.append(_gpu_finding(REASON_REMAP_FAILURE, gpu, "row remapping failed", now))
        if _set(prev.remap_pending, gpu.remap_pending):
            out.append(
                _gpu_finding(
                    REASON_REMAP_PENDING, gpu, "row remapping pending (takes effect on reset)", now
                )
            )
        if _set(prev.retired_pending, gpu.retired_pending):
            out.append(
                _gpu_finding(
                    REASON_RETIRED_PENDING, gpu, "retired pages pending (needs a reset)", now
                )
            )
        if (gpu.retired_pages_dbe or 0) >= retired_limit > (prev.retired_pages_dbe or 0):
            out.append(
                _gpu_finding(
                    REASON_RETIRED_LIMIT,
                    gpu,
                    f"{gpu.retired_pages_dbe} pages retired for double-bit ECC errors "
                    f"(limit {retired_limit})",
                    now,
                )
            )
        if _rose(prev.ecc_uncorrected_volatile, gpu.ecc_uncorrected_volatile):
            out.append(
                _gpu_finding(
                    REASON_ECC_DBE,
                    gpu,
                    f"uncorrectable ECC errors since driver load: {gpu.ecc_uncorrected_volatile}",
                    now,
                )
            )
    expected = expected_gpus if expected_gpus is not None else len(before) or None
    if expected is not None and len(current.gpus) < expected:
        missing = sorted(set(before) - set(current.by_pci))
        names = ", ".join(
            f"{pci} ({before[pci].uuid})" if before[pci].uuid else pci for pci in missing
        )
        what = f"NVML sees {len(current.gpus)} of {expected} GPUs" + (
            f"; missing: {names}" if names else ""
        )
        already = previous is not None and len(previous.gpus) < expected
        if not already:
            out.append(
                Finding(
                    reason=REASON_COUNT,
                    key=f"nvml/{REASON_COUNT}",
                    message=f"NVML: {what}",
                    time=now,
                    position=len(current.gpus),  # one Event per count reached in a boot
                )
            )
    return out
