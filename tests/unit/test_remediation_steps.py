"""Step executors that need no cluster: Slurm requeue options, spare choice, Job specs, and
the reset/reboot hook contract against a real local HTTP server."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

from gpuheal.adapters.kube import ClaimResult
from gpuheal.adapters.slurm import (
    SlurmConflict,
    SlurmError,
    SlurmNotFound,
    SlurmUnavailable,
    UnknownCluster,
)
from gpuheal.api.noderemediation import CheckpointedJob
from gpuheal.api.remediationpolicy import Action, CheckpointOptions, HookSpec, SlurmDrainOptions
from gpuheal.api.remediationpolicy import RequeueMode as PolicyRequeue
from gpuheal.api.reservepool import ReservePool
from gpuheal.policy import spare_candidates
from gpuheal.policy.spares import Unavailable, slurm_unavailable, spare_unavailable
from gpuheal.policy.types import NodeCondition, NodeView
from gpuheal.remediation import steps
from gpuheal.remediation.state import ClusterView
from gpuheal_bridge.api.models import (
    JobSignalOutcome,
    JobSignalResult,
    JobsResponse,
    JobState,
    NodeState,
    Owner,
    RequeueMode,
    ResumeOutcome,
    ResumeResponse,
)

NOW = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)


def test_requeue_options_follow_the_policy() -> None:
    assert steps.requeue_options(SlurmDrainOptions(requeue="none")) is None
    opts = steps.requeue_options(
        SlurmDrainOptions(requeue="requeue", checkpoint_signal="USR1", grace_period="90s")
    )
    assert opts is not None
    assert opts.mode is RequeueMode.REQUEUE
    assert opts.checkpoint is not None
    assert (opts.checkpoint.signal, opts.checkpoint.grace_seconds) == ("USR1", 90.0)
    assert opts.exclude_node
    assert opts.expedite
    held = steps.requeue_options(SlurmDrainOptions(requeue="requeueHold", grace_period="10m"))
    assert held is not None
    assert held.mode is RequeueMode.REQUEUE_HOLD
    assert not held.expedite
    # The CRD and the model refuse a gracePeriod over 10m now; the cap stays for policies
    # stored before (built past validation here).
    capped = steps.requeue_options(
        SlurmDrainOptions.model_construct(
            requeue=PolicyRequeue.REQUEUE, checkpoint_signal="USR1", grace_period="1h"
        )
    )
    assert capped is not None
    assert capped.checkpoint is not None
    assert capped.checkpoint.grace_seconds == 600  # the bridge's bound


def view(name: str, *, ready: bool = True, **labels: str) -> NodeView:
    claimed = labels.pop("claimed", None)
    cordoned = labels.pop("cordoned", None)
    return NodeView(
        name=name, uid=name, labels={"pool": "reserve", **labels}, unschedulable=False,
        conditions=(NodeCondition("Ready", "True" if ready else "False", NOW),),
        claimed_by=claimed, cordoned_by=cordoned,
    )  # fmt: skip


def test_spare_candidates_are_ready_unclaimed_uncordoned_pool_members() -> None:
    pool = ReservePool.model_validate(
        {"metadata": {"name": "spares"},
         "spec": {"nodeSelector": {"matchLabels": {"pool": "reserve"}}}}
    )  # fmt: skip
    nodes = [
        view("s3"), view("s1"), view("s2", ready=False), view("s4", claimed="nrem-a"),
        view("s5", cordoned="nrem-b"), view("w1", pool="train"), view("broken"),
    ]  # fmt: skip
    assert spare_candidates(pool, nodes, "broken") == ["s1", "s3"]


def test_a_spare_someone_else_cordoned_or_drained_in_slurm_is_not_a_candidate() -> None:
    pool = ReservePool.model_validate(
        {"metadata": {"name": "spares"},
         "spec": {"nodeSelector": {"matchLabels": {"pool": "reserve"}}}}
    )  # fmt: skip
    cordoned = dataclasses.replace(view("s2"), unschedulable=True)
    nodes = [view("s1"), cordoned, view("s3"), view("s4")]
    admin = NodeState(
        node="s3", slurm_node="s3", state="IDLE", flags=["DRAIN"], drain=True,
        unavailable=True, reason="admin: bad fan", reason_user="root", owner=Owner.OTHER,
    )  # fmt: skip
    down = admin.model_copy(
        update={"flags": [], "drain": False, "state": "DOWN", "reason": "Not responding"}
    )
    pools_own = admin.model_copy(update={"reason": "reserve pool"})
    assert slurm_unavailable(pools_own, "reserve pool") is None
    out = {
        "s3": slurm_unavailable(admin, "reserve pool"),
        "s4": slurm_unavailable(down, "reserve pool"),
    }
    assert out["s3"] == Unavailable(
        "DrainedInSlurm",
        "drained in Slurm by root: 'admin: bad fan' (not the pool's 'reserve pool'); left as it is",
    )
    assert out["s4"] is not None
    assert out["s4"].reason == "DownInSlurm"
    assert spare_candidates(pool, nodes, "broken", {k: v for k, v in out.items() if v}) == ["s1"]
    why = spare_unavailable(cordoned)
    assert why is not None
    assert why.reason == "Cordoned"


class _SpareKube:
    """Nodes as bodies with labels; `claim_spare` takes the first unclaimed candidate."""

    def __init__(self, names: list[str]) -> None:
        self.labels: dict[str, dict[str, str]] = {n: {"pool": "reserve"} for n in names}

    async def get_node(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": dict(self.labels[name]),
                             "resourceVersion": "1"}}  # fmt: skip

    async def claim_spare(self, incident: str, bodies: list[dict[str, Any]]) -> Any:
        for name, labels in self.labels.items():
            if labels.get("gpuheal.io/claimed-by") == incident:
                return ClaimResult(node=name, already=True)
        for body in bodies:
            name = body["metadata"]["name"]
            self.labels[name]["gpuheal.io/claimed-by"] = incident
            return ClaimResult(node=name, already=False)
        return None

    async def patch_node_metadata(self, name: str, **kw: Any) -> None:
        for key, value in (kw.get("labels") or {}).items():
            if value is None:
                self.labels[name].pop(key, None)
            else:
                self.labels[name][key] = value


class _Bridge:
    """Resumes a spare unless an admin drained it (then 409, as the bridge answers), except
    with force (which lifts any drain)."""

    def __init__(self, admin_drained: set[str]) -> None:
        self.admin_drained = admin_drained
        self.resumed: list[tuple[str, str | None, bool]] = []

    async def resume(self, node: str, **kw: Any) -> Any:
        state = NodeState(
            node=node, slurm_node=node, state="IDLE", flags=["DRAIN"], drain=True,
            unavailable=True, reason="reserve pool", owner=Owner.OTHER,
        )  # fmt: skip
        if node in self.admin_drained and not kw.get("force"):
            admin = state.model_copy(update={"reason": "admin: bad fan", "reason_user": "root"})
            raise SlurmConflict(f"{node} is not waiting in the reserve pool", admin)
        self.resumed.append((node, kw.get("reserve_reason"), kw.get("force", False)))
        return ResumeResponse(node=node, slurm_node=node, outcome=ResumeOutcome.RESUMED,
                              previous=state, current=state)  # fmt: skip


async def test_replace_takes_back_a_spare_slurm_refuses_and_promotes_the_next() -> None:
    """An admin drained s1 after the operator's last look: the bridge refuses to resume it,
    the claim is taken back (s1 neither claimed nor promoted), s1 is noted as out, s2 is
    promoted; the spare is resumed only as the pool's (reserve_reason), never with force."""
    pool = ReservePool.model_validate(
        {"metadata": {"name": "spares"},
         "spec": {"nodeSelector": {"matchLabels": {"pool": "reserve"}},
                  "promotion": {"setLabels": {"promoted": "yes"}, "slurm": {"resume": True}}}}
    )  # fmt: skip
    kube, bridge = _SpareKube(["s1", "s2"]), _Bridge({"s1"})
    out: dict[str, Unavailable] = {}
    result = await steps.replace(
        kube,  # type: ignore[arg-type]
        lambda _node: bridge,  # type: ignore[arg-type, return-value]
        pool, "spares", [view("s1"), view("s2"), view("broken")], out,
        node="broken", incident="nrem-1", retry_after=1.0,
    )  # fmt: skip
    assert result.kind == "done", result.message
    assert result.status == {"replacementNode": "s2"}
    assert "passed over s1 (drained in Slurm by root: 'admin: bad fan'" in result.message
    assert kube.labels["s1"] == {"pool": "reserve"}
    assert kube.labels["s2"]["promoted"] == "yes"
    assert bridge.resumed == [("s2", "reserve pool", False)]
    assert out["s1"].reason == "DrainedInSlurm"

    again = await steps.replace(
        _SpareKube(["s1"]),  # type: ignore[arg-type]
        lambda _node: bridge,  # type: ignore[arg-type, return-value]
        pool, "spares", [view("s1"), view("broken")], {},
        node="broken", incident="nrem-2", retry_after=1.0,
    )  # fmt: skip
    assert result.kind == "done"
    assert again.kind == "wait"
    assert again.reason == "NoSpareAvailable"
    assert "s1 DrainedInSlurm" in again.message
    assert "admin: bad fan" in again.message


