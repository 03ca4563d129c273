"""The sandbox's Slurm is real: nodes with GPUs, drain, requeue with resume elsewhere, resume,
several clusters side by side, nothing left behind after stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from gpuheal_dev.sandbox import _proc
from gpuheal_dev.sandbox import slurm as slurm_mod
from gpuheal_dev.sandbox.faults import Wedge, WedgeUnavailable, job_processes
from gpuheal_dev.sandbox.slurm import SlurmCluster, SlurmCommandError, SlurmSandboxError
from tests.fixtures.slurm import SLURM_RELEASES, SLURM_TEST_NODES, on_every_release

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

START_RE = re.compile(r"START host=(\S+) restart_count=(\d+) resume_step=(\d+) gpus=(\S+)")


T = TypeVar("T")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    return _proc.wait_for(check, what=what, timeout=timeout, interval=0.05)


def job_fields(cluster: SlurmCluster, job: str) -> tuple[str, str, str]:
    """(state, reason, nodes) of a job from squeue; ('', '', '') once it left the queue."""
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%r|%N", check=False).stdout.strip()
    state, reason, nodes = [*out.split("|"), "", "", ""][:3]
    return state, reason, nodes


def node_reason(cluster: SlurmCluster, node: str) -> str:
    return cluster.run("sinfo", "-h", "-N", "-n", node, "-o", "%E").stdout.strip()


def read_step(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def starts(out: Path) -> list[tuple[str, int, int, str]]:
    text = out.read_text() if out.exists() else ""
    return [(h, int(r), int(s), g) for h, r, s, g in START_RE.findall(text)]


def at_least(n: int, items: list[T]) -> list[T] | None:
    return items if len(items) >= n else None


def cluster_processes(cluster: SlurmCluster) -> list[int]:
    """Every live process that belongs to ``cluster``, found through /proc: 26.05's slurmstepd
    wipe their environment (marker and all) but keep their slurmd's working directory, the
    cluster's root."""
    conf, root = str(cluster.conf_path), str(cluster.root)
    pids = set(_proc.find_pids(env_match={slurm_mod.SANDBOX_ENV_MARKER: root}))
    pids |= set(_proc.find_pids(cwd=cluster.root))
    pids |= set(_proc.find_pids(env_match={"SLURM_CONF": conf}, env_has=("SLURM_JOB_ID",)))
    for pid in _proc.all_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if root in cmdline and _proc.pid_alive(pid) and pid != os.getpid():
            pids.add(pid)
    return sorted(pids)


