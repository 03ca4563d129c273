"""One GPU out through DRA: which device an XID names, the DeviceTaintRule that takes it out,
and whether gpuheal may lift it. Pure: ResourceSlices and the incident's records in, plain
answers out.

- **Which device.** The XID line names the GPU by PCI address (94, 95, 48, 63/64, 154 do);
  dcgm-exporter by UUID. NVIDIA's DRA driver publishes one pool per node (named after the
  node) with devices `gpu-<minor>` whose attributes carry `pcieBusID` (`0000:3b:00.0`) and
  `uuid`; the device is the one of the node's slices (spec.nodeName, the driver) whose
  attribute matches, in the pool's newest generation (older slices are being replaced).
- **The rule.** A `DeviceTaintRule` (resource.k8s.io/v1beta2 in 1.36, v1 from 1.37) selects
  by driver, pool and device name, nothing else (selection by class or CEL was removed in
  1.35), and carries one taint; its name is derived from the incident and the device, so a
  retried write finds its own rule. Labelled as gpuheal's and with the incident: gpuheal
  lifts only a rule it wrote. No ownerReference: deleting an incident (history clean-up)
  must not put a GPU that was never verified back into service.
- **Lifting it.** Only after a verified reset of that GPU: the incident's reset record
  (`status.repair`, verified on the node by `policy.repair.reset_proof`: the agent reports
  every GPU again with the same UUIDs and no XID for `settle`) asked for after the taint,
  with the GPU among those it covered.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuheal.api.devicequarantine import DEVICE_TAINT_KEY, DeviceTaintEffect, QuarantinedDevice
from gpuheal.api.names import GROUP
from gpuheal.api.noderemediation import RepairRecord
from gpuheal.xid.parse import normalize_pci
from gpuheal_bridge.api.models import JobState

RULE_API_VERSION = "resource.k8s.io/v1beta2"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuheal"
INCIDENT_LABEL = f"{GROUP}/incident"
MAX_NAME = 253


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceMatch:
    """One device of a ResourceSlice: what a DeviceTaintRule selects it by, and its identity."""

    driver: str
    pool: str
    device: str
    pci_bus_id: str | None = None
    gpu_uuid: str | None = None

    def describe(self) -> str:
        ids = ", ".join(x for x in (self.pci_bus_id, self.gpu_uuid) if x)
        return f"{self.driver}/{self.pool}/{self.device}" + (f" ({ids})" if ids else "")


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> str | None:
    """A string attribute by its short or driver-qualified name (both spellings are valid)."""
    value = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
    text = value.get("string") if isinstance(value, Mapping) else None
    return text if isinstance(text, str) else None


def _newest(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The slices of each pool's newest generation (a driver replaces a pool by generation)."""
    newest: dict[str, int] = {}
    kept = list(slices)
    for s in kept:
        pool = (s.get("spec") or {}).get("pool") or {}
        name, gen = str(pool.get("name", "")), int(pool.get("generation") or 0)
        newest[name] = max(newest.get(name, gen), gen)
    return [
        s
        for s in kept
        if int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
        == newest[str(((s.get("spec") or {}).get("pool") or {}).get("name", ""))]
    ]


def find_device(
    slices: Iterable[Mapping[str, Any]],
    *,
    node: str,
    driver: str,
    pci: str | None,
    uuid: str | None,
) -> DeviceMatch | str:
    """The device of `node` that the fault names (PCI address first, else UUID); or why none
    (a sentence for the step's Skipped reason)."""
    if not pci and not uuid:
        return "the signal names no GPU (no PCI address, no UUID): nothing to single out"
    mine = [
        s
        for s in slices
        if (s.get("spec") or {}).get("driver") == driver
        and (s.get("spec") or {}).get("nodeName") == node
    ]
    if not mine:
        return f"no ResourceSlice of driver {driver} for node {node} (DRA not in use there)"
    want_pci = normalize_pci(pci) if pci else None
    for s in _newest(mine):
        spec = s.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or []:
            attrs = device.get("attributes") or {}
            bus = _attribute(attrs, driver, "pcieBusID")
            dev_uuid = _attribute(attrs, driver, "uuid")
            by_pci = want_pci is not None and bus is not None and normalize_pci(bus) == want_pci
            by_uuid = uuid is not None and dev_uuid is not None and dev_uuid.lower() == uuid.lower()
            if by_pci or by_uuid:
                return DeviceMatch(
                    driver=driver,
                    pool=pool,
                    device=str(device.get("name", "")),
                    pci_bus_id=normalize_pci(bus) if bus else want_pci,
                    gpu_uuid=dev_uuid or uuid,
                )
    named = " / ".join(x for x in (want_pci, uuid) if x)
    return f"no device {named} in node {node}'s ResourceSlices of driver {driver}"


