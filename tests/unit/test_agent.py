"""`gpuheal agent` logic: records, series (counts, never floods), the condition, restarts that
post nothing twice, NVML edges. Time is a fake clock; the API server is an in-memory fake with
the semantics the agent relies on (409 on create of an existing name, 404 on patch of a gone
Event). The real API server is in tests/integration/test_agent_sandbox.py."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import io
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpuheal.agent import records as rec
from gpuheal.agent.detect import (
    AgentState,
    Aggregator,
    Condition,
    Detector,
    Finding,
    Series,
    xid_condition,
)
from gpuheal.agent.nvml import (
    REASON_COUNT,
    REASON_ECC_DBE,
    REASON_REMAP_FAILURE,
    REASON_REMAP_PENDING,
    Inventory,
    health_findings,
    load_nvml,
    read_inventory,
)
from gpuheal.agent.run import Agent, AgentOptions, DryRunSink, Publisher, event_body
from gpuheal.xid import GPU_MAP_ANNOTATION, parse_event, parse_gpu_map

T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
UUID = "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp"


class Clock:
    def __init__(self, t: dt.datetime = T0) -> None:
        self.t = t

    def __call__(self) -> dt.datetime:
        return self.t

    def tick(self, seconds: float) -> None:
        self.t += dt.timedelta(seconds=seconds)


class FakeApi:
    """In-memory Events and Nodes with the API server's create/patch semantics."""

    def __init__(self, node: str = "gpu-1") -> None:
        self.nodes: dict[str, dict[str, Any]] = {
            node: {"metadata": {"name": node, "uid": "uid-1", "annotations": {}}, "status": {}}
        }
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get_node(self, name: str) -> dict[str, Any] | None:
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node else None

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("node")
        node = self.nodes[name]
        node["metadata"]["annotations"].update(
            (patch.get("metadata") or {}).get("annotations") or {}
        )
        conds = node["status"].setdefault("conditions", [])
        for new in (patch.get("status") or {}).get("conditions") or []:
            conds[:] = [c for c in conds if c["type"] != new["type"]] + [new]
        return node

    async def create_event(self, namespace: str, body: dict[str, Any]) -> bool:
        self.writes.append("create")
        key = (namespace, body["metadata"]["name"])
        if key in self.events:
            return False
        self.events[key] = copy.deepcopy(body)
        return True

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.events.get((namespace, name)))

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        self.writes.append("patch")
        if (namespace, name) not in self.events:
            return False
        self.events[(namespace, name)].update(patch)
        return True

    def condition(self, node: str = "gpu-1") -> dict[str, Any] | None:
        conds = self.nodes[node]["status"].get("conditions") or []
        return next((c for c in conds if c["type"] == "GpuXid"), None)


# --- records ---------------------------------------------------------------------------------


def test_kmsg_record_with_escapes_and_dictionary() -> None:
    raw = (
        "3,1234,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        "commands.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\n"
    )
    record = rec.parse_kmsg_record(raw, boot_time=T0)
    assert record is not None
    assert record.position == 1234
    assert record.time == T0 + dt.timedelta(microseconds=1843308145)
    assert record.text.splitlines()[2].startswith("NVRM: fallen off the bus")
    assert "SUBSYSTEM" not in record.text
    assert rec.parse_kmsg_record("not a record") is None


def test_text_records() -> None:
    kmsg_line = rec.text_record(7, "6,99,100,-;NVRM: Xid (PCI:0000:3b:00): 13, x")
    assert kmsg_line is not None
    assert (kmsg_line.position, kmsg_line.text) == (
        7,
        "NVRM: Xid (PCI:0000:3b:00): 13, x",
    )
    assert rec.text_record(8, " SUBSYSTEM=pci") is None
    line = rec.text_record(9, "[Fri Aug 30 11:43:09 2024] " + XID13)
    assert line is not None
    assert line.time == dt.datetime(2024, 8, 30, 11, 43, 9, tzinfo=dt.UTC)


def test_text_log_follows_appends_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("a\nb\npart")
    log = rec.TextLog(path)
    assert log.read_available() == [(1, "a"), (2, "b")]
    with path.open("a") as fh:
        fh.write("ial\nc\n")
    assert log.read_available() == [(3, "partial"), (4, "c")]
    assert log.read_available() == []
    path.rename(tmp_path / "kern.log.1")
    path.write_text("new\n")
    assert log.read_available() == [(1, "new")]  # old file at its end: rotation noticed
    assert log.rotated
    log.close()


