"""The Slurm bridge against a real Slurm (the sandbox's ``make_slurm_cluster``), over real HTTP.

Each test gets its own 3-node cluster (gpu-node-0..2) and a bridge served by uvicorn on a free
loopback port in a thread, configured as in production (token file, state dir, audit log,
CLI backend). Timings are printed (``-s``) but not asserted; ``bench/`` measures them.

The ``bridge`` fixture runs every test that uses it on each Slurm release the sandbox has
(``[22.05]``, ``[26.05]``), with that release's own clients behind the CLI backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from gpuheal_bridge.api.models import CheckpointSignal, RequeueMode, RequeueOptions
from gpuheal_bridge.backends.base import Unsupported
from gpuheal_bridge.backends.cli import CliBackend
from gpuheal_bridge.backends.rest import RestBackend
from gpuheal_bridge.client import BridgeClient, BridgeConflict
from gpuheal_bridge.server.app import BridgeSettings, create_app
from gpuheal_dev.sandbox.faults import job_processes
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.fixtures.slurm import SLURM_RELEASES
from tests.integration.operator_harness import free_port

pytestmark = pytest.mark.integration

TOKEN = "integration-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODES = ("gpu-node-0", "gpu-node-1", "gpu-node-2")

# Checkpointing batch job: a step every STEP_S seconds, a checkpoint every CKPT_EVERY steps,
# and one on USR1 (the checkpoint signal). The trap runs at once because the loop waits on
# a background sleep.
JOB = """\
#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --gres=gpu:1
CK=$1; STEP_S=${2:-0.2}; CKPT_EVERY=${3:-10}
step=0; [ -f "$CK" ] && step=$(cat "$CK")
echo "START host=$SLURMD_NODENAME restart=${SLURM_RESTART_COUNT:-0} resume_step=$step"
save() { echo "$step" > "$CK.tmp" && mv "$CK.tmp" "$CK"; }
trap 'save; echo "USR1 checkpoint step=$step host=$SLURMD_NODENAME"' USR1
trap 'echo "TERM step=$step host=$SLURMD_NODENAME"; exit 143' TERM
while true; do
  step=$((step+1))
  [ $((step % CKPT_EVERY)) -eq 0 ] && save
  sleep "$STEP_S" & wait $!