def test_job_hook_spec_passes_the_node_to_every_container() -> None:
    template = {"template": {"spec": {"containers": [{"name": "a", "env": [{"name": "X",
                "value": "1"}]}, {"name": "b"}]}}}  # fmt: skip
    spec = steps._job_spec(template, node="n1", action="reset", incident="nrem-1")
    envs = [c["env"] for c in spec["template"]["spec"]["containers"]]
    assert envs[0][0] == {"name": "X", "value": "1"}
    assert all({"name": "NODE_NAME", "value": "n1"} in e for e in envs)
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert "env" not in template["template"]["spec"]["containers"][1]  # template untouched


class _Recorder(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[dict[str, Any], str | None]]] = []
    status: ClassVar[int] = 200

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((body, self.headers.get("Idempotency-Key")))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[tuple[str, type[_Recorder]]]:
    _Recorder.calls = []
    _Recorder.status = 200
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Recorder
    server.shutdown()


async def _hook(hook: HookSpec, *, started: dt.datetime = NOW) -> steps.StepResult:
    return await steps.run_hook(
        None,  # type: ignore[arg-type]  # only Job hooks touch the API
        hook, action="reset", node="n1", incident="nrem-1", xid=62, started=started, now=NOW,
        hook_timeout="10m", retry_after=1.0,
    )  # fmt: skip


