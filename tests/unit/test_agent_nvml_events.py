"""The agent hears XIDs from NVML events beside the kernel log: the listener over a fake
NVML (the pynvml calls NVIDIA's device plugin makes), one finding for one fault heard from
both sources, and an agent that runs on NVML alone when it cannot read the kernel log. On a
real GPU the listener was tried by bench/device (see docs/agent.md)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import types
from pathlib import Path
from typing import Any

import pytest

from gpuheal.agent import records as rec
from gpuheal.agent.nvml import NvmlXid, XidListener, xid_finding
from gpuheal.agent.run import PAIR_WINDOW, Agent, AgentOptions
from gpuheal.xid import parse_event
from tests.unit.test_agent import UUID, XID79, Clock, FakeApi, FakeNvml, _gpus, _write

NO_INSTANCE = 0xFFFFFFFF
GPU0, GPU1 = "0000:3b:00", "0000:3c:00"
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class EventNvml(FakeNvml):
    """FakeNvml with the event calls: `fire` queues what `nvmlEventSetWait_v2` delivers."""

    nvmlEventTypeXidCriticalError = 0x8
    NVML_ERROR_TIMEOUT = 10

    def __init__(self, gpus: list[dict[str, Any]], *, no_events: tuple[str, ...] = ()) -> None:
        super().__init__(gpus)
        self.queue: collections.deque[Any] = collections.deque()
        self.no_events = no_events
        self.freed = False
        self.shut = False

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: dict[str, Any], kinds: int, event_set: str) -> None:
        assert kinds == self.nvmlEventTypeXidCriticalError
        assert event_set == "event-set"
        if h["bus"] in self.no_events:
            raise NvmlError(3)  # NVML_ERROR_NOT_SUPPORTED

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.queue:
            raise NvmlError(self.NVML_ERROR_TIMEOUT)
        item = self.queue.popleft()
        if isinstance(item, Exception):
            raise item
        return item

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def nvmlShutdown(self) -> None:
        self.shut = True

    def fire(self, gpu: int, xid: int, *, kind: int = 0x8, gi: int = NO_INSTANCE) -> None:
        self.queue.append(
            types.SimpleNamespace(
                device=self.gpus[gpu],
                eventType=kind,
                eventData=xid,
                gpuInstanceId=gi,
                computeInstanceId=0 if gi != NO_INSTANCE else NO_INSTANCE,
            )
        )


def test_the_listener_hears_xids_on_the_gpus_that_take_events() -> None:
    nvml = EventNvml(_gpus(2), no_events=("00000000:3C:00.0",))
    listener = XidListener.register(nvml)
    assert listener is not None
    assert [pci for pci, _ in listener.gpus.values()] == [GPU0]
    assert listener.wait(10) is None  # quiet: NVML's timeout is no event
    nvml.fire(0, 79)
    assert listener.wait(10) == NvmlXid(79, GPU0, UUID0)
    nvml.fire(0, 94, kind=0x10)  # a clock event on the same set: not an XID
    assert listener.wait(10) is None
    nvml.fire(0, 31, gi=3)
    assert listener.wait(10) == NvmlXid(31, GPU0, UUID0, gpu_instance=3, compute_instance=0)
    nvml.queue.append(NvmlError(15))  # GPU_IS_LOST is not a quiet wait
    with pytest.raises(NvmlError):
        listener.wait(10)
    listener.close()
    assert nvml.freed


def test_no_gpu_taking_events_means_no_listener() -> None:
    nvml = EventNvml(_gpus(1), no_events=("00000000:3B:00.0",))
    assert XidListener.register(nvml) is None
    assert nvml.freed


def test_an_nvml_xid_reads_as_that_xid_for_the_operator() -> None:
    finding = xid_finding(NvmlXid(79, GPU0, UUID), Clock()())
    event = parse_event(finding.reason, finding.message)
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.gpu_uuid) == (79, GPU0, UUID)
    assert finding.key == f"xid/79/{GPU0}"  # the kernel log's key for the same fault


def _agent(tmp_path: Path, api: FakeApi, clock: Clock) -> tuple[Agent, Path]:
    log = tmp_path / "kern.log"
    _write(log, "boot")
    opts = AgentOptions(node="gpu-1", kmsg=log, nvml="off", repeat_window=600)
    agent = Agent(opts, api, clock=clock)
    asyncio.run(agent.start())
    agent.read()
    return agent, log


def _hear(agent: Agent, nvml: EventNvml, listener: XidListener, gpu: int, xid: int) -> None:
    nvml.fire(gpu, xid)
    agent.nvml_xids.append(listener.wait(10))
    agent.take_nvml_xids()


def _kernel(agent: Agent, log: Path, line: str) -> None:
    _write(log, line)
    agent.read()


@pytest.mark.parametrize("nvml_first", [True, False], ids=["nvml-first", "kernel-first"])
def test_one_fault_heard_from_both_sources_is_one_event(tmp_path: Path, nvml_first: bool) -> None:
    api, clock = FakeApi(), Clock()
    agent, log = _agent(tmp_path, api, clock)
    nvml = EventNvml(_gpus(2))
    listener = XidListener.register(nvml)
    assert listener is not None
    steps = [lambda: _hear(agent, nvml, listener, 0, 79), lambda: _kernel(agent, log, XID79)]
    for step in steps if nvml_first else steps[::-1]:
        step()
        clock.tick(0.3)
    asyncio.run(agent.flush())
    (event,) = api.events.values()
    assert event["count"] == 1
    assert event["message"].splitlines()[0] == XID79  # the driver's text, either way


def test_nvml_text_stays_once_posted_and_the_kernel_record_adds_nothing(tmp_path: Path) -> None:
    api, clock = FakeApi(), Clock()
    agent, log = _agent(tmp_path, api, clock)
    nvml = EventNvml(_gpus(2))
    listener = XidListener.register(nvml)
    assert listener is not None
    _hear(agent, nvml, listener, 0, 79)
    asyncio.run(agent.flush())
    clock.tick(2)
    _kernel(agent, log, XID79)
    asyncio.run(agent.flush())
    (event,) = api.events.values()
    assert event["count"] == 1
    assert event["message"].startswith("NVML: Xid 79 on PCI:0000:3b:00")


def test_repeats_count_once_each_and_distant_or_other_gpu_records_stand_alone(
    tmp_path: Path,
) -> None:
    api, clock = FakeApi(), Clock()
    agent, log = _agent(tmp_path, api, clock)
    nvml = EventNvml(_gpus(2))
    listener = XidListener.register(nvml)
    assert listener is not None
    for _ in range(2):  # two occurrences, each heard twice
        _kernel(agent, log, XID79)
        _hear(agent, nvml, listener, 0, 79)
        clock.tick(30)
    clock.tick(PAIR_WINDOW.total_seconds())
    _hear(agent, nvml, listener, 0, 79)  # a third, NVML only: the kernel record comes late
    clock.tick(PAIR_WINDOW.total_seconds() + 1)
    _kernel(agent, log, XID79)  # too late to be that one: a fourth
    _hear(agent, nvml, listener, 1, 79)  # the other GPU: its own Event
    asyncio.run(agent.flush())
    counts = sorted(
        (e["metadata"]["annotations"]["gpuheal.io/pci"], e["count"]) for e in api.events.values()
    )
    assert counts == [(GPU0, 4), (GPU1, 1)]


def test_without_the_kernel_log_the_agent_runs_on_nvml_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(path: Path, boot: object) -> rec.KmsgDevice:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(rec, "is_char_device", lambda path: True)
    monkeypatch.setattr(rec, "KmsgDevice", denied)
    opts = AgentOptions(node="gpu-1", kmsg=Path("/dev/kmsg"), nvml="off", boot_id="b-1")
    # Neither source: up, not ready saying why, one Warning Event on the Node (no exit: a
    # DaemonSet would restart it into a crash loop; the integration test runs the process)
    api = FakeApi()
    agent = Agent(opts, api, clock=Clock())
    asyncio.run(agent.start())
    status, body = agent.readiness.answer()
    assert status == 503
    assert "cannot read the kernel log /dev/kmsg (Operation not permitted)" in body
    (event,) = api.events.values()
    assert (event["reason"], event["type"]) == ("KernelLogUnreadable", "Warning")
    assert event["involvedObject"]["name"] == "gpu-1"
    with pytest.raises(SystemExit, match=r"cannot read the kernel log /dev/kmsg \(Operation"):
        asyncio.run(Agent(dataclasses.replace(opts, once=True), FakeApi(), clock=Clock()).start())

    nvml = EventNvml(_gpus(1))
    monkeypatch.setattr("gpuheal.agent.nvml.load_nvml", lambda: nvml)
    api = FakeApi()
    opts = AgentOptions(node="gpu-1", kmsg=Path("/dev/kmsg"), nvml="auto", boot_id="b-1")

    async def scenario() -> None:
        stop = asyncio.Event()
        agent = Agent(opts, api, clock=Clock())
        task = asyncio.create_task(agent.run(stop))
        for _ in range(200):  # the listener thread is up once NVML is asked
            await asyncio.sleep(0.01)
            if agent.listener is not None:
                break
        nvml.fire(0, 48)
        for _ in range(300):
            await asyncio.sleep(0.01)
            if api.events:
                break
        stop.set()
        assert await task == 0

    asyncio.run(scenario())
    (event,) = api.events.values()
    assert event["reason"] == "GpuXid"
    assert event["message"].startswith("NVML: Xid 48")
    condition = api.condition()
    assert condition is not None
    assert condition["reason"] == "Xid48"
    assert nvml.freed
    assert nvml.shut


def test_an_nvml_xid_waits_for_the_stream_of_an_empty_text_log(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.touch()  # a text log's stream is named by its first line: none yet
    api, clock = FakeApi(), Clock()
    agent = Agent(AgentOptions(node="gpu-1", kmsg=log, nvml="off"), api, clock=clock)
    asyncio.run(agent.start())
    agent.read()
    agent.nvml_xids.append(NvmlXid(79, GPU0, UUID0))
    assert agent.take_nvml_xids() == 0  # kept, not dropped
    _write(log, "boot")
    agent.read()
    assert agent.take_nvml_xids() == 1
    asyncio.run(agent.flush())
    (event,) = api.events.values()
    assert event["message"].startswith("NVML: Xid 79")
