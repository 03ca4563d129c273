"""Optional NVML probe: GPU identity (UUID, serial), memory health counters and the GPU count.

`nvidia-ml-py` (module `pynvml`) is imported only when NVML is asked for, and a node without
the driver library (or a container without it mounted) is skipped with one log line: the
kernel log still works. Reading is a pure function of an NVML-like object, so the unit tests
pass a fake one; the findings are edges (a counter rose, a flag became set, a GPU went
missing), reported with the reasons below and counted like any other finding.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

from gpuheal.xid.identity import normalize_uuid
from gpuheal.xid.parse import XID_EVENT_REASON, normalize_pci

from .detect import Finding, with_identity

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


def _devices(nvml: Any) -> Iterator[tuple[int, Any, str]]:
    """(index, handle, PCI bus id as NVML prints it) of each GPU NVML can name; a GPU whose
    handle or address NVML cannot give (lost, or going) is left out."""
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = _call(nvml.nvmlDeviceGetHandleByIndex, i)
        if handle is None:
            continue
        pci_info = _call(nvml.nvmlDeviceGetPciInfo, handle)
        bus = _text(getattr(pci_info, "busId", "")) if pci_info is not None else ""
        if bus:
            yield i, handle, bus


def read_inventory(nvml: Any) -> Inventory:
    """One pass over the GPUs NVML sees. Never raises for one GPU's missing feature."""
    gpus: list[GpuInfo] = []
    for i, handle, bus in _devices(nvml):
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
    return Finding(
        reason=reason,
        key=f"nvml/{reason}/{gpu.pci}",
        message=with_identity(f"NVML: GPU {name}: {what}", gpu.pci, gpu.uuid),
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


# ---- XID events (what NVIDIA's device plugin and DRA driver listen to) --------------------

_NO_INSTANCE = 0xFFFFFFFF
"""`gpuInstanceId`/`computeInstanceId` of an event outside MIG."""


@dataclasses.dataclass(frozen=True, slots=True)
class NvmlXid:
    """One `nvmlEventTypeXidCriticalError` event: the XID and the GPU it names."""

    xid: int
    pci: str | None
    uuid: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None


def xid_finding(event: NvmlXid, now: dt.datetime) -> Finding:
    """The finding of an NVML XID event: the same key as the kernel log's record of that XID
    (without XID 154's recovery action, which NVML does not give), and a message the
    operator's Event parser reads (reason GpuXid, `Xid <code>`, `PCI:<address>`)."""
    where = f"PCI:{event.pci}" if event.pci else "an unknown GPU"
    mig = ""
    if event.gpu_instance is not None:
        mig = f" GPU-I:{event.gpu_instance}"
        if event.compute_instance is not None:
            mig += f" GPU-CI:{event.compute_instance}"
    message = f"NVML: Xid {event.xid} on {where}{mig} (nvmlEventTypeXidCriticalError)"
    return Finding(
        reason=XID_EVENT_REASON,
        key=f"xid/{event.xid}/{event.pci}",
        message=with_identity(message, event.pci, event.uuid),
        xid=event.xid,
        pci=event.pci,
        uuid=event.uuid,
        time=now,
    )


def _handle_id(handle: Any) -> Any:
    """A hashable identity for a device handle (ctypes pointers compare by object, not by
    the address they hold, so the handle in an event is matched through its address)."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    try:
        hash(handle)
    except TypeError:
        return id(handle)
    return handle


def _is_timeout(nvml: Any, exc: BaseException) -> bool:
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_TIMEOUT", 10)


class XidListener:
    """Registered for XID events on every GPU that supports them; `wait` blocks (call it
    from a thread), returns the next event or None when `timeout_ms` passed quietly."""

    def __init__(self, nvml: Any, event_set: Any, gpus: dict[Any, tuple[str, str | None]]):
        self.nvml = nvml
        self.event_set = event_set
        self.gpus = gpus  # handle id -> (PCI address, UUID)

    @classmethod
    def register(cls, nvml: Any) -> XidListener | None:
        """None when no GPU takes XID events (NVML too old, a GPU without the event, or
        no GPU at all); one log line says which GPUs listen."""
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.info("NVML: cannot create an event set (%s); XIDs from the kernel log only", exc)
            return None
        gpus: dict[Any, tuple[str, str | None]] = {}
        try:
            devices = list(_devices(nvml))
        except Exception as exc:  # the count itself failed: no GPU to listen to
            log.info("NVML: cannot list the GPUs (%s); XIDs from the kernel log only", exc)
            devices = []
        for _, handle, bus in devices:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except Exception as exc:  # NotSupported on some GPUs (and in vGPU guests)
                log.info("NVML: GPU %s takes no XID events (%s)", normalize_pci(bus), exc)
                continue
            uuid = _call(nvml.nvmlDeviceGetUUID, handle)
            gpus[_handle_id(handle)] = (
                normalize_pci(bus),
                normalize_uuid(_text(uuid)) if uuid is not None else None,
            )
        if not gpus:
            _call(nvml.nvmlEventSetFree, event_set)
            log.info("NVML: no GPU takes XID events; XIDs from the kernel log only")
            return None
        log.info(
            "NVML: listening for XID events on %d GPU(s): %s",
            len(gpus),
            ", ".join(pci for pci, _ in gpus.values()),
        )
        return cls(nvml, event_set, gpus)

    def wait(self, timeout_ms: int) -> NvmlXid | None:
        try:
            data = self.nvml.nvmlEventSetWait_v2(self.event_set, timeout_ms)
        except Exception as exc:
            if _is_timeout(self.nvml, exc):
                return None
            raise
        if not int(data.eventType) & int(self.nvml.nvmlEventTypeXidCriticalError):
            return None
        pci, uuid = self.gpus.get(_handle_id(data.device), (None, None))
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return NvmlXid(
            xid=int(data.eventData),
            pci=pci,
            uuid=uuid,
            gpu_instance=None if gi == _NO_INSTANCE else gi,
            compute_instance=None if ci == _NO_INSTANCE else ci,
        )

    def close(self) -> None:
        _call(self.nvml.nvmlEventSetFree, self.event_set)