# --- detection, series, condition ------------------------------------------------------------


def _finding(key: str = "xid/13/0000:3b:00", xid: int = 13, when: dt.datetime = T0, pos: int = 1):
    return Finding(reason="GpuXid", key=key, message=XID13, xid=xid, pci="0000:3b:00",
                   time=when, position=pos)  # fmt: skip


def test_repeats_bump_one_series_within_the_window() -> None:
    agg = Aggregator("gpu-1", "boot-1", dt.timedelta(minutes=10))
    first = agg.add(_finding(pos=1), T0)
    for i in range(999):
        assert agg.add(_finding(when=T0 + dt.timedelta(seconds=i % 60), pos=i + 2), T0) is first
    assert first.count == 1000
    assert len(agg.series) == 1
    later = agg.add(_finding(when=T0 + dt.timedelta(minutes=30), pos=5000), T0)
    assert later is not first
    assert later.count == 1
    assert len(agg.series) == 2
    other_gpu = agg.add(_finding(key="xid/13/0000:86:00", pos=5001), T0)
    assert other_gpu.name not in (first.name, later.name)


def test_event_names_are_deterministic_per_stream_and_first_record() -> None:
    a = Aggregator("gpu-1", "boot-1", dt.timedelta(minutes=10)).add(_finding(pos=42), T0)
    b = Aggregator("gpu-1", "boot-1", dt.timedelta(minutes=10)).add(_finding(pos=42), T0)
    c = Aggregator("gpu-1", "boot-2", dt.timedelta(minutes=10)).add(_finding(pos=42), T0)
    assert a.name == b.name != c.name
    assert a.name.startswith("gpu-1.xid13.")


def test_condition() -> None:
    assert xid_condition([]) == Condition(
        "GpuXid", "False", "NoXid", "no NVIDIA XID in the kernel log since boot"
    )
    s1 = Series("a", "k1", "GpuXid", XID79, T0, T0, count=1, xid=79)
    s2 = Series("b", "k2", "GpuXid", XID13, T0, T0 + dt.timedelta(seconds=5), count=3, xid=13)
    sx = Series("c", "k3", "NvSwitchSxid", "SXid", T0, T0 + dt.timedelta(hours=1), count=1)
    cond = xid_condition([s1, s2, sx])
    assert (cond.status, cond.reason) == ("True", "Xid13")
    assert cond.message == f"{XID13} (4 XID records)"


def test_detector_dedupes_the_fallen_off_message_against_xid_79_and_adds_uuid() -> None:
    detector = Detector(known={"0000:3b:00": UUID})
    lines = [
        "NVRM: The NVIDIA GPU 0000:3b:00.0",
        "NVRM: (PCI ID: 10de:2330) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "[ 12.0] " + XID79,
    ]
    findings = [f for i, line in enumerate(lines, 1) for f in detector.feed(rec.Record(i, line))]
    assert len(findings) == 1
    (f,) = findings
    assert f.message.splitlines()[0] == "NVRM: The NVIDIA GPU 0000:3b:00.0"
    back = parse_event(f.reason, f.message)
    assert back is not None
    assert (back.xid, back.pci_bus_id, back.gpu_uuid) == (
        79,
        "0000:3b:00",
        UUID,
    )


def test_state_round_trip_and_garbage() -> None:
    s = Series("n", "k", "GpuXid", XID79, T0, T0, count=2, posted=2, xid=79, pci="0000:3b:00")
    state = AgentState("gpu-1", "boot-1", 17, [s], xid_condition([s]), {"0000:3b:00": UUID})
    back = AgentState.loads(state.dumps())
    assert back == state
    for bad in ("", "{}", "[1]", '{"version": 99}', '{"version": 1, "node": "x"}'):
        assert AgentState.loads(bad) is None


# --- writing: Publisher and the whole agent -----------------------------------------------------


def _agent(path: Path, api: FakeApi, clock: Clock, state: Path | None, **kw: Any) -> Agent:
    opts = AgentOptions(node="gpu-1", kmsg=path, once=True, state_file=state, nvml="off", **kw)
    return Agent(opts, api, clock=clock)


