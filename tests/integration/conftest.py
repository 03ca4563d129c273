"""Fixtures shared by the integration tests: the CRDs, gpuheal objects, operator and bridge
processes, and a case's own nodes.

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
