"""The chart's `helm test` checks and its standby-friendly liveness probe, run for real.

`helm test` itself cannot run here: kwok plays the kubelet, so the test pods would never run
their containers. What the pods run is plain Python (deploy/helm/gpuheal/files/helm_test.py),
so these tests run that same script on this machine against the sandbox's kube-apiserver,
with a TokenRequest token of the chart's own test ServiceAccount (its RBAC applied from the
rendered hooks): the checks and their RBAC are the ones `helm test` uses; only the network
path differs (an operator's /healthz is reached on loopback, `GPUHEAL_TEST_HEALTH_URL`,
instead of at its pod IP).

The operator copies are `gpuheal run` processes with the chart's operator ServiceAccount
token and `POD_NAME` set to the names of the Deployment's (kwok) pods, as in a pod.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir
from gpuheal_dev.sandbox.slurm import SlurmCluster
from tests.integration.operator_harness import free_port
from tests.integration.test_bridge_slurm import NODES, TOKEN, serve

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
SCRIPT = CHART / "files" / "helm_test.py"
KUBE_VERSION = "v1.36.3"
GPUHEAL_CRDS = (
    "noderemediations.gpuheal.io",
    "remediationpolicies.gpuheal.io",
    "reservepools.gpuheal.io",
    "faulthistories.gpuheal.io",  # issue 12: each node's memory of faults
)
LEASE_SECONDS = 4


def _helm(sandbox: Sandbox | None, home: Path, *args: str) -> str:
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    cmd = [str(cluster_bin_dir() / "helm"), *args]
    if sandbox is not None:
        cmd.append(f"--kubeconfig={sandbox.kubeconfig}")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def _run_check(check: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), check],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )


def _api_env(kubeconfig: Path, tmp_path: Path) -> dict[str, str]:
    """What a pod gets in-cluster, taken from a ServiceAccount kubeconfig."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    token = tmp_path / f"{kubeconfig.stem}.token"
    token.write_text(config["users"][0]["user"]["token"])
    return {
        "GPUHEAL_TEST_API_SERVER": cluster["server"],
        "GPUHEAL_TEST_API_TOKEN_FILE": str(token),
        "GPUHEAL_TEST_API_CA_FILE": cluster["certificate-authority"],
    }


def _adopt_crds(sandbox: Sandbox, release: str, namespace: str) -> None:
    for crd in GPUHEAL_CRDS:
        if sandbox.kubectl("get", "crd", crd, check=False).returncode != 0:
            continue
        sandbox.kubectl("label", "crd", crd, "--overwrite", "app.kubernetes.io/managed-by=Helm")
        sandbox.kubectl(
            "annotate",
            "crd",
            crd,
            "--overwrite",
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )


@pytest.fixture
def system_node(sandbox: Sandbox) -> Iterator[str]:
    """A Ready non-GPU node (kwok), where the operator's default affinity lets it run."""
    from gpuheal_dev.sandbox.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready

    core = sandbox.core_v1()
    name = f"t-system-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(core, [name], gpus=0, labels={"nvidia.com/gpu.present": "false"})
    wait_nodes_ready(core, [name])
    try:
        yield name
    finally:
        delete_nodes(core, [name])


class Release:
    def __init__(self, sandbox: Sandbox, name: str, namespace: str, home: Path) -> None:
        self.sandbox, self.name, self.namespace, self.home = sandbox, name, namespace, home
        self.fullname = f"{name}-gpuheal"

    def template(self, *args: str) -> list[dict[str, Any]]:
        out = _helm(
            None,
            self.home,
            "template",
            self.name,
            str(CHART),
            "-n",
            self.namespace,
            f"--kube-version={KUBE_VERSION}",
            f"--set=operator.leaseDuration={LEASE_SECONDS}",
            *args,
        )
        return [d for d in yaml.safe_load_all(out) if d]

    def operator_pods(self) -> list[str]:
        out = self.sandbox.kubectl(
            "get", "pods", "-n", self.namespace, "-o", "json",
            "-l", f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator",
        )  # fmt: skip
        return sorted(p["metadata"]["name"] for p in json.loads(out.stdout)["items"])