def _write(path: Path, *lines: str) -> None:
    with path.open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_agent_posts_events_condition_and_gpu_map(tmp_path: Path) -> None:
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    _write(log, "[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
           f"[ 2.0] NVRM: GPU at PCI:0000:3b:00: {UUID}", f"[ 3.0] {XID79}",
           "[ 4.0] NVRM: Xid happened yesterday, see ticket 79",
           "[ 5.0] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 x")  # fmt: skip
    assert asyncio.run(_agent(log, api, clock, None).run()) == 0
    events = sorted(api.events.values(), key=lambda e: e["reason"])
    assert [(e["reason"], e["count"]) for e in events] == [("GpuXid", 1), ("NvSwitchSxid", 1)]
    xid = events[0]
    assert xid["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1",
                                     "uid": "uid-1"}  # fmt: skip
    assert xid["source"]["component"] == "gpuheal-agent"
    assert xid["type"] == "Warning"
    parsed = parse_event(xid["reason"], xid["message"])
    assert parsed is not None
    assert (parsed.xid, parsed.gpu_uuid) == (79, UUID)
    cond = api.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Xid79")
    annotation = api.nodes["gpu-1"]["metadata"]["annotations"][GPU_MAP_ANNOTATION]
    assert parse_gpu_map(annotation).by_pci == {"0000:3b:00": UUID}
    assert api.writes == ["create", "create", "node"]


@pytest.mark.parametrize("keep_state", [True, False])
def test_restart_posts_nothing_twice(tmp_path: Path, keep_state: bool) -> None:
    """Same log read again by a new agent: with the state file it skips what it read; without
    it, it recomputes the same Event names, meets 409 and reconciles: no new Event, no count
    change, no node write."""
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    state = tmp_path / "state.json"
    _write(log, *([f"[ 3.0] {XID13}"] * 5), f"[ 4.0] {XID79}")
    asyncio.run(_agent(log, api, clock, state).run())
    before = copy.deepcopy(api.events)
    api.writes.clear()
    clock.tick(30)
    asyncio.run(_agent(log, api, clock, state if keep_state else None).run())
    assert api.events == before
    assert "patch" not in api.writes
    assert "node" not in api.writes
    assert api.writes == ([] if keep_state else ["create", "create"])  # both answered 409
    # New records after the restart bump the existing series.
    _write(log, f"[ 9.0] {XID13}", f"[ 9.1] {XID13}")
    asyncio.run(_agent(log, api, clock, state if keep_state else None).run())
    counts = sorted((e["message"].split(",")[0][-2:], e["count"]) for e in api.events.values())
    assert counts == [("13", 7), ("79", 1)]
    assert len(api.events) == 2


def test_a_flood_of_identical_records_is_one_event_and_few_writes(tmp_path: Path) -> None:
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    _write(log, *([f"[ 3.0] {XID13}"] * 5000))
    asyncio.run(_agent(log, api, clock, None).run())
    assert [e["count"] for e in api.events.values()] == [5000]
    assert api.writes == ["create", "node"]


def test_expired_event_is_posted_again(tmp_path: Path) -> None:
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    state = tmp_path / "state.json"
    _write(log, f"[ 3.0] {XID13}")
    asyncio.run(_agent(log, api, clock, state).run())
    api.events.clear()  # the API server's --event-ttl passed
    _write(log, f"[ 4.0] {XID13}")
    asyncio.run(_agent(log, api, clock, state).run())
    assert [e["count"] for e in api.events.values()] == [2]


def test_condition_written_only_when_it_changes(tmp_path: Path) -> None:
    api, clock = FakeApi(), Clock()
    node = asyncio.run(api.get_node("gpu-1"))
    assert node is not None
    pub = Publisher(api, node=node_name(), node_obj=node, namespace="default", clock=clock)
    cond = Condition("GpuXid", "True", "Xid79", "m1")
    assert asyncio.run(pub.sync_node(cond, {}))
    assert not asyncio.run(pub.sync_node(cond, {}))
    clock.tick(60)
    assert asyncio.run(pub.sync_node(Condition("GpuXid", "True", "Xid13", "m2"), {}))
    got = api.condition()
    assert got is not None
    assert got["lastTransitionTime"] == "2026-11-23T12:00:00Z"
    assert got["lastHeartbeatTime"] == "2026-11-23T12:01:00Z"
    assert api.writes == ["node", "node"]


def node_name() -> str:
    return "gpu-1"


def test_no_condition_on_a_log_without_xids_flips_nothing_true(tmp_path: Path) -> None:
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    _write(log, "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)")
    asyncio.run(_agent(log, api, clock, None).run())
    assert api.events == {}
    cond = api.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "NoXid")


