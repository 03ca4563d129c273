"""One idempotent executor per remediation action. Each looks at the world first (through
the adapters) and says what happened as a `StepResult`: the step's condition, its reason and
message, and what to merge into status. Running one twice (after a restart) repeats nothing
harmful.

The engine decides *whether* and *when* a step runs; the driver records the result.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuheal.adapters.hooks import HookUnreachable, post_webhook
from gpuheal.adapters.kube import CordonOutcome, Kube, UncordonOutcome
from gpuheal.adapters.slurm import (
    BridgeSlurm,
    SlurmConflict,
    SlurmError,
    SlurmNotFound,
    SlurmUnavailable,
    UnknownCluster,
)
from gpuheal.api.meta import parse_duration, rfc3339
from gpuheal.api.names import NODE_LABEL, REPLACES_ANNOTATION, JobOutcome
from gpuheal.api.names import NremCondition as C
from gpuheal.api.noderemediation import JobRecord, NodeRemediation
from gpuheal.api.remediationpolicy import (
    Action,
    DrainOptions,
    DrainTimeoutAction,
    HookSpec,
    HookType,
    SlurmDrainOptions,
    Step,
)
from gpuheal.api.remediationpolicy import RequeueMode as PolicyRequeue
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy import pods_to_evict, spare_candidates
from gpuheal.policy.types import Act, NodeView
from gpuheal.remediation.record import Recorder
from gpuheal.remediation.state import Runtime
from gpuheal.remediation.victims import PostEvent, RecordPlan, base_options, requeue_victims
from gpuheal_bridge.api.models import DrainOutcome, RequeueOptions

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
            C.CORDONED,
            "AlreadyCordonedByOther",
            f"{node} was already cordoned by someone else; gpuheal will not uncordon it",
            ownership={"cordoned": False},
        )
    return StepResult.done(
        C.CORDONED,
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
    """How the policy wants the node's jobs requeued (None: leave them)."""
    if opts.requeue is PolicyRequeue.NONE:
        return None
    return base_options(opts)


async def slurm_drain(  # noqa: PLR0911 - one return per outcome
    slurm: BridgeSlurm | None,
    node: str,
    incident: str,
    xid: int | None,
    opts: SlurmDrainOptions,
    *,
    now: dt.datetime,
    attempt: int,
    signal_at: dt.datetime | None = None,
    recorded: Sequence[JobRecord] = (),
    record_plan: RecordPlan | None = None,
    post_event: PostEvent | None = None,
) -> StepResult:
    """Drain the Slurm node (unless someone else has), then requeue the fault's victims
    (`victims.requeue_victims`): the node's running jobs and those that died there."""
    if slurm is None:
        return StepResult.done(
            C.SLURM_DRAINED, "SlurmNotConfigured", "no Slurm bridge configured (--bridge-url)"
        )
    try:
        resp = await slurm.drain(
            node,
            incident=incident,
            xid=xid,
            requeue=None,
            idempotency_key=f"{incident}-slurm-drain",
        )
    except SlurmNotFound:
        return StepResult.done(C.SLURM_DRAINED, "NotASlurmNode", f"Slurm does not know {node}")
    except SlurmUnavailable as exc:
        delay = exc.retry_after or min(60.0, 2.0 ** min(attempt, 6))
        return StepResult.wait(C.SLURM_DRAINED, "BridgeUnavailable", str(exc), delay)
    except SlurmError as exc:
        return StepResult.failed(C.SLURM_DRAINED, "BridgeError", str(exc))
    ours = resp.outcome is not DrainOutcome.DRAINED_BY_OTHER
    drained = f"Slurm node {resp.slurm_node}: {resp.outcome.value} (reason {resp.current.reason!r})"
    reason = {
        DrainOutcome.DRAINED: "Drained",
        DrainOutcome.ALREADY_DRAINED: "AlreadyDrained",
        DrainOutcome.DRAINED_BY_OTHER: "DrainedByOther",
    }[resp.outcome]
    if opts.requeue is PolicyRequeue.NONE:
        result = StepResult.done(C.SLURM_DRAINED, reason, drained, ownership={"slurmDrained": ours})
        result.extra_conditions.append(
            (C.JOBS_REQUEUED, "False", "NotRequested", "requeue: none: jobs left running")
        )
        return result
    try:
        victims = await requeue_victims(
            slurm,
            node,
            incident,
            opts,
            signal_at=signal_at or now,
            now=now,
            recorded=recorded,
            record_plan=record_plan or _no_plan_record,
            post_event=post_event or _no_event,
        )
    except SlurmUnavailable as exc:
        delay = exc.retry_after or min(60.0, 2.0 ** min(attempt, 6))
        return StepResult.wait(C.SLURM_DRAINED, "BridgeUnavailable", f"{drained}; {exc}", delay)
    jobs_status = [r.to_k8s() for r in victims.records]
    if victims.retry is not None:
        delay = min(60.0, 2.0 ** min(attempt, 6))
        result = StepResult.wait(
            C.SLURM_DRAINED, "BridgeUnavailable", f"{drained}; {victims.retry}", delay
        )
    else:
        moved = [r for r in victims.records if r.outcome in (JobOutcome.REQUEUED, JobOutcome.HELD)]
        requeued = f"; requeued {len(moved)} job(s)" if moved else ""
        result = StepResult.done(
            C.SLURM_DRAINED, reason, drained + requeued, ownership={"slurmDrained": ours}
        )
        if moved:
            result.status["requeuedJobs"] = [
                {"jobId": r.job_id, "name": r.name, "requeuedAt": rfc3339(r.at or now)}
                for r in moved
            ]
    result.status["jobs"] = jobs_status
    result.extra_conditions.append((C.JOBS_REQUEUED, *victims.condition))
    return result


