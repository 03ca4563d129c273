"""Parsers against output captured from this machine's Slurm 22.05.8 (tests/unit/bridge/data)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gpuheal_bridge.api.models import JobEnd
from gpuheal_bridge.backends.base import NotFound, Rejected, Unavailable
from gpuheal_bridge.backends.cli import CommandResult, classify_failure, parse_kill_wait
from gpuheal_bridge.backends.parse import (
    ended_on,
    exit_parts,
    jobs_on,
    parse_excluded_lines,
    parse_exit_code,
    parse_job_lines,
    parse_jobs_json,
    parse_node_line,
    parse_node_lines,
    parse_nodes_json,
    parse_probe_line,
    split_state,
)

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("text", "state", "flags"),
    [
        ("IDLE", "IDLE", ()),
        ("MIXED+DRAIN", "MIXED", ("DRAIN",)),
        ("IDLE+DRAIN", "IDLE", ("DRAIN",)),
        ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", ("DRAIN", "NOT_RESPONDING")),
        ("idle*", "IDLE", ("NOT_RESPONDING",)),
        ("", "UNKNOWN", ()),
    ],
)
def test_split_state(text: str, state: str, flags: tuple[str, ...]) -> None:
    assert split_state(text) == (state, flags)


def test_node_line_admin_drain_reason_with_spaces_and_suffix() -> None:
    node = parse_node_line(read("node2_drain_admin.txt"))
    assert node.name == "node2"
    assert (node.state, node.flags) == ("IDLE", ("DRAIN",))
    assert node.reason == "admin maintenance: fan swap"
    assert node.reason_user == "root"
    assert node.reason_time == "2026-11-22T05:37:58"
    assert node.drain
    assert node.unavailable


def test_node_line_ours_while_jobs_run() -> None:
    node = parse_node_line(read("node_mixed_drain_ours.txt"))
    assert (node.state, node.flags) == ("MIXED", ("DRAIN",))
    assert node.reason == "gpuheal: nrem-cap xid=94"
    alloc = parse_node_line(read("node1_drain_ours_alloc.txt"))
    assert (alloc.state, alloc.flags, alloc.reason) == (
        "ALLOCATED",
        ("DRAIN",),
        "gpuheal: nrem-abc xid=79",
    )


def test_node_line_without_reason_and_os_with_spaces() -> None:
    line = read("node3_idle.txt")
    assert "OS=Linux " in line  # a value with spaces before State=
    node = parse_node_line(line)
    assert (node.name, node.state, node.flags, node.reason) == ("node3", "IDLE", (), None)
    assert not node.unavailable


def test_node_line_admin_down_is_unavailable() -> None:
    node = parse_node_line(read("node_down_admin.txt"))
    assert node.state == "DOWN"
    assert node.unavailable
    assert not node.drain
    assert node.reason == "admin: PSU replaced"


def test_node_lines_all() -> None:
    nodes = parse_node_lines(read("all_nodes.txt"))
    assert [n.name for n in nodes] == ["node1", "node2", "node3"]


def test_reason_containing_brackets_and_reason_word() -> None:
    line = read("node2_drain_admin.txt").replace(
        "Reason=admin maintenance: fan swap", "Reason=see ticket [OPS-1] Reason=psu"
    )
    node = parse_node_line(line)
    assert node.reason == "see ticket [OPS-1] Reason=psu"
    assert node.reason_user == "root"


def test_not_a_node_line() -> None:
    with pytest.raises(ValueError, match="not a"):
        parse_node_line("Node nodeX not found")


def test_sinfo_json_matches_text() -> None:
    nodes = {n.name: n for n in parse_nodes_json(json.loads(read("sinfo.json")))}
    assert nodes["node1"].state == "ALLOCATED"
    assert nodes["node1"].flags == ("DRAIN",)
    assert nodes["node1"].reason == "gpuheal: nrem-abc xid=79"
    assert nodes["node2"].reason == "admin maintenance: fan swap"
    assert nodes["node3"].reason is None
    assert not nodes["node3"].unavailable


@pytest.mark.parametrize("name", ["sinfo_ctld_down.json", "squeue_ctld_down.json"])
def test_json_with_slurmctld_down_is_unavailable(name: str) -> None:
    # 22.05's --json exits 0 with an error list when slurmctld is down.
    doc = json.loads(read(name))
    parse = parse_nodes_json if name.startswith("sinfo") else parse_jobs_json
    with pytest.raises(Unavailable):
        parse(doc)


def test_squeue_json_jobs_and_flags() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(json.loads(read("squeue_with_srun.json")))}
    assert jobs[1].state == "RUNNING"
    assert jobs[1].batch
    assert jobs[1].requeue
    assert jobs[2].requeue is False  # --no-requeue
    assert jobs[4].batch is False  # srun allocation
    assert jobs[3].state == "CANCELLED"  # --json includes finished jobs


def test_squeue_fields_read_as_the_json_says() -> None:
    """The filtered ``squeue -O`` listing (what the CLI backend runs) gives the same jobs as
    22.05's full ``--json`` dump, captured at the same moment: a finished job, a requeued one
    (BeginTime, restart 1, no host), held ones, a name with ``|`` and spaces, an exclusion."""
    excluded = parse_excluded_lines(read("squeue_excluded_all.txt"))
    assert excluded[3] == ["n-a1"]
    assert excluded[5] == []
    got = {j.job_id: j for j in parse_job_lines(read("squeue_fields_all.txt"), excluded)}
    want = {j.job_id: j for j in parse_jobs_json(json.loads(read("squeue_same_jobs.json")))}
    # 22.05 has no exit code among squeue's -O fields: the CLI backend reads it from
    # `scontrol show job` for the ended jobs it lists (ended_jobs_on_node)
    assert want[5].exit_status == 0
    no_exit = {"exit_status": None, "exit_signal": None}
    assert got == {k: v.model_copy(update=no_exit) for k, v in want.items()}
    assert (got[5].ended, got[5].end_time) == (JobEnd.COMPLETED, want[5].end_time)
    assert got[5].end_time is not None
    assert (got[3].required_nodes, got[3].node_count) == (["n-a0"], 1)
    assert got[2].name == "we|ird name"
    assert (got[1].state, got[1].reason, got[1].restart_count, got[1].batch_host) == (
        "PENDING", "BeginTime", 1, None)  # fmt: skip
    assert got[5].requeue is False
    with pytest.raises(ValueError, match="unexpected squeue line"):
        parse_job_lines("12|RUNNING|None")


def test_jobs_on_filters_node_and_finished_jobs() -> None:
    jobs = parse_jobs_json(json.loads(read("squeue_with_srun.json")))
    assert sorted(j.job_id for j in jobs_on(jobs, "node3")) == [1, 4]
    assert [j.job_id for j in jobs_on(jobs, "node1")] == [2]
    assert jobs_on(jobs, "node2") == []


def test_requeued_job_shows_restart_count_and_exclusion() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(json.loads(read("squeue_after_requeue.json")))}
    assert jobs[1].restart_count == 1
    assert jobs[1].excluded_nodes == ["node1"]
    assert jobs[1].nodes == ["node3"]


def test_pending_begintime_json_and_probe() -> None:
    jobs = {j.job_id: j for j in parse_jobs_json(json.loads(read("squeue_pending_begintime.json")))}
    assert (jobs[9].state, jobs[9].reason, jobs[9].nodes) == ("PENDING", "BeginTime", [])
    probe = parse_probe_line(read("probe_pending.txt"))
    assert (probe.job_id, probe.state, probe.reason, probe.nodes) == (9, "PENDING", "BeginTime", [])


def test_probe_line_running() -> None:
    probe = parse_probe_line("1|RUNNING|None|node[1-2]\n")
    assert (probe.state, probe.reason, probe.nodes) == ("RUNNING", None, ["node1", "node2"])
    with pytest.raises(ValueError, match="unexpected"):
        parse_probe_line("garbage")


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        (
            "slurm_load_node error: Unable to contact slurm controller (connect failure)",
            Unavailable,
        ),
        ("Unexpected message received for job 1", Unavailable),
        ("Node nodeX not found", NotFound),
        ("slurm_update error: Invalid node name specified", NotFound),
        ("Invalid job id specified for job 999", NotFound),
        ("squeue: error: Invalid job id: 4294906480", NotFound),  # an id above 2**31 - 1
        ("squeue: error: Invalid node name nodeX", NotFound),
        ("slurm_update error: Invalid node state specified", Rejected),
        ("Requested operation is presently disabled for job 2", Rejected),
        ("Job is pending execution for job 3", Rejected),
    ],
)
def test_classify_failure_real_messages(stderr: str, error: type[Exception]) -> None:
    exc = classify_failure(CommandResult(("scontrol",), 1, "", stderr))
    assert type(exc) is error
    assert stderr[:40] in str(exc)


def test_json_partly_allocated_node_is_mixed_like_scontrol() -> None:
    doc = json.loads(read("sinfo.json"))
    node = dict(doc["nodes"][0], idle_cpus=1)
    assert parse_nodes_json({"nodes": [node]})[0].state == "MIXED"
    assert parse_nodes_json(doc)[0].state == "ALLOCATED"  # no idle CPU left: ALLOCATED
    # 26.05.5's v0.0.45 (seen on the sandbox, one 1-GPU job on 8 CPUs): scontrol says MIXED
    v45 = {
        "name": "n0", "state": ["ALLOCATED"], "cpus": 8, "alloc_cpus": 0, "alloc_idle_cpus": 8,
        "reason_changed_at": {"set": True, "infinite": False, "number": 1795000000},
    }  # fmt: skip
    node = parse_nodes_json({"nodes": [v45]})[0]
    assert node.state == "MIXED"
    assert node.reason_time == dt.datetime.fromtimestamp(1795000000).isoformat()


def test_ended_jobs_say_how_and_when_they_ended() -> None:
    """Captured here: 2 SIGKILLed on n0, 3 `exit 3` on n1, 4 completed on n0, 5 scancelled,
    6 running on n[0,2] with `-w n0,n2`."""
    jobs = {j.job_id: j for j in parse_jobs_json(json.loads(read("squeue_ended.json")))}
    killed, exited, done, cancelled, pinned = (jobs[i] for i in (2, 3, 4, 5, 6))
    assert (killed.state, killed.ended, killed.exit_signal, killed.exit_status) == (
        "FAILED",
        JobEnd.FAILED,
        9,
        None,
    )
    assert (exited.ended, exited.exit_status, exited.exit_signal) == (JobEnd.FAILED, 3, None)
    assert (done.ended, done.exit_status) == (JobEnd.COMPLETED, 0)
    assert cancelled.ended is JobEnd.CANCELLED
    assert killed.end_time is not None
    assert killed.end_time.tzinfo is not None
    assert (pinned.ended, pinned.end_time, pinned.exit_status) == (None, None, None)
    assert pinned.required_nodes == ["n0", "n2"]
    assert pinned.nodes == ["n0", "n2"]
    assert pinned.node_count == 2
    assert killed.required_nodes == ["n0"]


def test_ended_on_filters_by_node_and_end_time() -> None:
    jobs = parse_jobs_json(json.loads(read("squeue_ended.json")))
    first = min(j.end_time for j in jobs if j.end_time is not None)
    assert sorted(j.job_id for j in ended_on(jobs, "n0", first)) == [2, 4, 5]
    later = max(j.end_time for j in jobs if j.job_id == 4 and j.end_time is not None)
    assert [j.job_id for j in ended_on(jobs, "n1", later + dt.timedelta(seconds=1))] == []


@pytest.mark.parametrize(
    ("raw", "parts"),
    [
        (0, (0, None)),
        (256, (1, None)),
        (768, (3, None)),
        (9, (None, 9)),
        (15, (None, 15)),
        ({"return_code": {"set": True, "number": 2}, "signal": {"id": {"number": 0}}}, (2, None)),
        ({"return_code": 0, "signal": {"id": 9}}, (0, 9)),
        (None, (None, None)),
    ],
)
def test_exit_parts(raw: object, parts: tuple[int | None, int | None]) -> None:
    assert exit_parts(raw) == parts


def test_kill_wait_from_show_config() -> None:
    assert parse_kill_wait("JobRequeue              = 1\nKillWait                = 30 sec\n") == 30
    assert parse_kill_wait("nothing here") is None


def test_exit_code_of_scontrol_show_job() -> None:
    assert parse_exit_code("JobId=7 ... Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:9 x") == (
        None,
        9,
    )
    assert parse_exit_code("JobId=8 ExitCode=3:0 DerivedExitCode=0:0") == (3, None)
    assert parse_exit_code("JobId=9 JobState=PENDING") == (None, None)
