"""The chart's node agent, rendered with the pinned helm: its switches, its privileges, its exact
RBAC and its schema. Installing it and its RBAC against the real apiserver:
test_agent_sandbox.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal_dev.sandbox.kube import cluster_bin_dir

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuheal"


def helm(tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"HELM_{k}_HOME": str(tmp / k) for k in ("CONFIG", "CACHE", "DATA")}}
    binary = cluster_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make bins`")
    result = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def render(tmp: Path, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "r", str(CHART), "-n", "gpuheal", "--kube-version=v1.36.3"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(tmp, *args).stdout) if d]


#: the agent's namespace by default, <release>-agent, and its ServiceAccount's user there
AGENT_NS = "r-agent"
AGENT_USER = f"system:serviceaccount:{AGENT_NS}:r-gpuheal-agent"


def agent_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's objects, its own namespace included."""
    return [
        d
        for d in docs
        if d["metadata"]["name"].startswith("r-gpuheal-agent")
        or (d["kind"] == "Namespace" and d["metadata"]["name"] == AGENT_NS)
    ]


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def test_defaults(tmp_path: Path) -> None:
    docs = render(tmp_path)
    ds = daemonset(docs)
    assert ds["metadata"]["namespace"] == AGENT_NS  # apart from the operator
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "gpuheal.agent"]
    assert "--kmsg=/dev/kmsg" in c["args"]
    assert "--event-namespace=default" in c["args"]
    assert "--state-file=/var/lib/gpuheal-agent/state.json" in c["args"]
    assert "--condition-type=GpuXid" in c["args"]
    # up and not ready, saying why, when it can hear no XID (never a crash loop)
    assert "--ready-port=8082" in c["args"]
    assert "127.0.0.1:8082/readyz" in c["readinessProbe"]["exec"]["command"][-1]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["NODE_NAME"] == "spec.nodeName"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert not pod.get("hostNetwork")
    assert not pod.get("hostPID")
    assert not pod.get("hostIPC")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kernel-log"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert volumes["state"]["hostPath"]["path"] == "/var/lib/gpuheal-agent"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kernel-log"]["readOnly"] is True
    assert set(volumes) == {"kernel-log", "state", "tmp"}  # nothing else from the host


def test_rbac_is_exactly_what_the_agent_calls(tmp_path: Path) -> None:
    docs = agent_objects(render(tmp_path))
    rules = {
        (d["kind"], d["metadata"].get("namespace")): d["rules"]
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
    }
    assert rules == {
        ("ClusterRole", None): [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        ],
        ("Role", "default"): [
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]}
        ],
    }
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "r-gpuheal-agent", "namespace": AGENT_NS}
        ]
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert sa["metadata"]["namespace"] == AGENT_NS
    assert sa["automountServiceAccountToken"] is False  # the pod opts in


def test_disabled_renders_no_agent(tmp_path: Path) -> None:
    assert agent_objects(render(tmp_path, "agent.enabled=false")) == []
    no_rbac = agent_objects(render(tmp_path, "rbac.create=false"))
    # Admission is not RBAC: the agent stays on its own node whoever grants its RBAC.
    assert {d["kind"] for d in no_rbac} == {
        "Namespace",  # <release>-agent
        "DaemonSet",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",  # <release>-gpuheal-agent-node (test_admission.py)
        "ValidatingAdmissionPolicyBinding",
    }


def test_text_log_without_privilege_and_options(tmp_path: Path) -> None:
    ds = daemonset(
        render(
            tmp_path,
            "agent.kernelLog=/var/log/kern.log",
            "agent.securityContext.privileged=false",
            "agent.stateHostPath=",
            "agent.conditionType=",
            "agent.nvml.mode=off",
            "agent.nvml.runtimeClassName=nvidia",
        )
    )
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["securityContext"]["privileged"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kernel-log"]["hostPath"] == {"path": "/var/log/kern.log", "type": "File"}
    assert "state" not in volumes
    assert "--no-condition" in c["args"]
    assert "--nvml=off" in c["args"]
    assert not any(a.startswith("--state-file") for a in c["args"])
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c["env"]}
    assert pod["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("agent.typo=1", "typo"),
        ("agent.nvml.mode=sometimes", "mode"),
        ("agent.kernelLog=dev/kmsg", "kernelLog"),
        ("agent.maxUnavailable=lots", "maxUnavailable"),
    ],
)
def test_schema_rejects(tmp_path: Path, value: str, error: str) -> None:
    result = helm(
        tmp_path, "template", "r", str(CHART), "--set", value, "--kube-version=v1.36.3", check=False
    )
    assert result.returncode != 0
    assert error in result.stderr


