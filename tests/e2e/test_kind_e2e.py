"""End to end on a real kind cluster with the real images: the chart installs and runs, and an
XID injected with `gpuheal simulate xid` gets the node cordoned, drained and replaced from the
reserve pool; a dry-run policy changes nothing.

Slurm is not part of these tests (no Slurm in kind): the policies here have no `slurmDrain` step.
The bridge image is built and loaded, and its in-cluster deployment is exercised by
`test_bridge_deployment_serves` when you point it at a slurmrestd (GPUHEAL_E2E_SLURMRESTD_URL).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from tests.e2e.kind import CHART, KindCluster, wait_for

pytestmark = pytest.mark.kind


def _policy(name: str, pool: str, *, dry_run: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/e2e-role": "gpu"}},
            "safety": {"maxUnhealthy": 1, "dryRun": dry_run, "paused": False},
            "returnToService": {"enabled": False},
            "rules": [
                {
                    "name": "fell-off-bus",
                    "signals": {"xids": [79]},
                    "ladder": [
                        {
                            "name": "replace",
                            "steps": [
                                {"action": "cordon"},
                                {
                                    "action": "drain",
                                    "drain": {"timeout": "60s", "onTimeout": "Force"},
                                },
                                {
                                    "action": "replace",
                                    "replace": {"reservePoolRef": {"name": pool}},
                                },
                            ],
                        }
                    ],
                }
            ],
        },
    }


def _pool(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {"gpuheal.io/e2e-role": "spare"}},
            "promotion": {"setLabels": {"gpuheal.io/pool": "training"}},
        },
    }


def _workload(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "train", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {
                    "nodeSelector": {"gpuheal.io/e2e-role": "gpu"},
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "10m"}},
                        }
                    ],
                },
            },
        },
    }


def _conditions(cluster: KindCluster, node: str) -> dict[str, str]:
    items = cluster.get("noderemediations", "-l", f"gpuheal.io/node={node}")["items"]
    return {
        c["type"]: c["status"]
        for item in items
        for c in (item.get("status") or {}).get("conditions") or []
    }


@pytest.fixture
def scenario(kind_cluster: KindCluster, installed: str) -> Any:
    """A fresh namespace with the workload, and cleanup of policies and incidents."""
    ns = f"e2e-{uuid.uuid4().hex[:6]}"
    kind_cluster.kubectl("create", "namespace", ns)
    kind_cluster.apply(_workload(ns))
    kind_cluster.kubectl("rollout", "status", "deploy/train", "-n", ns, "--timeout=180s")
    created: list[tuple[str, str]] = []

    def apply(obj: dict[str, Any]) -> None:
        kind_cluster.apply(obj)
        created.append((obj["kind"].lower(), obj["metadata"]["name"]))

    yield ns, apply
    for kind, name in created:
        kind_cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
    kind_cluster.kubectl("delete", "noderemediations", "--all", "--wait=false", check=False)
    kind_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    for node in kind_cluster.nodes("gpu"):
        kind_cluster.kubectl("uncordon", node, check=False)


def test_the_operator_runs_where_the_chart_puts_it(
    kind_cluster: KindCluster, installed: str
) -> None:
    pods = kind_cluster.get("pods", "-n", installed, "-l", "app.kubernetes.io/component=operator")
    (pod,) = pods["items"]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] in kind_cluster.nodes("system") + [
        n["metadata"]["name"]
        for n in kind_cluster.get("nodes", "-l", "node-role.kubernetes.io/control-plane")["items"]
    ]
    assert pod["spec"]["nodeName"] not in kind_cluster.nodes("gpu") + kind_cluster.nodes("spare")
    crds = kind_cluster.kubectl("get", "crd", "-o", "name")
    for crd in ("remediationpolicies", "reservepools", "noderemediations"):
        assert f"{crd}.gpuheal.io" in crds


def test_xid79_cordons_drains_and_replaces(kind_cluster: KindCluster, scenario: Any) -> None:
    ns, apply = scenario
    tid = uuid.uuid4().hex[:6]
    apply(_pool(f"spares-{tid}"))
    apply(_policy(f"e2e-{tid}", f"spares-{tid}"))
    broken = kind_cluster.nodes("gpu")[0]
    (spare,) = kind_cluster.nodes("spare")

    kind_cluster.gpuheal("simulate", "xid", "--node", broken, "--xid", "79")

    wait_for(
        lambda: kind_cluster.get("node", broken)["spec"].get("unschedulable"),
        f"{broken} cordoned",
    )
    wanted = {"Cordoned", "Drained", "ReplacementClaimed"}
    wait_for(
        lambda: all(_conditions(kind_cluster, broken).get(t) == "True" for t in wanted),
        f"incident on {broken}: {sorted(wanted)}",
        timeout=300,
    )
    pods = kind_cluster.get("pods", "-n", ns, "-l", "app=train")["items"]
    assert broken not in {p["spec"].get("nodeName") for p in pods}
    labels = kind_cluster.get("node", spare)["metadata"]["labels"]
    assert labels["gpuheal.io/pool"] == "training"


def test_dry_run_changes_nothing(kind_cluster: KindCluster, scenario: Any) -> None:
    _, apply = scenario
    tid = uuid.uuid4().hex[:6]
    apply(_pool(f"spares-{tid}"))
    apply(_policy(f"e2e-{tid}", f"spares-{tid}", dry_run=True))
    node = kind_cluster.nodes("gpu")[-1]
    kind_cluster.gpuheal("simulate", "xid", "--node", node, "--xid", "79")
    wait_for(lambda: _conditions(kind_cluster, node), f"an incident on {node} (dry run)")
    assert not kind_cluster.get("node", node)["spec"].get("unschedulable")


def test_bridge_deployment_serves(kind_cluster: KindCluster, images: dict[str, str]) -> None:
    """The bridge in the cluster (Slurm in Kubernetes mode), against your slurmrestd."""
    url = os.environ.get("GPUHEAL_E2E_SLURMRESTD_URL")
    if not url:
        pytest.skip("set GPUHEAL_E2E_SLURMRESTD_URL (a slurmrestd reachable from kind) to run it")
    ns = f"bridge-{uuid.uuid4().hex[:6]}"
    kind_cluster.helm(
        "upgrade", "--install", "bridge", str(CHART), "-n", ns, "--create-namespace",
        "--set", "crds.enabled=false",
        "--set", "operator.image.repository=gpuheal",
        "--set", f"operator.image.tag={kind_cluster.image_tag}",
        "--set", "operator.image.pullPolicy=Never",
        "--set", "slurmBridge.enabled=true",
        "--set", "slurmBridge.insecureHttp=true",  # plain HTTP in a throwaway kind cluster
        "--set", "slurmBridge.image.repository=gpuheal-slurm-bridge",
        "--set", f"slurmBridge.image.tag={kind_cluster.image_tag}",
        "--set", "slurmBridge.image.pullPolicy=Never",
        "--set", f"slurmBridge.rest.url={url}",
        "--set", f"bridge.token.value=e2e-{uuid.uuid4().hex}",
        "--wait", "--timeout=5m",
    )  # fmt: skip
    try:
        kind_cluster.kubectl(
            "rollout", "status", "deploy/bridge-gpuheal-slurm-bridge", "-n", ns, "--timeout=120s"
        )
    finally:
        kind_cluster.helm("uninstall", "bridge", "-n", ns)
        kind_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
