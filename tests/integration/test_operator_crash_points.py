"""Crash between every side effect and its record (issue 16 part 1).

For each crash point (`gpuheal.crashpoints`) of an XID 79 incident (cordon, Slurm drain and
requeue of a real running job, pod drain, replace from a ReservePool with a Slurm resume of
the spare) and of an XID 94 incident's return to service (uncordon, Slurm resume, the closing
status write), in turn: the real operator process starts with ``--crash-at <point>``, the
XID arrives, the process exits hard (code 86: no clean-up, its Lease left behind) right
before or after that side effect, a new process starts without the switch and finishes the
incident. Then the end state: one NodeRemediation, completed as expected; one cordon under
its mark; each job requeued once (Slurm's restart count 1); one spare claimed, by this
incident only; each step once in the timeline.

Each point is a test item of its own (``-k cordon.after`` picks one). One sandbox for all;
each point has its own nodes, its own Slurm cluster (0.3 s to start) and bridge, so nothing
one point leaves behind can hide or fake a duplicate in another. The dead process's Lease is
deleted, as a person would after a crash, rather than waited out (`delete_dead_lease`): the
points are about the side effects, and waiting the Lease out is tested in
test_operator_k8s.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuheal import crashpoints
from gpuheal.cli.simulate import simulate_xid
from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import start_bridge
from tests.integration.operator_harness import (
    Objects,
    OperatorProcess,
    completed,
    condition,
    dump,
    pod_gone,
    pod_on,
    policy,
    pool,
    wait_for,
    xid79_rule,
)

pytestmark = pytest.mark.integration

TOKEN = "crash-points-token-0123456789abcdef"
CLAIMED_BY = "gpuheal.io/claimed-by"
CORDONED_BY = "gpuheal.io/cordoned-by"

# The side effects each scenario reaches (each crashed before and after).
XID79_EFFECTS = (
    "nrem-create",
    "cordon",
    "bridge-drain",
    "bridge-jobs",
    "bridge-requeue",
    "evict",
    "claim",
    "promote",
    "bridge-resume",  # the spare's promotion in Slurm
    "status",
    "event",
)
RETURN_EFFECTS = ("uncordon", "bridge-resume", "status")  # from the hysteresis on
# Reached only by ladders these scenarios do not run (a Slurm reboot, a return to the pool,
# a checkpoint step).
ELSEWHERE = ("bridge-reboot", "bridge-reserve", "bridge-signal")
XID79_STEPS = ("replace/cordon", "replace/slurmDrain", "replace/drain", "replace/replace")
RETURN_STEPS = ("requeue/cordon", "requeue/slurmDrain", "requeue/reset")


def _points(effects: tuple[str, ...]) -> list[str]:
    """Each effect's two points; ``$GPUHEAL_TEST_CRASH_POINTS`` (comma-separated) narrows
    them down when chasing one."""
    points = [f"{e}.{when}" for e in effects for when in ("before", "after")]
    only = [x for x in os.environ.get("GPUHEAL_TEST_CRASH_POINTS", "").split(",") if x]
    return [x for x in points if x in only] if only else points


def test_every_crash_point_belongs_to_a_scenario() -> None:
    assert set(XID79_EFFECTS) | set(RETURN_EFFECTS) | set(ELSEWHERE) == set(crashpoints.EFFECTS)


# ---- one point's world: nodes, a Slurm cluster with a running job, its bridge -----------------
@dataclass
class Scene:
    cid: str
    work: str
    spares: list[str]
    cluster: SlurmCluster
    url: str
    token_file: Path
    bridge: subprocess.Popen[bytes]
    job: str
    pod: str
    logs: Path

    def operator(self, kubeconfig: str, role: str, *extra: str) -> OperatorProcess:
        # The chart's Lease (15 s, not the harness's 3 s): a loaded machine cannot make a
        # process lose it in the middle of a point (seen at load 15); nothing waits it out.
        args = ["--bridge-url", self.url, "--bridge-token-file", str(self.token_file),
                "--lease-duration", "15", *extra]  # fmt: skip
        logs = self.logs / role
        logs.mkdir()
        return OperatorProcess(Path(kubeconfig), logs, args)


def _job(cluster: SlurmCluster, job: str) -> tuple[str, str]:
    out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%N", check=False).stdout.strip()
    state, _, nodes = out.partition("|")
    return state, nodes


def _restarts(cluster: SlurmCluster, job: str) -> int:
    shown = cluster.run("scontrol", "show", "job", job).stdout
    found = re.search(r"Restarts=(\d+)", shown)
    assert found, shown
    return int(found.group(1))


@pytest.fixture
def scene(  # noqa: PLR0917
    sandbox: Sandbox,
    namespace: str,
    own_gpu_nodes: Callable[..., list[str]],
    make_slurm_cluster: Callable[..., SlurmCluster],
    tmp_path: Path,
    gpuheal_crds: None,
) -> Iterator[Callable[[str], Scene]]:
    """``scene(point)``: fresh nodes (one worker, two spares), a Slurm cluster of them with a
    requeueable job running on the worker, a pod there too, and a bridge; torn down after the
    test (or when a next one is made: one at a time keeps the machine quiet)."""
    core = sandbox.core_v1()
    made: list[Scene] = []
    objects = Objects(sandbox.api_client())

    def close(sc: Scene) -> None:
        sc.bridge.terminate()
        try:
            sc.bridge.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sc.bridge.kill()
        sc.cluster.stop(quiet=True, wait_for_jobs=False)
        objects.cleanup([sc.work, *sc.spares])
        objects.delete("remediationpolicies", f"reme-{sc.cid}")
        objects.delete("reservepools", f"rese-{sc.cid}")

    def make(point: str) -> Scene:
        if made:
            close(made[-1])
        cid = os.urandom(3).hex()
        work = own_gpu_nodes(1, **{"gpuheal.io/case": f"{cid}-work"})[0]
        spares = own_gpu_nodes(2, **{"gpuheal.io/case": f"{cid}-spare"})
        cluster = make_slurm_cluster([work, *spares], name=f"c{len(made)}")
        for s in spares:  # spares wait drained with the pool's reason; promotion resumes one
            cluster.run("scontrol", "update", f"NodeName={s}", "State=DRAIN", "Reason=reserve pool")
        job = cluster.run(
            "sbatch", "--parsable", "--requeue", "--gres=gpu:1", "-o", "/dev/null",
            "--wrap", "sleep 900",
        ).stdout.strip()  # fmt: skip
        pod = f"train-{cid}"
        core.create_namespaced_pod(namespace, pod_on(work, pod, {"app": pod}))
        logs = tmp_path / point
        logs.mkdir()
        b = start_bridge(cluster, logs, token=TOKEN)
        url, token_file, proc = b.url, b.operator_token, b.proc
        wait_for(lambda: _job(cluster, job) == ("RUNNING", work), f"job {job} RUNNING on {work}")
        wait_for(
            lambda: core.read_namespaced_pod(pod, namespace).status.phase == "Running",
            f"pod {pod} Running",
        )
        sc = Scene(cid, work, spares, cluster, url, token_file, proc, job, pod, logs)
        made.append(sc)
        return sc

    yield make
    if made:
        close(made[-1])


def _crash(op: OperatorProcess, point: str, state: Callable[[], Any], timeout: float = 90) -> None:
    """Wait for the armed process to exit at ``point`` (its code and its last words)."""
    assert op.proc is not None
    try:
        code = op.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        op.kill()
        why = f"no crash at {point} in {timeout:.0f}s:\n{op.log()[-3000:]}\n{dump(state())}"
        raise AssertionError(why) from None
    assert code == crashpoints.EXIT_CODE, f"exit {code} at {point}:\n{op.log()[-3000:]}"
    assert f"crash point {point}:1 reached" in op.log()


def _finished(objects: Objects, node: str, op: OperatorProcess, p: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = wait_for(
            lambda: completed(o := objects.incident(node)) and o,
            f"{p}: incident completed after the restart", timeout=90,
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nincident: {dump(objects.incidents(node))}\nrestarted operator:\n"
            f"{op.log()[-4000:]}"
        ) from None
    return found


def _timeline_once(done: dict[str, Any], steps: tuple[str, ...]) -> None:
    timeline = [e["step"] for e in done["status"]["timeline"]]
    for step in (*steps, "Detected", "Completed"):
        assert timeline.count(step) == 1, (step, timeline)


# ---- XID 79: cordon, Slurm drain + requeue, drain, replace ------------------------------------
@pytest.mark.parametrize("p", _points(XID79_EFFECTS))
def test_a_crash_at_each_point_of_an_xid79_loses_and_repeats_nothing(
    sandbox: Sandbox, scene: Callable[[str], Scene], namespace: str, p: str
) -> None:
    core = sandbox.core_v1()
    objects = Objects(sandbox.api_client())
    t0 = time.monotonic()
    sc = scene(p)
    pool_manifest = pool(f"rese-{sc.cid}", f"{sc.cid}-spare")
    pool_manifest["spec"]["promotion"]["slurm"] = {"resume": True}
    objects.apply("reservepools", pool_manifest)
    objects.apply(
        "remediationpolicies",
        policy(f"reme-{sc.cid}", f"{sc.cid}-work", [xid79_rule(f"rese-{sc.cid}")]),
    )
    simulate_xid(core, sc.work, 79)  # before the start: read from the Event list
    _crash_then_restart(
        sandbox, sc, objects, p, lambda done: _check_xid79(sc, objects, core, namespace, done, p)
    )
    _result("xid79", p, "Replaced", t0)


def _crash_then_restart(
    sandbox: Sandbox,
    sc: Scene,
    objects: Objects,
    p: str,
    check: Callable[[dict[str, Any]], None],
) -> None:
    """A process armed to crash at ``p`` runs until it does; its dead Lease deleted (as a
    person would), a process without the switch finishes the incident, and ``check`` looks
    at the finished incident while that process still runs."""
    armed = sc.operator(sandbox.kubeconfig, "armed", "--crash-at", p)
    _crash(
        armed.start(wait_started=False),
        p,
        lambda: [i.get("status") for i in objects.incidents(sc.work)],
    )
    armed.delete_dead_lease()
    op = sc.operator(sandbox.kubeconfig, "restarted").start()
    try:
        check(_finished(objects, sc.work, op, p))
    finally:
        op.stop()


def _result(what: str, p: str, end: str, started: float) -> None:
    print(
        f"\nRESULT crash point {what} {p}: crashed, restarted, {end} in "
        f"{time.monotonic() - started:.1f}s; incidents completed 1, duplicates 0, losses 0"
    )


def _check_xid79(  # noqa: PLR0917
    sc: Scene,
    objects: Objects,
    core: client.CoreV1Api,
    namespace: str,
    done: dict[str, Any],
    p: str,
) -> None:
    name = done["metadata"]["name"]
    status = done["status"]
    assert len(objects.incidents(sc.work)) == 1, f"{p}: a second incident"
    assert completed(done) == "Replaced", f"{p}: {dump(status)}"
    # One cordon, ours, under this incident's mark.
    node = objects.node(sc.work)
    assert node.spec.unschedulable
    assert node.metadata.annotations.get(CORDONED_BY) == name
    assert condition(done, "Cordoned")["reason"] == "Cordoned", f"{p}: {dump(status)}"
    assert status["ownership"] == {"cordoned": True, "slurmDrained": True}, p
    # Slurm: our drain, the job requeued once.
    assert condition(done, "SlurmDrained")["reason"] == "Drained", f"{p}: {dump(status)}"
    assert [j["jobId"] for j in status["requeuedJobs"]] == [sc.job], p
    assert _restarts(sc.cluster, sc.job) == 1, f"{p}: job requeued more than once"
    # The pod evicted.
    assert not [
        x for x in core.list_namespaced_pod(namespace).items if x.metadata.name == sc.pod
    ], f"{p}: pod {sc.pod} still there"
    # One spare claimed, by this incident, and resumed in Slurm; the other untouched.
    claims = {s: objects.node(s).metadata.labels.get(CLAIMED_BY) for s in sc.spares}
    claimed = [s for s, by in claims.items() if by]
    assert claimed == [status["replacementNode"]], f"{p}: claims {claims}"
    assert claims[claimed[0]] == name
    shown = sc.cluster.run("scontrol", "show", "node", claimed[0], "-o").stdout
    assert "DRAIN" not in shown, f"{p}: spare not resumed: {shown}"
    _timeline_once(done, XID79_STEPS)


# ---- XID 94, cordon + Slurm drain + requeue + reset, then back to service ---------------------
def _rule94() -> dict[str, Any]:
    return {
        "name": "ecc",
        "signals": {"xids": [94]},
        "ladder": [{"name": "requeue", "steps": [
            {"action": "cordon"},
            {"action": "slurmDrain", "slurmDrain": {"requeue": "requeue"}},
            {"action": "reset", "reset": {"hook": {"type": "Noop"}}},
        ]}],
    }  # fmt: skip


@pytest.mark.parametrize("p", _points(RETURN_EFFECTS))
def test_a_crash_at_each_point_of_a_return_to_service_loses_and_repeats_nothing(
    sandbox: Sandbox, scene: Callable[[str], Scene], namespace: str, p: str
) -> None:
    """uncordon and the Slurm resume happen only at the return, so the switch is set from the
    start; for the status write the incident first reaches its hysteresis under a process
    without the switch (stopped there), so that the crash hits a write of the return."""
    core = sandbox.core_v1()
    objects = Objects(sandbox.api_client())
    t0 = time.monotonic()
    sc = scene(p)
    objects.apply(
        "remediationpolicies",
        policy(f"reme-{sc.cid}", f"{sc.cid}-work", [_rule94()], healthy_for="3s"),
    )
    # The reset waits for an idle node: no pod; the requeued job needs somewhere to run.
    core.delete_namespaced_pod(sc.pod, namespace, grace_period_seconds=0)
    wait_for(lambda: pod_gone(core, namespace, sc.pod), f"pod {sc.pod} gone")
    sc.cluster.run("scontrol", "update", f"NodeName={sc.spares[0]}", "State=RESUME")
    simulate_xid(core, sc.work, 94)
    if p.startswith("status."):
        first = sc.operator(sandbox.kubeconfig, "first").start()
        try:
            wait_for(
                lambda: (c := condition(objects.incident(sc.work), "Returned"))
                and c["reason"] == "HysteresisPending",
                f"{p}: waiting out the hysteresis", timeout=60,
            )  # fmt: skip
        finally:
            first.stop()
    _crash_then_restart(sandbox, sc, objects, p, lambda done: _check_returned(sc, objects, done, p))
    _result("return to service", p, "Returned", t0)


def _check_returned(sc: Scene, objects: Objects, done: dict[str, Any], p: str) -> None:
    status = done["status"]
    assert len(objects.incidents(sc.work)) == 1, f"{p}: a second incident"
    assert completed(done) == "Returned", f"{p}: {dump(status)}"
    assert status["ownership"] == {"cordoned": True, "slurmDrained": True}, p
    node = objects.node(sc.work)
    assert not node.spec.unschedulable, f"{p}: still cordoned"
    assert CORDONED_BY not in (node.metadata.annotations or {}), f"{p}: mark left behind"
    shown = sc.cluster.run("scontrol", "show", "node", sc.work, "-o").stdout
    assert "DRAIN" not in shown, f"{p}: our Slurm drain not resumed: {shown}"
    assert [j["jobId"] for j in status["requeuedJobs"]] == [sc.job], p
    assert _restarts(sc.cluster, sc.job) == 1, f"{p}: job requeued more than once"
    assert not [s for s in sc.spares if objects.node(s).metadata.labels.get(CLAIMED_BY)], p
    _timeline_once(done, RETURN_STEPS)