@pytest.fixture
def release(
    sandbox: Sandbox, namespace: str, system_node: str, tmp_path: Path
) -> Iterator[Release]:
    """The chart with two operator replicas, plus the `helm test` hooks' ServiceAccount and
    RBAC as rendered (Helm creates them only during `helm test`)."""
    rel = Release(sandbox, f"ht-{uuid.uuid4().hex[:6]}", namespace, tmp_path / "helm-home")
    _adopt_crds(sandbox, rel.name, namespace)
    _helm(
        sandbox, rel.home, "install", rel.name, str(CHART), "-n", namespace,
        "--set", "operator.replicas=2", "--set", f"operator.leaseDuration={LEASE_SECONDS}",
        "--wait", "--timeout=3m",
    )  # fmt: skip
    hooks = _helm(
        None, rel.home, "template", rel.name, str(CHART), "-n", namespace,
        f"--kube-version={KUBE_VERSION}", "--show-only", "templates/tests/rbac.yaml",
    )  # fmt: skip
    sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=hooks)
    try:
        yield rel
    finally:
        sandbox.kubectl("delete", "-n", namespace, "-f", "-", "--ignore-not-found", input=hooks)
        _helm(sandbox, rel.home, "uninstall", rel.name, "-n", namespace)


class Operator:
    """`gpuheal run` as one copy of the Deployment (its pod name, the chart's token)."""

    def __init__(self, rel: Release, pod: str, kubeconfig: Path, log: Path) -> None:
        self.pod, self.log = pod, log
        self.health_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPUHEAL_"))}
        env |= {"KUBECONFIG": str(kubeconfig), "POD_NAME": pod}
        exe = Path(sys.executable).parent / "gpuheal"
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [
                    str(exe), "run", f"--namespace={rel.namespace}", "--sources=conditions",
                    "--metrics-port=0", f"--health-port={self.health_port}",
                    f"--lease-duration={LEASE_SECONDS}", "--log-format=plain",
                ],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
            )  # fmt: skip

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait(pred: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _liveness(rel: Release, port: int, timeout_s: int = 5) -> subprocess.CompletedProcess[str]:
    """The chart's liveness command, rendered for `port`, run here as the kubelet would."""
    docs = rel.template(
        f"--set=operator.healthPort={port}",
        f"--set=operator.livenessProbe.timeoutSeconds={timeout_s}",
        "--show-only",
        "templates/deployment.yaml",
    )
    command = docs[0]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"][
        "command"
    ]
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        capture_output=True,
        text=True,
        timeout=timeout_s * 3,
        check=False,
    )


