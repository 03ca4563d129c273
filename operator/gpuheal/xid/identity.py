"""One GPU, one key: PCI address <-> UUID, whichever a source happens to print.

Sources name a GPU differently: the kernel log (and so `gpuheal agent`, node-problem-detector,
`gpuheal simulate xid`) by PCI address, dcgm-exporter by UUID (and, since 3.x, also by its
`pci_bus_id` label), other tools' Event messages sometimes by UUID alone. Repeat counting and
de-duplication need them to agree, so every source's GPU goes through `GpuMap.key`:

- the canonical key is the **normalised PCI address** (`0000:3b:00`): every source we read
  has it or can be mapped to it, and it names the slot, which is what a node-level action
  (cordon, reset, replace) is about;
- a UUID alone is mapped to its PCI address through the node's map; unmapped, the UUID itself
  is the key (still stable, just not joinable with PCI-only sources).

Where the map comes from (all pure inputs to `GpuMap`):
- the node annotation `gpuheal.io/gpus` that `gpuheal agent` keeps current: a JSON object of
  PCI address -> UUID (`parse_gpu_map` / `format_gpu_map`), from NVML when present, else
  from the driver's `NVRM: GPU at PCI:...: GPU-...` lines;
- every pair a source prints together: a dcgm-exporter sample with both labels, an agent Event
  whose message carries the driver's identity line (`GpuMap.learn`).

Pure: no I/O, never raises on input it is given.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping

from gpuheal.xid.parse import normalize_pci

GPU_MAP_ANNOTATION = "gpuheal.io/gpus"
"""Node annotation written by `gpuheal agent`: `{"0000:3b:00": "GPU-8f6c...", ...}`."""

GPU_REPORT_ANNOTATION = "gpuheal.io/gpus-seen"
"""Node annotation written by `gpuheal agent` with NVML: the GPUs it sees *now* and when,
`{"at": "<RFC 3339>", "gpus": {"0000:3b:00": "GPU-8f6c...", ...}}`; written when the agent
starts and whenever that set changes (a GPU lost or back), so a report dated after a reset
says the GPUs answered after it. (`gpuheal.io/gpus` only ever learns: it keeps a lost GPU.)"""

MAX_GPUS = 256
"""Bound on a map read from an annotation (a node has 8-16 GPUs, MIG included far fewer than
this); the rest is ignored."""

_UUID_RE = re.compile(
    r"^(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$", re.ASCII
)
_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?$",
    re.ASCII | re.IGNORECASE,
)


def normalize_uuid(raw: str) -> str | None:
    """`GPU-B850F46D-...` -> `GPU-b850f46d-...`; None if it is not a GPU/MIG UUID."""
    text = raw.strip() if isinstance(raw, str) else ""
    if not _UUID_RE.match(text):
        return None
    return text[:4].upper() + text[4:].lower()


def _pci(raw: str | None) -> str | None:
    if not isinstance(raw, str) or not _PCI_RE.match(raw.strip()):
        return None
    return normalize_pci(raw)


@dataclasses.dataclass(frozen=True)
class GpuMap:
    """PCI address (normalised) -> UUID for one node."""

    by_pci: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def by_uuid(self) -> dict[str, str]:
        return {uuid: pci for pci, uuid in self.by_pci.items()}

    def key(self, pci: str | None = None, uuid: str | None = None) -> str | None:
        """The canonical key of a GPU named by PCI address and/or UUID (see module doc)."""
        address = _pci(pci)
        if address is not None:
            return address
        ident = normalize_uuid(uuid) if uuid else None
        if ident is None:
            return None
        return self.by_uuid.get(ident, ident)

    def uuid_of(self, pci: str | None) -> str | None:
        address = _pci(pci)
        return self.by_pci.get(address) if address else None

    def learn(self, pairs: Iterable[tuple[str | None, str | None]]) -> GpuMap:
        """A new map with the (PCI, UUID) pairs a source printed together added; pairs with
        a part missing or malformed are skipped, a newer pair for a PCI address wins."""
        merged = dict(self.by_pci)
        for pci, uuid in pairs:
            address = _pci(pci)
            ident = normalize_uuid(uuid) if uuid else None
            if address and ident and (address in merged or len(merged) < MAX_GPUS):
                merged[address] = ident
        return GpuMap(merged)


NO_GPUS = GpuMap()
"""The map of a node that has none (shared: thousands of nodes, one empty map)."""


def canonical_gpu_key(
    pci: str | None, uuid: str | None, gpu_map: GpuMap | None = None
) -> str | None:
    """`GpuMap.key` with an optional map: the one function every source's GPU goes through."""
    return (gpu_map or GpuMap()).key(pci, uuid)


def parse_gpu_map(text: str | None) -> GpuMap:
    """The `gpuheal.io/gpus` annotation -> GpuMap; anything malformed reads as empty/skipped."""
    if not isinstance(text, str) or len(text) > 64 * 1024:
        return GpuMap()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # `[[[[...` nests deeper than the parser recurses
        return GpuMap()
    if not isinstance(data, dict):
        return GpuMap()
    pairs = [(k, v) for k, v in data.items() if isinstance(k, str) and isinstance(v, str)]
    return GpuMap().learn(pairs[:MAX_GPUS])


def format_gpu_map(gpu_map: GpuMap | Mapping[str, str]) -> str:
    """GpuMap (or a PCI -> UUID mapping) -> the annotation value: compact, sorted JSON."""
    pairs = gpu_map.by_pci if isinstance(gpu_map, GpuMap) else gpu_map
    clean = GpuMap().learn(pairs.items()).by_pci
    return json.dumps(dict(sorted(clean.items())), separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class GpuReport:
    """The agent's `gpuheal.io/gpus-seen`: the GPUs (PCI address -> UUID) seen at `at`."""

    at: dt.datetime
    gpus: GpuMap


def format_gpu_report(at: dt.datetime, gpus: GpuMap | Mapping[str, str]) -> str:
    """The `gpuheal.io/gpus-seen` value: `{"at": ..., "gpus": {...}}`, compact and sorted."""
    stamp = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"at": stamp, "gpus": json.loads(format_gpu_map(gpus))},
                      separators=(",", ":"))  # fmt: skip


def parse_gpu_report(text: str | None) -> GpuReport | None:
    """`gpuheal.io/gpus-seen` -> GpuReport; None when absent or malformed."""
    if not isinstance(text, str) or len(text) > 64 * 1024:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), dict):
        return None
    raw = data.get("at")
    try:
        at = dt.datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) else None
    except ValueError:
        return None
    if at is None or at.tzinfo is None:
        return None
    return GpuReport(at=at, gpus=parse_gpu_map(json.dumps(data["gpus"])))
