"""One GPU out through DRA (`policy.devicequarantine`): which device, the rule, when it is
lifted. Table tests over ResourceSlice bodies as NVIDIA's DRA driver publishes them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.api.devicequarantine import DeviceTaintEffect, QuarantinedDevice
from gpuheal.api.noderemediation import RepairRecord
from gpuheal.api.remediationpolicy import Action, RemediationPolicySpec, Step
from gpuheal.policy import decide
from gpuheal.policy.devicequarantine import (
    DeviceMatch,
    find_device,
    may_release,
    ours,
    rule_manifest,
    rule_name,
)
from gpuheal.policy.types import (
    Act,
    ClusterCounts,
    History,
    Move,
    NodeCondition,
    NodeView,
    Observation,
)

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
NODE = "gpu-node-0"
GPUS = {f"0000:{0x18 + i:02x}:00": f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)}


def slice_of(
    node: str = NODE,
    *,
    driver: str = "gpu.nvidia.com",
    generation: int = 1,
    qualified: bool = False,
    gpus: dict[str, str] = GPUS,
) -> dict[str, Any]:
    prefix = f"{driver}/" if qualified else ""
    return {
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        f"{prefix}uuid": {"string": uuid},
                        f"{prefix}pcieBusID": {"string": f"{pci}.0"},
                    },
                }
                for i, (pci, uuid) in enumerate(sorted(gpus.items()))
            ],
        }
    }


def find(slices: list[dict[str, Any]], pci: str | None = None, uuid: str | None = None) -> Any:
    return find_device(slices, node=NODE, driver="gpu.nvidia.com", pci=pci, uuid=uuid)


@pytest.mark.parametrize(
    ("pci", "uuid", "device"),
    [
        ("0000:1b:00", None, "gpu-3"),  # as NVRM prints it
        ("PCI:0000:1B:00", None, "gpu-3"),
        ("00000000:1b:00.0", None, "gpu-3"),  # as dcgm-exporter prints it
        (None, GPUS["0000:1d:00"], "gpu-5"),  # a UUID alone
        (None, GPUS["0000:1d:00"].upper().replace("GPU-", "GPU-"), "gpu-5"),
    ],
)
def test_the_device_the_fault_names(pci: str | None, uuid: str | None, device: str) -> None:
    for qualified in (False, True):
        got = find([slice_of(qualified=qualified)], pci, uuid)
        assert isinstance(got, DeviceMatch), got
        assert (got.driver, got.pool, got.device) == ("gpu.nvidia.com", NODE, device)


def test_only_the_pools_newest_generation_and_the_nodes_own_slices_count() -> None:
    moved = {"0000:1b:00": "GPU-99999999-0000-0000-0000-000000000000"}
    slices = [
        slice_of("other-node"),
        slice_of(driver="example.com/nic"),
        slice_of(generation=1),
        slice_of(generation=2, gpus=moved),
    ]
    got = find(slices, "0000:1b:00")
    assert isinstance(got, DeviceMatch)
    assert (got.device, got.gpu_uuid) == ("gpu-0", moved["0000:1b:00"])


@pytest.mark.parametrize(
    ("slices", "pci", "uuid", "says"),
    [
        ([], "0000:1b:00", None, "no ResourceSlice of driver gpu.nvidia.com for node gpu-node-0"),
        ([slice_of("other")], "0000:1b:00", None, "DRA not in use there"),
        ([slice_of()], "0000:99:00", None, "no device 0000:99:00 in node gpu-node-0's"),
        ([slice_of()], None, None, "names no GPU"),
    ],
)
def test_no_device_says_why(
    slices: list[dict[str, Any]], pci: str | None, uuid: str | None, says: str
) -> None:
    got = find(slices, pci, uuid)
    assert isinstance(got, str)
    assert says in got


def test_the_rule_selects_driver_pool_and_device_and_is_labelled_as_ours() -> None:
    match = DeviceMatch("gpu.nvidia.com", NODE, "gpu-3", "0000:1b:00", GPUS["0000:1b:00"])
    name = rule_name("Gpu-Node-0-xid94-abcde", "gpu-3")
    assert name == "gpu-node-0-xid94-abcde-gpu-3"
    assert rule_name("i", "d") == rule_name("i", "d")  # the same on every retry
    long = rule_name("x" * 300, "gpu-3")
    assert len(long) <= 253
    assert long != rule_name("x" * 299 + "y", "gpu-3")
    body = rule_manifest(name, match, DeviceTaintEffect.NO_EXECUTE, incident="inc-1", xid=94)
    assert body["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-3"},
        "taint": {"key": "gpuheal.io/xid", "value": "94", "effect": "NoExecute"},
    }
    assert ours(body, "inc-1")
    assert not ours(body, "inc-2")
    assert not ours({"metadata": {"labels": {"gpuheal.io/incident": "inc-1"}}}, "inc-1")
    assert not ours(None, "inc-1")


def held(**kw: Any) -> QuarantinedDevice:
    base: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": NODE,
        "device": "gpu-3",
        "pci_bus_id": "0000:1b:00",
        "gpu_uuid": GPUS["0000:1b:00"],
        "rule": "r",
        "effect": DeviceTaintEffect.NO_EXECUTE,
        "tainted_at": T0,
    }
    return QuarantinedDevice(**{**base, **kw})


def reset(**kw: Any) -> RepairRecord:
    base: dict[str, Any] = {
        "action": "reset",
        "rung": 0,
        "via": "Webhook",
        "requested_at": T0 + dt.timedelta(seconds=5),
        "gpus_before": GPUS,
        "verified_at": T0 + dt.timedelta(seconds=60),
    }
    return RepairRecord(**{**base, **kw})


@pytest.mark.parametrize(
    ("repair", "verdict", "says"),
    [
        (reset(), True, "GPU 0000:1b:00 reset and verified"),
        (None, False, "no reset of GPU 0000:1b:00 was asked for"),
        (reset(action="reboot"), False, "no reset"),
        (reset(verified_at=None), False, "is not verified (yet)"),
        (reset(verified_at=None, failed_at=T0), False, "failed"),
        (reset(requested_at=T0 - dt.timedelta(seconds=1)), False, "predates the taint"),
        (reset(gpus_before={"0000:3b:00": GPUS["0000:18:00"]}), False, "did not cover"),
        # a reset that recorded no GPU map cannot be told apart per GPU: the node's reset
        (reset(gpus_before={}), True, "reset and verified"),
    ],
)
def test_the_taint_is_lifted_only_after_a_verified_reset_of_that_gpu(
    repair: RepairRecord | None, verdict: bool, says: str
) -> None:
    got, message = may_release(held(), repair)
    assert got is verdict
    assert says in message


def test_the_step_carries_only_its_own_options() -> None:
    step = Step.model_validate({"action": "quarantineDevice"})
    assert step.action is Action.QUARANTINE_DEVICE
    assert step.quarantine_device_options().effect is DeviceTaintEffect.NO_EXECUTE
    assert step.quarantine_device_options().driver == "gpu.nvidia.com"
    chosen = Step.model_validate(
        {"action": "quarantineDevice", "quarantineDevice": {"effect": "NoSchedule"}}
    )
    assert chosen.quarantine_device_options().effect is DeviceTaintEffect.NO_SCHEDULE
    with pytest.raises(ValidationError, match="options block of its own action"):
        Step.model_validate({"action": "cordon", "quarantineDevice": {}})
    with pytest.raises(ValidationError):
        Step.model_validate({"action": "quarantineDevice", "quarantineDevice": {"effect": "None"}})


ESCALATING = {
    "nodeSelector": {},
    "safety": {"maxUnhealthy": 5, "stormCooldown": "0s"},
    "rules": [
        {
            "name": "ecc",
            "signals": {"xids": [94]},
            "escalation": {"occurrences": 3, "window": "24h", "scope": "Gpu"},
            "ladder": [
                {
                    "name": "gpu",
                    "steps": [
                        {"action": "quarantineDevice"},
                        {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
                    ],
                },
                {"name": "node", "steps": [{"action": "cordon"}, {"action": "drain"}]},
            ],
        }
    ],
}


@pytest.mark.parametrize(
    ("gpus", "first", "rung"),
    [
        (["0000:1b:00"], "quarantineDevice", 0),
        (["0000:1b:00", "0000:1d:00", "0000:1b:00"], "quarantineDevice", 0),  # two GPUs
        (["0000:1b:00"] * 3, "cordon", 1),  # the 3rd on one GPU in 24h: the whole node
    ],
)
def test_repeats_on_one_gpu_climb_from_the_gpu_to_the_node(
    gpus: list[str], first: str, rung: int
) -> None:
    """The README's ladder: one GPU out first; the same GPU faulting again climbs to the node
    rung (the existing per-GPU escalation, nothing special to quarantines)."""
    spec = RemediationPolicySpec.model_validate(ESCALATING)
    node = NodeView(
        name="n", labels={}, conditions=[NodeCondition("Ready", "True", T0 - dt.timedelta(days=1))]
    )
    obs = [
        Observation(time=T0 - (len(gpus) - i) * dt.timedelta(hours=1), xid=94, gpu=g)
        for i, g in enumerate(gpus)
    ]
    calm = ClusterCounts(selected=100, unhealthy=1, remediating=0)
    decision = decide(spec, node, History(observations=obs), calm, T0)
    assert isinstance(decision, Act), decision
    assert decision.operation is Move.OPEN
    assert decision.trigger is not None
    assert (decision.trigger.steps[0].action.value, decision.rung) == (first, rung)