async def _no_plan_record(_: list[JobRecord]) -> None:
    return None


async def _no_event(reason: str, message: str, type_: str) -> None:
    return None


async def slurm_resume(
    slurm: BridgeSlurm | None, node: str, incident: str, *, force: bool = False
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
    todo = pods_to_evict(pods)
    counts = {"evicted": 0, "pdb_blocked": 0, "gone": 0, "forced": 0}
    if not todo:
        skipped = len(pods)
        return StepResult.done(
            C.DRAINED,
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
                C.DRAINED,
                "DrainTimedOut",
                f"{counts['pdb_blocked']} pod(s) on {node} still held by a PodDisruptionBudget "
                f"after {opts.timeout}; onTimeout=Alert: the node stays cordoned",
            ), counts
        return StepResult.wait(
            C.DRAINED,
            "PodDisruptionBudget",
            f"{counts['pdb_blocked']} pod(s) on {node} held by a PodDisruptionBudget; retrying",
            retry_after,
        ), counts
    return StepResult.wait(
        C.DRAINED,
        "Evicting",
        f"evicted {counts['evicted']}, forced {counts['forced']}; waiting for the pods to go",
        retry_after,
    ), counts


# ---- reset / reboot hooks ------------------------------------------------------------------
async def busy_pods(kube: Kube, node: str) -> list[str]:
    """Pods a reset would disturb (what a drain would evict), as namespace/name."""
    return [
        f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
        for p in pods_to_evict(await kube.pods_on_node(node))
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
    condition = C.RESET if action == "reset" else C.REBOOTED
    if hook.type is HookType.NOOP:
        return StepResult.done(condition, "NoopHook", f"{action} hook is Noop: nothing ran")
    if now - started > parse_duration(hook_timeout):
        return StepResult.failed(
            condition, "HookTimedOut", f"{action} hook did not finish in {hook_timeout}"
        )
    if hook.type is HookType.WEBHOOK and hook.webhook is not None:
        try:
            code = await post_webhook(
                hook.webhook.url,
                action=action,
                node=node,
                incident=incident,
                xid=xid,
                wait_s=parse_duration(hook.webhook.timeout).total_seconds(),
            )
        except HookUnreachable as exc:
            return StepResult.wait(condition, "HookUnreachable", str(exc), retry_after)
        if 200 <= code <= 299:
            return StepResult.done(condition, "HookSucceeded", f"{action} webhook: {code}")
        if code >= 500 or code == 429:
            return StepResult.wait(
                condition, "HookUnavailable", f"{action} webhook: {code}", retry_after
            )
        return StepResult.failed(condition, "HookRefused", f"{action} webhook: {code}")
    if hook.type is HookType.JOB and hook.job is not None:
        return await _job_hook(
            kube, hook, action=action, node=node, incident=incident, retry_after=retry_after
        )
    return StepResult.failed(condition, "HookInvalid", f"{action} hook has no {hook.type} block")


async def _job_hook(
    kube: Kube, hook: HookSpec, *, action: str, node: str, incident: str, retry_after: float
) -> StepResult:
    assert hook.job is not None
    condition = C.RESET if action == "reset" else C.REBOOTED
    name = f"{incident}-{action}"[:63].rstrip("-")
    ns = hook.job.namespace
    job = await kube.get_job(ns, name)
    if job is None:
        spec = _job_spec(hook.job.template, node=node, action=action, incident=incident)
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {NODE_LABEL: node}},
            "spec": spec,
        }
        await kube.create_job(ns, body)
        return StepResult.wait(condition, "HookRunning", f"Job {ns}/{name} created", retry_after)
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Complete" and c.get("status") == "True":
            return StepResult.done(condition, "HookSucceeded", f"Job {ns}/{name} completed")
        if c.get("type") == "Failed" and c.get("status") == "True":
            return StepResult.failed(
                condition, "HookFailed", f"Job {ns}/{name} failed: {c.get('message')}"
            )
    return StepResult.wait(condition, "HookRunning", f"Job {ns}/{name} running", retry_after)


