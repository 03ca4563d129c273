"""The Slurm side of one GPU out (quarantineDevice): which jobs hold the GPU's GRES index,
and that only they are requeued, through a fake bridge (pure logic; the real Slurm is in
tests/integration/test_operator_device_quarantine.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.adapters.slurm import SlurmError, SlurmUnavailable
from gpuheal.api.devicequarantine import (
    DeviceSlurmJobs,
    DeviceTaintEffect,
    QuarantinedDevice,
    QuarantineDeviceOptions,
)
from gpuheal.api.noderemediation import NodeRemediation
from gpuheal.policy.devicequarantine import gpu_index, jobs_on_gpu
from gpuheal.remediation.steps import StepResult, quarantine_device, requeue_gpu_jobs
from gpuheal_bridge.api.models import (
    JobOutcome,
    JobResult,
    JobsResponse,
    JobState,
    RequeueOptions,
)

T0 = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.UTC)


def job(job_id: int, gpus: list[int] | None, state: str = "RUNNING") -> JobState:
    return JobState(job_id=job_id, state=state, batch=True, requeue=True, nodes=["n1"], gpus=gpus)


def held(device: str = "gpu-3") -> QuarantinedDevice:
    return QuarantinedDevice(
        driver="gpu.nvidia.com", pool="n1", device=device, rule="r",
        effect=DeviceTaintEffect.NO_EXECUTE, tainted_at=T0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("device", "index"),
    [("gpu-3", 3), ("gpu-0", 0), ("gpu-12", 12), ("mig-1", None), ("gpu", None)],
)
def test_the_gres_index_is_the_devices_minor(device: str, index: int | None) -> None:
    assert gpu_index(device) == index


def test_jobs_split_by_whether_they_hold_the_index() -> None:
    split = jobs_on_gpu(
        [job(1, [0, 1, 2, 3]), job(2, [4, 5, 6]), job(3, []), job(4, None), job(5, [3], "PENDING")],
        3,
    )
    assert (split.holding, split.others, split.unknown) == ([1], [2, 3], [4])


class _Bridge:
    def __init__(self, jobs: list[JobState], fail: Exception | None = None) -> None:
        self.node_jobs, self.fail = jobs, fail
        self.asked_gpus: list[bool] = []
        self.requeued: list[tuple[int, RequeueOptions, str, str]] = []

    async def jobs(self, node: str, *, gpus: bool = False) -> JobsResponse:
        self.asked_gpus.append(gpus)
        return JobsResponse(node=node, slurm_node=node, jobs=self.node_jobs)

    async def requeue_job(
        self, job_id: int, options: RequeueOptions, *, from_node: str, idempotency_key: str
    ) -> JobResult:
        if self.fail is not None:
            raise self.fail
        self.requeued.append((job_id, options, from_node, idempotency_key))
        return JobResult(job_id=job_id, outcome=JobOutcome.REQUEUED)


async def test_only_the_jobs_holding_the_gpu_are_requeued_with_the_policys_options() -> None:
    bridge = _Bridge([job(1, [0, 1, 2, 3]), job(2, [4, 5, 6]), job(7, None)])
    opts = DeviceSlurmJobs(checkpoint_signal="USR1", grace_period="30s")
    out = await requeue_gpu_jobs(bridge, "n1", "inc", held(), opts)  # type: ignore[arg-type]
    assert isinstance(out, QuarantinedDevice)
    assert bridge.asked_gpus == [True]
    ((job_id, options, node, key),) = bridge.requeued
    assert (job_id, node, key) == (1, "n1", "inc-gpu-requeue-1")
    assert options.checkpoint is not None
    assert (options.checkpoint.signal, options.checkpoint.grace_seconds) == ("USR1", 30.0)
    assert (options.exclude_node, options.release_node, options.expedite) == (True, True, True)
    assert out.requeued_jobs == ["1"]
    assert out.slurm_gpu_index == 3
    assert out.slurm is not None
    assert "job(s) 1 holding GRES index 3 requeued" in out.slurm
    assert "1 other job(s) keep running" in out.slurm
    assert "job(s) 7 left running: Slurm gave no GRES index" in out.slurm
    assert "the Slurm node stays in service" in out.slurm


@pytest.mark.parametrize(
    ("bridge", "opts", "device", "said"),
    [
        (None, DeviceSlurmJobs(), "gpu-3", "not asked: no Slurm bridge configured"),
        (_Bridge([job(1, [3])]), DeviceSlurmJobs(requeue=False), "gpu-3", "not asked (slurm"),
        (_Bridge([job(1, [3])]), DeviceSlurmJobs(), "mig-3", "device mig-3 gives no GRES index"),
        (_Bridge([job(1, [0])]), DeviceSlurmJobs(), "gpu-3", "no running job holds GRES index 3"),
    ],
)
async def test_nothing_requeued_says_why(
    bridge: _Bridge | None, opts: DeviceSlurmJobs, device: str, said: str
) -> None:
    out = await requeue_gpu_jobs(bridge, "n1", "inc", held(device), opts)  # type: ignore[arg-type]
    assert isinstance(out, QuarantinedDevice)
    assert out.slurm is not None
    assert said in out.slurm, out.slurm
    assert out.requeued_jobs == []
    assert bridge is None or bridge.requeued == []


async def test_a_bridge_that_cannot_answer_makes_the_step_wait() -> None:
    bridge = _Bridge([job(1, [3])], fail=SlurmUnavailable("down", retry_after=3))
    out = await requeue_gpu_jobs(bridge, "n1", "inc", held(), DeviceSlurmJobs())  # type: ignore[arg-type]
    assert isinstance(out, StepResult)
    assert (out.kind, out.reason, out.retry_after) == ("wait", "BridgeUnavailable", 3)


class _Kube:
    """The three reads and writes of a fresh taint: n1's slice with gpu-3, the rule created."""

    def __init__(self) -> None:
        self.rules: list[dict[str, Any]] = []

    async def resource_slices(self, node: str) -> list[dict[str, Any]]:
        device = {"name": "gpu-3", "attributes": {"pcieBusID": {"string": "0000:1b:00.0"}}}
        pool = {"name": node, "generation": 1, "resourceSliceCount": 1}
        spec = {"driver": "gpu.nvidia.com", "nodeName": node, "pool": pool, "devices": [device]}
        return [{"spec": spec}]

    async def create_device_taint_rule(self, body: dict[str, Any]) -> str:
        self.rules.append(body)
        return "v1beta2"


