"""Control plane and Slurm faults in the middle of an XID 79 incident (issue 16 part 2).

Each test runs a real Slurm job on the faulty node, the real bridge (a process, CLI backend)
and the operator (a process) on the sandbox, injects one fault while the incident is being
remediated, ends it, and checks:

- nothing duplicated: one cordon, one Slurm requeue of the job (Slurm's restart count 1, one
  second START in the job's output), one spare claimed, each ladder step once in the timeline;
- nothing lost: the incident completes (Replaced), the job runs again elsewhere;
- while the fault lasted, the NodeRemediation said what it waits for and why (sampled every
  half second), not only at the end.

Each test prints a ``RESULT`` line with its figures (``pytest -s``); docs/reliability.md
carries them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    wait_for,
)
from tests.integration.test_operator_k8s import gpuheal_crds, policy, pool
from tests.integration.test_operator_slurm import bridge

pytestmark = pytest.mark.integration
__all__ = ["bridge", "gpuheal_crds"]

#: A job that checkpoints on USR1 and keeps running (it stays RUNNING through the grace, so a
#: fault can be injected while the bridge's requeue call is under way).
JOB = """\
#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
echo "START host=$SLURMD_NODENAME restart_count=${SLURM_RESTART_COUNT:-0}"
trap 'echo "CKPT host=$SLURMD_NODENAME"' USR1
while true; do sleep 0.2 & wait $!; done
"""
START_RE = re.compile(r"START host=(\S+) restart_count=(\d+)")
Bridge = Callable[..., tuple[str, Path, subprocess.Popen[bytes]]]


def _rfc(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass
class Scene:
    sandbox: Sandbox
    objects: Objects
    cluster: SlurmCluster
    broken: str
    other: str
    spare: str
    job: str
    out: Path
    url: str
    token_file: Path
    bridge_proc: subprocess.Popen[bytes]
    audit: Path
    op: OperatorProcess
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def incident(self) -> dict[str, Any] | None:
        return self.objects.incident(self.broken)

    def job_state(self) -> tuple[str, str]:
        out = self.cluster.run("squeue", "-h", "-j", self.job, "-o", "%T|%N", check=False)
        state, _, nodes = out.stdout.strip().partition("|")
        return state, nodes

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def sample(self, seconds: float, every: float = 0.5) -> list[tuple[float, dict[str, Any]]]:
        """Read the NodeRemediation every ``every`` s for ``seconds``: (monotonic, status)."""
        got: list[tuple[float, dict[str, Any]]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            obj = self.incident()
            got.append((time.monotonic(), dict((obj or {}).get("status") or {})))
            time.sleep(every)
        self.samples += got
        return got


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def _blocked_on_bridge(status: dict[str, Any]) -> bool:
    b, s = _cond(status, "Blocked"), _cond(status, "SlurmDrained")
    return (
        b.get("status") == "True"
        and b.get("reason") == "BridgeUnavailable"
        and s.get("status") == "False"
        and s.get("reason") == "BridgeUnavailable"
    )


def _setup(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    name: str,
    grace: str | None,
) -> Scene:
    """Three nodes (Kubernetes and Slurm: broken, other, a spare drained as the reserve
    pool), the job RUNNING on broken, the bridge, a replace policy, the operator."""
    cid = os.urandom(3).hex()
    broken, other = own_gpu_nodes(2, **{"gpuheal.io/case": f"{cid}-work"})
    (spare,) = own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-spare"})
    objects = Objects(sandbox.api_client())
    cluster = make_slurm_cluster([broken, other, spare], name=name)
    cluster.run("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=reserve pool")
    cluster.run("scontrol", "update", f"NodeName={other}", "State=DRAIN", "Reason=hold")
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(JOB)
    job = cluster.run("sbatch", "--parsable", "-o", str(out), str(script)).stdout.strip()
    url, token_file, proc = bridge(cluster)
    op = OperatorProcess(
        Path(sandbox.kubeconfig), tmp_path,
        ["--bridge-url", url, "--bridge-token-file", str(token_file)],
    )  # fmt: skip
    audit = tmp_path / "bridge-state" / "audit.jsonl"
    scene = Scene(sandbox, objects, cluster, broken, other, spare, job, out, url, token_file,
                  proc, audit, op)  # fmt: skip
    wait_for(lambda: scene.job_state() == ("RUNNING", broken), f"job {job} RUNNING on {broken}")
    wait_for(lambda: "START" in scene.output(), "the job's first START")
    cluster.run("scontrol", "update", f"NodeName={other}", "State=RESUME")
    pool_manifest = pool(f"spares-{cid}", f"{cid}-spare")
    pool_manifest["spec"]["promotion"]["slurm"] = {"resume": True}
    objects.apply("reservepools", pool_manifest)
    slurm_drain: dict[str, Any] = {"requeue": "requeue"}
    if grace is not None:
        slurm_drain |= {"checkpointSignal": "USR1", "gracePeriod": grace}
    rule = {
        "name": "fell-off-bus",
        "signals": {"xids": [79]},
        "ladder": [{"name": "replace", "steps": [
            {"action": "cordon"},
            {"action": "slurmDrain", "slurmDrain": slurm_drain},
            {"action": "drain", "drain": {"timeout": "5m"}},
            {"action": "replace", "replace": {"reservePoolRef": {"name": f"spares-{cid}"}}},
        ]}],
    }  # fmt: skip
    objects.apply("remediationpolicies", policy(f"p-{cid}", f"{cid}-work", [rule]))
    scene.op.start()
    return scene


def _audit(scene: Scene) -> list[dict[str, Any]]:
    if not scene.audit.exists():
        return []
    return [json.loads(line) for line in scene.audit.read_text().splitlines() if line.strip()]


def _check_end(scene: Scene) -> dict[str, Any]:
    """The incident completed once, with every effect once; returns it."""
    done = wait_for(lambda: completed(o := scene.incident()) and o, "incident completed",
                    timeout=120)  # fmt: skip
    name = done["metadata"]["name"]
    assert completed(done) == "Replaced", dump(done["status"])
    assert len(scene.objects.incidents(scene.broken)) == 1
    steps = [e["step"] for e in done["status"]["timeline"]]
    for step in ("replace/cordon", "replace/slurmDrain", "replace/drain", "replace/replace"):
        assert steps.count(step) == 1, steps
    assert done["status"]["ownership"] == {"cordoned": True, "slurmDrained": True}
    assert [j["jobId"] for j in done["status"]["requeuedJobs"]] == [scene.job]
    assert condition(done, "JobsRequeued")["status"] == "True", dump(done["status"])
    claimed = [
        n for n in (scene.spare,)
        if scene.objects.node(n).metadata.labels.get("gpuheal.io/claimed-by") == name
    ]  # fmt: skip
    assert claimed == [done["status"]["replacementNode"]]
    drained = scene.cluster.run("scontrol", "show", "node", scene.broken, "-o").stdout
    assert re.search(rf"Reason=gpuheal: {name}\b", drained), drained
    moved = wait_for(
        lambda: (s := scene.job_state())[0] == "RUNNING" and s[1] != scene.broken and s[1],
        "job running elsewhere", timeout=90,
    )  # fmt: skip
    assert moved in (scene.other, scene.spare)
    runs = wait_for(lambda: len(r := START_RE.findall(scene.output())) >= 2 and r, "2nd START")
    assert [int(r[1]) for r in runs] == [0, 1], runs  # one requeue, not two
    assert "Restarts=1 " in scene.cluster.run("scontrol", "show", "job", scene.job).stdout
    requeues = [a for a in _audit(scene) if a["op"] == "requeue_job" and not a["replayed"]
                and a["status"] == 200]  # fmt: skip
    assert len(requeues) == 1, requeues
    return done


def _result(test: str, **figures: Any) -> None:
    print("\nRESULT " + test + " " + " ".join(f"{k}={v}" for k, v in figures.items()))


def test_apiserver_and_etcd_restarted_while_the_requeue_is_under_way(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """kube-apiserver and etcd stop (data kept) while the bridge is in the job's checkpoint
    grace; Slurm requeues the job during the outage. The operator cannot renew its Lease and
    exits 70; started again (as its Deployment would), it finds the requeue answered from the
    bridge's store, records it with the bridge's time (when Slurm acted, not when it was
    written), and completes the incident."""
    cp = sandbox.control_plane
    s = _setup(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path, "api", "12s")
    try:
        simulate_xid(sandbox.core_v1(), s.broken, 79)
        wait_for(lambda: "CKPT" in s.output(), "checkpoint signal (requeue call under way)")
        before = s.incident()
        assert before is not None
        planned = [j["outcome"] for j in before["status"].get("jobs") or []]
        assert planned == ["Planned"], dump(before["status"])
        t_down = dt.datetime.now(dt.UTC)
        down0 = time.monotonic()
        cp.stop_component("kube-apiserver")
        cp.stop_component("etcd")
        code = wait_for(lambda: s.op.proc and s.op.proc.poll(), "operator exit", timeout=30)
        exited_after = time.monotonic() - down0
        assert code == 70, s.op.log()[-3000:]
        assert "lost Lease" in s.op.log()
        # Slurm acts while the API server is away: the job leaves the node (grace 12 s).
        wait_for(
            lambda: (j := s.job_state())[0] in ("PENDING", "RUNNING") and j[1] != s.broken,
            "job requeued by the bridge during the outage", timeout=40,
        )  # fmt: skip
        slurm_acted = dt.datetime.now(dt.UTC)
        cp.start_component("etcd")
        cp.start_component("kube-apiserver")
        down_s = time.monotonic() - down0
        t_up = dt.datetime.now(dt.UTC)
        s.op.start()  # as a Deployment restarts it
        done = _check_end(s)
        requeued_at = _rfc(done["status"]["requeuedJobs"][0]["requeuedAt"])
        drained_at = _rfc(condition(done, "SlurmDrained")["lastTransitionTime"])
        # the times Slurm acted (during the outage), not when the new process wrote them
        assert t_down - dt.timedelta(seconds=1) <= requeued_at <= slurm_acted, (t_down, t_up)
        assert drained_at <= slurm_acted, (drained_at, t_up)
        [entry] = [e for e in done["status"]["timeline"] if e["step"] == "replace/slurmDrain"]
        assert _rfc(entry["time"]) <= slurm_acted, (entry, t_up)
        _result("apiserver_etcd_restart", down_s=f"{down_s:.1f}",
                operator_exit=code, exit_after_s=f"{exited_after:.1f}",
                requeued_before_up_s=f"{(t_up - requeued_at).total_seconds():.1f}",
                incidents_completed=1, duplicates=0, losses=0)  # fmt: skip
    finally:
        if "kube-apiserver" not in cp.pids:  # a failure in the middle: leave the sandbox up
            if "etcd" not in cp.pids:
                cp.start_component("etcd")
            cp.start_component("kube-apiserver")
        s.op.stop()
        s.objects.cleanup([s.broken, s.other, s.spare])


def test_slurmctld_stopped_for_60s_in_the_middle_of_the_drain(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """slurmctld stops during the job's checkpoint grace (the node drained, the job not yet
    requeued) and stays down 60 s. The bridge must not answer "requeue failed" for good (a
    lost job): the incident says it waits for Slurm, and requeues the job once slurmctld is
    back."""
    s = _setup(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path, "ctld", "5s")
    try:
        simulate_xid(sandbox.core_v1(), s.broken, 79)
        wait_for(lambda: "CKPT" in s.output(), "checkpoint signal (requeue call under way)")
        down0 = time.monotonic()
        s.cluster.stop_daemon("slurmctld")
        samples = s.sample(60)
        s.cluster.start_daemon("slurmctld")
        blocked = [t for t, st in samples if _blocked_on_bridge(st)]
        assert blocked, dump(samples[-1][1])
        first = blocked[0] - down0
        # from the first failed attempt on (the grace ends ~5 s after the stop), to the end
        assert first < 30, first
        assert all(_blocked_on_bridge(st) for t, st in samples if t >= blocked[0]), dump(
            [st.get("conditions") for _, st in samples]
        )
        msg = _cond(samples[-1][1], "SlurmDrained")["message"]
        assert "slurmctld" in msg, msg
        assert not any(completed({"status": st}) for _, st in samples)
        done = _check_end(s)
        why = msg.split("; ", 1)[-1][:160]
        _result("slurmctld_down_60s", blocked_after_s=f"{first:.1f}",
                samples=len(samples), blocked_samples=len(blocked), message=repr(why),
                incidents_completed=1 if done else 0, duplicates=0, losses=0)  # fmt: skip
    finally:
        if "is UP" not in s.cluster.run("scontrol", "ping", check=False).stdout:
            s.cluster.start_daemon("slurmctld")
        s.op.stop()
        s.objects.cleanup([s.broken, s.other, s.spare])


def test_bridge_restarted_between_its_drain_and_its_requeue(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The bridge is SIGKILLed after it drained the node, in the job's checkpoint grace
    (before `scontrol requeue`), and started again 10 s later on the same state directory.
    The drain is answered from its persisted idempotency store (not done again); the job is
    requeued once."""
    s = _setup(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path, "brst", "20s")
    try:
        simulate_xid(sandbox.core_v1(), s.broken, 79)
        wait_for(lambda: "CKPT" in s.output(), "checkpoint signal (requeue call under way)")
        assert "DRAIN" in s.cluster.run("scontrol", "show", "node", s.broken, "-o").stdout
        down0 = time.monotonic()
        s.bridge_proc.kill()
        s.bridge_proc.wait(timeout=10)
        samples = s.sample(10)
        _, _, s.bridge_proc = bridge(s.cluster, s.port)
        blocked = [t for t, st in samples if _blocked_on_bridge(st)]
        assert blocked, dump(samples[-1][1])
        first = blocked[0] - down0
        assert first < 5, first
        assert s.job_state() == ("RUNNING", s.broken)  # not requeued yet
        done = _check_end(s)
        drains = [a for a in _audit(s) if a["op"] == "drain_node"]
        assert [a["replayed"] for a in drains] == [False, True], drains
        assert s.output().count("CKPT") == 2  # the grace ran again: nothing was requeued
        _result("bridge_restart", blocked_after_s=f"{first:.1f}",
                drain_calls=len(drains), drain_replayed=sum(a["replayed"] for a in drains),
                incidents_completed=1 if done else 0, duplicates=0, losses=0)  # fmt: skip
    finally:
        s.op.stop()
        s.objects.cleanup([s.broken, s.other, s.spare])


