"""One idempotent executor per remediation action. Each looks at the world first (through
the adapters) and says what happened as a `StepResult`: the step's condition, its reason and
message, and what to merge into status. Running one twice (after a restart) repeats nothing
harmful.

The engine decides *whether* and *when* a step runs; the driver records the result.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import yaml

from gpuheal import crashpoints
from gpuheal.adapters.hooks import HookUnreachable, post_webhook
from gpuheal.adapters.kube import ApiError, CordonOutcome, Kube, UncordonOutcome
from gpuheal.adapters.slurm import (
    BridgeSlurm,
    SlurmConflict,
    SlurmError,
    SlurmNotFound,
    SlurmUnavailable,
    UnknownCluster,
)
from gpuheal.api.devicequarantine import (
    DEVICE_TAINT_KEY,
    DeviceSlurmJobs,
    QuarantinedDevice,
    QuarantineDeviceOptions,
)
from gpuheal.api.meta import find_condition, parse_duration, parse_time, rfc3339
from gpuheal.api.names import (
    CLAIMED_AT_ANNOTATION,
    CLAIMED_BY_LABEL,
    NODE_LABEL,
    REPLACES_ANNOTATION,
    RETIRED_LABEL,
    RETIRED_WHY_ANNOTATION,
    UNHEALTHY_TAINT,
    JobOutcome,
    Reason,
)
from gpuheal.api.names import NremCondition as C
from gpuheal.api.noderemediation import (
    CheckpointedJob,
    JobRecord,
    NodeRemediation,
    RepairRecord,
    VerificationRecord,
)
from gpuheal.api.remediationpolicy import (
    Action,
    CheckpointOptions,
    CheckType,
    CordonTaint,
    DrainOptions,
    DrainTimeoutAction,
    HookSpec,
    HookType,
    JobHook,
    NodeConditionCheck,
    RebootOptions,
    ResetOptions,
    SlurmDrainOptions,
    Step,
    VerificationCheck,
)
from gpuheal.api.remediationpolicy import RequeueMode as PolicyRequeue
from gpuheal.api.reservepool import ReservePool, TaintEffect
from gpuheal.policy import devicequarantine as dq
from gpuheal.policy import idle, pods_to_evict, spare_candidates
from gpuheal.policy.repair import reboot_proof, reset_proof
from gpuheal.policy.snapshot import calls_webhook, policy_step
from gpuheal.policy.spares import Unavailable, slurm_unavailable, spare_unavailable
from gpuheal.policy.types import Act, NodeView
from gpuheal.remediation.record import Recorder
from gpuheal.remediation.state import ClusterView, Ports
from gpuheal.remediation.victims import PostEvent, RecordPlan, base_options, requeue_victims
from gpuheal.xid.identity import (
    GPU_MAP_ANNOTATION,
    GPU_REPORT_ANNOTATION,
    GpuMap,
    GpuReport,
    parse_gpu_map,
    parse_gpu_report,
)
from gpuheal_bridge.api.models import (
    CheckpointSignal,
    DrainOutcome,
    DrainResponse,
    JobSignalOutcome,
    JobState,
    RequeueOptions,
    ResumeOutcome,
)
from gpuheal_bridge.api.models import JobOutcome as BridgeOutcome

log = logging.getLogger("gpuheal.adapters.steps")


@dataclass
class StepResult:
    """``done``: the step's condition is True and the incident moves on. ``skipped``: the
    step did nothing (nothing to act on, not configured): its condition is False with the
    reason, and the incident moves on all the same; never ``done`` with an excuse.
    ``wait``: look again after ``retry_after`` seconds (and say why). ``failed``: stop; a
    person must look."""

    kind: str  # done | skipped | wait | failed
    condition: str
    reason: str
    message: str
    retry_after: float = 0.0
    status: dict[str, Any] = field(default_factory=dict)  # extra status fields to merge
    extra_conditions: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: when the step's effect happened, if the world says so (the bridge's time of the drain
    #: or requeue), not when it is recorded: the step may wait on afterwards, or be recorded
    #: only after an API server outage
    at: dt.datetime | None = None

    @classmethod
    def done(cls, condition: str, reason: str, message: str, **status: Any) -> StepResult:
        return cls("done", condition, reason, message, status=status)

    @classmethod
    def skipped(cls, condition: str, reason: str, message: str, **status: Any) -> StepResult:
        return cls("skipped", condition, reason, message, status=status)

    @property
    def moves_on(self) -> bool:
        """The incident goes to its next step (the step happened, or there was nothing to do)."""
        return self.kind in ("done", "skipped")

    @classmethod
    def wait(cls, condition: str, reason: str, message: str, retry_after: float) -> StepResult:
        return cls("wait", condition, reason, message, retry_after=retry_after)

    @classmethod
    def failed(cls, condition: str, reason: str, message: str) -> StepResult:
        return cls("failed", condition, reason, message)


# ---- cordon --------------------------------------------------------------------------------
async def cordon(
    kube: Kube, node: str, incident: str, taint: CordonTaint | None = None
) -> StepResult:
    outcome = await kube.cordon(node, incident, taint_effect=taint.value if taint else None)
    if outcome is CordonOutcome.BY_OTHER:
        return StepResult.done(
            C.CORDONED,
            "AlreadyCordonedByOther",
            f"{node} was already cordoned by someone else; gpuheal will not uncordon it",
            ownership={"cordoned": False},
        )
    tainted = f", tainted {UNHEALTHY_TAINT}:{taint.value}" if taint else ""
    return StepResult.done(
        C.CORDONED,
        "Cordoned",
        f"{node} cordoned by gpuheal ({incident}){tainted}",
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
def _bridge_delay(attempt: int, retry_after: float | None = None) -> float:
    """When to call a bridge that did not answer again: its Retry-After, else 1, 2, 4 ... 60 s."""
    return retry_after or min(60.0, 2.0 ** min(attempt, 6))


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
        return StepResult.skipped(
            C.SLURM_DRAINED,
            "SlurmNotConfigured",
            "nothing drained in Slurm: no Slurm bridge configured (--bridge-url)",
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
        return StepResult.skipped(
            C.SLURM_DRAINED, "NotASlurmNode", f"nothing drained: Slurm does not know {node}"
        )
    except SlurmUnavailable as exc:
        delay = _bridge_delay(attempt, exc.retry_after)
        return StepResult.wait(C.SLURM_DRAINED, Reason.BRIDGE_UNAVAILABLE, str(exc), delay)
    except SlurmError as exc:
        return StepResult.failed(C.SLURM_DRAINED, "BridgeError", str(exc))
    ours = resp.outcome is not DrainOutcome.DRAINED_BY_OTHER
    reason, drained = drain_outcome(resp)
    if opts.requeue is PolicyRequeue.NONE:
        result = StepResult.done(C.SLURM_DRAINED, reason, drained, ownership={"slurmDrained": ours})
        result.at = _acted_at(resp.at)
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
        delay = _bridge_delay(attempt, exc.retry_after)
        return StepResult.wait(
            C.SLURM_DRAINED, Reason.BRIDGE_UNAVAILABLE, f"{drained}; {exc}", delay
        )
    jobs_status = [r.to_k8s() for r in victims.records]
    if victims.retry is not None:
        delay = _bridge_delay(attempt)
        result = StepResult.wait(
            C.SLURM_DRAINED, Reason.BRIDGE_UNAVAILABLE, f"{drained}; {victims.retry}", delay
        )
    else:
        moved = [r for r in victims.records if r.outcome in (JobOutcome.REQUEUED, JobOutcome.HELD)]
        requeued = f"; requeued {len(moved)} job(s)" if moved else ""
        result = StepResult.done(
            C.SLURM_DRAINED, reason, drained + requeued, ownership={"slurmDrained": ours}
        )
        result.at = _acted_at(resp.at, *(r.at for r in moved))
        if moved:
            result.status["requeuedJobs"] = [
                {"jobId": r.job_id, "name": r.name, "requeuedAt": rfc3339(r.at or now)}
                for r in moved
            ]
    result.status["jobs"] = jobs_status
    result.extra_conditions.append((C.JOBS_REQUEUED, *victims.condition))
    return result


async def checkpoint(  # noqa: PLR0911 - one return per outcome
    slurm: BridgeSlurm | None,
    node: str,
    incident: str,
    opts: CheckpointOptions,
    *,
    attempt: int,
    recorded: Sequence[CheckpointedJob] = (),
    record: Callable[[list[CheckpointedJob]], Awaitable[None]] | None = None,
) -> StepResult:
    """Ask the node's running Slurm jobs to checkpoint now: the bridge's signal alone, no
    requeue, no drain. Each job is signalled once per incident: those in ``recorded`` (the
    status, kept across restarts) are not signalled again, and each signal is recorded
    (``record``) before the next; the bridge's idempotency key (one per incident and job)
    answers a call repeated after a crash from its first answer, without a second signal."""
    if slurm is None:
        return StepResult.skipped(
            C.CHECKPOINTED,
            "SlurmNotConfigured",
            "no job asked to checkpoint: no Slurm bridge configured (--bridge-url)",
        )
    try:
        jobs = (await slurm.jobs(node)).jobs
    except SlurmNotFound:
        return StepResult.skipped(
            C.CHECKPOINTED,
            "NotASlurmNode",
            f"no job asked to checkpoint: Slurm does not know {node}",
        )
    except SlurmUnavailable as exc:
        delay = _bridge_delay(attempt, exc.retry_after)
        return StepResult.wait(C.CHECKPOINTED, Reason.BRIDGE_UNAVAILABLE, str(exc), delay)
    except SlurmError as exc:
        return StepResult.failed(C.CHECKPOINTED, "BridgeError", str(exc))
    done = list(recorded)
    asked = {j.job_id for j in done}
    left: list[str] = []
    for job in jobs:
        jid = str(job.job_id)
        if job.state != "RUNNING" or jid in asked:
            continue
        try:
            answer = await slurm.signal_job(
                job.job_id,
                from_node=node,
                signal=opts.signal,
                idempotency_key=f"{incident}-checkpoint-{jid}",
            )
        except SlurmNotFound:
            left.append(f"{jid} (gone)")
            continue
        except SlurmUnavailable as exc:
            delay = _bridge_delay(attempt, exc.retry_after)
            return StepResult.wait(C.CHECKPOINTED, Reason.BRIDGE_UNAVAILABLE, str(exc), delay)
        except SlurmError as exc:
            return StepResult.failed(C.CHECKPOINTED, "BridgeError", f"job {jid}: {exc}")
        if answer.outcome is not JobSignalOutcome.SIGNALLED:
            left.append(f"{jid} ({answer.outcome.value})")
            continue
        done.append(
            CheckpointedJob(job_id=jid, signal=opts.signal, signalled_at=answer.signalled_at)
        )
        asked.add(jid)
        if record is not None:
            await record(done)
    status = {"checkpointedJobs": [j.to_k8s() for j in done]}
    not_asked = f"; not signalled: {', '.join(left)}" if left else ""
    if not done:
        return StepResult.skipped(
            C.CHECKPOINTED,
            "NoRunningJobs",
            f"no job asked to checkpoint: none runs on {node}{not_asked}",
            **status,
        )
    ids = ", ".join(j.job_id for j in done)
    result = StepResult.done(
        C.CHECKPOINTED,
        "CheckpointRequested",
        f"asked {len(done)} job(s) to checkpoint now ({opts.signal}): {ids}; left running "
        f"on {node}, not requeued{not_asked}",
        **status,
    )
    result.at = _acted_at(*(j.signalled_at for j in done))
    return result


def drain_outcome(resp: DrainResponse) -> tuple[str, str]:
    """The SlurmDrained reason and message for the bridge's answer. A node that was only
    DOWN (not responding, or set DOWN) is drained by gpuheal like one in service, and the
    status says so: Slurm would have put it back in service by itself once its slurmd
    answered again (ReturnToService), with the fault still there."""
    slurm_node, prev, cur = resp.slurm_node, resp.previous, resp.current
    if resp.outcome is DrainOutcome.DRAINED and prev.unavailable and not prev.drain:
        was = "+".join([prev.state, *prev.flags])
        why = f", reason {prev.reason!r}" if prev.reason else ""
        return "DrainedWasDown", (
            f"Slurm node {slurm_node} was {was}{why}: drained by gpuheal (reason "
            f"{cur.reason!r}) so that Slurm does not return it to service when slurmd answers"
        )
    reason = {
        DrainOutcome.DRAINED: "Drained",
        DrainOutcome.ALREADY_DRAINED: "AlreadyDrained",
        DrainOutcome.DRAINED_BY_OTHER: "DrainedByOther",
    }[resp.outcome]
    if resp.outcome is DrainOutcome.DRAINED_BY_OTHER:
        who = f"{cur.reason_user}: " if cur.reason_user else ""
        return reason, (
            f"Slurm node {slurm_node} already drained by someone else ({who}{cur.reason!r}): "
            "left as it is; gpuheal will not resume it"
        )
    return reason, f"Slurm node {slurm_node}: {resp.outcome.value} (reason {cur.reason!r})"


def _acted_at(*times: dt.datetime | None) -> dt.datetime | None:
    """When Slurm last acted for the step, as the bridge said (None: the bridge did not say):
    the time the step's condition and timeline entry carry. It is when the requeue was
    accepted, not when the bridge had seen the job off its node and PENDING (about 1.8 s
    later on a quiet cluster: Slurm's SIGTERM, KillWait and epilog), nor when it was
    recorded (later still after an API server outage). The recorder keeps it no later than
    its own clock."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


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
    lifted = resp.exclusion_lifted_from
    no_longer = (
        f"; no longer excluded from jobs {', '.join(map(str, lifted[:10]))}" if lifted else ""
    )
    return f"Slurm {resp.slurm_node}: {resp.outcome.value}{no_longer}"


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
            Reason.POD_DISRUPTION_BUDGET,
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
async def work_on_node(
    ports: Ports, cluster: ClusterView, node: str, action: Action, cond: str
) -> StepResult | None:
    """Before a reset or reboot is asked for: None when no Slurm job (the bridge's list of
    the node's jobs) and no pod a drain would evict is on the node, else the wait that says
    which (`policy.idle.work_on_node` decides). Without a bridge, or on a node Slurm does not
    know, only the pods count; a bridge that cannot answer is a wait, never "idle"."""
    retry = ports.config.retry_interval
    jobs: list[JobState] = []
    try:
        bridge = ports.slurm_for(cluster, node)
        if bridge is not None:
            jobs = (await bridge.jobs(node)).jobs
    except UnknownCluster as exc:
        return StepResult.wait(cond, Reason.SLURM_CLUSTER_UNKNOWN, str(exc), retry)
    except SlurmNotFound:
        jobs = []
    except SlurmUnavailable as exc:
        return StepResult.wait(
            cond, Reason.BRIDGE_UNAVAILABLE, f"cannot list {node}'s Slurm jobs: {exc}", retry
        )
    except SlurmError as exc:
        return StepResult.failed(cond, "BridgeError", f"cannot list {node}'s Slurm jobs: {exc}")
    pods = await ports.require_kube().pods_on_node(node)
    busy = idle.work_on_node(action.value, node, pods=pods, jobs=jobs)
    return None if busy is None else StepResult.wait(cond, busy.reason, busy.message, retry)


@dataclass(frozen=True)
class NodeJobs:
    """Where Job hooks and checks run when their policy names no namespace
    (``--node-jobs-namespace``), and whether an inline ``template`` may run at all
    (``--inline-job-templates``): without it only ``templateFrom`` (the chart's ConfigMap,
    which its admission policy matches) creates a Job."""

    namespace: str | None = None
    inline_templates: bool = False

    @classmethod
    def of(cls, ports: Ports) -> NodeJobs:
        cfg = ports.config
        return cls(cfg.node_jobs_namespace, cfg.inline_job_templates)


#: The reason of a step whose Job hook or check is an inline template the operator refuses.
INLINE_TEMPLATE_OFF = "InlineJobTemplateDisabled"


def _inline_refused(job_hook: JobHook, jobs: NodeJobs) -> str | None:
    """Why this Job may not be created (an inline template, not allowed), or None."""
    if job_hook.template is None or jobs.inline_templates:
        return None
    return (
        "the policy gives its Job inline (hook.job.template) and this operator runs no inline "
        "templates (--inline-job-templates, chart nodeJobs.inlineTemplates: off by default): "
        "no Job created. Use templateFrom (the chart's gpuheal-node-jobs) or turn it on "
        "(docs/security.md)"
    )


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
    job_name: str | None = None,
    power_cycle: bool = False,
    jobs: NodeJobs = NodeJobs(),
    gpu: str | None = None,
) -> StepResult:
    """The reset/reboot contract: a Webhook POST or a Job; ``Noop`` runs nothing, so the
    step is skipped (its condition False, `NoopHook`), never taken for a repair.
    ``done`` here means the hook reported success; `repair` then verifies it happened.

    Webhook: ``POST url`` with ``{"action", "node", "incident", "xid"}`` and header
    ``Idempotency-Key: <incident>-<action>``; any 2xx is success, the receiver must treat
    a repeated key as the same request. Job: ``<incident>-<action>`` in the hook's namespace
    from the template, env ``NODE_NAME``/``GPUHEAL_ACTION``/``GPUHEAL_INCIDENT``; success
    when the Job reports Complete, failure when it reports Failed. A reboot with
    ``powerCycle`` adds ``"powerCycle": true`` to the request (env
    ``GPUHEAL_POWER_CYCLE=true``): the hook must power-cycle the node (its BMC) or fail,
    never reboot it warm instead. A reset of the one GPU a ``quarantineDevice`` step took
    out names it (``gpu``): ``"gpu": "<PCI address>"`` (env ``GPUHEAL_GPU``), so the hook
    can reset that GPU alone. An inline Job template the operator does not allow
    (``jobs``) is skipped: nothing ran, the node was not repaired.
    """
    condition = C.RESET if action == "reset" else C.REBOOTED
    skipped = hook_skipped(hook, condition, action, jobs)
    if skipped is not None:
        return skipped
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
                power_cycle=power_cycle,
                gpu=gpu,
            )
        except HookUnreachable as exc:
            return StepResult.wait(condition, Reason.HOOK_UNREACHABLE, str(exc), retry_after)
        if 200 <= code <= 299:
            return StepResult.done(condition, "HookSucceeded", f"{action} webhook: {code}")
        if code >= 500 or code == 429:
            return StepResult.wait(
                condition, Reason.HOOK_UNAVAILABLE, f"{action} webhook: {code}", retry_after
            )
        return StepResult.failed(condition, "HookRefused", f"{action} webhook: {code}")
    if hook.type is HookType.JOB and hook.job is not None:
        return await _job_hook(
            kube,
            hook.job,
            condition=condition,
            action=action,
            node=node,
            incident=incident,
            name=job_name or job_name_for(incident, action),
            retry_after=retry_after,
            power_cycle=power_cycle,
            jobs=jobs,
            gpu=gpu,
        )
    return StepResult.failed(condition, "HookInvalid", f"{action} hook has no {hook.type} block")


