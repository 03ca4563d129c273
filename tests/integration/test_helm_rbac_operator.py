"""RBAC for real: the operator process runs locally with a TokenRequest token of the chart's
ServiceAccount (nothing else), through an XID-79 incident: cordon, drain through the Eviction
API, replacement from a reserve pool. It must get there without a single 403.

The Slurm steps are left out of the policy (no bridge here; the bridge calls do not touch the
Kubernetes API anyway).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
GPUHEAL_CRDS = (
    "noderemediations.gpuheal.io",
    "remediationpolicies.gpuheal.io",
    "reservepools.gpuheal.io",
    "faulthistories.gpuheal.io",  # issue 12: each node's memory of faults
)


def _run_command() -> list[str]:
    """`gpuheal run` from this environment."""
    exe = Path(sys.executable).parent / "gpuheal"
    if not exe.exists():
        pytest.fail(f"{exe} missing: `uv sync` installs the console script")
    return [str(exe), "run"]


def _helm(sandbox: Sandbox, home: Path, *args: str) -> str:
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(cluster_bin_dir() / "helm"), *args, f"--kubeconfig={sandbox.kubeconfig}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def _adopt_crds(sandbox: Sandbox, release: str, namespace: str) -> None:
    """CRDs may exist from other tests (kubectl apply, or kept by an earlier release): hand them
    to this release the way Helm documents adoption."""
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
def chart_release(sandbox: Sandbox, namespace: str, tmp_path: Path) -> Iterator[str]:
    release = f"op-{uuid.uuid4().hex[:6]}"
    _adopt_crds(sandbox, release, namespace)
    home = tmp_path / "helm-home"
    # The policy below drains with `onTimeout: Force`: grant it (off by default).
    _helm(
        sandbox, home, "install", release, str(CHART), "-n", namespace,
        "--set", "rbac.forceDrain=true",
    )  # fmt: skip
    for crd in GPUHEAL_CRDS:
        sandbox.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    try:
        yield release
    finally:
        _helm(sandbox, home, "uninstall", release, "-n", namespace)


def _sa_kubeconfig(sandbox: Sandbox, namespace: str, name: str) -> Path:
    """The ServiceAccount's token, with the namespace a pod would have (kopf posts Events
    about cluster-scoped objects into the namespace of its context)."""
    path = sandbox.control_plane.kubeconfig_for_service_account(namespace, name)
    config = yaml.safe_load(path.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


def _policy(name: str, selector: dict[str, str], pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "RemediationPolicy",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": selector},
            "safety": {"maxUnhealthy": 1, "dryRun": False, "paused": False},
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
                                    "drain": {"timeout": "20s", "onTimeout": "Force"},
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


def _pool(name: str, spare_label: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "gpuheal.io/v1alpha1",
        "kind": "ReservePool",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": spare_label},
            "promotion": {"setLabels": {"gpuheal.io/promoted": "true"}},
        },
    }


def _conditions(sandbox: Sandbox, node: str) -> dict[str, str]:
    out = sandbox.kubectl(
        "get", "noderemediations", "-l", f"gpuheal.io/node={node}", "-o", "json", check=False
    )
    if out.returncode != 0:
        return {}
    items = json.loads(out.stdout)["items"]
    return {
        c["type"]: c["status"]
        for item in items
        for c in (item.get("status") or {}).get("conditions") or []
    }


def test_operator_runs_an_xid79_incident_with_only_the_charts_rbac(
    sandbox: Sandbox,
    namespace: str,
    chart_release: str,
    own_gpu_nodes: Any,
    tmp_path: Path,
) -> None:
    from gpuheal.cli.simulate import simulate_xid

    command = _run_command()
    injected: dict[str, Any] = {}
    tid = uuid.uuid4().hex[:6]
    nodes = own_gpu_nodes(2, **{"gpuheal.io/rbac-test": tid})
    (spare,) = own_gpu_nodes(1, **{"gpuheal.io/rbac-spare": tid})
    broken, _healthy = nodes
    policy, pool = f"rbac-{tid}", f"rbac-{tid}"
    sandbox.kubectl(
        "apply", "-f", "-", input=json.dumps(_pool(pool, {"gpuheal.io/rbac-spare": tid}))
    )
    sandbox.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(_policy(policy, {"gpuheal.io/rbac-test": tid}, pool)),
    )
    # A workload pod on the broken node, for the drain to evict.
    sandbox.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "train", "labels": {"app": "train"}},
                "spec": {
                    "nodeName": broken,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "train", "image": "example.invalid/train:1"}],
                },
            }
        ),
    )

    kubeconfig = _sa_kubeconfig(sandbox, namespace, f"{chart_release}-gpuheal")
    log_path = tmp_path / "operator.log"
    # Only the ServiceAccount's kubeconfig: nothing from this environment's own credentials.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "GPUHEAL_"))}
    env["KUBECONFIG"] = str(kubeconfig)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                *command,
                f"--namespace={namespace}",
                "--sources=conditions,events",
                "--trusted-reporters=gpuheal-agent,kernel-monitor",  # simulate_xid posts as NPD
                "--metrics-port=0",
                "--health-port=0",
                "--log-format=plain",
                "--verbose",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        time.sleep(3)  # let kopf list and watch before the signal arrives
        injected = simulate_xid(sandbox.core_v1(), broken, 79)
        deadline = time.monotonic() + 150
        wanted = {"Cordoned", "Drained", "ReplacementClaimed"}
        conditions: dict[str, str] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            conditions = _conditions(sandbox, broken)
            if all(conditions.get(t) == "True" for t in wanted):
                break
            time.sleep(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if "event" in injected:  # no stale XID for operators started by later tests
            event_ns, event_name = injected["event"].split("/")
            sandbox.kubectl("delete", "event", event_name, "-n", event_ns, "--ignore-not-found")
        for kind, name in (("remediationpolicy", policy), ("reservepool", pool)):
            sandbox.kubectl("delete", kind, name, "--ignore-not-found")
        sandbox.kubectl(
            "delete",
            "noderemediations",
            "-l",
            f"gpuheal.io/node={broken}",
            "--ignore-not-found",
            "--wait=false",
        )
    log_text = log_path.read_text()
    # A 403 as a word: incident names end in a hex digest that may hold "403" ("-2853403a").
    forbidden = [
        line
        for line in log_text.splitlines()
        if re.search(r"\b403\b", line) or "forbidden" in line.lower()
    ]
    assert not forbidden, "the chart's RBAC is missing something:\n" + "\n".join(forbidden[:20])
    tail = "\n".join(log_text.splitlines()[-40:])
    assert all(conditions.get(t) == "True" for t in wanted), (
        f"incident did not get through cordon, drain, replace: {conditions}\n{tail}"
    )
    node = json.loads(sandbox.kubectl("get", "node", broken, "-o", "json").stdout)
    assert node["spec"].get("unschedulable") is True
    assert sandbox.kubectl(
        "get", "pod", "train", "-n", namespace, check=False
    ).returncode != 0 or json.loads(
        sandbox.kubectl("get", "pod", "train", "-n", namespace, "-o", "json").stdout
    )["metadata"].get("deletionTimestamp"), "the workload pod was not evicted"
    spare_labels = json.loads(sandbox.kubectl("get", "node", spare, "-o", "json").stdout)[
        "metadata"
    ]["labels"]
    assert spare_labels.get("gpuheal.io/promoted") == "true"
    # gpuheal's Events about the Node were accepted (the apiserver takes Events about
    # cluster-scoped objects only in `default`, and the chart must allow that namespace).
    assert "could not post Event" not in log_text, tail
    events = json.loads(
        sandbox.kubectl(
            "get", "events", "-n", "default", "-o", "json",
            f"--field-selector=involvedObject.kind=Node,involvedObject.name={broken}",
        ).stdout
    )["items"]  # fmt: skip
    assert [e for e in events if e.get("source", {}).get("component") == "gpuheal"], events