def _job_spec(
    template: Mapping[str, Any], *, node: str, action: str, incident: str
) -> dict[str, Any]:
    """The template (a JobSpec) with NODE_NAME & co added to every container's env."""
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
async def replace(
    kube: Kube,
    slurm_of: Callable[[str], BridgeSlurm | None],
    pool: ReservePool | None,
    pool_name: str,
    nodes: Sequence[NodeView],
    *,
    node: str,
    incident: str,
    retry_after: float,
) -> StepResult:
    """Claim a spare (resourceVersion precondition), promote it, resume it in Slurm (through
    the bridge of the spare's own Slurm cluster, ``slurm_of(spare)``)."""
    if pool is None:
        return StepResult.wait(
            C.REPLACEMENT_CLAIMED, "PoolNotFound", f"ReservePool {pool_name} not found", retry_after
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
            C.REPLACEMENT_CLAIMED,
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
        annotations={REPLACES_ANNOTATION: node},
        remove_taints=frozenset(t.key for t in promo.remove_taints),
        current=current,
    )
    slurm_msg = ""
    if promo.slurm is not None and promo.slurm.resume:
        try:
            slurm = slurm_of(claim.node)
            slurm_msg = "; " + await slurm_resume(slurm, claim.node, incident, force=True)
        except UnknownCluster as exc:
            return StepResult.wait(
                C.REPLACEMENT_CLAIMED,
                "SlurmClusterUnknown",
                f"claimed {claim.node}; Slurm resume pending: {exc}",
                retry_after,
            )
        except SlurmUnavailable as exc:
            return StepResult.wait(
                C.REPLACEMENT_CLAIMED,
                "BridgeUnavailable",
                f"claimed {claim.node}; Slurm resume pending: {exc}",
                retry_after,
            )
    return StepResult.done(
        C.REPLACEMENT_CLAIMED,
        "SpareClaimed",
        f"{claim.node} from ReservePool {pool_name} promoted for {node}{slurm_msg}",
        replacementNode=claim.node,
    )


# ---- dispatch --------------------------------------------------------------------------------
def _started(rec: Recorder, condition: str) -> dt.datetime:
    """When this step first ran: its condition's transition to False (kept across restarts)."""
    since = rec.since(condition)
    return since if since is not None and not rec.holds(condition) else rec.now