def hook_skipped(hook: HookSpec, condition: str, action: str, jobs: NodeJobs) -> StepResult | None:
    """A hook that will run nothing: ``Noop``, or an inline Job template the operator does
    not allow (skipped, with the reason and what to do, rather than a Job created)."""
    if hook.type is HookType.NOOP:
        return noop_skipped(condition, action)
    if hook.type is HookType.JOB and hook.job is not None:
        refused = _inline_refused(hook.job, jobs)
        if refused is not None:
            return StepResult.skipped(condition, INLINE_TEMPLATE_OFF, f"{action} hook: {refused}")
    return None


def noop_skipped(condition: str, action: str) -> StepResult:
    """A ``Noop`` hook runs nothing: the step is skipped (the node was not repaired) and the
    incident goes on with what its rung says next; the engine counts no repair for it."""
    return StepResult.skipped(
        condition, "NoopHook", f"{action} hook is Noop: nothing ran, the node was not repaired"
    )


def job_name_for(incident: str, suffix: str) -> str:
    """`<incident>-<suffix>`, shortened (with a hash of the incident) to fit 63 characters."""
    name = f"{incident}-{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(incident.encode()).hexdigest()[:8]
    return f"{incident[: 63 - len(suffix) - 10].rstrip('-')}-{digest}-{suffix}"