@pytest.mark.parametrize("slurm_release", SLURM_RELEASES, indirect=True)
def test_nodes_come_up_idle_with_gpus(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.node_states() == dict.fromkeys(SLURM_TEST_NODES, "idle")
    gres = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %G").stdout.split("\n")
    assert sorted(line.strip() for line in gres if line.strip()) == [
        f"{n} gpu:8" for n in SLURM_TEST_NODES
    ]
    config = slurm_cluster.run("scontrol", "show", "config").stdout
    assert re.search(r"JobRequeue\s+=\s+1", config)
    assert re.search(r"ReturnToService\s+=\s+2", config)
    if slurm_cluster.release == "22.05":  # 26.05's show config no longer lists build options
        assert re.search(r"MULTIPLE_SLURMD\s+=\s+Yes", config)
    status = slurm_cluster.status()
    assert status.ctld_up
    assert status.running
    assert {d.name for d in status.daemons if d.alive} == {
        "munged",
        "slurmctld",
        *(f"slurmd@{n}" for n in SLURM_TEST_NODES),
    }
    assert slurm_cluster.start_seconds is not None
    assert slurm_cluster.start_seconds < 30


@pytest.mark.parametrize("slurm_release", SLURM_RELEASES, indirect=True)
def test_gpu_job_gets_its_devices(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "gpu.out"
    job = slurm_cluster.run(
        "sbatch", "--parsable", "--gres=gpu:8", "-w", "gpu-node-1", "-o", str(out),
        "--wrap", "echo gpus=$CUDA_VISIBLE_DEVICES host=$SLURMD_NODENAME",
    ).stdout.strip()  # fmt: skip
    wait_for(lambda: "gpus=" in (out.read_text() if out.exists() else ""), f"job {job} output")
    assert "gpus=0,1,2,3,4,5,6,7 host=gpu-node-1" in out.read_text()
    with pytest.raises(SlurmCommandError, match="Requested node configuration is not available"):
        slurm_cluster.run("sbatch", "--gres=gpu:9", "--wrap", "true")


def test_drained_node_job_requeued_resumes_on_another_node(
    slurm_cluster: SlurmCluster, checkpoint_job: Path, tmp_path: Path
) -> None:
    c = slurm_cluster
    ckpt, out = tmp_path / "jobs" / "ckpt.state", tmp_path / "jobs" / "ckpt.out"
    job = c.run(
        "sbatch", "--parsable", "-o", str(out), str(checkpoint_job), str(ckpt), "0.2"
    ).stdout.strip()

    def running_on() -> str | None:
        state, _, nodes = job_fields(c, job)
        return nodes if state == "RUNNING" else None

    first = wait_for(running_on, f"job {job} RUNNING")
    assert first in SLURM_TEST_NODES
    wait_for(lambda: read_step(ckpt) >= 3, "3 checkpointed steps")

    c.run("scontrol", "update", f"NodeName={first}", "State=DRAIN", "Reason=gpuheal-test xid 79")
    assert c.node_states()[first] == "draining"  # MIXED+DRAIN: the job keeps running
    assert job_fields(c, job)[0] == "RUNNING"
    assert "gpuheal-test xid 79" in node_reason(c, first)

    t0 = time.monotonic()
    c.run("scontrol", "requeue", job)

    # A requeued job is held for munge's cred_expire (BeginTime); StartTime=now lifts the hold,
    # but only once the job shows PENDING/BeginTime (earlier, while COMPLETING, it is ignored).
    def running_elsewhere() -> str | None:
        state, reason, nodes = job_fields(c, job)
        if state == "PENDING" and reason == "BeginTime":
            c.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
        return nodes if state == "RUNNING" and nodes != first else None

    second = wait_for(running_elsewhere, f"job {job} RUNNING again", timeout=60)
    requeue_to_running = time.monotonic() - t0
    print(f"\nrequeue -> RUNNING on {second}: {requeue_to_running:.2f}s")
    assert second != first
    assert second in SLURM_TEST_NODES

    runs = wait_for(lambda: at_least(2, starts(out)), "second START line in output")
    (host1, restarts1, resume1, gpus1), (host2, restarts2, resume2, _) = runs[:2]
    assert (host1, restarts1, resume1, gpus1) == (first, 0, 0, "0")
    assert host2 == second
    assert restarts2 == 1
    assert resume2 >= 3, f"resumed from step {resume2}, not from its checkpoint"
    wait_for(lambda: read_step(ckpt) > resume2, "progress after resume")
    assert "Restarts=1" in c.run("scontrol", "show", "job", job).stdout

    assert wait_for(lambda: c.node_states()[first] == "drained", f"{first} drained")
    assert "gpuheal-test xid 79" in node_reason(c, first)
    c.run("scontrol", "update", f"NodeName={first}", "State=RESUME")
    wait_for(lambda: c.node_states()[first] == "idle", f"{first} idle after RESUME")
    assert node_reason(c, first) in ("none", "")
    # RESUME is not idempotent in Slurm: a second one on a node that is not drained fails.
    with pytest.raises(SlurmCommandError, match="Invalid node state"):
        c.run("scontrol", "update", f"NodeName={first}", "State=RESUME")


@pytest.mark.parametrize("slurm_release", SLURM_RELEASES, indirect=True)
def test_two_clusters_side_by_side(make_slurm_cluster: Callable[..., SlurmCluster]) -> None:
    a = make_slurm_cluster(["gpu-node-0", "gpu-node-1"], name="a")
    b = make_slurm_cluster(["gpu-node-0", "spare.node_1"], name="b", gpus_per_node=1)
    ports_a = {a.ctld_port, *a.node_ports.values()}
    ports_b = {b.ctld_port, *b.node_ports.values()}
    assert len(ports_a) == 3
    assert len(ports_b) == 3
    assert not ports_a & ports_b
    assert a.node_states() == {"gpu-node-0": "idle", "gpu-node-1": "idle"}
    assert b.node_states() == {"gpu-node-0": "idle", "spare.node_1": "idle"}
    job = a.run("sbatch", "--parsable", "--wrap", "sleep 30").stdout.strip()
    wait_for(lambda: job_fields(a, job)[0] == "RUNNING", "job on cluster a")
    assert b.run("squeue", "-h").stdout.strip() == ""
    b.run("scontrol", "update", "NodeName=gpu-node-0", "State=DRAIN", "Reason=only-b")
    assert a.node_states()["gpu-node-0"] in ("mixed", "allocated", "idle")
    a.stop()
    assert b.node_states()["spare.node_1"] == "idle"


def restd_nodes(c: SlurmCluster) -> list[str]:
    """The node names slurmrestd lists: 22.05's on its socket (rest_auth/local, v0.0.38),
    26.05's on TCP with root's JWT (v0.0.45)."""
    import httpx

    if c.restd_socket is not None:
        transport = httpx.HTTPTransport(uds=str(c.restd_socket))
        with httpx.Client(transport=transport, base_url="http://localhost") as http:
            answer = http.get("/slurm/v0.0.38/nodes")
    else:
        assert c.restd_url is not None
        assert c.restd_token_file is not None
        token = c.restd_token_file.read_text().strip()
        headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token}
        with httpx.Client(base_url=c.restd_url, headers=headers) as http:
            answer = http.get("/slurm/v0.0.45/nodes")
    assert answer.status_code == 200, answer.text
    return sorted(n["name"] for n in answer.json()["nodes"])


@on_every_release
def test_stop_leaves_no_process_behind(
    make_slurm_cluster: Callable[..., SlurmCluster], checkpoint_job: Path, tmp_path: Path
) -> None:
    c = make_slurm_cluster(restd=True)
    assert restd_nodes(c) == sorted(SLURM_TEST_NODES)

    ckpt = tmp_path / "ckpt.state"
    jobs = [
        c.run(
            "sbatch", "--parsable", "-o", "/dev/null", str(checkpoint_job), f"{ckpt}{i}", "0.2"
        ).stdout.strip()
        for i in range(2)
    ]
    wait_for(lambda: all(job_fields(c, j)[0] == "RUNNING" for j in jobs), "both jobs RUNNING")
    wait_for(lambda: read_step(Path(f"{ckpt}0")) >= 1, "job steps")
    # Worst case: a slurmd dies hard, its slurmstepd and job processes are left orphaned.
    victim_node = job_fields(c, jobs[0])[2]
    slurmd_pid = c.status().daemons
    pid = next(d.pid for d in slurmd_pid if d.name == f"slurmd@{victim_node}")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    before = cluster_processes(c)
    assert len(before) >= 6 + 2 * 2  # daemons + restd + slurmstepd and job shell per job
    # one batch slurmstepd per job, the orphaned one (its slurmd killed) too
    stepd = [p for p in before if _proc.exe_name(p) in ("slurmstepd", "slurmstepd-wlm")]
    assert len(stepd) == 2, before

    c.stop()
    assert cluster_processes(c) == []
    assert not any(_proc.pid_alive(p) for p in before)
    assert not c.status().running
    c.stop()  # idempotent
    assert (c.log_dir / "slurmctld.log").stat().st_size > 0


@pytest.mark.parametrize("slurm_release", SLURM_RELEASES, indirect=True)
def test_double_start_refused_and_attach_stops(slurm_cluster: SlurmCluster) -> None:
    again = SlurmCluster(
        slurm_cluster.root, SLURM_TEST_NODES, install=False, slurm=slurm_cluster.release
    )
    with pytest.raises(SlurmSandboxError, match="already running"):
        again.start()
    assert slurm_cluster.node_states() == dict.fromkeys(SLURM_TEST_NODES, "idle")

    attached = SlurmCluster.attach(slurm_cluster.root)  # as `gpuheal-dev sandbox down` would
    assert attached.node_ports == slurm_cluster.node_ports
    assert attached.status().nodes == dict.fromkeys(SLURM_TEST_NODES, "idle")
    attached.stop()
    assert cluster_processes(slurm_cluster) == []
    slurm_cluster.start()  # a stopped cluster starts again under the same root
    assert slurm_cluster.node_states() == dict.fromkeys(SLURM_TEST_NODES, "idle")


@pytest.mark.parametrize("slurm_release", ["26.05"], indirect=True)
def test_slurm_26_runs_from_its_root_with_its_clients_on_the_path_and_jwt_rest(
    make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path
) -> None:
    """26.05 from its Debian root: the wrappers on PATH are its own clients (also inside a
    job), slurmrestd answers with JWT and offers v0.0.45's requeue, stop leaves nothing."""
    import httpx

    c = make_slurm_cluster(restd=True)
    assert c.bin_dir is not None
    assert c.version().startswith("slurm-wlm 26.05.")
    env = {
        **os.environ,
        "PATH": f"{c.bin_dir}:{os.environ['PATH']}",
        "SLURM_CONF": str(c.conf_path),
    }
    shell = subprocess.run(
        ["sh", "-c", "scontrol --version; command -v sbatch"], env=env, capture_output=True,
        text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert shell[:2] == ["slurm-wlm", c.version().split()[1]]
    assert shell[2] == str(c.bin_dir / "sbatch")
    out = tmp_path / "in-job.out"
    job = subprocess.run(
        ["sbatch", "--parsable", "-o", str(out), "--wrap",
         "scontrol --version; cat /etc/debian_version; squeue -h -j $SLURM_JOB_ID -o %T"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    wait_for(lambda: job_fields(c, job)[0] == "" or None, f"job {job} done", timeout=30)
    assert out.read_text().split() == ["slurm-wlm", c.version().split()[1], "forky/sid", "RUNNING"]

    token = c.restd_token_file
    assert token is not None
    assert c.restd_url is not None
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token.read_text().strip()}
    with httpx.Client(base_url=c.restd_url, headers=headers, timeout=10) as http:
        nodes = http.get("/slurm/v0.0.45/nodes").json()["nodes"]
        paths = http.get("/openapi/v3").json()["paths"]
        refused = http.get("/slurm/v0.0.45/nodes", headers={"X-SLURM-USER-TOKEN": "x"})
    assert sorted(n["name"] for n in nodes) == sorted(SLURM_TEST_NODES)
    assert "/slurm/v0.0.45/job/{job_id}/requeue" in paths
    assert refused.status_code == 511  # 26.05.5 says "Network Authentication Required"
    c.stop()
    assert cluster_processes(c) == []


def test_daemon_failure_is_reported_with_its_log(
    make_slurm_cluster: Callable[..., SlurmCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    render = slurm_mod.render_slurm_conf
    monkeypatch.setattr(
        slurm_mod, "render_slurm_conf", lambda cfg: render(cfg) + "NoSuchOption=1\n"
    )
    cluster = make_slurm_cluster(name="broken", start=False)
    with pytest.raises(SlurmSandboxError, match=r"slurmctld exited[\s\S]*NoSuchOption") as err:
        cluster.start()
    assert "last" in str(err.value)  # the log tail is in the message
    assert cluster_processes(cluster) == []
    assert not cluster.status().running


def test_port_taken_between_pick_and_bind_is_retried(
    make_slurm_cluster: Callable[..., SlurmCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _proc.free_tcp_ports
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        calls: list[int] = []

        def first_one_taken(count: int, **kwargs: str) -> list[int]:
            calls.append(count)
            ports = real(count, **kwargs)
            return [port, *ports[1:]] if len(calls) == 1 else ports

        monkeypatch.setattr(_proc, "free_tcp_ports", first_one_taken)
        cluster = make_slurm_cluster(["gpu-node-0"], name="retry")
    assert len(calls) == 2
    assert cluster.ctld_port != port
    assert cluster.node_states() == {"gpu-node-0": "idle"}


def test_scontrol_reboot_restarts_the_nodes_slurmd_through_the_reboot_states(
    slurm_cluster: SlurmCluster,
) -> None:
    """The sandbox's RebootProgram restarts that node's slurmd with -b: Slurm shows the node
    REBOOT_REQUESTED / REBOOT_ISSUED, then back with a new BootTime, still drained (a drained
    node rebooted without nextstate keeps its drain), and the new slurmd is the cluster's
    (its PID recorded, stopped with it)."""
    c = slurm_cluster
    node = SLURM_TEST_NODES[0]

    def show() -> tuple[str, str]:
        out = c.run("scontrol", "show", "node", "-o", node).stdout
        state, boot = re.search(r"State=(\S+)", out), re.search(r"BootTime=(\S+)", out)
        assert state is not None
        assert boot is not None
        return state[1], boot[1]

    old_pid = next(d.pid for d in c.status().daemons if d.name == f"slurmd@{node}")
    c.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=gpuheal: t reboot")
    _, boot_before = show()
    time.sleep(1.1)  # BootTime has whole seconds
    c.run("scontrol", "reboot", "reason=gpuheal: t reboot", node)
    seen: list[str] = []

    def back() -> bool:
        state, boot = show()
        seen.append(state)
        return "REBOOT" not in state and boot != boot_before

    wait_for(back, "node back with a new BootTime", timeout=60)
    assert any("REBOOT_REQUESTED" in s or "REBOOT_ISSUED" in s for s in seen), seen
    assert "DRAIN" in show()[0]
    assert node_reason(c, node).startswith("gpuheal: t reboot")
    new_pid = next(d.pid for d in c.status().daemons if d.name == f"slurmd@{node}")
    assert new_pid != old_pid
    assert _proc.pid_alive(new_pid)
    c.stop()
    assert not _proc.pid_alive(new_pid)


@on_every_release
def test_a_stuck_child_whose_batch_shell_died_is_seen_only_with_cgroup_tracking(
    make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path
) -> None:
    """The batch script leaves a child stuck in uninterruptible sleep (a FUSE wedge) and exits.
    With proctrack/cgroup (production; the sandbox's choice where the machine allows it) Slurm
    sees the child, cannot kill it and drains the node itself ("Kill task failed"); with
    proctrack/linuxproc the job ends at once, the node looks idle, and the child lives on."""
    seen: dict[str, tuple[str, bool]] = {}
    for proctrack in ("cgroup", "linuxproc"):
        cluster = make_slurm_cluster(
            ["stuck-0"], name=f"stuck-{proctrack}", start=False, proctrack=proctrack,
            unkillable_step_timeout=5,
        )  # fmt: skip
        # a machine like CI's has cgroup: there a cluster that does not start with it fails
        if proctrack == "cgroup" and not (support := cluster.cgroup_support()).ok:
            pytest.skip(f"proctrack/cgroup not available here: {support.reason}")
        cluster.start()
        try:
            # under the cluster's root: a mount there reaches 26.05's daemons, as on a node
            wedge = Wedge(cluster.root / "wedge").open()
        except WedgeUnavailable as exc:
            pytest.skip(f"no FUSE here to wedge a process: {exc}")
        try:
            script = tmp_path / f"stuck-{proctrack}.sh"
            script.write_text(f"#!/bin/bash\nstat {wedge.path()} &\nsleep 1\nexit 1\n")
            script.chmod(0o755)
            job = cluster.run("sbatch", "--parsable", "-o", "/dev/null", str(script)).stdout
            job = job.strip()
            wait_for(lambda w=wedge: w.held, "the child stuck in D state")

            def settled(c: SlurmCluster = cluster) -> str | None:
                reason = node_reason(c, "stuck-0")
                state = c.node_states().get("stuck-0", "")
                if "Kill task failed" in reason or state == "idle":
                    return f"{state}|{reason}"
                return None

            node = wait_for(settled, "Slurm gives up on the job or forgets it", timeout=60)
            stuck = job_processes(cluster.conf_path, "stuck-0", int(job))
            seen[proctrack] = (node.split("|")[1], bool(stuck))
        finally:
            wedge.close()
            cluster.stop()
    # 26.05 names the step: "Kill task failed (JobId=1 StepId=batch)"
    assert seen["cgroup"][0].startswith("Kill task failed"), seen
    assert seen["cgroup"][1] is True
    assert seen["linuxproc"][1] is True  # the child lives on ...
    assert "Kill task failed" not in seen["linuxproc"][0]  # ... unseen by Slurm