def test_helm_test_checks_and_the_standby_replica(
    sandbox: Sandbox, release: Release, tmp_path: Path
) -> None:
    rel = release
    cp = sandbox.control_plane
    test_env = _api_env(
        cp.kubeconfig_for_service_account(rel.namespace, f"{rel.fullname}-test"), tmp_path
    )
    pod_env = rel.template("--show-only", "templates/tests/checks.yaml")
    envs = {
        p["metadata"]["name"].rsplit("-", 1)[1]: {
            e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]
        }
        for p in pod_env
    }
    assert set(envs) == {"crds", "operator"}

    crds = _run_check("crds", {**test_env, **envs["crds"]})
    assert crds.returncode == 0, crds.stdout + crds.stderr
    assert crds.stdout.startswith("PASS: 4 CRDs established")

    # Before any copy runs: nobody holds the Lease. The check first waits for an available
    # replica (kwok's pods, not operators), so that wait is done here on the Deployment's status
    # and the check's own wait only has to span its Lease polls.
    def available() -> bool:
        got = sandbox.kubectl("get", "deployment", rel.fullname, "-n", rel.namespace, "-o",
                              "jsonpath={.status.availableReplicas}")  # fmt: skip
        return int(got.stdout.strip() or 0) >= 1

    _wait(available, f"deployment {rel.fullname} available", timeout=60)
    no_lease = _run_check("operator", {**test_env, **envs["operator"], "GPUHEAL_TEST_WAIT": "3"})
    assert no_lease.returncode == 1, no_lease.stdout + no_lease.stderr
    assert "FAIL: no Lease" in no_lease.stdout

    pods = rel.operator_pods()
    assert len(pods) == 2, pods
    op_kubeconfig = cp.kubeconfig_for_service_account(rel.namespace, rel.fullname)
    first = Operator(rel, pods[0], op_kubeconfig, tmp_path / "first.log")
    second: Operator | None = None
    # A port that accepts connections and never answers: a hung kopf.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    try:
        _wait(first.healthy, f"{pods[0]}'s /healthz", timeout=120)
        active = _run_check(
            "operator",
            {**test_env, **envs["operator"], "GPUHEAL_TEST_HEALTH_URL": first.health_url},
        )
        assert active.returncode == 0, active.stdout + active.stderr
        assert f"{pods[0]} holds the Lease, /healthz 200" in active.stdout

        second = Operator(rel, pods[1], op_kubeconfig, tmp_path / "second.log")
        _wait(lambda: "standing by" in second.log.read_text(), f"{pods[1]} standing by", 60)
        time.sleep(2 * LEASE_SECONDS)  # it stays waiting: the first copy keeps renewing
        assert second.proc.poll() is None
        assert not second.healthy(), "a standby must not serve kopf's /healthz"

        # The liveness probe spares the waiting copy, passes the active one, fails a hung one.
        standby_probe = _liveness(rel, second.health_port)
        assert standby_probe.returncode == 0, standby_probe.stderr
        assert _liveness(rel, first.health_port).returncode == 0
        hung_probe = _liveness(rel, hung.getsockname()[1], timeout_s=1)
        assert hung_probe.returncode != 0
        assert "timed out" in hung_probe.stderr

        # Failover: the active copy exits (releasing the Lease); the standby takes over.
        first.stop()
        _wait(second.healthy, f"{pods[1]} taking over", timeout=120)
        after = _run_check(
            "operator",
            {**test_env, **envs["operator"], "GPUHEAL_TEST_HEALTH_URL": second.health_url},
        )
        assert after.returncode == 0, after.stdout + after.stderr
        assert f"{pods[1]} holds the Lease" in after.stdout
    finally:
        hung.close()
        first.stop()
        if second is not None:
            second.stop()
    logs = first.log.read_text() + (second.log.read_text() if second else "")
    assert "403" not in logs, logs[-3000:]
    assert "forbidden" not in logs.lower(), logs[-3000:]


def test_helm_test_bridge_check(
    make_slurm_cluster: Callable[..., SlurmCluster], tmp_path: Path
) -> None:
    """The bridge check against a real bridge (CLI backend, a real Slurm): ready and token
    accepted; a wrong token and a dead slurmctld each fail with their own message."""
    cluster = make_slurm_cluster(NODES, name="helmtest")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token-0123456789")
    with serve(cluster, tmp_path / "state", tmp_path / "audit.jsonl") as url:
        env = {"GPUHEAL_TEST_BRIDGE_URL": url, "GPUHEAL_TEST_BRIDGE_TOKEN_FILE": str(token)}
        ok = _run_check("bridge", env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.strip() == f"PASS: bridge {url}: ready (backend cli), token accepted"

        refused = _run_check("bridge", {**env, "GPUHEAL_TEST_BRIDGE_TOKEN_FILE": str(wrong)})
        assert refused.returncode == 1
        assert "refuses the operator's token (401)" in refused.stdout

        cluster.stop()
        down = _run_check("bridge", env)
        assert down.returncode == 1
        assert "slurmctld is not reachable" in down.stdout


def test_helm_test_bridge_check_fails_when_nothing_listens(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    url = f"http://127.0.0.1:{free_port()}"
    result = _run_check(
        "bridge", {"GPUHEAL_TEST_BRIDGE_URL": url, "GPUHEAL_TEST_BRIDGE_TOKEN_FILE": str(token)}
    )
    assert result.returncode == 1
    assert result.stdout.startswith(f"FAIL: bridge {url}: /readyz:")
