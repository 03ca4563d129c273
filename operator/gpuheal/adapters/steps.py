"""One idempotent executor per remediation action. Each looks at the world first and returns
what happened as a `StepResult`; running one twice (after a restart) repeats nothing harmful.

The driver (handlers/remediation.py) decides *when* a step runs (gates, order) and records
the result; the executors only do the I/O.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpuheal import incident as inc
from gpuheal.adapters.kube import CordonOutcome, Kube, UncordonOutcome
from gpuheal.adapters.slurm import (
    SlurmConflict,
    SlurmError,
    SlurmNotFound,
    SlurmPort,
    SlurmUnavailable,
)
from gpuheal.api.meta import parse_duration
from gpuheal.api.noderemediation import (
    CORDONED,
    DRAINED,
    JOBS_REQUEUED,
    REBOOTED,
    REPLACEMENT_CLAIMED,
    RESET,
    SLURM_DRAINED,
)
from gpuheal.api.remediationpolicy import (
    DrainOptions,
    DrainTimeoutAction,
    HookSpec,
    HookType,
    SlurmDrainOptions,
)
from gpuheal.api.remediationpolicy import RequeueMode as PolicyRequeue
from gpuheal.api.reservepool import ReservePool
from gpuheal_bridge.api.models import (
    CheckpointSignal,
    DrainOutcome,
    JobOutcome,
    RequeueMode,
    RequeueOptions,
)

log = logging.getLogger("gpuheal.adapters.steps")


@dataclass
class StepResult:
    """``done``: the step's condition is True and the incident moves on. ``wait``: look again
    after ``retry_after`` seconds (and say why). ``failed``: stop; a person must look."""

    kind: str  # done | wait | failed
    condition: str
    reason: str
    message: str
    retry_after: float = 0.0
    status: dict[str, Any] = field(default_factory=dict)  # extra status fields to merge
    extra_conditions: list[tuple[str, str, str, str]] = field(default_factory=list)

    @classmethod
    def done(cls, condition: str, reason: str, message: str, **status: Any) -> StepResult:
        return cls("done", condition, reason, message, status=status)

    @classmethod
    def wait(cls, condition: str, reason: str, message: str, retry_after: float) -> StepResult:
        return cls("wait", condition, reason, message, retry_after=retry_after)

    @classmethod
    def failed(cls, condition: str, reason: str, message: str) -> StepResult:
        return cls("failed", condition, reason, message)


# ---- cordon --------------------------------------------------------------------------------
async def cordon(kube: Kube, node: str, incident: str) -> StepResult:
    outcome = await kube.cordon(node, incident)
    if outcome is CordonOutcome.BY_OTHER:
        return StepResult.done(
            CORDONED,
            "AlreadyCordonedByOther",
            f"{node} was already cordoned by someone else; gpuheal will not uncordon it",
            ownership={"cordoned": False},
        )
    return StepResult.done(
        CORDONED,
        "Cordoned",
        f"{node} cordoned by gpuheal ({incident})",
        ownership={"cordoned": True},
    )


async def uncordon(kube: Kube, node: str, incident: str) -> str:
    outcome = await kube.uncordon(node, incident)
    return {
        UncordonOutcome.UNCORDONED: f"{node} uncordoned",
        UncordonOutcome.NOT_OURS: f"{node} left as it is: its cordon is not this incident's",
        UncordonOutcome.NOT_CORDONED: f"{node} was no longer cordoned",
    }[outcome]


# ---- Slurm ---------------------------------------------------------------------------------
def requeue_options(opts: SlurmDrainOptions) -> RequeueOptions | None:
    if opts.requeue is PolicyRequeue.NONE:
        return None
    checkpoint = None
    if opts.checkpoint_signal:
        grace = min(600.0, parse_duration(opts.grace_period).total_seconds())
        checkpoint = CheckpointSignal(signal=opts.checkpoint_signal, grace_seconds=grace)
    mode = (
        RequeueMode.REQUEUE_HOLD
        if opts.requeue is PolicyRequeue.REQUEUE_HOLD
        else (RequeueMode.REQUEUE)
    )
    return RequeueOptions(
        mode=mode,
        checkpoint=checkpoint,
        exclude_node=True,
        expedite=mode is RequeueMode.REQUEUE,
    )


_REQUEUED = {JobOutcome.REQUEUED, JobOutcome.REQUEUED_HELD, JobOutcome.REQUEUED_BY_JOB}


async def slurm_drain(
    slurm: SlurmPort | None,
    node: str,
    incident: str,
    xid: int | None,
    opts: SlurmDrainOptions,
    *,
    now: dt.datetime,
    attempt: int,
) -> StepResult:
    if slurm is None:
        return StepResult.done(
            SLURM_DRAINED, "SlurmNotConfigured", "no Slurm bridge configured (--bridge-url)"
        )
    try:
        resp = await slurm.drain(
            node,
            incident=incident,
            xid=xid,
            requeue=requeue_options(opts),
            idempotency_key=f"{incident}-slurm-drain",
        )
    except SlurmNotFound:
        return StepResult.done(SLURM_DRAINED, "NotASlurmNode", f"Slurm does not know {node}")
    except SlurmUnavailable as exc:
        delay = exc.retry_after or min(60.0, 2.0 ** min(attempt, 6))
        return StepResult.wait(SLURM_DRAINED, "BridgeUnavailable", str(exc), delay)
    except SlurmError as exc:
        return StepResult.failed(SLURM_DRAINED, "BridgeError", str(exc))
    ours = resp.outcome is not DrainOutcome.DRAINED_BY_OTHER
    jobs = [
        {"jobId": str(j.job_id), "requeuedAt": inc.rfc3339(now)}
        for j in resp.jobs
        if j.outcome in _REQUEUED
    ]
    other = [f"{j.job_id}:{j.outcome.value}" for j in resp.jobs if j.outcome not in _REQUEUED]
    detail = f"; requeued {len(jobs)} job(s)" + (
        f"; not requeued: {', '.join(other)}" if other else ""
    )
    result = StepResult.done(
        SLURM_DRAINED,
        {
            DrainOutcome.DRAINED: "Drained",
            DrainOutcome.ALREADY_DRAINED: "AlreadyDrained",
            DrainOutcome.DRAINED_BY_OTHER: "DrainedByOther",
        }[resp.outcome],
        f"Slurm node {resp.slurm_node}: {resp.outcome.value} (reason {resp.current.reason!r})"
        + detail,
        ownership={"slurmDrained": ours},
    )
    if jobs:
        result.status["requeuedJobs"] = jobs
    result.extra_conditions.append(
        (
            JOBS_REQUEUED,
            "True" if jobs or not other else "False",
            "Requeued" if jobs else ("NoJobs" if not other else "NotRequeued"),
            f"{len(jobs)} job(s) requeued" + (f"; {', '.join(other)}" if other else ""),
        )
    )
    return result


async def slurm_resume(
    slurm: SlurmPort | None, node: str, incident: str, *, force: bool = False
) -> str:
    """Resume ``node`` in Slurm only if our drain (this incident) is still its reason."""
    if slurm is None:
        return "no Slurm bridge"
    try:
        resp = await slurm.resume(
            node,
            incident=None if force else incident,
            force=force,
            idempotency_key=f"{incident}-slurm-resume-{node}",
        )
    except SlurmConflict as exc:
        return f"Slurm drain of {node} is not ours, left as it is ({exc})"
    except SlurmNotFound:
        return f"Slurm does not know {node}"
    return f"Slurm {resp.slurm_node}: {resp.outcome.value}"


# ---- drain pods ----------------------------------------------------------------------------
async def drain_pods(
    kube: Kube,
    node: str,
    opts: DrainOptions,
    *,
    started: dt.datetime,
    now: dt.datetime,
    retry_after: float,
) -> tuple[StepResult, dict[str, int]]:
    """One pass: evict every pod a drain should evict; done once none is left.

    429 (a PodDisruptionBudget allows no disruption) means "later"; after ``timeout`` the
    policy's ``onTimeout`` decides: stop and alert, or delete the rest without the Eviction API.
    """
    pods = await kube.pods_on_node(node)
    todo = inc.pods_to_evict(pods)
    counts = {"evicted": 0, "pdb_blocked": 0, "gone": 0, "forced": 0}
    if not todo:
        skipped = len(pods)
        return StepResult.done(
            DRAINED,
            "Drained",
            f"no pods left to evict on {node} ({skipped} DaemonSet/mirror/finished pod(s) kept)",
        ), counts
    grace = (
        int(parse_duration(opts.grace_period).total_seconds())
        if opts.grace_period is not None
        else None
    )
    timed_out = now - started >= parse_duration(opts.timeout)
    force = timed_out and opts.on_timeout is DrainTimeoutAction.FORCE
    for pod in todo:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # already going
        outcome = (
            await kube.delete_pod(dict(pod), grace_seconds=grace)
            if force
            else await kube.evict(dict(pod), grace_seconds=grace)
        )
        counts[outcome.value] += 1
    if counts["pdb_blocked"]:
        if timed_out:
            return StepResult.failed(
                DRAINED,
                "DrainTimedOut",
                f"{counts['pdb_blocked']} pod(s) on {node} still held by a PodDisruptionBudget "
                f"after {opts.timeout}; onTimeout=Alert: the node stays cordoned",
            ), counts
        return StepResult.wait(
            DRAINED,
            "PodDisruptionBudget",
            f"{counts['pdb_blocked']} pod(s) on {node} held by a PodDisruptionBudget; retrying",
            retry_after,
        ), counts
    return StepResult.wait(
        DRAINED,
        "Evicting",
        f"evicted {counts['evicted']}, forced {counts['forced']}; waiting for the pods to go",
        retry_after,
    ), counts


# ---- reset / reboot hooks ------------------------------------------------------------------
async def busy_pods(kube: Kube, node: str) -> list[str]:
    """Pods a reset would disturb (what a drain would evict), as namespace/name."""
    return [
        f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
        for p in inc.pods_to_evict(await kube.pods_on_node(node))
    ]


async def run_hook(  # noqa: PLR0911
    kube: Kube,
    hook: HookSpec,
    *,
    action: str,
    node: str,
    incident: str,
    xid: int | None,
    started: dt.datetime,
    now: dt.datetime,
    hook_timeout: str,
    retry_after: float,
) -> StepResult:
    """The reset/reboot contract: a Webhook POST or a Job; ``Noop`` records and succeeds.

    Webhook: ``POST url`` with ``{"action", "node", "incident", "xid"}`` and header
    ``Idempotency-Key: <incident>-<action>``; any 2xx is success, the receiver must treat
    a repeated key as the same request. Job: ``<incident>-<action>`` in the hook's namespace
    from the template, env ``NODE_NAME``/``GPUHEAL_ACTION``/``GPUHEAL_INCIDENT``; success
    when the Job reports Complete, failure when it reports Failed.
    """
    condition = RESET if action == "reset" else REBOOTED
    if hook.type is HookType.NOOP:
        return StepResult.done(condition, "NoopHook", f"{action} hook is Noop: nothing ran")
    if now - started > parse_duration(hook_timeout):
        return StepResult.failed(
            condition, "HookTimedOut", f"{action} hook did not finish in {hook_timeout}"
        )
    if hook.type is HookType.WEBHOOK and hook.webhook is not None:
        payload = {"action": action, "node": node, "incident": incident, "xid": xid}
        try:
            async with httpx.AsyncClient(
                timeout=parse_duration(hook.webhook.timeout).total_seconds()
            ) as http:
                resp = await http.post(
                    hook.webhook.url,
                    json=payload,
                    headers={"Idempotency-Key": f"{incident}-{action}"},
                )
        except httpx.HTTPError as exc:
            return StepResult.wait(condition, "HookUnreachable", str(exc), retry_after)
        if resp.is_success:
            return StepResult.done(
                condition, "HookSucceeded", f"{action} webhook: {resp.status_code}"
            )
        if resp.status_code >= 500 or resp.status_code == 429:
            return StepResult.wait(
                condition, "HookUnavailable", f"{action} webhook: {resp.status_code}", retry_after
            )
        return StepResult.failed(condition, "HookRefused", f"{action} webhook: {resp.status_code}")
    if hook.type is HookType.JOB and hook.job is not None:
        return await _job_hook(
            kube, hook, action=action, node=node, incident=incident, retry_after=retry_after
        )
    return StepResult.failed(condition, "HookInvalid", f"{action} hook has no {hook.type} block")


async def _job_hook(
    kube: Kube, hook: HookSpec, *, action: str, node: str, incident: str, retry_after: float
) -> StepResult:
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio.client.exceptions import ApiException

    assert hook.job is not None
    condition = RESET if action == "reset" else REBOOTED
    batch: Any = k8s.BatchV1Api(kube.api)
    name = f"{incident}-{action}"[:63].rstrip("-")
    ns = hook.job.namespace
    try:
        job = await batch.read_namespaced_job_status(name, ns)
    except ApiException as exc:
        if exc.status != 404:
            raise
        spec = _job_spec(hook.job.template, node=node, action=action, incident=incident)
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {inc.NODE_LABEL: node}},
            "spec": spec,
        }
        try:
            await batch.create_namespaced_job(ns, body)
        except ApiException as create_exc:
            if create_exc.status != 409:
                raise
        return StepResult.wait(condition, "HookRunning", f"Job {ns}/{name} created", retry_after)
    for c in job.status.conditions or []:
        if c.type == "Complete" and c.status == "True":
            return StepResult.done(condition, "HookSucceeded", f"Job {ns}/{name} completed")
        if c.type == "Failed" and c.status == "True":
            return StepResult.failed(
                condition, "HookFailed", f"Job {ns}/{name} failed: {c.message}"
            )
    return StepResult.wait(condition, "HookRunning", f"Job {ns}/{name} running", retry_after)


def _job_spec(
    template: Mapping[str, Any], *, node: str, action: str, incident: str
) -> dict[str, Any]:
    """The template (a JobSpec) with NODE_NAME & co added to every container's env."""
    import copy

    spec = copy.deepcopy(dict(template))
    pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
    pod_spec.setdefault("restartPolicy", "Never")
    env = [
        {"name": "NODE_NAME", "value": node},
        {"name": "GPUHEAL_ACTION", "value": action},
        {"name": "GPUHEAL_INCIDENT", "value": incident},
    ]
    for container in pod_spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *env]
    return spec