def rule_name(incident: str, device: str) -> str:
    """`<incident>-<device>`: the same name on every retry (the create is idempotent)."""
    name = f"{incident}-{device}".lower()
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def rule_manifest(
    name: str, match: DeviceMatch, effect: DeviceTaintEffect, *, incident: str, xid: int | None
) -> dict[str, Any]:
    """The DeviceTaintRule that taints exactly `match` (driver + pool + device)."""
    return {
        "apiVersion": RULE_API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, INCIDENT_LABEL: incident[:63]},
            "annotations": {f"{GROUP}/device": match.describe()[:1024]},
        },
        "spec": {
            "deviceSelector": {"driver": match.driver, "pool": match.pool, "device": match.device},
            "taint": {
                "key": DEVICE_TAINT_KEY,
                "value": str(xid) if xid is not None else "unknown",
                "effect": effect.value,
            },
        },
    }


def ours(rule: Mapping[str, Any] | None, incident: str) -> bool:
    """A DeviceTaintRule gpuheal wrote for `incident` (the only kind it deletes)."""
    labels = ((rule or {}).get("metadata") or {}).get("labels") or {}
    return (
        labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(INCIDENT_LABEL) == incident[:63]
    )


def may_release(quarantined: QuarantinedDevice, repair: RepairRecord | None) -> tuple[bool, str]:
    """Lift the device's taint? Only after a reset asked for after the taint, verified on the
    node, that covered this GPU."""
    gpu = quarantined.pci_bus_id or quarantined.gpu_uuid or quarantined.device
    if repair is None or repair.action != "reset":
        return False, f"no reset of GPU {gpu} was asked for: it stays quarantined"
    if repair.requested_at < quarantined.tainted_at:
        return False, f"the last reset predates the taint of GPU {gpu}: it stays quarantined"
    if repair.verified_at is None:
        why = "failed" if repair.failed_at is not None else "is not verified (yet)"
        return False, f"the reset of GPU {gpu} {why}: it stays quarantined"
    covered = {normalize_pci(p) for p in repair.gpus_before}
    uuids = {u.lower() for u in repair.gpus_before.values()}
    if covered and not (
        (quarantined.pci_bus_id and normalize_pci(quarantined.pci_bus_id) in covered)
        or (quarantined.gpu_uuid and quarantined.gpu_uuid.lower() in uuids)
    ):
        return False, f"the verified reset did not cover GPU {gpu}: it stays quarantined"
    return True, f"GPU {gpu} reset and verified at {repair.verified_at.isoformat()}"


_DEVICE_INDEX = re.compile(r"^gpu-(\d+)$")


def gpu_index(device: str) -> int | None:
    """The Slurm GRES index of a DRA device: NVIDIA's driver names a GPU `gpu-<minor>`, and a
    gres.conf of `File=/dev/nvidia[0-7]` gives index i to /dev/nvidia<i>, the same minor.
    None for any other name (no index can be assumed)."""
    m = _DEVICE_INDEX.match(device)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True, slots=True)
class JobsOnGpu:
    """The node's running Slurm jobs by whether they hold the GPU's index."""

    holding: list[int]  # hold the index: requeued
    others: list[int]  # hold other GPUs (or none): left running
    unknown: list[int]  # Slurm gave no index (or an old bridge): left running, named


def jobs_on_gpu(jobs: Iterable[JobState], index: int) -> JobsOnGpu:
    """Split the node's listed jobs (the bridge's listing with `gpus`) by GRES index; jobs
    that are not running (pending, completing) hold nothing to move."""
    holding: list[int] = []
    others: list[int] = []
    unknown: list[int] = []
    for job in jobs:
        if job.state != "RUNNING":
            continue
        if job.gpus is None:
            unknown.append(job.job_id)
        elif index in job.gpus:
            holding.append(job.job_id)
        else:
            others.append(job.job_id)
    return JobsOnGpu(sorted(holding), sorted(others), sorted(unknown))