async def test_webhook_hook_contract(hook_server: tuple[str, type[_Recorder]]) -> None:
    url, rec = hook_server
    hook = HookSpec(type="Webhook", webhook={"url": url})
    done = await _hook(hook)
    assert (done.kind, done.condition, done.reason) == ("done", "Reset", "HookSucceeded")
    assert rec.calls == [
        ({"action": "reset", "node": "n1", "incident": "nrem-1", "xid": 62}, "nrem-1-reset")
    ]
    rec.status = 503
    assert (await _hook(hook)).kind == "wait"
    rec.status = 400
    refused = await _hook(hook)
    assert (refused.kind, refused.reason) == ("failed", "HookRefused")
    late = await _hook(hook, started=NOW - dt.timedelta(minutes=11))
    assert (late.kind, late.reason) == ("failed", "HookTimedOut")


async def test_noop_hook_and_unreachable_webhook() -> None:
    noop = await _hook(HookSpec(type="Noop"))
    # Nothing ran: skipped (Reset False, NoopHook), never done.
    assert (noop.kind, noop.condition, noop.reason) == ("skipped", "Reset", "NoopHook")
    assert noop.moves_on
    gone = await _hook(HookSpec(type="Webhook", webhook={"url": "http://127.0.0.1:9/x"}))
    assert (gone.kind, gone.reason) == ("wait", "HookUnreachable")


async def test_slurm_drain_without_a_bridge_is_skipped_not_done() -> None:
    result = await steps.slurm_drain(None, "n1", "nrem-1", 79, SlurmDrainOptions(), now=NOW,
                                     attempt=0)  # fmt: skip
    assert (result.kind, result.reason) == ("skipped", "SlurmNotConfigured")
    assert "ownership" not in result.status