# ---- replace -------------------------------------------------------------------------------
def spare_candidates(pool: ReservePool, nodes: Sequence[inc.NodeView], broken: str) -> list[str]:
    """Ready, schedulable-or-ours, unclaimed nodes of the pool, by name (stable order)."""
    return sorted(
        n.name
        for n in nodes
        if n.name != broken
        and pool.spec.node_selector.matches(dict(n.labels))
        and n.ready
        and n.claimed_by is None
        and n.cordoned_by is None
    )


async def replace(
    kube: Kube,
    slurm: SlurmPort | None,
    pool: ReservePool | None,
    pool_name: str,
    nodes: Sequence[inc.NodeView],
    *,
    node: str,
    incident: str,
    retry_after: float,
) -> StepResult:
    """Claim a spare (resourceVersion precondition), promote it, resume it in Slurm."""
    if pool is None:
        return StepResult.wait(
            REPLACEMENT_CLAIMED, "PoolNotFound", f"ReservePool {pool_name} not found", retry_after
        )
    names = spare_candidates(pool, nodes, node)
    bodies = []
    for name in names[:8]:
        body = await kube.get_node(name)
        if body is not None:
            bodies.append(body)
    claim = await kube.claim_spare(incident, bodies)
    if claim is None:
        return StepResult.wait(
            REPLACEMENT_CLAIMED,
            "NoSpareAvailable",
            f"no ready, unclaimed node in ReservePool {pool_name}",
            retry_after,
        )
    promo = pool.spec.promotion
    current = await kube.get_node(claim.node)
    labels: dict[str, str | None] = dict(promo.set_labels)
    labels.update({k: None for k in promo.remove_labels})
    await kube.patch_node_metadata(
        claim.node,
        labels=labels,
        annotations={inc.REPLACES_ANNOTATION: node},
        remove_taints=frozenset(t.key for t in promo.remove_taints),
        current=current,
    )
    slurm_msg = ""
    if promo.slurm is not None and promo.slurm.resume:
        try:
            slurm_msg = "; " + await slurm_resume(slurm, claim.node, incident, force=True)
        except SlurmUnavailable as exc:
            return StepResult.wait(
                REPLACEMENT_CLAIMED,
                "BridgeUnavailable",
                f"claimed {claim.node}; Slurm resume pending: {exc}",
                retry_after,
            )
    return StepResult.done(
        REPLACEMENT_CLAIMED,
        "SpareClaimed",
        f"{claim.node} from ReservePool {pool_name} promoted for {node}{slurm_msg}",
        replacementNode=claim.node,
    )


async def sleep_until(deadline: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, deadline - loop.time()))
