"""Who owns a node's drain: pure functions over the reason text.

gpuheal writes ``gpuheal: <incident> xid=<n>``; anything else (an admin's text, Slurm's
``Not responding``, SchedMD slurm-operator's ``slurm-operator: ...``) belongs to someone else
and is never overwritten or resumed without ``force``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuheal_bridge.api.models import Owner
from gpuheal_bridge.api.names import REASON_PREFIX

_OURS = re.compile(r"gpuheal:\s*(?P<incident>\S+)?(?:.*?\bxid=(?P<xid>\d+))?")
# `scontrol show node` appends "[user@2026-11-22T05:37:58]" to the reason.
_SUFFIX = re.compile(r"^(?P<reason>.*?)\s*\[(?P<user>[^@\]\s]+)@(?P<time>[0-9T:-]+)\]\s*$", re.S)


@dataclass(frozen=True)
class ReasonInfo:
    owner: Owner
    incident: str | None = None
    xid: int | None = None


def build_reason(incident: str, xid: int | None) -> str:
    """The reason gpuheal sets: ``gpuheal: nrem-abc xid=79``."""
    return f"{REASON_PREFIX} {incident}" + (f" xid={xid}" if xid is not None else "")


def classify(reason: str | None, unavailable: bool) -> ReasonInfo:
    """Owner of a node's drain given its reason and whether it is drained/down at all."""
    if not unavailable:
        return ReasonInfo(Owner.NONE)
    text = (reason or "").strip()
    if not text.startswith(REASON_PREFIX):
        return ReasonInfo(Owner.OTHER)
    m = _OURS.match(text)
    incident = m.group("incident") if m else None
    xid = int(m.group("xid")) if m and m.group("xid") else None
    return ReasonInfo(Owner.GPUHEAL, incident, xid)


def split_reason_suffix(text: str) -> tuple[str, str | None, str | None]:
    """``"fan swap [root@2026-11-22T05:37:58]"`` -> ``("fan swap", "root", "2026-...")``."""
    m = _SUFFIX.match(text)
    if m is None:
        return text.strip(), None, None
    return m.group("reason"), m.group("user"), m.group("time")