class _Work:
    """What `steps.work_on_node` acts through: the ports' bridge for a node and its pods."""

    def __init__(self, jobs: Any, pods: list[dict[str, Any]]) -> None:
        self.jobs_answer, self.pods = jobs, pods
        self.config = type("Config", (), {"retry_interval": 5.0})()

    def slurm_for(self, cluster: Any, node: str) -> Any:
        return None if self.jobs_answer is None else self

    def require_kube(self) -> Any:
        return self

    async def jobs(self, node: str) -> Any:
        if isinstance(self.jobs_answer, Exception):
            raise self.jobs_answer
        return JobsResponse(node=node, slurm_node=node, jobs=self.jobs_answer)

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods


_RUNNING = JobState(job_id=5, state="RUNNING", batch=True, requeue=True)
_POD = {"metadata": {"namespace": "ml", "name": "train"}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("jobs", "pods", "verdict"),
    [
        ([_RUNNING], [], ("wait", "WaitingForSlurmJobs")),
        ([], [_POD], ("wait", "WaitingForIdle")),
        (None, [_POD], ("wait", "WaitingForIdle")),  # no bridge: the pods still count
        (None, [], None),
        ([], [], None),
        (SlurmNotFound("no such node"), [], None),  # not a Slurm node: no Slurm job on it
        (SlurmUnavailable("down"), [], ("wait", "BridgeUnavailable")),  # never taken as idle
        (UnknownCluster("cluster b?"), [], ("wait", "SlurmClusterUnknown")),
    ],
)
async def test_a_reset_or_reboot_waits_for_the_nodes_work(
    jobs: Any, pods: list[dict[str, Any]], verdict: tuple[str, str] | None
) -> None:
    ports: Any = _Work(jobs, pods)
    result = await steps.work_on_node(ports, ClusterView(), "n1", Action.RESET, "Reset")
    assert (None if result is None else (result.kind, result.reason)) == verdict