done
"""


@dataclass
class Bridge:
    url: str
    cluster: SlurmCluster
    state_dir: Path
    audit_log: Path
    http: httpx.Client

    def client(self) -> BridgeClient:
        return BridgeClient(self.url, TOKEN, retries=1, backoff=0.1)

    def audit(self) -> list[dict[str, object]]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]


@contextlib.contextmanager
def serve(cluster: SlurmCluster, state_dir: Path, audit_log: Path) -> Iterator[str]:
    """Run the bridge (uvicorn, CLI backend) in a thread; yield its base URL."""
    bin_dir = str(cluster.bin_dir) if cluster.bin_dir else None  # that Slurm's own clients
    backend = CliBackend(env=cluster.subprocess_env(), bin_dir=bin_dir, timeout=15)
    app = create_app(
        BridgeSettings(
            backend=backend,
            tokens={"operator": TOKEN},
            state_dir=state_dir,
            audit_log=audit_log,
            retry_after=2,
        )
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name=f"bridge-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("bridge did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(params=SLURM_RELEASES)
def bridge(
    request: pytest.FixtureRequest, make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path
) -> Iterator[Bridge]:
    cluster = make_slurm_cluster(NODES, name="bridge", slurm=request.param)
    state_dir, audit_log = tmp_path / "state", tmp_path / "audit.jsonl"
    with serve(cluster, state_dir, audit_log) as url, httpx.Client(base_url=url, timeout=120) as h:
        yield Bridge(url, cluster, state_dir, audit_log, h)


@pytest.fixture
def job_script(tmp_path: Path) -> Path:
    path = tmp_path / "jobs" / "ckpt.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(JOB)
    path.chmod(0o755)
    return path


def submit(cluster: SlurmCluster, script: Path, *args: str, sbatch: tuple[str, ...] = ()) -> int:
    out = script.parent / "out-%j.txt"
    jid = cluster.run(
        "sbatch",
        "--parsable",
        "-o",
        str(out),
        "--chdir",
        str(script.parent),
        *sbatch,
        str(script),
        *args,
    ).stdout.strip()
    return int(jid.split(";")[0])


def job_field(cluster: SlurmCluster, job_id: int, fmt: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", fmt).stdout.strip()


def wait_for(pred: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def restart_count(cluster: SlurmCluster, job_id: int) -> int:
    text = cluster.run("scontrol", "show", "job", "-o", str(job_id)).stdout
    m = re.search(r"\bRestarts=(\d+)", text)
    assert m, text
    return int(m.group(1))


def running_on(cluster: SlurmCluster, job_id: int) -> str:
    wait_for(lambda: job_field(cluster, job_id, "%T") == "RUNNING", f"job {job_id} running")
    return job_field(cluster, job_id, "%N")


# ---- the main path --------------------------------------------------------------------------


async def test_drain_requeue_with_checkpoint_resumes_elsewhere(
    bridge: Bridge, job_script: Path
) -> None:
    cluster = bridge.cluster
    ckpt = job_script.parent / "job.state"
    jid = submit(cluster, job_script, str(ckpt), "0.2", "10")
    node_a = running_on(cluster, jid)
    wait_for(lambda: ckpt.exists() and int(ckpt.read_text()) >= 10, "first checkpoint")
    opts = RequeueOptions(
        checkpoint=CheckpointSignal(signal="USR1", grace_seconds=1.5),
        expedite=True,
        wait_running_seconds=30,
    )
    t0 = time.monotonic()
    async with bridge.client() as client:
        resp = await client.drain(node_a, incident="nrem-it1", xid=79, requeue=opts)
    elapsed = time.monotonic() - t0
    assert resp.outcome == "drained"
    assert resp.current.reason == "gpuheal: nrem-it1 xid=79"
    [job] = resp.jobs
    assert job.job_id == jid
    assert job.outcome == "requeued", job
    assert job.signalled
    assert job.excluded_nodes == [node_a]
    assert job.expedited
    assert job.state_after == "RUNNING"
    assert job.nodes_after
    assert node_a not in job.nodes_after
    assert job.restart_count == 1
    print(
        f"\ndrain+requeue call {elapsed:.2f}s (grace 1.5s); requeue->PENDING "
        f"{job.requeue_seconds}s; requeue->RUNNING (expedite) {job.requeue_to_running_seconds}s"
    )

    out = job_script.parent / f"out-{jid}.txt"
    wait_for(lambda: out.read_text().count("START") == 2, "second START line")
    text = out.read_text()
    usr1 = [int(x) for x in re.findall(r"USR1 checkpoint step=(\d+) host=" + node_a, text)]
    term = [int(x) for x in re.findall(r"TERM step=(\d+)", text)]
    starts = re.findall(r"START host=(\S+) restart=(\d) resume_step=(\d+)", text)
    assert usr1, text  # the job got the checkpoint signal before the requeue
    assert starts[1][0] != node_a
    assert starts[1][1] == "1"
    resume_step = int(starts[1][2])
    assert resume_step >= usr1[0]  # resumed from (at least) the signal's checkpoint
    assert term
    assert term[0] - resume_step <= 10  # lost at most one checkpoint interval

    # resume A: ours, so it goes back to service
    async with bridge.client() as client:
        resumed = await client.resume(node_a, incident="nrem-it1")
    assert resumed.outcome == "resumed"
    assert resumed.previous.owner == "gpuheal"
    wait_for(lambda: cluster.node_states()[node_a] == "idle", f"{node_a} idle", timeout=10)
    cluster.run("scancel", str(jid))

    ops = [(e["op"], e["status"]) for e in bridge.audit()]
    assert ops == [("drain_node", 200), ("resume_node", 200)]
    metrics = bridge.http.get("/metrics").text
    assert 'gpuheal_bridge_requests_total{operation="drain_node",result="success"} 1.0' in metrics
    assert 'gpuheal_bridge_jobs_total{outcome="requeued"} 1.0' in metrics


async def test_requeue_without_expedite_waits_for_cred_expire(
    bridge: Bridge, job_script: Path
) -> None:
    cluster = bridge.cluster
    jid = submit(cluster, job_script, str(job_script.parent / "s"), "0.2", "5")
    node_a = running_on(cluster, jid)
    async with bridge.client() as client:
        result = await client.requeue_job(
            jid, RequeueOptions(wait_running_seconds=40), from_node=node_a
        )
    assert result.outcome == "requeued"
    assert result.state_after == "RUNNING"
    assert result.nodes_after
    assert node_a not in result.nodes_after
    print(f"\nrequeue->RUNNING without expedite: {result.requeue_to_running_seconds}s")
    cluster.run("scancel", str(jid))


async def test_requeuehold_keeps_the_job_held(bridge: Bridge, job_script: Path) -> None:
    cluster = bridge.cluster
    jid = submit(cluster, job_script, str(job_script.parent / "s"))
    node_a = running_on(cluster, jid)
    async with bridge.client() as client:
        result = await client.requeue_job(
            jid, RequeueOptions(mode=RequeueMode.REQUEUE_HOLD), from_node=node_a
        )
    assert result.outcome == "requeued_held"
    assert result.excluded_nodes == [node_a]
    assert job_field(cluster, jid, "%T|%r") == "PENDING|job requeued in held state"
    cluster.run("scancel", str(jid))


async def test_a_node_back_in_service_is_no_longer_excluded_from_the_jobs_it_failed(
    bridge: Bridge, job_script: Path
) -> None:
    """Two faults under one job, the first node repaired between them: the job excludes the
    second only; a held job loses the exclusion as soon as its node is resumed; the job's
    own exclusion stays throughout."""
    cluster = bridge.cluster
    own = NODES[2]
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=(f"--exclude={own}",))
    first = running_on(cluster, jid)
    moved = RequeueOptions(expedite=True, wait_running_seconds=30)
    async with bridge.client() as client:
        drained = await client.drain(first, incident="nrem-x1", xid=79, requeue=moved)
        assert drained.jobs[0].excluded_nodes == sorted([first, own])
        second = drained.jobs[0].nodes_after[0]
        resumed = await client.resume(first, incident="nrem-x1")
        assert resumed.exclusion_lifted_from == []  # running: Slurm will not update it now
        assert first in (await client.get_job(jid)).excluded_nodes
        again = await client.drain(second, incident="nrem-x2", xid=79, requeue=moved)
        assert again.jobs[0].outcome == "requeued", again.jobs[0]
        assert again.jobs[0].excluded_nodes == sorted([second, own])  # the first: lifted
        third = again.jobs[0].nodes_after[0]
        assert third == first  # the only node left for it: the repaired one
        held = RequeueOptions(mode=RequeueMode.REQUEUE_HOLD)
        await client.drain(third, incident="nrem-x3", xid=79, requeue=held)
        excluded = (await client.get_job(jid)).excluded_nodes
        assert sorted(excluded) == sorted([second, third, own])
        await client.resume(second, incident="nrem-x2")
        lifted = await client.resume(third, incident="nrem-x3")
        # pending: both lifted at once (the second when it was resumed), the job's own kept
        assert (await client.get_job(jid)).excluded_nodes == [own]
    assert lifted.exclusion_lifted_from == [jid]
    assert job_field(cluster, jid, "%T") == "PENDING"  # still held: only the list changed
    cluster.run("scancel", str(jid))


# ---- ownership ------------------------------------------------------------------------------


async def test_admin_drain_keeps_its_reason_and_the_jobs_still_move(
    bridge: Bridge, job_script: Path
) -> None:
    """Who drained the node decides who may resume it, not whether its jobs move: the admin's
    reason stays (and resume is refused), the job pinned there is requeued, released from its
    --nodelist and runs elsewhere."""
    cluster = bridge.cluster
    node = NODES[1]
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=("-w", node))
    running_on(cluster, jid)
    admin_reason = "admin: replacing fan, ticket OPS-42"
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={admin_reason}")

    body = {"incident": "nrem-it2", "xid": 79, "requeue": {"expedite": True, "release_node": True}}
    drained = bridge.http.post(f"/v1/nodes/{node}/drain", headers=AUTH, json=body)
    assert drained.status_code == 200
    assert drained.json()["outcome"] == "drained_by_other"
    assert drained.json()["owner"] == "other"
    [job] = drained.json()["jobs"]
    assert job["outcome"] == "requeued"
    assert job["released_node"] is True
    assert job["excluded_nodes"] == [node]
    refused = bridge.http.post(f"/v1/nodes/{node}/resume", headers=AUTH, json={})
    assert refused.status_code == 409
    assert refused.json()["owner"] == "other"
    async with bridge.client() as client:
        with pytest.raises(BridgeConflict):
            await client.resume(node, incident="nrem-it2")

    text = cluster.run("scontrol", "show", "node", "-o", node).stdout
    assert f"Reason={admin_reason} [" in text  # reason untouched
    assert running_on(cluster, jid) != node
    assert restart_count(cluster, jid) == 1
    cluster.run("scancel", str(jid))


def test_resume_is_idempotent_and_reports_previous_state(bridge: Bridge) -> None:
    node = NODES[2]
    first = bridge.http.post(f"/v1/nodes/{node}/resume", headers=AUTH, json={})
    assert first.status_code == 200
    assert first.json()["outcome"] == "not_drained"  # Slurm itself would refuse this RESUME
    bridge.http.post(f"/v1/nodes/{node}/drain", headers=AUTH, json={"incident": "nrem-it3"})
    again = bridge.http.post(f"/v1/nodes/{node}/drain", headers=AUTH, json={"incident": "other"})
    assert again.json()["outcome"] == "already_drained"
    assert again.json()["current"]["incident"] == "nrem-it3"
    # a drain of gpuheal's is lifted only for its incident (or with force)
    unnamed = bridge.http.post(f"/v1/nodes/{node}/resume", headers=AUTH, json={})
    assert unnamed.status_code == 409
    assert "nrem-it3" in unnamed.json()["message"]
    resumed = bridge.http.post(
        f"/v1/nodes/{node}/resume", headers=AUTH, json={"incident": "nrem-it3"}
    )
    assert resumed.json()["outcome"] == "resumed"
    assert resumed.json()["previous"]["reason"] == "gpuheal: nrem-it3"


# ---- safety ---------------------------------------------------------------------------------


def test_idempotency_key_requeues_once_even_across_restart(
    bridge: Bridge, job_script: Path
) -> None:
    cluster = bridge.cluster
    jid = submit(cluster, job_script, str(job_script.parent / "s"))
    node_a = running_on(cluster, jid)
    headers = {**AUTH, "Idempotency-Key": f"nrem-it4/requeue/{jid}"}
    body = {"from_node": node_a, "expedite": True, "wait_running_seconds": 20}
    first = bridge.http.post(f"/v1/jobs/{jid}/requeue", headers=headers, json=body)
    assert first.status_code == 200
    assert first.json()["outcome"] == "requeued"
    running_on(cluster, jid)
    second = bridge.http.post(f"/v1/jobs/{jid}/requeue", headers=headers, json=body)
    assert second.headers["Idempotency-Replayed"] == "true"
    assert second.json() == first.json()
    # a new bridge process on the same state dir answers from the persisted store
    with (
        serve(cluster, bridge.state_dir, bridge.audit_log) as url,
        httpx.Client(base_url=url, timeout=60) as h,
    ):
        third = h.post(f"/v1/jobs/{jid}/requeue", headers=headers, json=body)
    assert third.headers["Idempotency-Replayed"] == "true"
    time.sleep(1)
    assert restart_count(cluster, jid) == 1
    assert job_field(cluster, jid, "%T") == "RUNNING"
    replays = [e["replayed"] for e in bridge.audit() if e["op"] == "requeue_job"]
    assert replays == [False, True, True]
    cluster.run("scancel", str(jid))


def test_finished_and_no_requeue_jobs_are_reported_not_touched(
    bridge: Bridge, job_script: Path
) -> None:
    cluster = bridge.cluster
    sbatch = ("sbatch", "--parsable", "-w", NODES[0], "--wrap", "true")
    done = int(cluster.run(*sbatch).stdout.strip())
    wait_for(lambda: job_field(cluster, done, "%T") == "COMPLETED", "job completed")
    body = {"from_node": NODES[0]}
    resp = bridge.http.post(f"/v1/jobs/{done}/requeue", headers=AUTH, json=body)
    assert resp.json()["outcome"] == "not_running"
    time.sleep(0.5)
    assert job_field(cluster, done, "%T") == "COMPLETED"  # not revived

    node = NODES[0]
    noreq = submit(
        cluster, job_script, str(job_script.parent / "s"), sbatch=("--no-requeue", "-w", node)
    )
    running_on(cluster, noreq)
    body = {"incident": "nrem-it5", "requeue": {}}
    drained = bridge.http.post(f"/v1/nodes/{node}/drain", headers=AUTH, json=body).json()
    [job] = drained["jobs"]
    assert job["outcome"] == "not_requeueable"
    assert "--no-requeue" in job["detail"]
    assert job_field(cluster, noreq, "%T") == "RUNNING"
    cluster.run("scancel", str(noreq))


def test_auth_validation_and_not_found(bridge: Bridge) -> None:
    h = bridge.http
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789abcdef"}):
        resp = h.post(f"/v1/nodes/{NODES[0]}/drain", headers=headers, json={"incident": "x"})
        assert resp.status_code == 401
    assert bridge.cluster.node_states()[NODES[0]] == "idle"  # 401 touched nothing
    # a 401 written down with the caller's address, and no one's name; the second from the
    # same address within the minute is only counted (the next line says how many: suppressed)
    assert [(e["who"], e["peer"], e["status"], e["op"]) for e in bridge.audit()] == [
        (None, "127.0.0.1", 401, "drain_node")
    ]
    for bad in ("node1;reboot", "node[1-100]", "-rf"):
        resp = h.post(f"/v1/nodes/{bad}/drain", headers=AUTH, json={"incident": "x"})
        assert resp.status_code == 422, bad
        assert resp.json()["error"] == "invalid"
    assert h.get("/v1/jobs/1_2", headers=AUTH).status_code == 422
    assert h.get("/v1/nodes/no-such-node", headers=AUTH).status_code == 404
    body = {"from_node": NODES[0]}
    assert h.post("/v1/jobs/999999/requeue", headers=AUTH, json=body).status_code == 404
    assert h.get("/healthz").status_code == 200
    assert h.get("/readyz").json()["ready"] is True


# ---- slurmctld down -------------------------------------------------------------------------


def _restart_slurmctld(cluster: SlurmCluster) -> Callable[[], None]:
    """Stop the cluster's slurmctld alone; return a function that starts it again (its state,
    the jobs and drains, recovered from StateSaveLocation)."""
    cluster.stop_daemon("slurmctld")
    return lambda: cluster.start_daemon("slurmctld")


def test_503_when_slurmctld_is_down_and_nothing_lost(bridge: Bridge, job_script: Path) -> None:
    cluster = bridge.cluster
    node = NODES[0]
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=("-w", node))
    running_on(cluster, jid)
    assert (
        bridge.http.post(
            f"/v1/nodes/{node}/drain", headers=AUTH, json={"incident": "nrem-it6"}
        ).status_code
        == 200
    )
    start_again = _restart_slurmctld(cluster)
    try:
        ready = bridge.http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False
        resp = bridge.http.get(f"/v1/nodes/{node}", headers=AUTH)
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "5"  # max(configured 2, backend's 5)
        headers = {**AUTH, "Idempotency-Key": "while-down"}
        body = {"incident": "nrem-it6", "requeue": {}}
        down = bridge.http.post(f"/v1/nodes/{node}/drain", headers=headers, json=body)
        assert down.status_code == 503
        assert down.json()["error"] == "unavailable"
    finally:
        start_again()
    wait_for(lambda: bridge.http.get("/readyz").status_code == 200, "slurmctld back", 30)
    # nothing lost: our drain and the job survived; the 503 was not stored, so a retry acts
    node_state = bridge.http.get(f"/v1/nodes/{node}", headers=AUTH).json()
    assert node_state["reason"] == "gpuheal: nrem-it6"
    assert job_field(cluster, jid, "%T") == "RUNNING"
    retry = bridge.http.post(f"/v1/nodes/{node}/drain", headers=headers, json=body)
    assert retry.status_code == 200
    assert retry.json()["outcome"] == "already_drained"
    assert [j["outcome"] for j in retry.json()["jobs"]] == ["requeued"]
    cluster.run("scancel", str(jid))


# ---- slurmrestd backend (reads on the real 22.05 slurmrestd) -----------------------------------


async def test_rest_backend_reads_and_capabilities(
    make_slurm_cluster: Callable[..., SlurmCluster], job_script: Path
) -> None:
    # slurmrestd v0.0.38 on its socket (rest_auth/local); 26.05's (v0.0.45, JWT):
    # test_rest_backend_on_26_05_reads_drains_and_resumes_with_jwt
    cluster = make_slurm_cluster(NODES, name="restd", restd=True, slurm="22.05")
    assert cluster.restd_url is not None
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=("-w", NODES[0]))
    running_on(cluster, jid)
    cluster.run("scontrol", "update", f"NodeName={NODES[1]}", "State=DRAIN", "Reason=admin x y")
    rest = RestBackend(cluster.restd_url)
    cli = CliBackend(env=cluster.subprocess_env())
    try:
        ping = await rest.ping()
        assert ping.up
        assert rest.version == "v0.0.38"
        for name in NODES:
            assert await rest.get_node(name) == await cli.get_node(name)
        assert [j.job_id for j in await rest.jobs_on_node(NODES[0])] == [jid]
        assert (await rest.get_job(jid)).state == "RUNNING"
        with pytest.raises(Unsupported):
            await rest.drain(NODES[2], "gpuheal: x")
        with pytest.raises(Unsupported):
            await rest.requeue(jid, hold=False)
        # with the CLI as write fallback the same backend can do everything
        hybrid = RestBackend(cluster.restd_url, fallback=cli)
        await hybrid.ping()
        await hybrid.drain(NODES[2], "gpuheal: nrem-it7")
        assert (await hybrid.get_node(NODES[2])).reason == "gpuheal: nrem-it7"
        await hybrid.aclose()
    finally:
        await rest.aclose()
        cluster.run("scancel", str(jid))


# ---- reboot and the reserve pool ---------------------------------------------------------------


def test_reboot_goes_through_slurms_reboot_states_and_stays_ours_until_resumed(
    bridge: Bridge,
) -> None:
    """`POST /reboot` on a node in service: drained with our reason, rebooted by Slurm's
    RebootProgram (the sandbox restarts its slurmd with -b), back with a new BootTime and
    still drained by us; then resume, and hand another node to the reserve pool."""
    node = NODES[0]
    body = {"incident": "nrem-rb1", "xid": 79}
    first = bridge.http.post(f"/v1/nodes/{node}/reboot", headers=AUTH, json=body)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["outcome"] == "requested"
    assert answer["previous"]["owner"] == "none"
    assert answer["current"]["incident"] == "nrem-rb1"
    assert any(f.startswith("REBOOT") for f in answer["current"]["flags"]), answer["current"]
    before = answer["previous"]["boot_time"]
    assert before
    again = bridge.http.post(f"/v1/nodes/{node}/reboot", headers=AUTH, json=body)
    assert again.json()["outcome"] in ("already_requested", "requested")

    def back() -> bool:
        st = bridge.http.get(f"/v1/nodes/{node}", headers=AUTH).json()
        return not any(f.startswith("REBOOT") for f in st["flags"]) and st["boot_time"] != before

    wait_for(back, "rebooted", timeout=60)
    st = bridge.http.get(f"/v1/nodes/{node}", headers=AUTH).json()
    assert (st["drain"], st["owner"], st["incident"]) == (True, "gpuheal", "nrem-rb1")
    resumed = bridge.http.post(
        f"/v1/nodes/{node}/resume", headers=AUTH, json={"incident": "nrem-rb1"}
    )
    assert resumed.json()["outcome"] == "resumed"

    theirs = NODES[1]
    bridge.cluster.run("scontrol", "update", f"NodeName={theirs}", "State=DRAIN",
                       "Reason=admin: firmware")  # fmt: skip
    refused = bridge.http.post(f"/v1/nodes/{theirs}/reboot", headers=AUTH, json=body)
    assert refused.status_code == 409
    assert refused.json()["owner"] == "other"

    pool_node = NODES[2]
    bridge.http.post(f"/v1/nodes/{pool_node}/drain", headers=AUTH, json={"incident": "nrem-rb2"})
    reserved = bridge.http.post(
        f"/v1/nodes/{pool_node}/reserve", headers=AUTH, json={"incident": "nrem-rb2"}
    )
    assert reserved.status_code == 200, reserved.text
    assert reserved.json()["current"]["reason"] == "reserve pool"
    assert reserved.json()["current"]["owner"] == "other"
    text = bridge.cluster.run("scontrol", "show", "node", "-o", pool_node).stdout
    assert "Reason=reserve pool [" in text


def test_a_job_that_died_on_the_node_is_listed_and_requeued_when_asked(
    bridge: Bridge, job_script: Path
) -> None:
    """A job killed on the node (as by a lost GPU) is FAILED: listed with how and when it
    ended, left alone by a plain requeue, requeued with requeue_ended, never a completed one."""
    cluster = bridge.cluster
    node = NODES[0]
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=("-w", node))
    running_on(cluster, jid)
    done = int(cluster.run("sbatch", "--parsable", "-w", node, "--wrap", "true").stdout.strip())
    since = time.time() - 5
    kill_job(cluster, jid)
    wait_for(lambda: job_field(cluster, jid, "%T") == "FAILED", "job FAILED")
    wait_for(lambda: job_field(cluster, done, "%T") == "COMPLETED", "job completed")

    listed = bridge.http.get(f"/v1/nodes/{node}/jobs?ended_since={since}", headers=AUTH).json()
    ended = {j["job_id"]: j for j in listed["jobs"]}
    assert ended[jid]["ended"] == "failed"
    assert ended[jid]["exit_signal"] == 9
    assert ended[jid]["required_nodes"] == [node]
    assert ended[done]["ended"] == "completed"
    assert bridge.http.get(f"/v1/nodes/{node}/jobs", headers=AUTH).json()["jobs"] == []

    plain = bridge.http.post(f"/v1/jobs/{jid}/requeue", headers=AUTH, json={"from_node": node})
    assert plain.json()["outcome"] == "not_running"
    for job in (done, jid):
        body = {
            "from_node": node,
            "requeue_ended": True,
            "release_node": True,
            "expedite": True,
            "wait_running_seconds": 20,
        }
        answer = bridge.http.post(f"/v1/jobs/{job}/requeue", headers=AUTH, json=body).json()
        if job == done:
            assert answer["outcome"] == "not_running"  # never revived
        else:
            assert answer["outcome"] == "requeued"
            assert answer["ended_before"] == "failed"
            assert answer["released_node"] is True
            assert answer["state_after"] == "RUNNING"
            assert answer["nodes_after"] != [node]
    assert job_field(cluster, done, "%T") == "COMPLETED"
    assert restart_count(cluster, jid) == 1
    cluster.run("scancel", str(jid))


def job_pids(cluster: SlurmCluster, job_id: int) -> list[int]:
    node = job_field(cluster, job_id, "%N")
    return job_processes(cluster.conf_path, node, job_id)


def kill_job(cluster: SlurmCluster, job_id: int) -> None:
    """SIGKILL the job's processes on its node, as a lost GPU does, until Slurm sees it end.

    Slurm says RUNNING before the batch shell has exec'd (its process is still slurmstepd, so
    it is not listed): a single listing then kills nothing (seen in CI). The short ``sleep``
    children may also end between the listing and the kill."""

    def killed() -> bool:
        for pid in job_pids(cluster, job_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return job_field(cluster, job_id, "%T") != "RUNNING"

    wait_for(killed, f"job {job_id} killed on its node")


async def test_rest_backend_on_26_05_reads_drains_and_resumes_with_jwt(
    make_slurm_cluster: Callable[..., SlurmCluster], job_script: Path
) -> None:
    """26.05's slurmrestd (v0.0.45, JWT): the rest backend's reads equal the CLI's, its drain
    and resume go through ``POST /slurm/v0.0.45/node/{name}``, its job updates set and clear
    ExcNodeList/ReqNodeList, its requeuehold holds the job; reboot is not its own (no
    endpoint); its requeue of a running job: test_bridge_rest_only.py."""
    cluster = make_slurm_cluster(NODES, name="restd26", restd=True, slurm="26.05")
    assert cluster.restd_url is not None
    assert cluster.restd_token_file is not None
    gres = ("--gres=gpu:2",)
    jid = submit(cluster, job_script, str(job_script.parent / "s"), sbatch=("-w", NODES[0], *gres))
    running_on(cluster, jid)
    token = cluster.restd_token_file.read_text().strip()
    rest = RestBackend(cluster.restd_url, user="root", token=token)
    cli = CliBackend(env=cluster.subprocess_env(), bin_dir=str(cluster.bin_dir))
    try:
        ping = await rest.ping()
        assert (ping.up, ping.version, rest.version) == (True, ping.version, "v0.0.45")
        assert str(ping.version).startswith("26.05.")
        assert [j.job_id for j in await rest.jobs_on_node(NODES[0])] == [jid]
        # the GPUs the job holds there: gres_detail (REST), scontrol show job -d (CLI)
        gpus = [j.gpus for j in await rest.jobs_on_node(NODES[0], gpus=True)]
        assert gpus == [j.gpus for j in await cli.jobs_on_node(NODES[0], gpus=True)] == [[0, 1]]
        assert (await rest.get_job(jid)).state == "RUNNING"
        await rest.drain(NODES[1], "gpuheal: nrem-r26")
        for name in NODES:
            assert await rest.get_node(name) == await cli.get_node(name)
        drained = await cli.get_node(NODES[1])
        assert (drained.drain, drained.reason) == (True, "gpuheal: nrem-r26")
        await rest.resume(NODES[1])
        assert not (await cli.get_node(NODES[1])).drain
        with pytest.raises(Unsupported):
            await rest.reboot(NODES[1], "gpuheal: nrem-r26", asap=True, resume=True)
        # its job updates set and clear a pending job's node lists (a held job stays pending)
        held = submit(cluster, job_script, "x", sbatch=("-H", "-w", NODES[1], "-x", NODES[0]))
        await rest.set_excluded_nodes(held, [NODES[2]])
        got = await cli.get_job(held)
        assert (got.excluded_nodes, got.required_nodes) == ([NODES[2]], [NODES[1]])
        await rest.set_excluded_nodes(held, [], required_nodes=[])
        got = await cli.get_job(held)
        assert (got.excluded_nodes, got.required_nodes) == ([], [])
        cluster.run("scancel", str(held))
        # requeuehold over GET .../job/{id}/requeue?Hold=true
        await rest.requeue(jid, hold=True)
        wait_for(
            lambda: job_field(cluster, jid, "%T|%r") == "PENDING|job requeued in held state",
            f"job {jid} requeued held",
        )
    finally:
        await rest.aclose()
        cluster.run("scancel", str(jid))