def test_operator_cut_off_from_the_bridge_for_60s(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The bridge's port is closed when the fault comes and for 60 s after. The node is
    cordoned at once; the Slurm step says it waits for the bridge from its first failed
    attempt; Slurm is untouched meanwhile (no fallback: the job keeps running on the faulty
    node, see docs/reliability.md); the bridge back, the incident completes."""
    s = _setup(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path, "cut", None)
    try:
        s.bridge_proc.terminate()
        s.bridge_proc.wait(timeout=10)
        t0 = time.monotonic()
        simulate_xid(sandbox.core_v1(), s.broken, 79)
        wait_for(s.incident, "NodeRemediation")
        samples = s.sample(60)
        state_during = s.job_state()
        node_during = s.cluster.run("scontrol", "show", "node", s.broken, "-o").stdout
        _, _, s.bridge_proc = bridge(s.cluster, s.port)
        blocked = [t for t, st in samples if _blocked_on_bridge(st)]
        assert blocked, dump(samples[-1][1])
        first = blocked[0] - t0
        assert first < 5, first
        assert all(_blocked_on_bridge(st) for t, st in samples if t >= blocked[0])
        assert _cond(samples[-1][1], "Cordoned").get("status") == "True"
        why = _cond(samples[-1][1], "Blocked")["message"]
        assert f"Slurm bridge {s.url}" in why, why
        assert state_during == ("RUNNING", s.broken)
        assert "DRAIN" not in node_during, node_during
        done = _check_end(s)
        _result("bridge_cut_off_60s", blocked_after_s=f"{first:.1f}", samples=len(samples),
                blocked_samples=len(blocked), incidents_completed=1 if done else 0,
                duplicates=0, losses=0)  # fmt: skip
    finally:
        s.op.stop()
        s.objects.cleanup([s.broken, s.other, s.spare])


def _unavailable_calls(scene: Scene) -> dict[str, float]:
    """The operator's failed bridge calls (gpuheal_bridge_calls_total, result unavailable)
    by operation."""
    got: dict[str, float] = {}
    for key, value in scene.op.metrics().items():
        if key.startswith("gpuheal_bridge_calls_total{") and 'result="unavailable"' in key:
            op = re.search(r'operation="([^"]+)"', key)
            got[op.group(1) if op else key] = got.get(op.group(1) if op else key, 0) + value
    return got


def test_operator_backs_off_while_the_bridge_refuses_connections(  # noqa: PLR0917
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
    tmp_path: Path,
    gpuheal_crds: None,
) -> None:
    """The bridge's port closed for 20 s from the fault on: the operator retries the Slurm
    drain (and the early spare claim's Slurm resume beside it) with its backoff (1, 2, 4,
    8 s...), not at once: a failed early claim used to wake the driver, whose pass failed
    the drain and started the claim again (hundreds of calls in seconds). The bridge back,
    the incident completes, every effect once."""
    s = _setup(sandbox, own_gpu_nodes, make_slurm_cluster, bridge, tmp_path, "backoff", None)
    try:
        s.bridge_proc.terminate()
        s.bridge_proc.wait(timeout=10)
        simulate_xid(sandbox.core_v1(), s.broken, 79)
        wait_for(s.incident, "NodeRemediation")
        cut = 20.0
        time.sleep(cut)
        calls = _unavailable_calls(s)
        _, _, s.bridge_proc = bridge(s.cluster, s.port)
        # Passes at 0, 1, 3, 7, 15 s (each wait twice the last): 5 in 20 s, each with at
        # most one drain call and one early-claim resume; 2 passes of slack (a new signal,
        # the claim's own wake-up) -> at most 14 failed calls.
        passes, t, step = 1, 0.0, 1.0
        while t + step <= cut:
            passes, t, step = passes + 1, t + step, step * 2
        bound = 2 * (passes + 2)
        total = sum(calls.values())
        assert calls.get("drain", 0) >= 1, calls  # it did try
        assert total <= bound, (
            f"{total:.0f} failed bridge calls in {cut:.0f} s with the bridge's port closed "
            f"({calls}): more than {bound} (the backoff's {passes} passes, two calls each, "
            "and two spare): the operator retries a refused bridge without backing off"
        )
        done = _check_end(s)
        _result("bridge_refused_backoff", cut_s=f"{cut:.0f}", failed_calls=f"{total:.0f}",
                bound=bound, incidents_completed=1 if done else 0)  # fmt: skip
    finally:
        s.op.stop()
        s.objects.cleanup([s.broken, s.other, s.spare])
