"""What proves a repair happened, per action: pure verdicts over what the node reports.

A hook's exit code or 2xx says only that it ran. The node says whether the repair happened:

- **reboot**: the node's boot ID (`status.nodeInfo.bootID`, a new random value every boot,
  reported by the kubelet) differs from the one recorded before the reboot was asked for.
  No boot ID recorded before: nothing can prove it (gpuheal does not ask for one).
- **GPU reset**: `gpuheal agent` (with NVML) reports the GPUs again after the reset, on its
  `gpuheal.io/gpus-seen` annotation: a report dated after the hook finished, every GPU
  recorded before the reset at its PCI address with the same UUID (a different UUID there is
  another GPU: failed), at least as many GPUs as before (and as the node's GPU count label),
  and no XID on the node since the reset for `settle`. No GPU map before the reset (no agent
  on the node): nothing can prove it (gpuheal does not ask for one).

Each verdict is (True: proven / False: failed for good / None: not yet) and what was seen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

from gpuheal.api.meta import format_duration
from gpuheal.policy.types import Observation
from gpuheal.xid.identity import GpuReport

Verdict = tuple[bool | None, str]


def reboot_proof(boot_id_before: str | None, boot_id_now: str | None) -> Verdict:
    """A reboot happened when the node reports a boot ID other than the one before it."""
    if not boot_id_before:
        return False, "no boot ID was recorded before the reboot: it cannot be verified"
    if not boot_id_now or boot_id_now == boot_id_before:
        return None, f"bootID unchanged ({boot_id_before})"
    return True, f"bootID {boot_id_before} -> {boot_id_now}"


def reset_proof(  # noqa: PLR0911 - one exit per verdict
    before: Mapping[str, str],
    report: GpuReport | None,
    *,
    reset_at: dt.datetime,
    want_count: int | None,
    observations: Iterable[Observation],
    settle: dt.timedelta,
    now: dt.datetime,
) -> Verdict:
    """Did the GPU reset happen and hold? `before`: PCI address -> UUID recorded when the
    reset was asked for; `report`: the agent's latest; `reset_at`: when the hook finished;
    `observations`: the node's signals (an XID since the reset fails it)."""
    if not before:
        return False, "no GPU map was recorded before the reset: it cannot be verified"
    late = sorted(
        (o for o in observations if o.xid is not None and o.time > reset_at), key=lambda o: o.time
    )
    if late:
        first = late[0]
        return False, f"XID {first.xid} at {first.time.isoformat()} after the reset"
    if report is None:
        return None, "the agent has not reported the GPUs (gpuheal.io/gpus-seen)"
    if report.at <= reset_at:
        return None, (
            f"the agent's last GPU report ({report.at.isoformat()}) is not after the reset "
            f"({reset_at.isoformat()})"
        )
    seen = report.gpus.by_pci
    for pci, uuid in sorted(before.items()):
        now_there = seen.get(pci)
        if now_there is not None and now_there != uuid:
            return False, f"GPU at {pci} is {now_there}, was {uuid}: another GPU, not a reset"
    missing = sorted(set(before) - set(seen))
    want = max(len(before), want_count or 0)
    if missing or len(seen) < want:
        gone = f" (missing {', '.join(missing[:4])})" if missing else ""
        return None, f"the agent reports {len(seen)} of {want} GPUs{gone}"
    held = now - max(reset_at, report.at)
    if held < settle:
        return None, (
            f"{len(seen)} of {want} GPUs back with the same UUIDs; no XID for "
            f"{format_duration(held)} of {format_duration(settle)}"
        )
    return True, (
        f"{len(seen)} of {want} GPUs reported again after the reset, same UUIDs, no XID "
        f"for {format_duration(settle)}"
    )