async def _job_hook(  # noqa: PLR0911 - one exit per outcome
    kube: Kube,
    job_hook: JobHook,
    *,
    condition: str,
    action: str,
    node: str,
    incident: str,
    name: str,
    retry_after: float,
    power_cycle: bool = False,
    jobs: NodeJobs,
    gpu: str | None = None,
) -> StepResult:
    """Create the Job once, then follow it: Complete is done, Failed is failed (its exit
    code said so). The namespace is the hook's, else the operator's node-jobs namespace."""
    ns = job_hook.namespace or jobs.namespace
    if ns is None:
        return StepResult.failed(
            condition,
            "HookInvalid",
            "hook.job.namespace is not set and the operator has no --node-jobs-namespace "
            "(the chart sets it): nowhere to create the Job",
        )
    refused = _inline_refused(job_hook, jobs)
    if refused is not None:
        return StepResult.failed(condition, INLINE_TEMPLATE_OFF, refused)
    job = await kube.get_job(ns, name)
    if job is None:
        template = await _template(kube, job_hook, ns)
        if isinstance(template, str):
            return StepResult.failed(condition, "HookInvalid", template)
        spec = _job_spec(
            template,
            node=node,
            action=action,
            incident=incident,
            pin=job_hook.run_on_node,
            power_cycle=power_cycle,
            gpu=gpu,
        )
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {NODE_LABEL: node[:63]}},
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


async def _template(kube: Kube, job_hook: JobHook, ns: str) -> dict[str, Any] | str:
    """The JobSpec: inline, or from the ConfigMap key in ``ns`` (a str says what is wrong)."""
    if job_hook.template is not None:
        return dict(job_hook.template)
    ref = job_hook.template_from
    assert ref is not None  # the model (and CEL) require one of the two
    cm = await kube.get_configmap(ns, ref.name)
    raw = ((cm or {}).get("data") or {}).get(ref.key)
    if raw is None:
        return f"ConfigMap {ns}/{ref.name} has no key {ref.key}"
    try:
        loaded = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        return f"ConfigMap {ns}/{ref.name} key {ref.key} is not YAML: {exc}"
    if not isinstance(loaded, dict):
        return f"ConfigMap {ns}/{ref.name} key {ref.key} is not a JobSpec"
    return loaded


def _job_spec(
    template: Mapping[str, Any],
    *,
    node: str,
    action: str,
    incident: str,
    pin: bool = False,
    power_cycle: bool = False,
    gpu: str | None = None,
) -> dict[str, Any]:
    """The template (a JobSpec) with NODE_NAME & co added to every container's env; with
    ``pin``, its pod runs on the node (spec.nodeName: the scheduler and the node's cordon do
    not apply) and tolerates every taint (the node is tainted or cordoned now)."""
    spec = copy.deepcopy(dict(template))
    pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
    pod_spec.setdefault("restartPolicy", "Never")
    if pin:
        pod_spec["nodeName"] = node
        pod_spec.pop("nodeSelector", None)
        pod_spec.pop("affinity", None)
        tolerations = pod_spec.setdefault("tolerations", [])
        if {"operator": "Exists"} not in tolerations:
            tolerations.append({"operator": "Exists"})
    env = [
        {"name": "NODE_NAME", "value": node},
        {"name": "GPUHEAL_ACTION", "value": action},
        {"name": "GPUHEAL_INCIDENT", "value": incident},
    ]
    if power_cycle:
        env.append({"name": "GPUHEAL_POWER_CYCLE", "value": "true"})
    if gpu:
        env.append({"name": "GPUHEAL_GPU", "value": gpu})
    for container in pod_spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *env]
    return spec


# ---- replace -------------------------------------------------------------------------------
async def replace(  # noqa: PLR0917 - the pool, its nodes and what Slurm said of them
    kube: Kube,
    slurm_of: Callable[[str], BridgeSlurm | None],
    pool: ReservePool | None,
    pool_name: str,
    nodes: Sequence[NodeView],
    out_in_slurm: MutableMapping[str, Unavailable],
    *,
    node: str,
    incident: str,
    retry_after: float,
) -> StepResult:
    """Claim a spare (resourceVersion precondition), resume it in Slurm (through the bridge
    of the spare's own Slurm cluster, ``slurm_of(spare)``), then promote it.

    A spare someone else keeps out is never chosen (`spare_candidates`: cordoned, or kept
    out in Slurm as ``out_in_slurm`` says) and never resumed: the bridge resumes a spare only
    while its drain is the pool's own (``reserveReason``), checked under its lock. A spare it
    refuses (drained meanwhile) goes back unclaimed and unpromoted, is noted in
    ``out_in_slurm`` (the pool's status names it) and the next one is tried."""
    if pool is None:
        return StepResult.wait(
            C.REPLACEMENT_CLAIMED,
            Reason.POOL_NOT_FOUND,
            f"ReservePool {pool_name} not found",
            retry_after,
        )
    promo = pool.spec.promotion
    skipped: list[str] = []
    for _ in range(len(nodes) + 1):  # each turn claims a spare or notes one as out
        names = spare_candidates(pool, nodes, node, out_in_slurm)
        bodies = []
        for name in names[:8]:
            body = await kube.get_node(name)
            if body is not None:
                bodies.append(body)
        claim = await kube.claim_spare(incident, bodies)
        if claim is None:
            return StepResult.wait(
                C.REPLACEMENT_CLAIMED,
                Reason.NO_SPARE_AVAILABLE,
                _no_spare(pool, pool_name, nodes, node, out_in_slurm, skipped),
                retry_after,
            )
        slurm_msg = ""
        if promo.slurm is not None and promo.slurm.resume:
            try:
                slurm_msg = "; " + await _resume_spare(
                    slurm_of(claim.node), claim.node, incident, promo.slurm.reserve_reason
                )
            except SlurmConflict as exc:
                why = _refused(exc, promo.slurm.reserve_reason)
                out_in_slurm[claim.node] = why
                skipped.append(f"{claim.node} ({why.message})")
                await kube.patch_node_metadata(
                    claim.node,
                    labels={CLAIMED_BY_LABEL: None},
                    annotations={CLAIMED_AT_ANNOTATION: None},
                )
                continue
            except UnknownCluster as exc:
                return StepResult.wait(
                    C.REPLACEMENT_CLAIMED,
                    Reason.SLURM_CLUSTER_UNKNOWN,
                    f"claimed {claim.node}; Slurm resume pending: {exc}",
                    retry_after,
                )
            except SlurmUnavailable as exc:
                return StepResult.wait(
                    C.REPLACEMENT_CLAIMED,
                    Reason.BRIDGE_UNAVAILABLE,
                    f"claimed {claim.node}; Slurm resume pending: {exc}",
                    retry_after,
                )
        current = await kube.get_node(claim.node)
        labels: dict[str, str | None] = dict(promo.set_labels)
        labels.update({k: None for k in promo.remove_labels})
        crashpoints.at("promote", "before")
        await kube.patch_node_metadata(
            claim.node,
            labels=labels,
            annotations={REPLACES_ANNOTATION: node},
            remove_taints=frozenset(t.key for t in promo.remove_taints),
            current=current,
        )
        crashpoints.at("promote", "after")
        passed = f"; passed over {', '.join(skipped)}" if skipped else ""
        return StepResult.done(
            C.REPLACEMENT_CLAIMED,
            "SpareClaimed",
            f"{claim.node} from ReservePool {pool_name} promoted for {node}{slurm_msg}{passed}",
            replacementNode=claim.node,
        )
    return StepResult.wait(
        C.REPLACEMENT_CLAIMED,
        Reason.NO_SPARE_AVAILABLE,
        _no_spare(pool, pool_name, nodes, node, out_in_slurm, skipped),
        retry_after,
    )