def test_dry_run_prints_the_writes(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    _write(log, XID79)
    out = io.StringIO()
    opts = AgentOptions(node="n", kmsg=log, once=True, nvml="off", dry_run=True)
    asyncio.run(Agent(opts, DryRunSink(out), clock=Clock()).run())
    writes = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [w["write"] for w in writes] == ["event", "nodeStatus"]
    assert writes[0]["message"] == XID79


def test_event_body_is_what_simulate_posts() -> None:
    """Same fields the operator reads from `gpuheal simulate xid` Events."""
    from gpuheal.cli.simulate import xid_event

    s = Series("gpu-1.xid79.abc", "k", "GpuXid", XID79, T0, T0, count=3, xid=79)
    ours = event_body(s, node="gpu-1", node_uid="uid-1", namespace="default", stream="b")
    theirs = xid_event({"metadata": {"name": "gpu-1", "uid": "uid-1"}}, XID79)
    for field in ("apiVersion", "kind", "involvedObject", "reason", "message", "type"):
        assert ours[field] == theirs[field], field
    assert ours["count"] == 3


# --- NVML ------------------------------------------------------------------------------------


class FakeNvml:
    """The pynvml calls the agent makes, over a list of GPU dicts."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

    class NotSupported(Exception):
        pass

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> Any:
        return types.SimpleNamespace(busId=h["bus"].encode())

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> str:
        return str(h["uuid"])

    def nvmlDeviceGetSerial(self, h: dict[str, Any]) -> str:
        return "1650423013443"

    def nvmlDeviceGetTotalEccErrors(self, h: dict[str, Any], kind: int, counter: int) -> int:
        return int(h.get("dbe", 0))

    def nvmlDeviceGetRetiredPages(self, h: dict[str, Any], cause: int) -> list[int]:
        raise self.NotSupported  # Ampere+: rows are remapped instead

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: dict[str, Any]) -> int:
        raise self.NotSupported

    def nvmlDeviceGetRemappedRows(self, h: dict[str, Any]) -> tuple[int, int, int, int]:
        return (0, h.get("unc", 0), h.get("pending", 0), h.get("failure", 0))

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"


def _gpus(n: int = 2, **first: Any) -> list[dict[str, Any]]:
    out = [
        {"bus": f"00000000:{0x3B + i:02X}:00.0", "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000"}
        for i in range(n)
    ]
    out[0].update(first)
    return out


def test_nvml_inventory_reads_identity_and_skips_unsupported() -> None:
    inv = read_inventory(FakeNvml(_gpus()))
    assert [g.pci for g in inv.gpus] == ["0000:3b:00", "0000:3c:00"]
    g = inv.gpus[0]
    assert g.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert g.serial == "1650423013443"
    assert (g.retired_pages_dbe, g.retired_pending, g.remap_pending) == (None, None, False)
    assert inv.driver == "550.54.15"


def test_nvml_findings_are_edges() -> None:
    first = read_inventory(FakeNvml(_gpus()))
    assert health_findings(None, first, T0) == []
    bad = read_inventory(FakeNvml(_gpus(pending=1, failure=1, dbe=2, unc=3)))
    reasons = sorted(f.reason for f in health_findings(first, bad, T0))
    assert reasons == sorted([REASON_REMAP_PENDING, REASON_REMAP_FAILURE, REASON_ECC_DBE])
    assert health_findings(bad, bad, T0) == []  # no change, nothing new
    gone = read_inventory(FakeNvml(_gpus(1)[:1]))
    (count,) = health_findings(first, gone, T0)
    assert count.reason == REASON_COUNT
    assert "1 of 2" in count.message
    assert "0000:3c:00" in count.message
    assert health_findings(gone, gone, T0) == []
    assert [f.reason for f in health_findings(None, gone, T0, expected_gpus=8)] == [REASON_COUNT]
    assert health_findings(None, Inventory(), T0) == []


def test_nvml_missing_is_skipped_cleanly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    broken = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise OSError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert load_nvml() is None
    log = tmp_path / "kern.log"
    _write(log, XID13)
    agent = _agent(log, FakeApi(), Clock(), None)
    agent.opts.nvml = "on"
    with pytest.raises(SystemExit, match="NVML is not available"):
        asyncio.run(agent.run())
    agent = _agent(log, FakeApi(), Clock(), None)
    agent.opts.nvml = "auto"
    assert asyncio.run(agent.run()) == 0


def test_nvml_findings_reach_the_api_once_across_restarts(tmp_path: Path) -> None:
    log, api, clock = tmp_path / "kern.log", FakeApi(), Clock()
    _write(log, "boot")
    for _ in range(2):  # a restart: the same NVML state again
        agent = _agent(log, api, clock, None, expected_gpus=2)
        asyncio.run(agent.start())
        agent.nvml = FakeNvml(_gpus(1, failure=1))
        agent.read(final=True)
        agent.probe_nvml()
        asyncio.run(agent.flush())
    reasons = sorted(e["reason"] for e in api.events.values())
    assert reasons == [REASON_COUNT, REASON_REMAP_FAILURE]
    assert all(e["count"] == 1 for e in api.events.values())
    annotation = api.nodes["gpu-1"]["metadata"]["annotations"][GPU_MAP_ANNOTATION]
    assert (
        parse_gpu_map(annotation).uuid_of("0000:3b:00")
        == "GPU-00000000-0000-0000-0000-000000000000"
    )


# --- fuzzing ---------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _kmsg_escape(text: str) -> str:
    """How the kernel prints a record's text in /dev/kmsg (kernel/printk/printk.c)."""
    return "".join(
        f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F or c == "\\" else c for c in text
    )


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=200))
def test_kmsg_escaping_round_trips(text: str) -> None:
    record = rec.parse_kmsg_record(f"6,1,2,-;{_kmsg_escape(text)}\n SUBSYSTEM=pci")
    assert record is not None
    assert record.text == text


