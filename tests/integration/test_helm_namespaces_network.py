"""Namespaces and network (issue 23): the privileged agent runs apart by default, the
operator's and the bridge's pods pass the restricted Pod Security Standard, NetworkPolicies
say who may reach them, and plain HTTP to the bridge stays inside the cluster.

The Pod Security check is the API server's own (the PodSecurity admission plugin, on by
default): each pod template the chart puts in the release namespace is created with a
server-side dry run in a namespace that enforces `restricted`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox
from gpuheal_dev.sandbox.kube import cluster_bin_dir

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuheal"
BRIDGE_VALUES = CHART / "ci" / "bridge-values.yaml"
RELEASE_NS = "gpuheal"
#: the agent's namespace by default: <release>-agent (values.yaml, agent.namespace.name)
AGENT_NS = "r-agent"
AGENT_USER = f"system:serviceaccount:{AGENT_NS}:r-gpuheal-agent"
MODES = ("enforce", "warn", "audit")  # the Pod Security modes a namespace label sets


def _helm(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),  # kubectl's discovery cache goes there, not into the checkout
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }
    return subprocess.run(
        [str(cluster_bin_dir() / "helm"), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def render(tmp: Path, *args: str) -> list[dict[str, Any]]:
    result = _helm("template", "r", str(CHART), "-n", RELEASE_NS, *args, tmp=tmp)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind/name, namespace, pod spec) of every pod the chart would run."""
    for d in docs:
        meta = d["metadata"]
        where = meta.get("namespace", RELEASE_NS)
        if d["kind"] == "Pod":
            yield f"Pod/{meta['name']}", where, d["spec"]
        elif d["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{d['kind']}/{meta['name']}", where, d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield (
                f"CronJob/{meta['name']}",
                where,
                d["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            )


@pytest.fixture
def restricted_ns(sandbox: Sandbox) -> Iterator[str]:
    name = f"psa-{uuid.uuid4().hex[:6]}"
    sandbox.kubectl("create", "namespace", name)
    sandbox.kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )  # fmt: skip
    try:
        yield name
    finally:
        sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _dry_run_pod(sandbox: Sandbox, namespace: str, name: str, spec: dict[str, Any]) -> str:
    """'' when the API server admits the pod in `namespace` without a warning, else its
    refusal or warnings."""
    account = spec.get("serviceAccountName")
    if account and sandbox.kubectl("get", "sa", account, "-n", namespace, check=False).returncode:
        sandbox.kubectl("create", "serviceaccount", account, "-n", namespace)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    out = sandbox.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        input=json.dumps(pod), check=False,
    )  # fmt: skip
    return "" if out.returncode == 0 and "Warning" not in out.stderr else out.stderr.strip()


def _dry_run(sandbox: Sandbox, namespace: str, doc: dict[str, Any]) -> str:
    """'' when the API server admits the object as rendered in `namespace` without a warning
    (Pod Security warns on a workload whose pods `warn` would refuse), else what it said."""
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    out = sandbox.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-",
        input=json.dumps(doc), check=False,
    )  # fmt: skip
    return "" if out.returncode == 0 and "Warning" not in out.stderr else out.stderr.strip()