async def _resume_spare(
    slurm: BridgeSlurm | None, spare: str, incident: str, reserve_reason: str
) -> str:
    """Resume the spare only while its Slurm drain is the pool's (SlurmConflict otherwise)."""
    if slurm is None:
        return "no Slurm bridge"
    try:
        resp = await slurm.resume(
            spare,
            incident=None,
            reserve_reason=reserve_reason,
            idempotency_key=f"{incident}-slurm-resume-{spare}",
        )
    except SlurmNotFound:
        return f"Slurm does not know {spare}"
    return f"Slurm {resp.slurm_node}: {resp.outcome.value}"


def _refused(exc: SlurmConflict, reserve_reason: str) -> Unavailable:
    """Why the bridge would not resume a spare, from the state it saw."""
    why = slurm_unavailable(exc.current, reserve_reason) if exc.current else None
    return why or Unavailable(Reason.DRAINED_IN_SLURM, f"resume refused: {exc}"[:512])


def _no_spare(  # noqa: PLR0917
    pool: ReservePool,
    pool_name: str,
    nodes: Sequence[NodeView],
    broken: str,
    out_in_slurm: Mapping[str, Unavailable],
    skipped: Sequence[str],
) -> str:
    """No spare to promote, and why each node of the pool is out (the first few)."""
    outs = [
        f"{v.name} {why.reason} ({why.message})"
        for v in nodes
        if v.name != broken
        and pool.spec.node_selector.matches(dict(v.labels))
        and v.claimed_by is None
        and (why := spare_unavailable(v, out_in_slurm)) is not None
    ]
    detail = f": {'; '.join(sorted(outs)[:5])}" if outs else ""
    refused = f"; refused now: {', '.join(skipped)}" if skipped else ""
    return f"no spare in ReservePool {pool_name} can be promoted{detail}{refused}"[:1024]


# ---- reset / reboot, verified ---------------------------------------------------------------
GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


def _repair_record(rec: Recorder, action: Action) -> RepairRecord | None:
    """This rung's request for `action`, unless it failed (then a new one is asked for)."""
    record = rec.status.repair
    if record is None or record.rung != rec.status.rung or record.action != action.value:
        return None
    return None if record.failed_at is not None else record


def _gpu_map(body: Mapping[str, Any] | None) -> GpuMap:
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return parse_gpu_map(annotations.get(GPU_MAP_ANNOTATION))


def _gpu_report(body: Mapping[str, Any] | None) -> GpuReport | None:
    annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
    return parse_gpu_report(annotations.get(GPU_REPORT_ANNOTATION))


def _boot_id(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("status") or {}).get("nodeInfo", {}).get("bootID") or "")


def gpus_back(body: Mapping[str, Any] | None) -> tuple[bool, str]:
    """Ready, and every GPU allocatable again (as many as the node's GPU count label, else
    its capacity): what "the GPU came back" means to Kubernetes."""
    if body is None:
        return False, "node not found"
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if not ready:
        return False, "node not Ready"
    labels = (body.get("metadata") or {}).get("labels") or {}
    want = labels.get(GPU_COUNT_LABEL) or (status.get("capacity") or {}).get(GPU_RESOURCE)
    have = (status.get("allocatable") or {}).get(GPU_RESOURCE)
    if want is None:
        return True, "Ready (no GPU resource to count)"
    if have is None or int(have) < int(want):
        return False, f"{have or 0} of {want} GPUs allocatable"
    return True, f"Ready, {have} of {want} GPUs allocatable"


async def repair(  # noqa: PLR0917, PLR0911 - one exit per verified outcome
    ports: Ports,
    cluster: ClusterView,
    nrem: NodeRemediation,
    rec: Recorder,
    action: Action,
    opts: ResetOptions | RebootOptions,
    *,
    xid: int | None,
) -> StepResult:
    """A reset or reboot, asked for once per rung and then *verified* on the node
    (`policy.repair`): a reboot by a new boot ID (node.status.nodeInfo.bootID) or Slurm's
    new BootTime, a reset by the agent reporting the same GPUs again after it and no XID for
    `settle`; both with the node Ready and every GPU allocatable. A hook's exit code or 2xx
    alone is never taken for it; the request and what proves it are kept in status.repair,
    written before the hook runs (restarts)."""
    kube = ports.require_kube()
    cond = C.RESET if action is Action.RESET else C.REBOOTED
    node, name, rung = nrem.spec.node_name, nrem.metadata.name, rec.status.rung
    hook = opts.hook
    retry = ports.config.retry_interval
    # Before the request is recorded: a hook that runs nothing asks for no repair.
    skipped = hook_skipped(hook, cond, action.value, NodeJobs.of(ports))
    if skipped is not None:
        return skipped
    record = _repair_record(rec, action)
    if record is None:
        body = await kube.get_node(node)
        boot_id = _boot_id(body)
        gpus = dict(_gpu_map(body).by_pci)
        reports = _gpu_report(body) is not None
        # What would prove the repair, recorded before it; without it, nothing could.
        if action is Action.REBOOT and hook.type is not HookType.SLURM and not boot_id:
            return StepResult.failed(
                cond,
                "NoBootID",
                f"{node} reports no boot ID (status.nodeInfo.bootID): a reboot of it could "
                "not be verified, so none is asked for",
            )
        if action is Action.RESET and not (gpus and reports):
            return StepResult.failed(
                cond,
                "NoGpuReport",
                f"no gpuheal agent (with NVML) reports {node}'s GPUs (annotations "
                f"{GPU_MAP_ANNOTATION}, {GPU_REPORT_ANNOTATION}): a reset could not be "
                "verified, so none is asked for",
            )
        record = RepairRecord(
            action=action.value,
            rung=rung,
            via=hook.type.value,
            requested_at=rec.now,
            boot_id_before=boot_id or None,
            gpus_before=gpus if action is Action.RESET else {},
            power_cycle=isinstance(opts, RebootOptions) and opts.asks_power_cycle,
        )
        # On record before the hook runs: a restart in between compares with the boot ID
        # from before the reboot, never with one read after it.
        rec.merge({"repair": record.to_k8s()})
        await rec.write(kube)
    status: dict[str, Any] = {}
    if record.hook_done_at is None:
        if hook.type is HookType.SLURM:
            try:
                bridge = ports.slurm_for(cluster, node)
            except UnknownCluster as exc:
                return StepResult.wait(cond, Reason.SLURM_CLUSTER_UNKNOWN, str(exc), retry)
            asked = await _slurm_reboot(bridge, node, name, xid, rung)
            if isinstance(asked, StepResult):
                return asked
            record = record.model_copy(
                update={"slurm_boot_time_before": asked, "hook_done_at": rec.now}
            )
        else:
            ran = await run_hook(
                kube,
                hook,
                action=action.value,
                node=node,
                incident=name,
                xid=xid,
                started=record.requested_at,
                now=rec.now,
                hook_timeout=opts.timeout,
                retry_after=retry,
                job_name=job_name_for(name, f"{action.value}-{rung}"),
                power_cycle=record.power_cycle,
                jobs=NodeJobs.of(ports),
                gpu=_quarantined_gpu(nrem) if action is Action.RESET else None,
            )
            if ran.kind != "done":
                ran.status["repair"] = record.to_k8s()
                return ran
            record = record.model_copy(update={"hook_done_at": rec.now})
        status["repair"] = record.to_k8s()
    settle = parse_duration(opts.settle) if isinstance(opts, ResetOptions) else dt.timedelta()
    seen, what = await _repaired(ports, cluster, node, action, record, now=rec.now, settle=settle)
    if seen is True:
        verified = record.model_copy(update={"verified_at": rec.now, "message": what[:1024]})
        reason = (
            "SlurmRebooted"
            if hook.type is HookType.SLURM
            else ("BootIDChanged" if action is Action.REBOOT else "GpusReported")
        )
        return StepResult.done(cond, reason, f"{action} verified: {what}", repair=verified.to_k8s())
    if seen is False or rec.now - record.requested_at > parse_duration(opts.timeout):
        why = what if seen is False else f"not verified within {opts.timeout}: {what}"
        return StepResult.failed(cond, "NotVerified", f"{action} via {record.via}: {why}")
    result = StepResult.wait(cond, "Verifying", f"{action} via {record.via}: {what}", retry)
    result.status.update(status)
    return result