async def test_a_power_cycle_is_asked_of_the_hook_by_name(
    hook_server: tuple[str, type[_Recorder]],
) -> None:
    """powerCycle reaches the hook (the webhook's body, the Job's env), so a hook made for
    it can act on it and one that cannot can refuse; a plain reboot's request is unchanged."""
    url, rec = hook_server
    hook = HookSpec(type="Webhook", webhook={"url": url})
    for cycle in (True, False):
        await steps.run_hook(
            None,  # type: ignore[arg-type]  # only Job hooks touch the API
            hook, action="reboot", node="n1", incident="nrem-1", xid=79, started=NOW, now=NOW,
            hook_timeout="10m", retry_after=1.0, power_cycle=cycle,
        )  # fmt: skip
    plain = {"action": "reboot", "node": "n1", "incident": "nrem-1", "xid": 79}
    assert [body for body, _ in rec.calls] == [{**plain, "powerCycle": True}, plain]
    template = {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    env = steps._job_spec(template, node="n1", action="reboot", incident="i", power_cycle=True)[
        "template"
    ]["spec"]["containers"][0]["env"]
    assert {"name": "GPUHEAL_POWER_CYCLE", "value": "true"} in env


async def test_the_reset_of_a_quarantined_gpu_names_it_to_the_hook(
    hook_server: tuple[str, type[_Recorder]],
) -> None:
    """A reset of the one GPU a quarantineDevice step took out names its PCI address (the
    webhook's "gpu", the Job's GPUHEAL_GPU), so the hook can reset that GPU alone; a reset
    of the node's GPUs is asked as before."""
    url, rec = hook_server
    hook = HookSpec(type="Webhook", webhook={"url": url})
    for gpu in ("0000:1b:00", None):
        await steps.run_hook(
            None,  # type: ignore[arg-type]  # only Job hooks touch the API
            hook, action="reset", node="n1", incident="nrem-1", xid=94, started=NOW, now=NOW,
            hook_timeout="10m", retry_after=1.0, gpu=gpu,
        )  # fmt: skip
    plain = {"action": "reset", "node": "n1", "incident": "nrem-1", "xid": 94}
    assert [body for body, _ in rec.calls] == [{**plain, "gpu": "0000:1b:00"}, plain]
    template = {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    env = steps._job_spec(template, node="n1", action="reset", incident="i", gpu="0000:1b:00")[
        "template"
    ]["spec"]["containers"][0]["env"]
    assert {"name": "GPUHEAL_GPU", "value": "0000:1b:00"} in env
    plain_env = steps._job_spec(template, node="n1", action="reset", incident="i")["template"][
        "spec"
    ]["containers"][0]["env"]
    assert not [e for e in plain_env if e["name"] == "GPUHEAL_GPU"]


def test_power_cycle_is_asked_only_of_a_hook_that_can_carry_it() -> None:
    from gpuheal.api.remediationpolicy import RebootOptions

    def opts(hook: dict[str, Any]) -> RebootOptions:
        return RebootOptions.model_validate({"powerCycle": True, "hook": hook})

    job = {"type": "Job", "job": {"namespace": "ns", "templateFrom": {"name": "c", "key": "k"}}}
    assert opts(job).asks_power_cycle
    assert opts({"type": "Webhook", "webhook": {"url": "http://bmc"}}).asks_power_cycle
    # Slurm's reboot is warm and Noop does nothing: still accepted, never claimed
    assert not opts({"type": "Slurm"}).asks_power_cycle
    assert not opts({"type": "Noop"}).asks_power_cycle


class _NoJobs:
    """A Kube that fails the test if anything would create or read a Job or ConfigMap."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the Kubernetes API was called ({name}): a Job would be created")


async def test_an_inline_job_template_runs_only_where_the_operator_allows_it() -> None:
    """A policy's inline hook.job.template is any pod on the node: off by default, the
    reset is skipped (nothing ran, the reason says what to do) and no Job is asked for; a
    check with one fails rather than pass a node unchecked."""
    inline = HookSpec.model_validate({"type": "Job", "job": {"template": {"template": {
        "spec": {"containers": [{"name": "x", "image": "example.invalid/x"}]}}}}})  # fmt: skip
    skipped = await steps.run_hook(
        _NoJobs(),  # type: ignore[arg-type]
        inline, action="reset", node="n1", incident="nrem-1", xid=62, started=NOW, now=NOW,
        hook_timeout="10m", retry_after=1.0, jobs=steps.NodeJobs("gpuheal-node-jobs"),
    )  # fmt: skip
    assert (skipped.kind, skipped.reason) == ("skipped", steps.INLINE_TEMPLATE_OFF)
    assert "--inline-job-templates" in skipped.message
    assert inline.job is not None
    check = await steps._job_hook(
        _NoJobs(),  # type: ignore[arg-type]
        inline.job, condition="Verified", action="check", node="n1", incident="nrem-1",
        name="nrem-1-check", retry_after=1.0, jobs=steps.NodeJobs("gpuheal-node-jobs"),
    )  # fmt: skip
    assert (check.kind, check.reason) == ("failed", steps.INLINE_TEMPLATE_OFF)


async def test_a_job_hook_without_a_namespace_runs_in_the_operators_node_jobs_namespace() -> None:
    ref = HookSpec.model_validate(
        {"type": "Job", "job": {"templateFrom": {"name": "gpuheal-node-jobs", "key": "gpu-reset"}}}
    )
    assert ref.job is not None
    nowhere = await steps._job_hook(
        _NoJobs(),  # type: ignore[arg-type]
        ref.job, condition="Reset", action="reset", node="n1", incident="nrem-1",
        name="nrem-1-reset", retry_after=1.0, jobs=steps.NodeJobs(),
    )  # fmt: skip
    assert (nowhere.kind, nowhere.reason) == ("failed", "HookInvalid")
    assert "--node-jobs-namespace" in nowhere.message

    class _Created:
        def __init__(self) -> None:
            self.asked: list[tuple[str, str]] = []

        async def get_job(self, ns: str, name: str) -> None:
            self.asked.append(("get_job", ns))

        async def get_configmap(self, ns: str, name: str) -> dict[str, Any]:
            self.asked.append(("get_configmap", ns))
            return {"data": {"gpu-reset": "template: {spec: {containers: []}}"}}

        async def create_job(self, ns: str, body: dict[str, Any]) -> bool:
            self.asked.append(("create_job", body["metadata"]["namespace"]))
            return True

    kube = _Created()
    made = await steps._job_hook(
        kube,  # type: ignore[arg-type]
        ref.job, condition="Reset", action="reset", node="n1", incident="nrem-1",
        name="nrem-1-reset", retry_after=1.0, jobs=steps.NodeJobs("r-node-jobs"),
    )  # fmt: skip
    assert made.kind == "wait"
    assert kube.asked == [
        ("get_job", "r-node-jobs"),
        ("get_configmap", "r-node-jobs"),
        ("create_job", "r-node-jobs"),
    ]


class _Signaller:
    """The bridge as the checkpoint step sees it: the node's jobs, and a signal alone."""

    def __init__(self, jobs: list[JobState], answers: dict[int, Any] | None = None) -> None:
        self.node_jobs, self.answers = jobs, answers or {}
        self.signalled: list[tuple[int, str, str, str]] = []

    async def jobs(self, node: str) -> JobsResponse:
        return JobsResponse(node=node, slurm_node=node, jobs=self.node_jobs)

    async def signal_job(
        self, job_id: int, *, from_node: str, signal: str, idempotency_key: str
    ) -> JobSignalResult:
        answer = self.answers.get(job_id, JobSignalOutcome.SIGNALLED)
        if isinstance(answer, Exception):
            raise answer
        self.signalled.append((job_id, from_node, signal, idempotency_key))
        at = NOW if answer is JobSignalOutcome.SIGNALLED else None
        return JobSignalResult(job_id=job_id, outcome=answer, signalled_at=at)


def _job(job_id: int, state: str = "RUNNING") -> JobState:
    return JobState(job_id=job_id, state=state, batch=True, requeue=True, nodes=["n1"])


async def test_a_checkpoint_signals_each_running_job_once_and_requeues_nothing() -> None:
    """Running jobs only, each with its own idempotency key, each recorded as it is
    signalled; a job the status already holds (a restart) is not signalled again."""
    bridge = _Signaller([_job(5), _job(6, "PENDING"), _job(7)])
    seen: list[list[str]] = []

    async def record(done: list[CheckpointedJob]) -> None:
        seen.append([j.job_id for j in done])

    result = await steps.checkpoint(
        bridge,  # type: ignore[arg-type]
        "n1", "nrem-1", CheckpointOptions(signal="USR2"), attempt=0, record=record,
    )  # fmt: skip
    assert (result.kind, result.condition, result.reason) == (
        "done", "Checkpointed", "CheckpointRequested",
    )  # fmt: skip
    assert bridge.signalled == [
        (5, "n1", "USR2", "nrem-1-checkpoint-5"),
        (7, "n1", "USR2", "nrem-1-checkpoint-7"),
    ]
    assert seen == [["5"], ["5", "7"]]
    assert [j["jobId"] for j in result.status["checkpointedJobs"]] == ["5", "7"]
    assert "not requeued" in result.message
    assert result.at == NOW

    again = _Signaller([_job(5), _job(7)])
    recorded = [CheckpointedJob(job_id="5", signal="USR2", signalled_at=NOW)]
    result = await steps.checkpoint(
        again,  # type: ignore[arg-type]
        "n1", "nrem-1", CheckpointOptions(signal="USR2"), attempt=0, recorded=recorded,
    )  # fmt: skip
    assert [s[0] for s in again.signalled] == [7]
    assert [j["jobId"] for j in result.status["checkpointedJobs"]] == ["5", "7"]


@pytest.mark.parametrize(
    ("bridge", "verdict"),
    [
        (None, ("skipped", "SlurmNotConfigured")),
        (_Signaller([]), ("skipped", "NoRunningJobs")),
        (_Signaller([_job(5)], {5: JobSignalOutcome.NOT_RUNNING}), ("skipped", "NoRunningJobs")),
        (_Signaller([_job(5)], {5: SlurmUnavailable("down")}), ("wait", "BridgeUnavailable")),
        (_Signaller([_job(5)], {5: SlurmError("403: lacks the scope signal")}),
         ("failed", "BridgeError")),
    ],
)  # fmt: skip
async def test_a_checkpoint_with_nothing_signalled_says_why(
    bridge: _Signaller | None, verdict: tuple[str, str]
) -> None:
    result = await steps.checkpoint(
        bridge,  # type: ignore[arg-type]
        "n1", "nrem-1", CheckpointOptions(), attempt=0,
    )  # fmt: skip
    assert (result.kind, result.reason) == verdict
