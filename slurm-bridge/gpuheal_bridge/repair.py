"""Reboot a node through Slurm, and hand a repaired node to the reserve pool: ownership-
checked like drain and resume (:mod:`gpuheal_bridge.operations`), under the same per-node
lock, written against the :class:`~gpuheal_bridge.backends.base.Backend` interface.

Measured on Slurm 22.05 (several ``slurmd -N`` on one host, a RebootProgram that restarts the
node's slurmd with ``-b``):

- ``scontrol reboot reason=R NODE`` on a DRAINED node: ``IDLE+DRAIN+REBOOT_REQUESTED`` ->
  ``DOWN+DRAIN+REBOOT_ISSUED`` -> ``IDLE+DRAIN`` with reason ``R : reboot issued`` and a new
  ``BootTime``: the node stays out until someone resumes it. That is what gpuheal wants: it
  resumes the node only after its own check passed.
- ``scontrol reboot ASAP nextstate=RESUME reason=R NODE``: the same states, then ``IDLE``
  with no reason: Slurm returns the node by itself (also when it was drained before).
- ``ASAP`` without ``nextstate`` also ends ``IDLE``; ``nextstate=DOWN`` ends DOWN, which
  ``ReturnToService=2`` turns back to IDLE within seconds.
- A node whose RebootProgram does not bring it back goes DOWN "reboot timed out" after
  ``ResumeTimeout``; its ``BootTime`` does not change. That reason is not gpuheal's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gpuheal_bridge.api.models import (
    NodeState,
    Owner,
    RebootNextState,
    RebootOutcome,
    RebootRequest,
    RebootResponse,
    ReserveOutcome,
    ReserveRequest,
    ReserveResponse,
)
from gpuheal_bridge.operations import Operations, OwnershipConflict, node_state
from gpuheal_bridge.ownership import build_reason

Answer = TypeVar("Answer", RebootResponse, ReserveResponse)


def reboot_reason(incident: str, xid: int | None) -> str:
    """``gpuheal: nrem-abc xid=79 reboot``: still gpuheal's (and this incident's) reason, also
    after Slurm appends ``: reboot issued``."""
    return f"{build_reason(incident, xid)} reboot"


async def reboot(
    ops: Operations, k8s_name: str, slurm_name: str, req: RebootRequest
) -> RebootResponse:
    """Ask Slurm to reboot the node (once): refused (409) when someone else drained or
    downed it; a reboot of ours already pending or in progress is reported, not repeated."""
    backend = ops.backend

    async def act(previous: NodeState) -> RebootOutcome:
        if previous.owner is Owner.OTHER:
            raise OwnershipConflict(
                f"{slurm_name} is drained/down by someone else "
                f"({previous.reason_user or 'unknown'}: {previous.reason!r}); not rebooting it",
                previous,
            )
        if previous.rebooting and previous.owner is Owner.GPUHEAL:
            return RebootOutcome.ALREADY_REQUESTED
        reason = reboot_reason(req.incident, req.xid)
        if req.next_state is RebootNextState.RESUME:
            await backend.reboot(slurm_name, reason, asap=True, resume=True)
        else:
            if previous.owner is Owner.NONE:
                # Drained first, with our reason: nothing new starts there, and the drain
                # (ours) outlives the reboot until gpuheal resumes the node.
                await backend.drain(slurm_name, reason)
            await backend.reboot(slurm_name, reason, asap=False, resume=False)
        return RebootOutcome.REQUESTED

    return await _change(ops, k8s_name, slurm_name, act, RebootResponse)


async def reserve(
    ops: Operations, k8s_name: str, slurm_name: str, req: ReserveRequest
) -> ReserveResponse:
    """DRAIN the node with the pool's reason: only a drain of this incident (or none) is
    replaced; someone else's is refused (409); the pool's reason already there is a no-op.
    A reason that is not one of the bridge's reserve pool reasons: 403 (promotion could not
    resume the spare)."""
    ops.check_reserve_reason(req.reason)

    async def act(previous: NodeState) -> ReserveOutcome:
        if previous.drain and previous.reason == req.reason:
            return ReserveOutcome.ALREADY_RESERVED
        _check_ours(previous, req.incident)
        await ops.backend.drain(slurm_name, req.reason)
        return ReserveOutcome.RESERVED

    return await _change(ops, k8s_name, slurm_name, act, ReserveResponse)


async def _change(
    ops: Operations,
    k8s_name: str,
    slurm_name: str,
    act: Callable[[NodeState], Awaitable[Any]],  # the answer's outcome: checked by it
    answer: type[Answer],
) -> Answer:
    """``act`` on the node under its lock, between two reads of its state: the answer
    holds both and what ``act`` says it did."""
    async with ops.lock(f"node:{slurm_name}"):
        previous = node_state(k8s_name, await ops.backend.get_node(slurm_name))
        outcome = await act(previous)
        current = node_state(k8s_name, await ops.backend.get_node(slurm_name))
        return answer(
            node=k8s_name,
            slurm_node=slurm_name,
            outcome=outcome,
            previous=previous,
            current=current,
        )


def _check_ours(state: NodeState, incident: str) -> None:
    if state.owner is Owner.OTHER or (
        state.owner is Owner.GPUHEAL and state.incident not in (None, incident)
    ):
        raise OwnershipConflict(
            f"{state.slurm_node} is drained for {state.incident or state.reason!r}, not for "
            f"{incident}; left as it is",
            state,
        )
