"""Fixtures shared by the integration tests: the CRDs, gpuheal objects, operator and bridge
processes, a case's own nodes, and the XID-79 scene.

The sandbox itself (``sandbox``, ``namespace``, ``own_gpu_nodes``) and Slurm clusters
(``make_slurm_cluster``, ``slurm_cluster``, ``checkpoint_job``) come from tests/fixtures.
What a test builds from plain functions (policies, pools, rules, pods) is in
operator_harness.py.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.bridge_harness import BridgeProcess, start_bridge, stop
from tests.integration.operator_harness import (
    REPO,
    Objects,
    OperatorProcess,
    Xid79Scene,
    policy,
    pool,
    xid79_rule,
)

#: the bridge token of the ``bridge`` fixture (and of the operator it serves)
BRIDGE_TOKEN = "operator-e2e-token-0123456789abcdef"

Bridge = Callable[..., tuple[str, Path, subprocess.Popen[bytes]]]


@pytest.fixture(scope="session")
def gpuheal_crds(sandbox: Sandbox) -> None:
    sandbox.kubectl("apply", "-f", str(REPO / "crds"))
    for plural in ("noderemediations", "remediationpolicies", "reservepools", "faulthistories"):
        sandbox.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.gpuheal.io", "--timeout=60s"
        )


@pytest.fixture
def objects(sandbox: Sandbox, gpuheal_crds: None) -> Objects:
    return Objects(sandbox.api_client())


@pytest.fixture
def run_operator(
    sandbox: Sandbox, gpuheal_crds: None, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """``run_operator(*flags, wait_started=True, env=None)``: a started operator process (its
    logs in ``tmp_path/op<n>``), stopped after the test."""
    procs: list[OperatorProcess] = []

    def start(
        *extra: str, wait_started: bool = True, env: dict[str, str] | None = None
    ) -> OperatorProcess:
        logs = tmp_path / f"op{len(procs)}"
        logs.mkdir()
        op = OperatorProcess(Path(sandbox.kubeconfig), logs, list(extra), env or {})
        op.start(wait_started=wait_started)
        procs.append(op)
        return op

    yield start
    for op in procs:
        op.stop()


@pytest.fixture
def case(
    own_gpu_nodes: Callable[..., list[str]], objects: Objects
) -> Iterator[Callable[..., list[str]]]:
    """``case(n, role)``: n fresh nodes labelled ``gpuheal.io/case=<id>-<role>``."""
    made: list[str] = []
    case_id = uuid.uuid4().hex[:6]

    def make(n: int, role: str = "work", **labels: str) -> list[str]:
        names = own_gpu_nodes(n, **{"gpuheal.io/case": f"{case_id}-{role}", **labels})
        made.extend(names)
        return names

    make.case_id = case_id  # type: ignore[attr-defined]
    yield make
    objects.cleanup(made)


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator[Bridge]:
    """``bridge(cluster, port=None)``: (url, the operator's token file, process); the same
    ``port`` again restarts it with its idempotency store."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        cluster: SlurmCluster, port: int | None = None
    ) -> tuple[str, Path, subprocess.Popen[bytes]]:
        b = start_bridge(cluster, tmp_path, token=BRIDGE_TOKEN, port=port)
        procs.append(b.proc)
        return b.url, b.operator_token, b.proc

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture
def run_bridge(tmp_path: Path) -> Iterator[Callable[..., BridgeProcess]]:
    """``run_bridge(cluster, *extra, token=..., ...)``: `start_bridge` in the test's
    directory, stopped after the test."""
    started: list[BridgeProcess] = []

    def start(cluster: SlurmCluster, *extra: str, **options: Any) -> BridgeProcess:
        bridge = start_bridge(cluster, tmp_path, *extra, **options)
        started.append(bridge)
        return bridge

    yield start
    for bridge in started:
        stop(bridge.proc)


# --- the XID-79 scene -----------------------------------------------------------------------------
@pytest.fixture
def xid79_scene(  # noqa: PLR0917 - pytest passes fixtures positionally
    sandbox: Sandbox,
    own_gpu_nodes: Callable[..., list[str]],
    objects: Objects,
    run_operator: Callable[..., OperatorProcess],
    make_slurm_cluster: Callable[..., SlurmCluster],
    bridge: Bridge,
) -> Iterator[Callable[..., Xid79Scene]]:
    """``xid79_scene(work=1, spares=1, *, slurm=False, rules=None, drain=None, **policy)``:
    fresh work and spare nodes, a ReservePool of the spares (promotion resumes a spare in
    Slurm when there is Slurm), a policy over the work nodes with ``rules`` (default: the
    XID 79 replace ladder: cordon, Slurm drain + requeue, drain, replace; ``drain`` its
    drain step's options) and ``policy`` as its safety options (``max_unhealthy``,
    ``healthy_for``, ``dryRun``, ``requireApproval``...); ``slurm=True`` (or a dict of
    SlurmCluster options) adds the Slurm cluster and its bridge. Nothing is started that
    acts: the test calls ``start()`` once its world is ready, then ``xid()``. The nodes,
    their incidents, the policy and the pool are deleted after the test."""
    made: list[str] = []

    def make(
        work: int = 1,
        spares: int = 1,
        *,
        slurm: bool | dict[str, Any] = False,
        rules: list[dict[str, Any]] | None = None,
        drain: dict[str, Any] | None = None,
        **policy_options: Any,
    ) -> Xid79Scene:
        cid = uuid.uuid4().hex[:6]
        work_nodes = own_gpu_nodes(work, **{"gpuheal.io/case": f"{cid}-work"})
        made.extend(work_nodes)
        spare_nodes = own_gpu_nodes(spares, **{"gpuheal.io/case": f"{cid}-spare"}) if spares else []
        made.extend(spare_nodes)
        scene = Xid79Scene(
            cid=cid,
            work=work_nodes,
            spares=spare_nodes,
            policy=f"p-{cid}",
            pool=f"spares-{cid}" if spares else None,
            objects=objects,
            core=sandbox.core_v1(),
            run_operator=run_operator,
        )
        if slurm:
            options = slurm if isinstance(slurm, dict) else {}
            scene.cluster = make_slurm_cluster([*work_nodes, *spare_nodes], name="x79", **options)
            for s in spare_nodes:  # the pool's own drain, which promotion lifts
                scene.cluster.run(
                    "scontrol", "update", f"NodeName={s}", "State=DRAIN", "Reason=reserve pool"
                )
            scene.bridge_url, scene.bridge_token, scene.bridge_proc = bridge(scene.cluster)
        if scene.pool:
            manifest = pool(scene.pool, f"{cid}-spare")
            if slurm:
                manifest["spec"]["promotion"]["slurm"] = {"resume": True}
            objects.apply("reservepools", manifest)
        if rules is None:
            assert scene.pool, "the XID 79 replace ladder needs spares"
            rules = [xid79_rule(scene.pool, drain)]
        objects.apply("remediationpolicies", policy(scene.policy, f"{cid}-work", rules,
                                                    **policy_options))  # fmt: skip
        return scene

    yield make
    objects.cleanup(made)