def _quarantined_gpu(nrem: NodeRemediation) -> str | None:
    """The PCI address of the GPU this incident holds out (a reset of it names it)."""
    held = nrem.status.quarantined_device
    return held.pci_bus_id if held is not None and held.released_at is None else None


async def _slurm_reboot(
    slurm: BridgeSlurm | None, node: str, incident: str, xid: int | None, rung: int
) -> str | StepResult | None:
    """Ask the bridge for `scontrol reboot` (once per rung: idempotency key); the node's
    BootTime before it (None: Slurm did not say), or what to record instead."""
    cond = C.REBOOTED
    if slurm is None:
        return StepResult.failed(cond, "SlurmNotConfigured", "Slurm reboot without a bridge")
    try:
        resp = await slurm.reboot(
            node, incident=incident, xid=xid, idempotency_key=f"{incident}-reboot-{rung}"
        )
    except SlurmUnavailable as exc:
        return StepResult.wait(cond, Reason.BRIDGE_UNAVAILABLE, str(exc), exc.retry_after or 5.0)
    except SlurmNotFound:
        return StepResult.failed(cond, "NotASlurmNode", f"Slurm does not know {node}")
    except SlurmError as exc:
        return StepResult.failed(cond, "SlurmRefused", str(exc))
    return resp.previous.boot_time


async def _repaired(  # noqa: PLR0911 - one exit per verdict
    ports: Ports,
    cluster: ClusterView,
    node: str,
    action: Action,
    record: RepairRecord,
    *,
    now: dt.datetime,
    settle: dt.timedelta,
) -> tuple[bool | None, str]:
    """(True: it happened / False: it failed / None: not yet, what was seen): the proof per
    action is `policy.repair`'s; the node Ready with its GPUs allocatable besides."""
    body = await ports.require_kube().get_node(node)
    back, gpus = gpus_back(body)
    if action is Action.REBOOT and record.via == HookType.SLURM.value:
        try:
            bridge = ports.slurm_for(cluster, node)
            assert bridge is not None  # the reboot went through it
            st = await bridge.node(node)
        except (SlurmUnavailable, UnknownCluster) as exc:
            return None, f"bridge unavailable: {exc}"
        if st.rebooting:
            return None, f"Slurm: {st.state}+{'+'.join(st.flags)}"
        if st.reason and "reboot timed out" in st.reason:
            return False, f"Slurm: {st.reason}"
        if not st.boot_time or st.boot_time == record.slurm_boot_time_before:
            return None, f"Slurm BootTime still {st.boot_time} ({st.state})"
        slurm_says = f"Slurm BootTime {record.slurm_boot_time_before} -> {st.boot_time}"
        return (True, f"{slurm_says}; {gpus}") if back else (None, f"{slurm_says}; {gpus}")
    if action is Action.REBOOT:
        proof, said = reboot_proof(record.boot_id_before, _boot_id(body))
    else:
        labels = ((body or {}).get("metadata") or {}).get("labels") or {}
        count = labels.get(GPU_COUNT_LABEL)
        proof, said = reset_proof(
            record.gpus_before,
            _gpu_report(body),
            reset_at=record.hook_done_at or record.requested_at,
            want_count=int(count) if count and count.isdecimal() else None,
            observations=cluster.node_history(node).observations,
            settle=settle,
            now=now,
        )  # fmt: skip
    if proof is True and not back:
        return None, f"{said}; {gpus}"
    return proof, f"{said}; {gpus}"


# ---- verification before return (returnToService.check) -------------------------------------
async def verify(  # noqa: PLR0911, PLR0912 - one exit per check type and verdict
    ports: Ports,
    nrem: NodeRemediation,
    rec: Recorder,
    check: VerificationCheck,
    *,
    restart: bool,
) -> StepResult:
    """Start (``restart``) or look at the policy's check on the node. ``done``: passed;
    ``failed``: the check says unhealthy (or gave no verdict in time); ``wait``: not yet.
    A new run is recorded in ``status["verification"]``."""
    kube = ports.require_kube()
    node, name, rung = nrem.spec.node_name, nrem.metadata.name, rec.status.rung
    cond, retry = C.VERIFIED, ports.config.retry_interval
    current = rec.status.verification
    run = current if current is not None and current.rung == rung else None
    if restart or run is None:
        attempt = run.attempt + 1 if run is not None else 1
        new = VerificationRecord(rung=rung, attempt=attempt, started_at=rec.now)
        if check.type is CheckType.NODE_LABEL and check.node_label is not None:
            # A verdict from before this run must not count: ask afresh.
            await kube.patch_node_metadata(node, labels={check.node_label.key: None})
        result = StepResult.wait(
            cond, "CheckRunning", f"{check.type} check started (attempt {attempt})", 0.0
        )
        result.status["verification"] = new.to_k8s()
        return result
    if rec.now - run.started_at > parse_duration(check.timeout):
        return StepResult.failed(cond, "CheckTimedOut", f"no verdict within {check.timeout}")
    if check.type is CheckType.JOB and check.job is not None:
        ran = await _job_hook(
            kube,
            check.job,
            condition=cond,
            action="check",
            node=node,
            incident=name,
            name=job_name_for(name, f"check-{rung}-{run.attempt}"),
            retry_after=retry,
            jobs=NodeJobs.of(ports),
        )
        if ran.kind == "done":
            return StepResult.done(cond, "CheckPassed", f"{ran.message} (exit code 0)")
        if ran.kind == "failed":
            return StepResult.failed(cond, "CheckFailed", ran.message)
        return ran
    if check.type is CheckType.WEBHOOK and check.webhook is not None:
        try:
            code = await post_webhook(
                check.webhook.url,
                action="check",
                node=node,
                incident=name,
                xid=None,
                wait_s=parse_duration(check.webhook.timeout).total_seconds(),
            )
        except HookUnreachable as exc:
            return StepResult.wait(cond, "CheckUnreachable", str(exc), retry)
        if 200 <= code <= 299:
            return StepResult.done(cond, "CheckPassed", f"check webhook: {code}")
        if code >= 500 or code == 429:
            return StepResult.wait(cond, "CheckUnavailable", f"check webhook: {code}", retry)
        return StepResult.failed(cond, "CheckFailed", f"check webhook: {code}")
    body = await kube.get_node(node)
    if check.type is CheckType.NODE_CONDITION and check.node_condition is not None:
        return _condition_verdict(body, check.node_condition, since=run.started_at, retry=retry)
    if check.type is CheckType.NODE_LABEL and check.node_label is not None:
        value = ((body or {}).get("metadata") or {}).get("labels", {}).get(check.node_label.key)
        label = check.node_label
        if value == label.pass_value:
            return StepResult.done(cond, "CheckPassed", f"label {label.key}={value}")
        if value == label.fail_value:
            return StepResult.failed(cond, "CheckFailed", f"label {label.key}={value}")
        return StepResult.wait(cond, "CheckRunning", f"waiting for label {label.key}", retry)
    # The model requires the type's block; without it nothing could be checked, and an
    # unchecked node must not read as verified.
    return StepResult.failed(cond, "CheckInvalid", f"check {check.type} has no {check.type} block")


