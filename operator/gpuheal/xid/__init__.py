"""XID catalogue and parsers. Pure: no Kubernetes, no I/O (import-linter enforces it).

Stable entry points: `parse_kernel_line`, `parse_event`, `KernelLogScanner`, `lookup`.
"""

from gpuheal.xid.catalogue import CATALOGUE, XidEntry, codes_of_class, explain, lookup
from gpuheal.xid.parse import (
    DCGM_XID_COUNT,
    DCGM_XID_GAUGE,
    XID_CONDITION_TYPE,
    XID_EVENT_REASON,
    DcgmSample,
    KernelLogScanner,
    dcgm_xid_events,
    format_kernel_line,
    normalize_pci,
    parse_dcgm_metrics,
    parse_event,
    parse_kernel_line,
    parse_kernel_text,
    parse_sxid_line,
    parse_timestamp,
)
from gpuheal.xid.types import (
    FALLEN_OFF_BUS_XID,
    RECOVERY_ACTION_CODES,
    FirstSight,
    RecoveryAction,
    SxidEvent,
    XidClass,
    XidEvent,
)

__all__ = [
    "CATALOGUE",
    "DCGM_XID_COUNT",
    "DCGM_XID_GAUGE",
    "FALLEN_OFF_BUS_XID",
    "RECOVERY_ACTION_CODES",
    "XID_CONDITION_TYPE",
    "XID_EVENT_REASON",
    "DcgmSample",
    "FirstSight",
    "KernelLogScanner",
    "RecoveryAction",
    "SxidEvent",
    "XidClass",
    "XidEntry",
    "XidEvent",
    "codes_of_class",
    "dcgm_xid_events",
    "explain",
    "format_kernel_line",
    "lookup",
    "normalize_pci",
    "parse_dcgm_metrics",
    "parse_event",
    "parse_kernel_line",
    "parse_kernel_text",
    "parse_sxid_line",
    "parse_timestamp",
]
