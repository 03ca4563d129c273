"""Crash points, for tests only: exit the process hard right before or after a side effect.

``GPUHEAL_CRASH_AT=<effect>.<before|after>[:<n>]`` (or ``--crash-at``) makes the operator
call ``os._exit(EXIT_CODE)`` the ``n``-th time (default: the first) it reaches that point:
no clean-up, no Lease release, nothing flushed, as a power cut or an OOM kill would leave
it. ``tests/integration/test_operator_crash_points.py`` crashes at each point in turn and
checks that the restarted operator finishes the incident with nothing done twice or lost.
Never set it anywhere else (the Helm chart has no value for it).

Unset (the only production setting), `at` is one comparison with None.
"""

from __future__ import annotations

import os
from typing import Literal

#: Distinctive exit status (70 is the Lease's; 137 a SIGKILL).
EXIT_CODE = 86

#: Every side effect with a crash point on each side, and where it is called from.
EFFECTS = (
    "nrem-create",  # intake: the NodeRemediation of a new incident
    "status",  # record: a NodeRemediation status write
    "event",  # kube.send_event: a core/v1 Event (the outbox's workers)
    "cordon",  # kube.cordon: unschedulable + gpuheal.io/cordoned-by
    "uncordon",  # kube.uncordon
    "evict",  # kube.evict / kube.delete_pod: one pod
    "claim",  # kube.claim_spare: gpuheal.io/claimed-by on a spare
    "promote",  # steps.replace: the spare's promotion labels and taints
    "bridge-drain",  # adapters.slurm: each bridge call that changes or lists Slurm
    "bridge-jobs",
    "bridge-requeue",
    "bridge-resume",
    "bridge-reboot",
    "bridge-reserve",
    "bridge-signal",
)
POINTS = tuple(f"{effect}.{when}" for effect in EFFECTS for when in ("before", "after"))

_armed: tuple[str, int] | None = None
_reached = 0


def parse(spec: str) -> tuple[str, int]:
    """``"cordon.after:2"`` -> ``("cordon.after", 2)``; ValueError names the known points."""
    point, _, nth = spec.strip().partition(":")
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; one of {', '.join(POINTS)}")
    if nth and not (nth.isdecimal() and int(nth) >= 1):
        raise ValueError(f"crash point count {nth!r} is not a whole number >= 1")
    return point, int(nth or 1)


def arm(spec: str | None) -> None:
    """Crash at ``spec`` (None or empty: never). Called once at start-up."""
    global _armed, _reached  # noqa: PLW0603 - one switch per process, by design
    _armed = parse(spec) if spec else None
    _reached = 0


def at(effect: str, when: Literal["before", "after"]) -> None:
    """The process reaches ``effect``'s point ``when``: exit here if that is the armed one."""
    if _armed is not None:
        _reach(f"{effect}.{when}")


def _reach(point: str) -> None:
    global _reached  # noqa: PLW0603
    assert point in POINTS, f"crash point {point} is not in crashpoints.EFFECTS"
    if _armed is None or point != _armed[0]:
        return
    _reached += 1
    if _reached == _armed[1]:
        said = f"gpuheal: crash point {point}:{_reached} reached, exiting {EXIT_CODE}\n"
        os.write(2, said.encode())
        os._exit(EXIT_CODE)