def signal_trust(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (vap,) = [
        d for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"].endswith("-signal-trust")
    ]  # fmt: skip
    (binding,) = [
        d for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d["metadata"]["name"].endswith("-signal-trust")
    ]  # fmt: skip
    return vap, binding


def test_admission_policy_reserves_the_agents_reporter_name_for_the_agent(tmp_path: Path) -> None:
    """docs/security.md: Events naming gpuheal-agent only from the agent's ServiceAccount on
    the Event's node, enforced (Deny) in every namespace; the operator trusts that name only.
    What the API server makes of it: test_signal_trust.py."""
    docs = render(tmp_path)
    vap, binding = signal_trust(docs)
    assert vap["metadata"]["name"] == binding["spec"]["policyName"] == "r-gpuheal-signal-trust"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace
    assert vap["spec"]["failurePolicy"] == "Fail"
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    assert {(g, op) for r in rules for g in r["apiGroups"] for op in r["operations"]} == {
        (g, op) for g in ("", "events.k8s.io") for op in ("CREATE", "UPDATE")
    }
    agent = AGENT_USER  # in its own namespace (test_helm_namespaces_network.py)
    reserved, own_node = vap["spec"]["validations"]
    assert '"gpuheal-agent" in variables.names' in reserved["expression"]
    assert f'request.userInfo.username == "{agent}" && variables.ownNode' in reserved["expression"]
    assert f'request.userInfo.username != "{agent}" || variables.ownNode' in own_node["expression"]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--trusted-reporters=gpuheal-agent" in args


def test_more_reporters_are_reserved_and_trusted_as_configured(tmp_path: Path) -> None:
    docs = render(
        tmp_path,
        "signalTrust.trustedReporters={gpuheal-agent,kernel-monitor}",
        "signalTrust.admissionPolicy.reporters[0].name=kernel-monitor",
        "signalTrust.admissionPolicy.reporters[0].serviceAccount=kube-system/npd",
        "signalTrust.admissionPolicy.reporters[1].name=dcgm-bridge",
        "signalTrust.admissionPolicy.reporters[1].serviceAccount=gpu-operator/dcgm",
        "signalTrust.admissionPolicy.reporters[1].sameNode=false",
    )
    vap, _ = signal_trust(docs)
    _, npd, dcgm, _ = vap["spec"]["validations"]
    assert (
        'request.userInfo.username == "system:serviceaccount:kube-system:npd" && '
        "variables.ownNode" in npd["expression"]
    )
    assert dcgm["expression"].endswith(
        '|| (request.userInfo.username == "system:serviceaccount:gpu-operator:dcgm")'
    )
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--trusted-reporters=gpuheal-agent,kernel-monitor" in args
    off = render(tmp_path, "signalTrust.admissionPolicy.enabled=false")
    assert not [
        d for d in off
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith("-signal-trust")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("signalTrust.admissionPolicy.reporters[0].name=gpuheal-agent", "name"),
        ("signalTrust.admissionPolicy.reporters[0].serviceAccount=npd", "reporters"),
        ("signalTrust.trustedReporters[0]=a b", "trustedReporters"),
        ("signalTrust.typo=1", "typo"),
    ],
)
def test_schema_rejects_a_bad_trust_setting(tmp_path: Path, value: str, error: str) -> None:
    result = helm(
        tmp_path, "template", "r", str(CHART), "--set", value, "--kube-version=v1.36.3", check=False
    )
    assert result.returncode != 0
    assert error in result.stderr