def agent_placement(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the chart puts the agent: its DaemonSet's and ServiceAccount's namespaces, the
    namespaces its bindings name it in, the users the admission policies name as the agent,
    and the Namespaces the chart creates (name -> enforced Pod Security level)."""
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (account,) = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "r-gpuheal-agent"
    ]
    subjects = [
        s
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in d.get("subjects") or []
        if s["name"] == account["metadata"]["name"]
    ]
    policies = {
        d["metadata"]["name"]: json.dumps(d["spec"])
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] in ("r-gpuheal-signal-trust", "r-gpuheal-agent-node")
    }
    return {
        "daemonset": ds["metadata"].get("namespace"),
        "serviceaccount": account["metadata"].get("namespace"),
        "subjects": sorted({s["namespace"] for s in subjects}),
        "bindings": len(subjects),
        "policies name": {
            name: sorted(set(re.findall(r"system:serviceaccount:[a-z0-9-]+:r-gpuheal-agent", t)))
            for name, t in policies.items()
        },
        "namespaces": {
            d["metadata"]["name"]: d["metadata"]["labels"].get("pod-security.kubernetes.io/enforce")
            for d in docs
            if d["kind"] == "Namespace"
        },
    }


@pytest.mark.parametrize("values", ["defaults", "bridge"])
def test_every_pod_in_the_release_namespace_passes_restricted(
    sandbox: Sandbox, restricted_ns: str, tmp_path: Path, values: str
) -> None:
    """With the chart's default values the agent runs in a namespace of its own, and every
    pod the chart runs in the release namespace (operator, bridge, helm test pods) is
    admitted where `restricted` is enforced; the agent's is refused there (the check is
    real), and goes to <release>-agent, which the chart creates labelled `privileged`, with
    its ServiceAccount, the subjects of its bindings and the user its admission policies
    name."""
    extra = ["-f", str(BRIDGE_VALUES)] if values == "bridge" else []
    docs = render(tmp_path, *extra)
    specs = list(pod_specs(docs))
    in_release = [(what, spec) for what, ns, spec in specs if ns == RELEASE_NS]
    assert any(what.startswith("Deployment/") for what, _ in in_release), specs
    if values == "bridge":
        assert any("slurm-bridge" in what for what, _ in in_release), specs
    refused = {
        what: why
        for what, spec in in_release
        if (why := _dry_run_pod(sandbox, restricted_ns, what.split("/")[1].lower(), spec))
    }
    assert not refused, "refused under the restricted Pod Security Standard:\n" + "\n".join(
        f"{k}: {v}" for k, v in refused.items()
    )
    # The Deployments themselves, as rendered: no refusal, no warning.
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        assert _dry_run(sandbox, restricted_ns, d) == "", d["metadata"]["name"]
    # The namespaces the chart creates for its privileged pods say so in every mode.
    for ns in (d for d in docs if d["kind"] == "Namespace"):
        labels = ns["metadata"]["labels"]
        assert {m: labels.get(f"pod-security.kubernetes.io/{m}") for m in MODES} == {
            m: "privileged" for m in MODES
        }, ns["metadata"]["name"]
    (agent,) = [(what, ns, spec) for what, ns, spec in specs if what.startswith("DaemonSet/")]
    assert agent[1] == AGENT_NS, agent[:2]
    assert "violates PodSecurity" in _dry_run_pod(sandbox, restricted_ns, "agent", agent[2])
    assert agent_placement(docs) == {
        "daemonset": AGENT_NS,
        "serviceaccount": AGENT_NS,
        "subjects": [AGENT_NS],
        "bindings": 2,  # the ClusterRoleBinding (Nodes) and the RoleBinding in `default` (Events)
        "policies name": {
            "r-gpuheal-signal-trust": [AGENT_USER],
            "r-gpuheal-agent-node": [AGENT_USER],
        },
        "namespaces": {AGENT_NS: "privileged", "r-node-jobs": "privileged"},
    }


@pytest.mark.parametrize(
    ("name", "where", "created"),
    [
        ("gpu-agents", "gpu-agents", True),  # a name of the site's
        (RELEASE_NS, RELEASE_NS, False),  # back in the release namespace, as before
    ],
)
def test_agent_namespace_name_moves_the_agent_and_its_admission_user(
    tmp_path: Path, name: str, where: str, created: bool
) -> None:
    """agent.namespace.name overrides <release>-agent; the release namespace's own name puts
    the agent back there (no namespace created for it), and the admission policies name its
    ServiceAccount where it is, either way."""
    user = f"system:serviceaccount:{where}:r-gpuheal-agent"
    placement = agent_placement(render(tmp_path, f"--set=agent.namespace.name={name}"))
    assert placement == {
        "daemonset": where,
        "serviceaccount": where,
        "subjects": [where],
        "bindings": 2,
        "policies name": {"r-gpuheal-signal-trust": [user], "r-gpuheal-agent-node": [user]},
        "namespaces": {"r-node-jobs": "privileged", **({where: "privileged"} if created else {})},
    }
    # agent.namespace.create=false: the namespace is the site's, the chart creates none.
    assert agent_placement(
        render(tmp_path, f"--set=agent.namespace.name={name}", "--set=agent.namespace.create=false")
    )["namespaces"] == {"r-node-jobs": "privileged"}


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"].get("app.kubernetes.io/component", "operator"): d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
    }


def test_notes_warn_while_the_release_namespace_does_not_enforce_restricted(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """helm install's NOTES look the release namespace up: no `restricted` enforced, a warning
    with the command; labelled, none."""
    name = f"psa-{uuid.uuid4().hex[:6]}"
    sandbox.kubectl("create", "namespace", name)

    def notes() -> str:
        out = _helm(
            "install", f"n{name}", str(CHART), "-n", name, "--dry-run=server",
            "--set", "crds.enabled=false", f"--kubeconfig={sandbox.kubeconfig}", tmp=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout[out.stdout.index("NOTES:") :]

    try:
        said = notes()
        assert f"WARNING: namespace {name} does not enforce the restricted" in said, said
        assert (
            f"kubectl label namespace {name} pod-security.kubernetes.io/enforce=restricted" in said
        )
        sandbox.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=baseline")
        assert "(it enforces baseline)" in notes()
        sandbox.kubectl(
            "label",
            "namespace",
            name,
            "--overwrite",
            "pod-security.kubernetes.io/enforce=restricted",
        )
        assert "does not enforce the restricted" not in notes()
    finally:
        sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_network_policies_let_only_the_operator_reach_the_bridge(
    sandbox: Sandbox, namespace: str, tmp_path: Path
) -> None:
    docs = render(tmp_path, "-f", str(BRIDGE_VALUES))
    policies = _policies(docs)
    assert set(policies) == {"operator", "slurm-bridge"}, policies
    operator_labels = next(
        d["spec"]["selector"]["matchLabels"]
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "r-gpuheal"
    )
    scrapers = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    bridge = policies["slurm-bridge"]
    assert bridge["policyTypes"] == ["Ingress"]
    (rule,) = bridge["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": operator_labels}}, scrapers]
    assert rule["ports"] == [{"port": "api", "protocol": "TCP"}]
    (op_rule,) = policies["operator"]["ingress"]
    assert op_rule["from"] == [scrapers]
    assert op_rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # The scrapers are a value; the API server accepts what the chart renders.
    peers = [{"namespaceSelector": {"matchLabels": {"team": "obs"}},
              "podSelector": {"matchLabels": {"app": "prometheus"}}}]  # fmt: skip
    custom = render(
        tmp_path,
        "-f",
        str(BRIDGE_VALUES),
        f"--set-json=networkPolicy.metricsFrom={json.dumps(peers)}",
    )
    (op_rule,) = _policies(custom)["operator"]["ingress"]
    assert op_rule["from"] == peers
    # Nobody: the operator admits no connection, the bridge the operator's only.
    nobody = _policies(
        render(tmp_path, "-f", str(BRIDGE_VALUES), "--set-json=networkPolicy.metricsFrom=[]")
    )
    assert nobody["operator"]["ingress"] == []
    assert nobody["slurm-bridge"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": operator_labels}}
    ]
    for d in [d for d in docs if d["kind"] == "NetworkPolicy"]:
        d["metadata"]["namespace"] = namespace
        sandbox.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(d))
    assert not _policies(render(tmp_path, "--set=networkPolicy.enabled=false"))


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_plain_http_bridge_outside_the_cluster_fails_to_render(
    tmp_path: Path, service_type: str
) -> None:
    args = ("-f", str(BRIDGE_VALUES), f"--set=slurmBridge.service.type={service_type}")
    result = _helm("template", "r", str(CHART), "-n", RELEASE_NS, *args, tmp=tmp_path)
    assert result.returncode != 0, "rendered a plain-HTTP bridge behind a " + service_type
    assert "slurmBridge.insecureHttp" in result.stderr, result.stderr
    assert f"slurmBridge.service.type is {service_type}" in result.stderr, result.stderr
    # With TLS, any Service type renders.
    tls = _helm(
        "template", "r", str(CHART), "-n", RELEASE_NS, *args,
        "--set=slurmBridge.insecureHttp=false", "--set=slurmBridge.tlsSecret=bridge-tls",
        tmp=tmp_path,
    )  # fmt: skip
    assert tls.returncode == 0, tls.stderr