@pytest.mark.parametrize(
    ("fail", "kind"),
    [(SlurmUnavailable("down", retry_after=3), "wait"), (SlurmError("refused"), "failed")],
)
async def test_a_rule_written_before_slurm_could_not_be_told_is_on_record(
    fail: Exception, kind: str
) -> None:
    """The rule exists whatever the bridge answers: a waiting or failed step still records it,
    so that the return (or a person reading the failed incident) finds it."""
    kube, bridge = _Kube(), _Bridge([job(1, [3])], fail=fail)
    nrem = NodeRemediation.model_validate({
        "metadata": {"name": "inc"},
        "spec": {"nodeName": "n1", "policyRef": {"name": "p"}, "rule": "r",
                 "ladder": [{"name": "gpu", "steps": [{"action": "quarantineDevice"}]}],
                 "signals": [{"source": "Event", "observedAt": T0.isoformat(), "xid": 94,
                              "pciBusId": "0000:1b:00"}]},
    })  # fmt: skip
    opts = QuarantineDeviceOptions(slurm=DeviceSlurmJobs())
    out = await quarantine_device(
        kube,
        nrem,
        opts,
        xid=94,
        now=T0,
        slurm_for=lambda: bridge,  # type: ignore[arg-type,return-value]
    )
    assert out.kind == kind
    assert [r["metadata"]["name"] for r in kube.rules] == ["inc-gpu-3"]
    kept = QuarantinedDevice.model_validate(out.status["quarantinedDevice"])
    assert (kept.rule, kept.device, kept.slurm) == ("inc-gpu-3", "gpu-3", None)


@pytest.mark.parametrize(
    "bad", [{"checkpointSignal": "KILL"}, {"gracePeriod": "11m"}, {"checkpointSignal": "USR9"}]
)
def test_the_options_refuse(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        DeviceSlurmJobs.model_validate(bad)