def _condition_verdict(
    body: Mapping[str, Any] | None, want: NodeConditionCheck, *, since: dt.datetime, retry: float
) -> StepResult:
    """Only a verdict reported after the check started counts (heartbeat or transition)."""
    cond = C.VERIFIED
    for c in ((body or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") != want.type:
            continue
        seen = max(
            filter(None, (parse_time(c.get("lastHeartbeatTime")),
                          parse_time(c.get("lastTransitionTime")))),
            default=None,
        )  # fmt: skip
        fresh = seen is not None and seen >= since.replace(microsecond=0)
        status = c.get("status")
        what = f"condition {want.type}={status} ({c.get('reason') or 'no reason'})"
        if fresh and status == want.status.value:
            return StepResult.done(cond, "CheckPassed", what)
        opposite = {"True": "False", "False": "True"}.get(want.status.value)
        if fresh and status == opposite:
            return StepResult.failed(cond, "CheckFailed", what)
        return StepResult.wait(cond, "CheckRunning", f"{what}; waiting for a fresh verdict", retry)
    return StepResult.wait(cond, "CheckRunning", f"no condition {want.type} yet", retry)


# ---- retire --------------------------------------------------------------------------------
async def retire(kube: Kube, node: str, incident: str, why: str) -> StepResult:
    """Mark the node retired (label + why); its cordon stays. gpuheal never returns it."""
    await kube.patch_node_metadata(
        node,
        labels={RETIRED_LABEL: incident[:63]},
        annotations={RETIRED_WHY_ANNOTATION: why or f"retired by {incident}"},
    )
    return StepResult.done(
        C.RETIRED, "Retired", f"{node} retired ({why or incident}); it stays out for inspection"
    )


# ---- one GPU out: a DRA DeviceTaintRule ------------------------------------------------------
SlurmFor = Callable[[], "BridgeSlurm | None"]


async def quarantine_device(  # noqa: PLR0911 - one exit per outcome
    kube: Kube,
    nrem: NodeRemediation,
    opts: QuarantineDeviceOptions,
    *,
    xid: int | None,
    now: dt.datetime,
    slurm_for: SlurmFor | None = None,
    attempt: int = 0,
) -> StepResult:
    """Taint the one GPU the fault names (`policy.devicequarantine.find_device`) through one
    DeviceTaintRule named after the incident and the device; the node stays schedulable and
    its other GPUs in service. Then, on a Slurm node, requeue the jobs holding that GPU
    (`requeue_gpu_jobs`). Idempotent: the rule's name is fixed, a retry finds its own rule
    (409) and records it; Slurm is asked until the record says it was (``slurm``). Skipped,
    saying why, where the cluster has no DRA slice for the node, the signal names no GPU, or
    DeviceTaintRules are not served."""
    cond = C.DEVICE_QUARANTINED
    node, name = nrem.spec.node_name, nrem.metadata.name
    held = nrem.status.quarantined_device
    if held is not None and held.released_at is None:
        said = f"{held.device} already quarantined by {held.rule}"
        if held.slurm is not None:
            return StepResult.done(cond, "DeviceTainted", f"{said}; Slurm: {held.slurm}")
        return await _tell_slurm(slurm_for, nrem, held, opts.slurm_options(), said, attempt)
    signal = next((s for s in reversed(nrem.spec.signals) if s.pci_bus_id or s.gpu_uuid), None)
    slices = await kube.resource_slices(node)
    if slices is None:
        return StepResult.skipped(
            cond, "NoDRA", "the API server serves no resource.k8s.io/v1 ResourceSlices: "
            f"{node}'s GPUs are not DRA devices, so none can be tainted alone",
        )  # fmt: skip
    found = dq.find_device(
        slices,
        node=node,
        driver=opts.driver,
        pci=signal.pci_bus_id if signal else None,
        uuid=signal.gpu_uuid if signal else None,
    )
    if isinstance(found, str):
        return StepResult.skipped(cond, "NoDevice", found)
    rule = dq.rule_name(name, found.device)
    manifest = dq.rule_manifest(rule, found, opts.effect, incident=name, xid=xid)
    try:
        created = await kube.create_device_taint_rule(manifest)
    except ApiError as exc:
        if exc.status == 404:
            return StepResult.skipped(
                cond, "DeviceTaintRulesOff", "the API server serves no DeviceTaintRule "
                "(Kubernetes 1.36: feature gate DRADeviceTaintRules and --runtime-config="
                "resource.k8s.io/v1beta2=true; GA in 1.37)",
            )  # fmt: skip
        if exc.status == 403:
            return StepResult.failed(cond, "Forbidden", f"creating DeviceTaintRule {rule}: {exc}")
        raise
    if created == "exists" and not dq.ours(await kube.device_taint_rule(rule), name):
        return StepResult.failed(
            cond, "RuleNotOurs", f"DeviceTaintRule {rule} exists and is not this incident's"
        )
    record = QuarantinedDevice(
        **asdict(found),  # as its ResourceSlice names it: driver, pool, device, PCI, UUID
        rule=rule,
        effect=opts.effect,
        tainted_at=now,
        message=f"tainted {DEVICE_TAINT_KEY}:{opts.effect.value}",
    )
    said = (
        f"{found.describe()} tainted {DEVICE_TAINT_KEY}={xid}:{opts.effect.value} by "
        f"DeviceTaintRule {rule}; {node} and its other GPUs stay in service"
    )
    return await _tell_slurm(slurm_for, nrem, record, opts.slurm_options(), said, attempt)


async def _tell_slurm(  # noqa: PLR0917
    slurm_for: SlurmFor | None,
    nrem: NodeRemediation,
    record: QuarantinedDevice,
    opts: DeviceSlurmJobs,
    said: str,
    attempt: int,
) -> StepResult:
    """The DeviceQuarantined result once the rule is written: done with what Slurm was
    told in the record, or wait (the record kept) while the bridge cannot answer."""
    cond = C.DEVICE_QUARANTINED
    try:
        slurm = slurm_for() if slurm_for is not None else None
    except UnknownCluster as exc:
        return StepResult.wait(cond, Reason.SLURM_CLUSTER_UNKNOWN, str(exc), _bridge_delay(attempt))
    told = await requeue_gpu_jobs(slurm, nrem.spec.node_name, nrem.metadata.name, record, opts)
    if isinstance(told, StepResult):
        # The rule is written whatever Slurm answers: on record, so that the next attempt asks
        # Slurm only, and a failed incident still shows (and the return still lifts) its rule.
        told.status["quarantinedDevice"] = record.to_k8s()
        return told
    return StepResult.done(
        cond, "DeviceTainted", f"{said}; Slurm: {told.slurm}", quarantinedDevice=told.to_k8s()
    )


def _device_requeue_options(opts: DeviceSlurmJobs) -> RequeueOptions:
    checkpoint = None
    if opts.checkpoint_signal:
        grace = min(600.0, parse_duration(opts.grace_period).total_seconds())
        checkpoint = CheckpointSignal(signal=opts.checkpoint_signal, grace_seconds=grace)
    return RequeueOptions(
        checkpoint=checkpoint,
        exclude_node=opts.exclude_node,
        # a job pinned to the node (-w) and excluded from it would wait forever
        release_node=opts.exclude_node,
        expedite=True,
        requeue_ended=True,  # one that ends in the checkpoint grace was stopped by it
    )


async def requeue_gpu_jobs(  # noqa: PLR0911, PLR0912 - one exit per outcome
    slurm: BridgeSlurm | None,
    node: str,
    incident: str,
    record: QuarantinedDevice,
    opts: DeviceSlurmJobs,
) -> QuarantinedDevice | StepResult:
    """Requeue the node's running Slurm jobs whose GRES indexes include the GPU's (gpu-N: N,
    `policy.devicequarantine.jobs_on_gpu`), each through the bridge's requeue with the key
    ``<incident>-gpu-requeue-<job>``; the node's other jobs keep running and the Slurm node
    stays in service (see `DeviceSlurmJobs`). The record comes back with what Slurm was told
    (``slurm``, set once: the step does not ask again), or a wait/failed result."""
    cond = C.DEVICE_QUARANTINED

    def told(what: str, **more: Any) -> QuarantinedDevice:
        return record.model_copy(update={"slurm": what[:1024], **more})

    if not opts.requeue:
        return told("not asked (slurm.requeue false)")
    if slurm is None:
        return told("not asked: no Slurm bridge configured (--bridge-url)")
    index = dq.gpu_index(record.device)
    if index is None:
        return told(f"no job requeued: device {record.device} gives no GRES index (gpu-N)")
    try:
        jobs = (await slurm.jobs(node, gpus=True)).jobs
    except SlurmNotFound:
        return told(f"not asked: Slurm does not know {node}")
    except SlurmUnavailable as exc:
        return StepResult.wait(
            cond, Reason.BRIDGE_UNAVAILABLE, str(exc), _bridge_delay(0, exc.retry_after)
        )
    except SlurmError as exc:
        return StepResult.failed(cond, "BridgeError", str(exc))
    split = dq.jobs_on_gpu(jobs, index)
    base = _device_requeue_options(opts)
    requeued: list[str] = []
    left: list[str] = []
    for job_id in split.holding:
        try:
            answer = await slurm.requeue_job(
                job_id, base, from_node=node, idempotency_key=f"{incident}-gpu-requeue-{job_id}"
            )
        except SlurmNotFound:
            left.append(f"{job_id} (gone)")
            continue
        except SlurmUnavailable as exc:
            delay = _bridge_delay(0, exc.retry_after)
            return StepResult.wait(cond, Reason.BRIDGE_UNAVAILABLE, f"job {job_id}: {exc}", delay)
        except SlurmError as exc:
            return StepResult.failed(cond, "BridgeError", f"job {job_id}: {exc}")
        if answer.outcome in (BridgeOutcome.REQUEUED, BridgeOutcome.REQUEUED_BY_JOB):
            requeued.append(str(job_id))
        else:
            left.append(f"{job_id} ({answer.outcome.value})")
    parts = [
        f"job(s) {', '.join(requeued)} holding GRES index {index} requeued"
        if requeued
        else f"no running job holds GRES index {index}"
    ]
    if left:
        parts.append(f"not requeued: {', '.join(left)}")
    if split.others:
        parts.append(f"{len(split.others)} other job(s) keep running")
    if split.unknown:
        ids = ", ".join(str(j) for j in split.unknown)
        parts.append(f"job(s) {ids} left running: Slurm gave no GRES index for them")
    parts.append(f"the Slurm node stays in service (Slurm still schedules index {index})")
    return told("; ".join(parts), slurm_gpu_index=index, requeued_jobs=requeued)


async def release_device(
    kube: Kube, nrem: NodeRemediation, now: dt.datetime
) -> tuple[bool, str, dict[str, Any]]:
    """Lift this incident's device taint if `policy.devicequarantine.may_release` says so
    (a verified reset of that GPU): (the GPU is back or was never out, what was done, status
    to merge). A rule that is gone or not gpuheal's is left alone."""
    held = nrem.status.quarantined_device
    if held is None or held.released_at is not None:
        return True, "", {}
    ok, why = dq.may_release(held, nrem.status.repair)
    if not ok:
        kept = held.model_copy(update={"message": why[:1024]})
        return False, f"{why} (DeviceTaintRule {held.rule})", {"quarantinedDevice": kept.to_k8s()}
    current = await kube.device_taint_rule(held.rule)
    if current is not None and not dq.ours(current, nrem.metadata.name):
        said = f"DeviceTaintRule {held.rule} is no longer gpuheal's: left as it is"
    elif current is None:
        said = f"DeviceTaintRule {held.rule} was gone already"
    else:
        await kube.delete_device_taint_rule(held.rule)
        said = f"DeviceTaintRule {held.rule} deleted: {held.device} back in service ({why})"
    released = held.model_copy(update={"released_at": now, "message": said[:1024]})
    return True, said, {"quarantinedDevice": released.to_k8s()}


# ---- dispatch --------------------------------------------------------------------------------
def _started(rec: Recorder, condition: str) -> dt.datetime:
    """When this step first ran: its condition's transition to False (kept across restarts)."""
    since = rec.since(condition)
    return since if since is not None and not rec.holds(condition) else rec.now


def _policy_step(
    cluster: ClusterView, nrem: NodeRemediation, rec: Recorder, step: Step
) -> Step | None:
    spec = nrem.spec
    policy = cluster.policies.get(spec.policy_ref.name)
    rule = next((r for r in policy.spec.rules if r.name == spec.rule), None) if policy else None
    rung = spec.ladder[min(rec.status.rung, len(spec.ladder) - 1)].name
    return policy_step(step, rung, rule)


async def execute(  # noqa: PLR0911, PLR0912 - one branch per action
    ports: Ports,
    cluster: ClusterView,
    nrem: NodeRemediation,
    rec: Recorder,
    step: Step,
    *,
    attempt: int,
) -> StepResult:
    """Run `step` of the incident once."""
    kube = ports.require_kube()
    spec = nrem.spec
    name = nrem.metadata.name
    node = spec.node_name
    retry = ports.config.retry_interval
    now = rec.now
    xid = next((s.xid for s in reversed(spec.signals) if s.xid is not None), None)
    action = step.action
    if action is Action.CORDON:
        return await cordon(kube, node, name, step.cordon.taint if step.cordon else None)
    if action is Action.SLURM_DRAIN:
        try:
            slurm = ports.slurm_for(cluster, node)
        except UnknownCluster as exc:
            return StepResult.wait(C.SLURM_DRAINED, Reason.SLURM_CLUSTER_UNKNOWN, str(exc), retry)
        return await _slurm_drain_step(ports, slurm, nrem, rec, step, xid=xid, attempt=attempt)
    if action is Action.CHECKPOINT:
        try:
            slurm = ports.slurm_for(cluster, node)
        except UnknownCluster as exc:
            return StepResult.wait(C.CHECKPOINTED, Reason.SLURM_CLUSTER_UNKNOWN, str(exc), retry)
        return await _checkpoint_step(ports, slurm, nrem, rec, step, attempt=attempt)
    if action is Action.QUARANTINE_DEVICE:
        return await quarantine_device(
            kube,
            nrem,
            step.quarantine_device_options(),
            xid=xid,
            now=now,
            slurm_for=partial(ports.slurm_for, cluster, node),
            attempt=attempt,
        )
    if action is Action.DRAIN:
        result, counts = await drain_pods(
            kube,
            node,
            step.drain_options(),
            started=_started(rec, C.DRAINED),
            now=now,
            # evicted pods usually go within their grace period: look again soon, then less
            retry_after=min(retry, 0.25 * 2 ** min(attempt, 8)),
        )
        for what, n in counts.items():
            if n:
                ports.metrics.evictions.labels(what).inc(n)
        return result
    if action in (Action.RESET, Action.REBOOT):
        cond = C.RESET if action is Action.RESET else C.REBOOTED
        if calls_webhook(step):
            # The incident keeps the hook's URL as scheme and host: the whole URL is the
            # policy's (`policy.snapshot`).
            found = _policy_step(cluster, nrem, rec, step)
            if found is None:
                return StepResult.failed(
                    cond,
                    "HookChanged",
                    f"RemediationPolicy {spec.policy_ref.name} no longer has this {action.value} "
                    f"webhook in rung {spec.ladder[rec.status.rung].name} of rule {spec.rule} "
                    "(its host or options changed since the incident opened): not called",
                )
            step = found
        opts: ResetOptions | RebootOptions | None = (
            step.reset if action is Action.RESET else step.reboot
        )
        assert opts is not None
        if opts.when_idle and _repair_record(rec, action) is None:
            busy = await work_on_node(ports, cluster, node, action, cond)
            if busy is not None:
                return busy
        return await repair(ports, cluster, nrem, rec, action, opts, xid=xid)
    if action is Action.RETIRE:
        return await retire(kube, node, name, rec.status.why)
    if action is Action.REPLACE:
        assert step.replace is not None
        pool_name = step.replace.reserve_pool_ref.name
        return await replace(
            kube,
            partial(ports.slurm_for, cluster),
            cluster.pools.get(pool_name),
            pool_name,
            list(cluster.nodes.values()),
            cluster.spares_out_in_slurm,
            node=node,
            incident=name,
            retry_after=retry,
        )
    return StepResult.failed(C.DETECTED, "UnknownAction", f"no executor for {action}")


async def return_to_pool(  # noqa: PLR0911 - one return per outcome
    ports: Ports, cluster: ClusterView, nrem: NodeRemediation, decision: Act, pool_name: str
) -> StepResult:
    """Put a verified, repaired node back into the ReservePool that gave its replacement:
    the pool's labels (and none of its promotion labels), the pool's taints back, no claim;
    then our cordon is lifted (the taints keep work off) and, in Slurm, our drain becomes
    the pool's ('reserve pool'), which promotion resumes. The Returned condition says what
    happened, as for `return_to_service`."""
    kube = ports.require_kube()
    node, name = nrem.spec.node_name, nrem.metadata.name
    pool = cluster.pools.get(pool_name)
    current = await kube.get_node(node)
    if pool is None or current is None:
        return await return_to_service(ports, cluster, nrem, decision)
    promo = pool.spec.promotion
    labels: dict[str, str | None] = {k: None for k in promo.set_labels}
    labels.update(pool.spec.node_selector.match_labels)
    labels[CLAIMED_BY_LABEL] = None
    now_labels = {**(current.get("metadata", {}).get("labels") or {}), **labels}
    if not pool.spec.node_selector.matches({k: v for k, v in now_labels.items() if v}):
        back = await return_to_service(ports, cluster, nrem, decision)
        back.message = f"ReservePool {pool_name}'s selector cannot be set by labels; {back.message}"
        return back
    taints = tuple(
        {"key": t.key, "effect": (t.effect or TaintEffect.NO_SCHEDULE).value}
        for t in promo.remove_taints
    )
    await kube.patch_node_metadata(
        node,
        labels=labels,
        annotations={REPLACES_ANNOTATION: None, CLAIMED_AT_ANNOTATION: None},
        add_taints=taints,
        current=current,
    )
    messages = [f"{node} back in ReservePool {pool_name} as a spare"]
    if decision.uncordon:
        messages.append(await uncordon(kube, node, name))
    if promo.slurm is None or not nrem.status.ownership.slurm_drained:
        if decision.resume_slurm:
            return await _resume(ports, cluster, node, name, "ReturnedToPool", messages)
        return StepResult.done(C.RETURNED, "ReturnedToPool", "; ".join(messages))
    # Our drain becomes the pool's: the node stays out of Slurm until promotion resumes it.
    bridge = _bridge_to_return(ports, cluster, node, messages)
    if isinstance(bridge, StepResult):
        return bridge
    reason = promo.slurm.reserve_reason
    try:
        resp = await bridge.reserve(
            node, incident=name, reason=reason, idempotency_key=f"{name}-reserve"
        )
    except SlurmError as exc:
        return _not_returned(exc, "Reserve", messages, ports.config.retry_interval)
    said = f"Slurm {resp.slurm_node}: {resp.outcome.value} ({reason!r})"
    return StepResult.done(C.RETURNED, "ReturnedToPool", _joined(messages, said))


async def _slurm_drain_step(
    ports: Ports,
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
    kube = ports.require_kube()

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
        ports.post_event(nrem.to_k8s(), reason=reason, message=message, type_=type_)

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


async def _checkpoint_step(
    ports: Ports,
    slurm: BridgeSlurm | None,
    nrem: NodeRemediation,
    rec: Recorder,
    step: Step,
    *,
    attempt: int,
) -> StepResult:
    """`checkpoint` with the jobs this incident already signalled, each new one written to
    the status as soon as it is signalled."""

    async def record(done: list[CheckpointedJob]) -> None:
        rec.merge({"checkpointedJobs": [j.to_k8s() for j in done]})
        await rec.write(ports.require_kube())

    return await checkpoint(
        slurm,
        nrem.spec.node_name,
        nrem.metadata.name,
        step.checkpoint_options(),
        attempt=attempt,
        recorded=rec.status.checkpointed_jobs,
        record=record,
    )


async def return_to_service(
    ports: Ports,
    cluster: ClusterView,
    nrem: NodeRemediation,
    decision: Act,
    *,
    now: dt.datetime | None = None,
) -> StepResult:
    """Undo what gpuheal did (only that): lift its device taint (after a verified reset of
    that GPU, `release_device`), uncordon, resume in Slurm. The Returned condition says what
    happened: `done` only when every side gpuheal had taken out is back (reason
    ReturnedToService, or ReturnedInKubernetesOnly when the policy's Slurm drain found no
    bridge: Slurm was never asked, either way); skipped (DeviceStillQuarantined) while the
    GPU it took out is not verified reset; see `resume_in_slurm` for the rest."""
    kube = ports.require_kube()
    back, said, status = await release_device(kube, nrem, now or dt.datetime.now(dt.UTC))
    if not back:
        return StepResult.skipped(C.RETURNED, "DeviceStillQuarantined", said, **status)
    result = await _return_node(ports, cluster, nrem, decision, [said] if said else [])
    result.status.update(status)
    return result


async def _return_node(
    ports: Ports, cluster: ClusterView, nrem: NodeRemediation, decision: Act, messages: list[str]
) -> StepResult:
    node = nrem.spec.node_name
    name = nrem.metadata.name
    if decision.uncordon:
        messages.append(await uncordon(ports.require_kube(), node, name))
    elif nrem.status.quarantined_device is None or nrem.status.ownership.cordoned:
        messages.append(f"{node}: cordon was not gpuheal's, left as it is")
    if decision.resume_slurm:
        return await _resume(ports, cluster, node, name, "ReturnedToService", messages)
    drained = find_condition(nrem.status.conditions, C.SLURM_DRAINED)
    if drained is not None and drained.reason == "SlurmNotConfigured":
        messages.append("Slurm not asked: no Slurm bridge configured (--bridge-url)")
        return StepResult.done(C.RETURNED, "ReturnedInKubernetesOnly", "; ".join(messages))
    if drained is not None and drained.reason == "DrainedByOther":
        messages.append("its Slurm drain is someone else's: left as it is")
    return StepResult.done(C.RETURNED, "ReturnedToService", "; ".join(messages))


async def resume_in_slurm(  # noqa: PLR0917
    bridge: BridgeSlurm,
    node: str,
    incident: str,
    returned: str,
    messages: list[str],
    retry: float,
) -> StepResult:
    """Lift this incident's Slurm drain at the return to service, after ``messages`` (what
    was done before). ``done`` (reason ``returned``): resumed, or back in service already.
    ``wait`` (Returned False): the bridge cannot be reached or failed: retried, the
    incident stays open. ``skipped`` (Returned False): the bridge refused (the drain is
    someone else's now, or another incident's) or Slurm no longer knows the node: the
    incident ends without claiming the node is back in Slurm."""
    try:
        resp = await bridge.resume(
            node, incident=incident, idempotency_key=f"{incident}-slurm-resume-{node}"
        )
    except SlurmError as exc:
        return _not_returned(exc, "Resume", messages, retry)
    lifted = resp.exclusion_lifted_from
    no_longer = (
        f"; no longer excluded from jobs {', '.join(map(str, lifted[:10]))}" if lifted else ""
    )
    if resp.outcome is ResumeOutcome.NOT_DRAINED:
        said = f"Slurm {resp.slurm_node}: back in service already ({resp.current.state})"
    else:
        said = f"Slurm {resp.slurm_node}: resumed ({resp.current.state})"
    return StepResult.done(C.RETURNED, returned, _joined(messages, said + no_longer))


async def _resume(  # noqa: PLR0917
    ports: Ports, cluster: ClusterView, node: str, incident: str, returned: str, messages: list[str]
) -> StepResult:
    bridge = _bridge_to_return(ports, cluster, node, messages)
    if isinstance(bridge, StepResult):
        return bridge
    return await resume_in_slurm(
        bridge, node, incident, returned, messages, ports.config.retry_interval
    )


def _bridge_to_return(
    ports: Ports, cluster: ClusterView, node: str, messages: list[str]
) -> BridgeSlurm | StepResult:
    """The bridge that lifts gpuheal's Slurm drain of ``node``, or the wait that says why
    there is none: the node names a cluster without a bridge, or no bridge is configured
    any more (gpuheal drained the node through one: the drain stays until it is back)."""
    retry = ports.config.retry_interval
    try:
        bridge = ports.slurm_for(cluster, node)
    except UnknownCluster as exc:
        return StepResult.wait(
            C.RETURNED, Reason.SLURM_CLUSTER_UNKNOWN, _joined(messages, exc), retry
        )
    if bridge is None:
        why = (
            f"gpuheal drained {node} in Slurm and no Slurm bridge is configured now to lift "
            "that drain: configure --bridge-url (the return is retried)"
        )
        return StepResult.wait(C.RETURNED, "SlurmNotConfigured", _joined(messages, why), retry)
    return bridge


def _not_returned(exc: SlurmError, what: str, messages: list[str], retry: float) -> StepResult:
    """A Slurm ``what`` (Resume, Reserve) of the return that did not happen: refused (the
    drain is not this incident's any more) or the node unknown to Slurm: skipped, it will
    not happen; the bridge unreachable or failing: wait and try again."""
    if isinstance(exc, SlurmConflict):
        why = f"not {what.lower()}d in Slurm: the bridge refused ({exc})"
        return StepResult.skipped(C.RETURNED, f"Slurm{what}Refused", _joined(messages, why))
    if isinstance(exc, SlurmNotFound):
        why = f"not {what.lower()}d in Slurm: Slurm does not know the node any more"
        return StepResult.skipped(C.RETURNED, "NotASlurmNode", _joined(messages, why))
    if isinstance(exc, SlurmUnavailable):
        delay = exc.retry_after or retry
        return StepResult.wait(C.RETURNED, Reason.BRIDGE_UNAVAILABLE, _joined(messages, exc), delay)
    why = f"Slurm {what.lower()} failed: {exc}"
    return StepResult.wait(C.RETURNED, f"Slurm{what}Failed", _joined(messages, why), retry)


def _joined(messages: list[str], last: object) -> str:
    return "; ".join([*messages, str(last)])