async def execute(  # noqa: PLR0911
    rt: Runtime, nrem: NodeRemediation, rec: Recorder, step: Step, *, attempt: int
) -> StepResult:
    """Run `step` of the incident once."""
    kube = rt.require_kube()
    spec = nrem.spec
    name = nrem.metadata.name
    node = spec.node_name
    retry = rt.config.retry_interval
    now = rec.now
    xid = next((s.xid for s in reversed(spec.signals) if s.xid is not None), None)
    action = step.action
    if action is Action.CORDON:
        return await cordon(kube, node, name)
    if action is Action.SLURM_DRAIN:
        try:
            slurm = rt.slurm_for(node)
        except UnknownCluster as exc:
            return StepResult.wait(C.SLURM_DRAINED, "SlurmClusterUnknown", str(exc), retry)
        return await _slurm_drain_step(rt, slurm, nrem, rec, step, xid=xid, attempt=attempt)
    if action is Action.DRAIN:
        result, counts = await drain_pods(
            kube,
            node,
            step.drain_options(),
            started=_started(rec, C.DRAINED),
            now=now,
            retry_after=retry,
        )
        for what, n in counts.items():
            if n:
                rt.metrics.evictions.labels(what).inc(n)
        return result
    if action in (Action.RESET, Action.REBOOT):
        opts = step.reset if action is Action.RESET else step.reboot
        assert opts is not None
        cond = C.RESET if action is Action.RESET else C.REBOOTED
        if step.reset is not None and action is Action.RESET and step.reset.when_idle:
            busy = await busy_pods(kube, node)
            if busy:
                return StepResult.wait(
                    cond,
                    "WaitingForIdle",
                    f"reset when idle: {len(busy)} pod(s) still run on {node} "
                    f"({', '.join(busy[:3])})",
                    retry,
                )
        return await run_hook(
            kube,
            opts.hook,
            action=action.value,
            node=node,
            incident=name,
            xid=xid,
            started=_started(rec, cond),
            now=now,
            hook_timeout=opts.timeout,
            retry_after=retry,
        )
    if action is Action.REPLACE:
        assert step.replace is not None
        pool_name = step.replace.reserve_pool_ref.name
        return await replace(
            kube,
            rt.slurm_for,
            rt.pools.get(pool_name),
            pool_name,
            list(rt.nodes.values()),
            node=node,
            incident=name,
            retry_after=retry,
        )
    return StepResult.failed(C.DETECTED, "UnknownAction", f"no executor for {action}")


async def _slurm_drain_step(
    rt: Runtime,
    slurm: BridgeSlurm | None,
    nrem: NodeRemediation,
    rec: Recorder,
    step: Step,
    *,
    xid: int | None,
    attempt: int,
) -> StepResult:
    """`slurm_drain` with this incident's signal time, its recorded job plan, a way to record
    the plan before acting, and Events about its jobs posted on the incident."""
    kube = rt.require_kube()

    async def record_plan(records: list[JobRecord]) -> None:
        rec.merge({"jobs": [r.to_k8s() for r in records]})
        rec.condition(
            C.JOBS_REQUEUED,
            "False",
            "Requeueing",
            "requeueing job(s) "
            + ", ".join(r.job_id for r in records if r.outcome is JobOutcome.PLANNED),
        )
        await rec.write(kube)

    async def post_event(reason: str, message: str, type_: str) -> None:
        await kube.post_event(nrem.to_k8s(), reason=reason, message=message, type_=type_)

    return await slurm_drain(
        slurm,
        nrem.spec.node_name,
        nrem.metadata.name,
        xid,
        step.slurm_drain_options(),
        now=rec.now,
        attempt=attempt,
        signal_at=nrem.spec.signals[0].observed_at,
        recorded=rec.status.jobs,
        record_plan=record_plan,
        post_event=post_event,
    )


async def return_to_service(rt: Runtime, nrem: NodeRemediation, decision: Act) -> str:
    """Undo what gpuheal did (only that): uncordon, resume in Slurm. Says what happened."""
    node = nrem.spec.node_name
    name = nrem.metadata.name
    messages = []
    if decision.uncordon:
        messages.append(await uncordon(rt.require_kube(), node, name))
    else:
        messages.append(f"{node}: cordon was not gpuheal's, left as it is")
    if decision.resume_slurm:
        try:
            messages.append(await slurm_resume(rt.slurm_for(node), node, name))
        except UnknownCluster as exc:
            messages.append(f"not resumed in Slurm: {exc}")
    return "; ".join(messages)
