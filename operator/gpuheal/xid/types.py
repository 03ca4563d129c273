"""Typed values shared by the XID catalogue, the parsers and the policy engine."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum


class XidClass(enum.StrEnum):
    """gpuheal's default action class for an XID; policies can match on it.

    The class picks the default ladder in `examples/default-policy.yaml`; it is gpuheal's
    reading of NVIDIA's "resolution bucket", not NVIDIA's own vocabulary.
    """

    FELL_OFF_BUS = "FellOffBus"  # GPU gone from PCIe: power-cycle once, then replace
    CONTAINED_MEMORY = "ContainedMemory"  # 94: job dies, GPU keeps working; reset when idle
    RESET_WHEN_IDLE = "ResetWhenIdle"  # 63: fine now, needs a reset to take effect
    GPU_RESET = "GpuReset"  # driver says reset the GPU; reboot/replace on recurrence
    NVLINK = "NvLink"  # NVLink/fabric: reset, reboot, replace on recurrence
    RECOVERY_ACTION = "RecoveryAction"  # 154: do what the driver says
    APPLICATION = "Application"  # usually the job's fault: act only on repeats per GPU
    INFORMATIONAL = "Informational"  # no action on its own
    UNKNOWN = "Unknown"  # not in the catalogue: alert, never disrupt


class FirstSight(enum.StrEnum):
    """The most the engine may do the first time an XID is seen on a GPU within a window."""

    ANY = "Any"
    NO_REPLACE = "NoReplace"  # e.g. 94: never take the node out of the cluster for good
    ALERT_ONLY = "AlertOnly"  # e.g. 13/31/43: a buggy job must not drain a node


class RecoveryAction(enum.StrEnum):
    """The GPU recovery action XID 154 announces (nvmlDeviceGpuRecoveryAction_t)."""

    NONE = "None"
    GPU_RESET = "GpuReset"
    NODE_REBOOT = "NodeReboot"
    DRAIN_P2P = "DrainP2P"
    DRAIN_AND_RESET = "DrainAndReset"
    RECOVER_IMEX_DOMAIN = "RecoverImexDomain"
    BUS_RESET = "BusReset"
    SYSTEM_REBOOT = "SystemReboot"


# nvmlDeviceGpuRecoveryAction_t values, as printed in hex by the driver ("to 0x1 (...)").
RECOVERY_ACTION_CODES: dict[int, RecoveryAction] = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
    5: RecoveryAction.RECOVER_IMEX_DOMAIN,
    6: RecoveryAction.BUS_RESET,
    7: RecoveryAction.SYSTEM_REBOOT,
}

FALLEN_OFF_BUS_XID = 79
"""XID reported for the multi-line "has fallen off the bus" message that carries no XID."""


@dataclasses.dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID seen on one GPU, from any source (kernel log, Event, dcgm-exporter)."""

    xid: int
    pci_bus_id: str | None  # normalised "0000:3b:00" (domain:bus:device, lower case)
    gpu_uuid: str | None = None
    pid: int | None = None
    process: str | None = None
    message: str = ""
    timestamp: dt.datetime | None = None
    recovery_action: RecoveryAction | None = None  # XID 154 only
    gpu_instance: int | None = None  # MIG GPU-I
    compute_instance: int | None = None  # MIG GPU-CI

    @property
    def gpu_key(self) -> str | None:
        """What identifies "the same GPU" for repeat counting: UUID if known, else PCI id."""
        return self.gpu_uuid or self.pci_bus_id


@dataclasses.dataclass(frozen=True, slots=True)
class SxidEvent:
    """An NVSwitch error (SXid): recognised so it is never mistaken for a GPU XID."""

    sxid: int
    pci_bus_id: str | None
    severity: str | None  # "Fatal" / "Non-fatal" as printed
    message: str
    timestamp: dt.datetime | None = None