_LINES = st.one_of(
    st.text(max_size=200),
    st.sampled_from([XID79, XID13, "NVRM: The NVIDIA GPU 0000:3b:00.0",
                     "NVRM: fallen off the bus and is not responding to commands.",
                     f"NVRM: GPU at PCI:0000:3b:00: {UUID}",
                     "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28"]),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINES, max_size=30))
def test_detector_never_raises_and_its_messages_read_back(lines: list[str]) -> None:
    detector = Detector()
    agg = Aggregator("gpu-1", "s", dt.timedelta(minutes=10))
    for i, line in enumerate(lines, 1):
        for record in (rec.text_record(i, line), rec.parse_kmsg_record(line)):
            if record is None:
                continue
            for f in detector.feed(record):
                agg.add(f, T0)
                if f.xid is not None:
                    back = parse_event(f.reason, f.message)
                    assert back is not None
                    assert (back.xid, back.pci_bus_id) == (f.xid, f.pci)
    assert sum(s.count for s in agg.series.values()) >= len(agg.series)


def test_the_gpus_seen_are_reported_dated_once_per_start_and_on_change() -> None:
    """gpuheal.io/gpus-seen: what NVML sees now and when (the proof a reset needs: the GPUs
    answered after it), written at the first probe after a start and when the set changes,
    not on every probe (no writes while nothing changes)."""
    from gpuheal.xid.identity import GPU_REPORT_ANNOTATION, parse_gpu_report

    api, clock = FakeApi(), Clock()
    node = asyncio.run(api.get_node("gpu-1"))
    assert node is not None
    both = {"0000:3b:00": UUID, "0000:5e:00": "GPU-00000000-0000-0000-0000-000000000001"}

    def report() -> Any:
        return parse_gpu_report(api.nodes["gpu-1"]["metadata"]["annotations"].get(
            GPU_REPORT_ANNOTATION))  # fmt: skip

    pub = Publisher(api, node=node_name(), node_obj=node, namespace="default", clock=clock)
    assert not asyncio.run(pub.sync_node(None, {}, None))  # no NVML probe yet: nothing to say
    assert asyncio.run(pub.sync_node(None, both, both))
    first = report()
    assert first is not None
    assert (first.at, dict(first.gpus.by_pci)) == (T0, both)
    clock.tick(30)
    assert not asyncio.run(pub.sync_node(None, both, both))  # unchanged: no write
    one = {"0000:3b:00": UUID}
    assert asyncio.run(pub.sync_node(None, both, one))  # a GPU lost (the map keeps it)
    assert dict(report().gpus.by_pci) == one
    clock.tick(30)
    assert asyncio.run(pub.sync_node(None, both, both))  # back
    assert report().at == T0 + dt.timedelta(seconds=60)
    # A new agent (restarted after a reset) reports again, though nothing changed.
    again = Publisher(api, node=node_name(), node_obj=api.nodes["gpu-1"], namespace="default",
                      clock=clock)  # fmt: skip
    clock.tick(5)
    assert asyncio.run(again.sync_node(None, both, both))
    assert report().at == T0 + dt.timedelta(seconds=65)
