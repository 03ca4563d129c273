"""The Helm chart, rendered and linted with the pinned helm, then installed on the sandbox's real
kube-apiserver: every object accepted, CRDs established, upgrade and uninstall (CRDs kept), and
the ServiceAccount's RBAC checked with a real TokenRequest token.

The render tests need only the built `helm`; the install tests need the sandbox.
"""

from __future__ import annotations

import base64
import hashlib
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

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuheal"
KUBE_VERSION = "v1.36.3"  # the sandbox's; our helm is built without its default version stamp
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
GPUHEAL_CRDS = (
    "noderemediations.gpuheal.io",
    "remediationpolicies.gpuheal.io",
    "reservepools.gpuheal.io",
    "faulthistories.gpuheal.io",  # issue 12: each node's memory of faults
)


# --- helpers ----------------------------------------------------------------------------------


class Helm:
    """The pinned helm binary with its own config/cache dirs (nothing from ~ leaks in)."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *args]
        if self.kubeconfig is not None:
            cmd.append(f"--kubeconfig={self.kubeconfig}")
        result = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, timeout=300, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
            )
        return result

    def template(
        self, *args: str, namespace: str = "gpuheal", tests: bool = False
    ) -> list[dict[str, Any]]:
        """The rendered objects; the `helm test` hooks only with ``tests`` (`helm install`
        never creates them)."""
        skip = () if tests else ("--skip-tests",)
        out = self(
            "template",
            "r",
            str(CHART),
            "-n",
            namespace,
            f"--kube-version={KUBE_VERSION}",
            *skip,
            *args,
        )
        return [d for d in yaml.safe_load_all(out.stdout) if d]


def _objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in _objects(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    binary = cluster_bin_dir() / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make bins`")
    return binary


@pytest.fixture(scope="module")
def helm(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_bin, tmp_path_factory.mktemp("helm-home"))


# --- render: lint, template, schema --------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_lint_passes_for_every_ci_values_file(helm: Helm, values: Path) -> None:
    out = helm("lint", str(CHART), "--strict", "-f", str(values), f"--kube-version={KUBE_VERSION}")
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_every_pod_is_hardened(helm: Helm, values: Path) -> None:
    docs = helm.template("-f", str(values))
    deployments = _objects(docs, "Deployment")
    assert deployments
    for dep in deployments:
        component = dep["metadata"]["labels"]["app.kubernetes.io/component"]
        assert dep["spec"]["replicas"] == 1
        if component == "operator":
            # Behind the Lease: the new copy starts first and takes over when the old exits.
            assert dep["spec"]["strategy"] == {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            }
        else:
            assert dep["spec"]["strategy"] == {"type": "Recreate"}
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        container = _container(dep)
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"]
        assert container["resources"]["limits"]
        probe = container["livenessProbe"]
        if component == "operator":  # kopf's /healthz, sparing a copy that waits for the Lease
            assert "/healthz" in probe["exec"]["command"][-1]
            # /readyz: not ready with the reason on a misconfiguration (a standby is ready)
            assert "127.0.0.1:8081/readyz" in container["readinessProbe"]["exec"]["command"][-1]
        else:
            assert probe["httpGet"]["path"] == "/healthz"
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_defaults_render_the_operator_as_the_flag_contract_says(helm: Helm) -> None:
    docs = helm.template(namespace="gpu-system")
    dep = _one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    args = _container(dep)["args"]
    assert args[0] == "run"
    assert "--namespace=gpu-system" in args
    assert "--metrics-port=9090" in args
    assert "--health-port=8080" in args
    assert "--ready-port=8081" in args
    assert "--sources=conditions,events" in args
    assert "--trusted-reporters=gpuheal-agent" in args  # docs/security.md
    assert "--log-format=json" in args
    assert "--lease-duration=15" in args
    assert dep["spec"]["replicas"] == 1
    assert not any(a.startswith(("--peering", "--standalone")) for a in args)  # not gpuheal's
    assert not any(a.startswith("--bridge-") for a in args), "no bridge configured by default"
    ports = {p["name"]: p["containerPort"] for p in _container(dep)["ports"]}
    assert ports == {"metrics": 9090, "health": 8080, "ready": 8081}
    # Stays up while nodes are cordoned, and keeps off the GPU nodes it may drain.
    assert {
        "key": "node.kubernetes.io/unschedulable",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}
    ]
    assert pod["serviceAccountName"] == "r-gpuheal"
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",  # gpuheal-node-jobs: the reset/reboot/check Job templates (nodeJobs)
        "CustomResourceDefinition",
        "DaemonSet",  # the node agent (on by default; its own checks: test_helm_agent.py)
        "Deployment",
        "Namespace",  # the node Jobs' and the agent's own (test_helm_namespaces_network.py)
        "NetworkPolicy",  # ingress to the operator's metrics port (test_helm_namespaces_network.py)
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        # the agent's reporter name reserved (test_helm_agent.py); node Jobs, the agent's and
        # the operator's Node writes (test_admission.py)
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert sorted(n["metadata"]["name"] for n in _objects(docs, "Namespace")) == [
        "r-agent",
        "r-node-jobs",
    ]
    for absent in ("ServiceMonitor", "PrometheusRule", "Secret"):
        assert not _objects(docs, absent), f"{absent} must be off by default"
    # The only ConfigMap by default is the node Job templates (the dashboard's is off).
    assert [c["metadata"]["name"] for c in _objects(docs, "ConfigMap")] == ["gpuheal-node-jobs"]
    # One replica: no PodDisruptionBudget (it would block draining the operator's node).
    assert not _objects(docs, "PodDisruptionBudget")
    # No policy unless asked: a second priority-0 policy on the same nodes would overlap.
    assert not _objects(docs, "RemediationPolicy")
    # Pod deletion only when asked (rbac.forceDrain).
    assert not [
        r for _, _, r in _rules(docs) if "pods" in r["resources"] and "delete" in r["verbs"]
    ]


def test_in_cluster_bridge_wires_the_operator_to_its_service(helm: Helm) -> None:
    docs = helm.template("-f", str(CHART / "ci" / "bridge-values.yaml"))
    operator = _one(docs, "Deployment", "r-gpuheal")
    bridge = _one(docs, "Deployment", "slurm-bridge")
    service = _one(docs, "Service", "slurm-bridge")
    secret = _one(docs, "Secret", "bridge-token")
    args = _container(operator)["args"]
    assert "--bridge-url=http://r-gpuheal-slurm-bridge.gpuheal.svc:8787" in args
    assert "--bridge-token-file=/var/run/secrets/gpuheal/bridge/token" in args
    token_volumes = [
        v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "bridge-token"
    ]
    assert token_volumes[0]["secret"]["secretName"] == secret["metadata"]["name"]
    # The bridge never talks to the Kubernetes API.
    assert bridge["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert service["spec"]["selector"] == bridge["spec"]["selector"]["matchLabels"]
    bridge_args = _container(bridge)["args"]
    for flag in (
        "--listen=0.0.0.0:8787",
        "--insecure-http=true",  # said in the values (no tlsSecret): never by default
        "--backend=rest",
        "--token-file=/var/run/secrets/gpuheal/bridge/token",
        "--state-dir=/var/lib/gpuheal-bridge",
        "--rest-url=http://slurmrestd.slurm.svc:6820",
        "--rest-token-file=/var/run/secrets/gpuheal/slurmrestd/token",
        "--node-map-template={short}",
    ):
        assert flag in bridge_args
    bridge_volumes = {v["name"]: v for v in bridge["spec"]["template"]["spec"]["volumes"]}
    assert bridge_volumes["token"]["secret"]["secretName"] == secret["metadata"]["name"]
    pvc = _one(docs, "PersistentVolumeClaim")
    assert bridge_volumes["state"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


def test_the_bridge_is_told_the_reserve_pools_reasons(helm: Helm) -> None:
    """--reserve-reasons: a resume with a reserve_reason lifts only these drains (issue 23),
    so the chart passes slurmBridge.reserveReasons and its own pool's reason."""

    def reasons(*values: str) -> list[str]:
        docs = helm.template("-f", str(CHART / "ci" / "bridge-values.yaml"), *values)
        args = _container(_one(docs, "Deployment", "slurm-bridge"))["args"]
        return [a for a in args if a.startswith("--reserve-reasons")]

    assert reasons() == ["--reserve-reasons=reserve pool"]
    assert reasons(
        "--set-json", 'slurmBridge.reserveReasons=["reserve pool","spares: rack 7"]',
        "--set", "defaultReservePool.enabled=true",
        "--set", "defaultReservePool.spec.nodeSelector.pool=spares",
        "--set", "defaultReservePool.spec.promotion.slurm.reserveReason=pool b",
    ) == ["--reserve-reasons=reserve pool|spares: rack 7|pool b"]  # fmt: skip
    refused = helm(
        "template", "r", str(CHART), "-f", str(CHART / "ci" / "bridge-values.yaml"),
        "--set", "slurmBridge.reserveReasons[0]=a|b", check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "/slurmBridge/reserveReasons/0" in refused.stderr


DIGEST = "sha256:" + "ab" * 32


def _images(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Every container image the chart runs, by 'kind/name/container' (the node Jobs' from
    their ConfigMap)."""
    out: dict[str, str] = {}

    def pod(where: str, spec: dict[str, Any]) -> None:
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            out[f"{where}/{c['name']}"] = c["image"]

    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("Deployment", "DaemonSet"):
            pod(f"{kind}/{name}", d["spec"]["template"]["spec"])
        elif kind == "Pod":
            pod(f"Pod/{name}", d["spec"])
        elif kind == "ConfigMap" and name == "gpuheal-node-jobs":
            for key in ("gpu-reset", "node-reboot", "gpu-check"):
                pod(f"Job/{key}", yaml.safe_load(d["data"][key])["template"]["spec"])
    return out


def test_every_image_by_digest_and_requireDigests_refuses_a_tag(helm: Helm) -> None:
    """operator.image, agent.image, slurmBridge.image and the node Jobs' images are pinned by
    their `digest`; with requireDigests a tag anywhere fails the render, naming the value."""
    bridge = ("-f", str(CHART / "ci" / "bridge-values.yaml"))
    pinned = [
        "--set", "requireDigests=true",
        "--set", f"operator.image.digest={DIGEST}",
        "--set", f"slurmBridge.image.digest={DIGEST}",
        "--set", f"nodeJobs.image.digest={DIGEST}",
        "--set", f"nodeJobs.dcgmImage.digest={DIGEST}",
    ]  # fmt: skip
    images = _images(helm.template(*bridge, *pinned, tests=True))
    assert {"DaemonSet/r-gpuheal-agent/agent", "Job/gpu-reset/operands"} <= set(images)
    assert any("slurm-bridge" in k for k in images), images
    assert any(k.startswith("Pod/") for k in images), images  # the helm test pods
    assert [k for k, v in images.items() if not v.endswith(f"@{DIGEST}")] == [], images
    # The agent's own digest with no repository of its own: the operator's image, pinned.
    agent = _images(helm.template("--set", f"agent.image.digest={DIGEST}"))
    assert agent["DaemonSet/r-gpuheal-agent/agent"] == f"gpuheal@{DIGEST}"
    # Each unpinned image refuses the render, naming what to set.
    for i in range(1, len(pinned), 2):
        if pinned[i] == "requireDigests=true":
            continue
        left = pinned[: i - 1] + pinned[i + 1 :]
        value = pinned[i].split("=")[0]
        out = helm("template", "r", str(CHART), *bridge, *left, check=False)
        assert out.returncode != 0, value
        assert "is not pinned by digest" in out.stderr, out.stderr
        assert f"set {value}" in out.stderr, (value, out.stderr)


def _rollouts(docs: list[dict[str, Any]]) -> set[str]:
    """The bridge token's rollout value on its Secret and on the operator's and bridge's pods."""
    secret = _one(docs, "Secret", "bridge-token")["metadata"]["annotations"]
    pods = [_one(docs, "Deployment", n)["spec"]["template"]["metadata"]["annotations"]
            for n in ("r-gpuheal", "slurm-bridge")]  # fmt: skip
    return {secret["gpuheal.io/token-rollout"]} | {
        a["gpuheal.io/bridge-token-rollout"] for a in pods
    }


def test_the_pods_roll_with_the_bridge_token_without_showing_a_hash_of_it(helm: Helm) -> None:
    """A pod's annotations are read by many more than its Secrets (the `view` role): the value
    that rolls the pods when bridge.token.value changes must not be a function of the token
    (a hash of a guessable token is the token)."""
    token = yaml.safe_load((CHART / "ci" / "bridge-values.yaml").read_text())["bridge"]["token"]
    first = helm.template("-f", str(CHART / "ci" / "bridge-values.yaml"))
    (rollout,) = _rollouts(first)  # one value on the Secret and both pods
    assert len(rollout) >= 20
    text = json.dumps(first)
    for digest in (hashlib.sha256, hashlib.sha1, hashlib.md5):
        hexed = digest(token["value"].encode()).hexdigest()
        assert hexed[:8] not in text, f"a {digest.__name__} prefix of the token is in the output"
    # Not a function of the token: with no cluster to look at, each render draws a new one
    # (an upgrade reuses the Secret's: test_install_upgrade_uninstall_on_a_real_apiserver).
    (again,) = _rollouts(helm.template("-f", str(CHART / "ci" / "bridge-values.yaml")))
    assert again != rollout


def test_external_bridge_uses_existing_secret_and_ca(helm: Helm) -> None:
    docs = helm.template("-f", str(CHART / "ci" / "external-bridge-values.yaml"))
    assert not _objects(docs, "Secret"), "existing Secret is referenced, not created"
    operator = _one(docs, "Deployment")
    args = _container(operator)["args"]
    assert "--bridge-url=https://slurm-bridge.example.internal:8443" in args
    assert "--bridge-ca-file=/var/run/secrets/gpuheal/bridge-ca/ca.crt" in args
    assert "--log-format=plain" in args
    volumes = {v["name"]: v for v in operator["spec"]["template"]["spec"]["volumes"]}
    assert volumes["bridge-token"]["secret"]["secretName"] == "gpuheal-bridge-token"
    assert volumes["bridge-ca"]["configMap"]["name"] == "gpuheal-bridge-ca"
    # Job hooks: a Role in that namespace only; no forced drains: no pod deletion at all.
    hooks = _one(docs, "Role", "-job-hooks")
    assert hooks["metadata"]["namespace"] == "gpu-maintenance"
    assert {r for rule in hooks["rules"] for r in rule["resources"]} == {"jobs"}
    assert not [
        rule
        for _, _, rule in _rules(docs)
        if "pods" in rule["resources"] and "delete" in rule["verbs"]
    ]


def test_notification_webhooks_are_read_from_secrets_never_from_the_pod_spec(helm: Helm) -> None:
    values = CHART / "ci" / "notifications-values.yaml"
    docs = helm.template("-f", str(values))
    url = yaml.safe_load(values.read_text())["notifications"]["webhooks"][0]["url"]
    made = _one(docs, "Secret", "-notify")
    assert made["metadata"]["name"] == "r-gpuheal-notify"
    assert made["data"] == {"webhook-0": base64.b64encode(url.encode()).decode()}
    operator = _one(docs, "Deployment")
    assert url not in json.dumps(operator)
    args = _container(operator)["args"]
    webhooks = "slack:secret:r-gpuheal-notify/webhook-0,generic:secret:ops-pager/webhook"
    assert f"--notify-webhooks={webhooks}" in args
    assert "--notify-events=Opened,Failed" in args
    (rule,) = [r for kind, n, r in _rules(docs) if "secrets" in r["resources"]]
    assert rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["ops-pager", "r-gpuheal-notify", "team-a-hooks"],
        "verbs": ["get"],
    }
    # Without webhooks or policy Secrets: no Secret, no flag, no rule on Secrets at all.
    plain = helm.template()
    assert not _objects(plain, "Secret")
    assert not any(a.startswith("--notify") for a in _container(_one(plain, "Deployment"))["args"])
    assert not [r for _, _, r in _rules(plain) if "secrets" in r["resources"]]
    both = '{"url": "https://x.example/h", "existingSecret": "s"}'
    result = helm("template", "r", str(CHART), f"--kube-version={KUBE_VERSION}",
                  "--set-json", f"notifications.webhooks=[{both}]", check=False)  # fmt: skip
    assert result.returncode != 0
    assert "notifications/webhooks/0" in result.stderr, result.stderr


def test_invalid_values_are_rejected_by_the_schema_with_a_clear_message(helm: Helm) -> None:
    bad = CHART / "ci" / "invalid" / "typo-values.yaml"
    for cmd in (("lint", str(CHART)), ("template", "r", str(CHART))):
        result = helm(*cmd, "-f", str(bad), f"--kube-version={KUBE_VERSION}", check=False)
        assert result.returncode != 0
        out = result.stdout + result.stderr
        assert "values don't meet the specifications of the schema" in out
        assert "additional properties 'logFormt' not allowed" in out
        assert "/slurmBridge/backend" in out
        assert "'cli', 'rest'" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "operator.replicas=2", "--set", "operator.leaseDuration=0"),
            "operator.replicas > 1 needs the Lease",
        ),
        (("--set", "operator.replicas=0"), "minimum: got 0, want 1"),
        (
            ("--set", "defaultPolicy.enabled=true", "--set", "defaultPolicy.catalogue=false"),
            "defaultPolicy.enabled=true without a spec",
        ),
        (
            ("--set", "defaultPolicy.enabled=true", "--set-json", 'defaultPolicy.spec={"x":1}'),
            "defaultPolicy.spec.nodeSelector is required",
        ),
        (
            (
                "--set",
                "defaultPolicy.enabled=true",
                "--set-json",
                'defaultPolicy.spec={"nodeSelector":{},"rules":[{"name":"a","signals":{"xids":'
                '[79]},"ladder":[{"name":"r","steps":[{"action":"cordon"}]}]}],"safety":{}}',
            ),
            "set exactly one of maxUnhealthy or minHealthy",
        ),
        (
            (
                "--set",
                "defaultPolicy.enabled=true",
                "--set-json",
                'defaultPolicy.spec={"nodeSelector":{},"rules":[{"name":"a","signals":{"xids":'
                '[79]}}],"safety":{"maxUnhealthy":1}}',
            ),
            "defaultPolicy.spec.rules[0] needs name, signals and a non-empty ladder",
        ),
        (
            ("--set", "defaultReservePool.enabled=true"),
            "needs defaultReservePool.spec.nodeSelector",
        ),
        (("--set", "bridge.url=https://b:8443"), "set bridge.token.existingSecret"),
        (("--set", "slurmBridge.enabled=true"), "set bridge.token.existingSecret"),
        (
            ("--set", "slurmBridge.enabled=true", "--set", "bridge.token.value=0123456789abcdef"),
            "the bridge refuses plain HTTP from clients not on loopback",
        ),
        (
            (
                "--set",
                "slurmBridge.enabled=true",
                "--set",
                "bridge.token.value=0123456789abcdef",
                "--set",
                "slurmBridge.insecureHttp=true",
            ),
            "slurmBridge.rest.url is required",
        ),
        (("--set", "bridge.token.value=short"), "does not match"),
        (
            (
                "--set",
                "operator.sources.conditions=false",
                "--set",
                "operator.sources.events=false",
            ),
            "enable at least one of conditions, events, dcgm",
        ),
        (("--set", "monitoring.prometheusRule.incidentStuckAfter=2 hours"), "does not match"),
        (("--set", "operator.image.digest=latest"), "does not match"),
    ],
)
def test_broken_combinations_fail_at_render_time(
    helm: Helm, args: tuple[str, ...], message: str
) -> None:
    result = helm("template", "r", str(CHART), f"--kube-version={KUBE_VERSION}", *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_chart_crds_are_the_repository_crds_with_a_keep_policy(helm: Helm) -> None:
    docs = helm.template()
    rendered = {d["metadata"]["name"]: d for d in _objects(docs, "CustomResourceDefinition")}
    assert set(rendered) == set(GPUHEAL_CRDS)
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        source = yaml.safe_load(path.read_text())
        crd = rendered[source["metadata"]["name"]]
        assert crd["spec"] == source["spec"], (
            f"{path.name}: chart copy drifted from crds/; run `cp crds/*.yaml {CHART}/crd-sources/`"
        )
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert len(list((ROOT / "crds").glob("*.yaml"))) == len(GPUHEAL_CRDS)

    no_keep = helm.template("--set", "crds.keep=false")
    for crd in _objects(no_keep, "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})
    assert not _objects(helm.template("--set", "crds.enabled=false"), "CustomResourceDefinition")


def _rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (d["kind"], d["metadata"]["name"], rule)
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
        for rule in d["rules"]
    ]


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_rbac_is_least_privilege(helm: Helm, values: Path) -> None:
    docs = helm.template("-f", str(values))
    # The gpu-reset Job's own: its node's labels and the pods on it (test below).
    reset_sa = "r-gpuheal-gpu-reset"
    # The operator's RBAC; the node agent's (r-gpuheal-agent*) is checked in test_helm_agent.py.
    rules = [r for r in _rules(docs) if not r[1].startswith(("r-gpuheal-agent", reset_sa))]
    assert {name for _, name, _ in rules} <= {
        "r-gpuheal-kopf",
        "r-gpuheal-operator",
        "r-gpuheal-operator-events",  # events create in `default` only (checked below)
        "r-gpuheal-operator-event-reader",  # events list/watch in --event-namespace only
        "r-gpuheal-job-hooks",
        "r-gpuheal-node-jobs",  # Jobs + the one ConfigMap gpuheal-node-jobs, node-jobs namespace
    }
    for kind, name, rule in rules:
        if name == "r-gpuheal-operator-events":
            assert (kind, rule["resources"], rule["verbs"]) == ("Role", ["events"], ["create"])
    values_doc = yaml.safe_load(values.read_text()) or {}
    default_force = yaml.safe_load((CHART / "values.yaml").read_text())["rbac"]["forceDrain"]
    force = values_doc.get("rbac", {}).get("forceDrain", default_force)
    for kind, name, rule in rules:
        where = f"{kind}/{name} {rule}"
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {where}"
        assert "serviceaccounts/token" not in rule["resources"], where
        if "secrets" in rule["resources"]:  # notification webhook URLs, by name, read only
            assert (kind, name) == ("Role", "r-gpuheal-operator"), where
            assert rule["resourceNames"], where
            assert rule["verbs"] == ["get"], where
        if "configmaps" in rule["resources"]:  # the node Job templates, by name, read only
            assert (kind, name) == ("Role", "r-gpuheal-node-jobs"), where
            assert (rule["resourceNames"], rule["verbs"]) == (["gpuheal-node-jobs"], ["get"])
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
        if "nodes" in rule["resources"]:
            assert not {"delete", "create", "update"} & set(rule["verbs"]), where
        if "pods" in rule["resources"]:
            assert not {"create", "update", "patch"} & set(rule["verbs"]), where
            assert ("delete" in rule["verbs"]) <= force, f"pod deletion without forceDrain: {where}"
        if kind == "ClusterRole":
            assert "jobs" not in rule["resources"], f"Jobs only in hook namespaces: {where}"
    cluster_writes = {
        (res, verb)
        for kind, _, rule in rules
        if kind == "ClusterRole"
        for res in rule["resources"]
        for verb in rule["verbs"]
        if verb in ("create", "update", "patch", "delete")
    }
    assert {r for r, _ in cluster_writes} <= {
        "nodes",
        "pods",  # delete, with rbac.forceDrain only (checked above)
        "pods/eviction",
        "remediationpolicies",
        "reservepools",
        "noderemediations",
        "remediationpolicies/status",
        "reservepools/status",
        "noderemediations/status",
        "faulthistories",  # written by gpuheal only (issue 12)
        "faulthistories/status",
        # quarantineDevice: one GPU out; no more than the node cordon it already has (README)
        "devicetaintrules",
    }
    bindings = _objects(docs, "ClusterRoleBinding") + _objects(docs, "RoleBinding")
    mine = ("r-gpuheal-agent", reset_sa)
    for binding in (b for b in bindings if not b["metadata"]["name"].startswith(mine)):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "r-gpuheal", "namespace": "gpuheal"}
        ]


def test_gpu_reset_job_follows_nvidias_procedure(helm: Helm) -> None:
    """The gpu-reset template: a native sidecar takes the GPU operator's DaemonSets (and the
    NVML agent) off the node and puts them back; the privileged reset container runs
    files/gpu-reset.sh (its steps: tests/unit/test_node_job_scripts.py) with the scripts
    from the same ConfigMap; its ServiceAccount may read and label nodes and list pods, and
    nothing else. The agent keeps off a node being reset."""
    docs = helm.template(namespace="gpu-system")
    cm = _one(docs, "ConfigMap", "gpuheal-node-jobs")
    assert cm["data"]["gpu-reset.sh"] == (CHART / "files" / "gpu-reset.sh").read_text()
    assert cm["data"]["gpu_operands.py"] == (CHART / "files" / "gpu_operands.py").read_text()
    job = yaml.safe_load(cm["data"]["gpu-reset"])
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "r-gpuheal-gpu-reset"
    assert pod["hostPID"] is True  # the holders of /dev/nvidia* are the host's processes
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # beside the reset, stopped after it
    assert sidecar["command"] == ["python", "/gpuheal/gpu_operands.py", "hold"]
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert (
        env["GPU_OPERANDS"] == "device-plugin,dcgm-exporter,dcgm,gpu-feature-discovery,mig-manager"
    )
    pods = env["GPU_OPERAND_PODS"].split(";")
    assert "app=nvidia-device-plugin-daemonset" in pods
    assert "app.kubernetes.io/instance=r,app.kubernetes.io/component=agent" in pods
    (reset,) = pod["containers"]
    assert reset["securityContext"] == {"privileged": True}
    assert reset["command"] == ["/bin/bash", "/gpuheal/gpu-reset.sh"]
    assert {"name": "GPU_RESET_SCOPE", "value": "each"} in reset["env"]
    for container in (sidecar, reset):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts == {"scripts": "/gpuheal", "state": "/run/gpuheal"}
    (scripts,) = [v for v in pod["volumes"] if v["name"] == "scripts"]
    assert scripts["configMap"]["name"] == "gpuheal-node-jobs"
    role = _one(docs, "ClusterRole", "-gpu-reset")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    binding = _one(docs, "ClusterRoleBinding", "-gpu-reset")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "r-gpuheal-gpu-reset", "namespace": "r-node-jobs"}
    ]
    agent = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    terms = agent["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "gpuheal.io/gpu-reset", "operator": "DoesNotExist"}
    ]
    # Without NVML the agent holds no GPU: no agent pods to wait for, no affinity.
    off = helm.template("--set", "agent.nvml.mode=off", "--set", "nodeJobs.gpuReset.scope=all")
    job = yaml.safe_load(_one(off, "ConfigMap", "gpuheal-node-jobs")["data"]["gpu-reset"])
    env = {e["name"]: e["value"] for e in job["template"]["spec"]["initContainers"][0]["env"]}
    assert "component=agent" not in env["GPU_OPERAND_PODS"]
    reset_env = job["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GPU_RESET_SCOPE", "value": "all"} in reset_env
    assert "affinity" not in _one(off, "DaemonSet")["spec"]["template"]["spec"]
    bad = helm("template", "r", str(CHART), "--set", "nodeJobs.gpuReset.operands={driver}",
               check=False)  # fmt: skip
    assert bad.returncode != 0
    assert "gpuReset" in bad.stderr


# The operator's metric names, from its source when present (operator/gpuheal/metrics.py);
# the alerts and the dashboard may only use these.
_FALLBACK_METRICS = {
    "gpuheal_active_incidents",
    "gpuheal_breaker_open",
    "gpuheal_reserve_pool_nodes",
    "gpuheal_steps_total",
    "gpuheal_source_up",
}


def _operator_metrics() -> set[str]:
    source = ROOT / "operator" / "gpuheal" / "metrics.py"
    if not source.exists():
        return _FALLBACK_METRICS
    names = set(re.findall(r'"(gpuheal_[a-z_]+)"', source.read_text()))
    histograms = {n for n in names if n.endswith("_seconds")}
    return names | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}


# Metrics the per-incident, pool and bridge alerts need: the operator must export them.
ALERT_METRICS = {
    "gpuheal_reserve_pool_min_available",
    "gpuheal_incident_blocked",
    "gpuheal_incident_last_progress_timestamp_seconds",
    "gpuheal_bridge_up",
}


def _pretty(expr: str) -> str:
    """The expression as promql-parser prints it (one spelling for spaces and line breaks)."""
    import promql_parser

    return " ".join(str(promql_parser.parse(expr).prettify()).split())


def _promql(expr: str) -> set[str]:
    """Parse a PromQL expression (raises on a syntax error); return the gpuheal_ metrics in it."""
    import promql_parser

    promql_parser.parse(expr)
    return set(re.findall(r"\bgpuheal_[a-z_]+", expr))


def test_monitoring_objects_are_well_formed(helm: Helm) -> None:
    docs = helm.template("-f", str(CHART / "ci" / "monitoring-values.yaml"))
    monitor = _one(docs, "ServiceMonitor")
    service = _one(docs, "Service", "-metrics")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert all(
        service["metadata"]["labels"][k] == v
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )

    rule = _one(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "GpuhealOperatorDown",
        "GpuhealReservePoolLow",
        "GpuhealCircuitBreakerOpen",
        "GpuhealIncidentStuck",
        "GpuhealApprovalPending",
        "GpuhealIncidentFailed",
        "GpuhealBridgeUnavailable",
        "GpuhealSourceBlind",
    }
    used: set[str] = set()
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["labels"]["team"] == "gpu-infra"
        assert alert["annotations"]["summary"]
        assert alert["annotations"]["description"]
        assert alert["annotations"]["runbook_url"].endswith("#" + name.lower())
        used |= _promql(alert["expr"])
    assert "> 5400" in alerts["GpuhealIncidentStuck"]["expr"]  # 90m, from the values file
    assert _operator_metrics() >= ALERT_METRICS, ALERT_METRICS - _operator_metrics()
    assert used <= _operator_metrics(), used - _operator_metrics()

    dashboard = json.loads(_one(docs, "ConfigMap", "-dashboard")["data"]["gpuheal.json"])
    assert dashboard["uid"] == "gpuheal-overview"
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used_in_dashboard = {m for e in exprs for m in _promql(e)}
    assert used_in_dashboard <= _operator_metrics(), used_in_dashboard - _operator_metrics()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])

    args = _container(_one(docs, "Deployment"))["args"]
    assert "--sources=conditions,events,dcgm" in args
    assert "--dcgm-selector=app=nvidia-dcgm-exporter" in args


def _alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rule = _one(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_alerts_are_per_incident_and_per_pool(helm: Helm) -> None:
    """The issue's four: bridge unavailable, incident failed, approval pending per incident,
    each pool against its own minAvailable; stuck per incident, never for one waiting for
    approval."""
    alerts = _alerts(helm.template("--set", "monitoring.prometheusRule.enabled=true"))
    pool = _pretty(alerts["GpuhealReservePoolLow"]["expr"])
    assert "gpuheal_reserve_pool_min_available" in pool
    assert "< on (pool)" in pool
    assert not re.search(r"<\s*[0-9]", pool), "a fixed threshold, not the pool's own minAvailable"

    stuck = _pretty(alerts["GpuhealIncidentStuck"]["expr"])
    assert "by (incident, node)" in stuck
    assert "> 7200" in stuck  # incidentStuckAfter: 2h
    approval_pending = 'gpuheal_incident_blocked{reason="ApprovalPending"}'
    assert f"unless on (incident) (max by (incident) ({approval_pending}) == 1)" in stuck
    assert "gpuheal_active_incidents" not in stuck  # cluster-wide: what the issue asked away

    approval = _pretty(alerts["GpuhealApprovalPending"]["expr"])
    assert approval == (
        'max by (incident, node) (gpuheal_incident_blocked{reason="ApprovalPending"}) == 1'
    )
    assert alerts["GpuhealApprovalPending"]["for"] == "15m"

    failed = _pretty(alerts["GpuhealIncidentFailed"]["expr"])
    assert 'gpuheal_incidents_completed_total{outcome="failed"}' in failed
    assert "offset 1h" in failed  # a failure that creates the series is seen too

    bridge = _pretty(alerts["GpuhealBridgeUnavailable"]["expr"])
    assert "gpuheal_bridge_up" in bridge
    assert 'reason="BridgeUnavailable"' in bridge
    assert alerts["GpuhealBridgeUnavailable"]["for"] == "5m"
    for alert in alerts.values():
        _promql(alert["expr"])


def test_default_policy_is_the_catalogue_in_dry_run(helm: Helm) -> None:
    """`--set defaultPolicy.enabled=true` creates examples/default-policy.yaml in dry run; a spec
    of your own replaces it whole; dryRun applies to either."""
    example = yaml.safe_load((ROOT / "examples" / "default-policy.yaml").read_text())
    assert example["spec"]["safety"]["dryRun"] is True  # docs/install.md: start in dry run
    assert (CHART / "files" / "default-policy.yaml").read_text() == (
        ROOT / "examples" / "default-policy.yaml"
    ).read_text(), "chart copy drifted: cp examples/default-policy.yaml deploy/helm/gpuheal/files/"

    # Rendered once the CRDs are served (helm asks the cluster; `--api-versions` here):
    # a release object, patched in place by upgrades and rollbacks so that its status (the
    # breaker) stays, never deleted by Helm. Not a hook: a hook is re-created every upgrade.
    served = (
        "--api-versions", "gpuheal.io/v1alpha1/RemediationPolicy",
        "--api-versions", "gpuheal.io/v1alpha1/ReservePool",
    )  # fmt: skip
    pool = (
        "--set", "defaultReservePool.enabled=true",
        "--set-json", 'defaultReservePool.spec={"nodeSelector":{"matchLabels":{"a":"b"}}}',
    )  # fmt: skip
    docs = helm.template("--set", "defaultPolicy.enabled=true", *pool, *served)
    policy = _one(docs, "RemediationPolicy")
    assert policy["metadata"]["name"] == "default"
    assert policy["spec"] == example["spec"]
    for kind in ("RemediationPolicy", "ReservePool"):
        meta = _one(docs, kind)["metadata"]
        assert not any(k.startswith("helm.sh/hook") for k in meta["annotations"]), meta
        assert meta["annotations"]["helm.sh/resource-policy"] == "keep"
    # Not served yet (the install that creates the CRDs): a post-install hook, never deleted
    # by Helm, owned by the release so that the next upgrade takes it over.
    unserved = helm.template("--set", "defaultPolicy.enabled=true", *pool)
    for kind in ("RemediationPolicy", "ReservePool"):
        meta = _one(unserved, kind)["metadata"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert meta["annotations"] == {
            "helm.sh/hook": "post-install",
            "helm.sh/resource-policy": "keep",
            "meta.helm.sh/release-name": "r",
            "meta.helm.sh/release-namespace": "gpuheal",
        }
    assert _one(unserved, "ConfigMap", "-default-objects")["data"] == {
        "RemediationPolicy": "hook/default",
        "ReservePool": "hook/spares",
    }
    # ...unless the CRDs are someone else's (crds.enabled=false): NOTES.txt says to install them.
    theirs = helm.template("--set", "defaultPolicy.enabled=true", "--set", "crds.enabled=false")
    assert not _objects(theirs, "RemediationPolicy")

    live = helm.template(
        "--set", "defaultPolicy.enabled=true", "--set", "defaultPolicy.dryRun=false", *served
    )
    assert _one(live, "RemediationPolicy")["spec"]["safety"]["dryRun"] is False

    own = {
        "nodeSelector": {"matchLabels": {"pool": "a100"}},
        "rules": [
            {
                "name": "x",
                "signals": {"xids": [79]},
                "ladder": [{"name": "r", "steps": [{"action": "cordon"}]}],
            }
        ],
        "safety": {"maxUnhealthy": 1},
    }
    mine = helm.template(
        "--set", "defaultPolicy.enabled=true",
        "--set-json", f"defaultPolicy.spec={json.dumps(own)}", *served,
    )  # fmt: skip
    assert _one(mine, "RemediationPolicy")["spec"] == {
        **own,
        "safety": {"maxUnhealthy": 1, "dryRun": True},
    }


def test_two_replicas_behind_the_lease(helm: Helm) -> None:
    docs = helm.template("--set", "operator.replicas=2")
    dep = _one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["minReadySeconds"] == 10
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    (spread,) = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"] == dep["spec"]["selector"]
    assert "--lease-duration=15" in _container(dep)["args"]
    no_pdb = helm.template(
        "--set", "operator.replicas=2", "--set", "operator.podDisruptionBudget.enabled=false"
    )
    assert not _objects(no_pdb, "PodDisruptionBudget")


def _test_hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_helm_test_pods_check_crds_operator_and_bridge(helm: Helm, values: Path) -> None:
    docs = helm.template("-f", str(values), tests=True)
    hooks = _test_hooks(docs)
    pods = {p["metadata"]["name"]: p for p in _objects(hooks, "Pod")}
    operator = _one(docs, "Deployment", "r-gpuheal")
    bridge = any(a.startswith("--bridge-url=") for a in _container(operator)["args"])
    expected = {"r-gpuheal-test-crds", "r-gpuheal-test-operator"} | (
        {"r-gpuheal-test-bridge"} if bridge else set()
    )
    assert set(pods) == expected
    script = (CHART / "files" / "helm_test.py").read_text()
    for name, pod in pods.items():
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never"
        assert spec["serviceAccountName"] == "r-gpuheal-test"
        assert spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["command"][:3] == ["python", "-c", script]
        assert container["command"][3] == name.rsplit("-", 1)[1]
        assert container["image"] == _container(_one(docs, "Deployment", "r-gpuheal"))["image"]
    if bridge:
        pod = pods["r-gpuheal-test-bridge"]
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        operator_args = _container(_one(docs, "Deployment", "r-gpuheal"))["args"]
        assert f"--bridge-url={env['GPUHEAL_TEST_BRIDGE_URL']}" in operator_args
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        op_volumes = {
            v["name"]: v
            for v in _one(docs, "Deployment", "r-gpuheal")["spec"]["template"]["spec"]["volumes"]
        }
        assert volumes["bridge-token"] == op_volumes["bridge-token"]
        assert pod["spec"]["automountServiceAccountToken"] is False
    # Their RBAC: read-only, named objects, gone after a passing run.
    rules = _rules(hooks)
    assert {name for _, name, _ in rules} == {"r-gpuheal-test"}
    for _, _, rule in rules:
        assert set(rule["verbs"]) <= {"get", "list"}, rule
        if rule["resources"] != ["pods"]:
            assert rule.get("resourceNames"), f"not limited to named objects: {rule}"
    # Passed pods too: Helm deletes no hook on uninstall (a failed check's pod stays for a look)
    for obj in hooks:
        assert "hook-succeeded" in obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert not _test_hooks(
        helm.template("-f", str(values), "--set", "tests.enabled=false", tests=True)
    )


# --- install on the sandbox ------------------------------------------------------------------


@pytest.fixture
def sandbox_helm(helm_bin: Path, sandbox: Sandbox, tmp_path: Path) -> Helm:
    return Helm(helm_bin, tmp_path / "helm-home", kubeconfig=sandbox.kubeconfig)


@pytest.fixture
def system_node(sandbox: Sandbox) -> Iterator[str]:
    """A Ready non-GPU node (kwok), where the operator's default affinity lets it run."""
    from gpuheal_dev.sandbox.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready

    core = sandbox.core_v1()
    name = f"t-system-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(
        core, [name], gpus=0, labels={"nvidia.com/gpu.present": "false", "gpuheal.io/test": name}
    )
    wait_nodes_ready(core, [name])
    try:
        yield name
    finally:
        delete_nodes(core, [name])


def _adopt_cluster_objects(sandbox: Sandbox, release: str, namespace: str) -> None:
    """CRDs are cluster-wide and other tests may have applied them with kubectl (or kept them
    from an earlier release): hand them to this release the way Helm documents adoption."""
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


def _install_values(tmp_path: Path, **extra: Any) -> Path:
    values: dict[str, Any] = {
        "defaultReservePool": {
            "enabled": True,
            "name": f"spares-{uuid.uuid4().hex[:6]}",
            "spec": {"nodeSelector": {"matchLabels": {"gpuheal.io/pool": "spare"}}},
        },
        **extra,
    }
    # The chart's own default: NVIDIA's catalogue (examples/default-policy.yaml), in dry run.
    values["defaultPolicy"] = {"enabled": True, "name": f"default-{uuid.uuid4().hex[:6]}"}
    path = tmp_path / "install-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_install_upgrade_uninstall_on_a_real_apiserver(
    sandbox: Sandbox, sandbox_helm: Helm, namespace: str, system_node: str, tmp_path: Path
) -> None:
    release = f"gh-{uuid.uuid4().hex[:6]}"
    fullname = f"{release}-gpuheal"
    # CRDs another test applied are served at install: the default objects are release objects;
    # else this install creates the CRDs, and the default objects with a post-install hook.
    served = all(
        sandbox.kubectl("get", "crd", crd, check=False).returncode == 0 for crd in GPUHEAL_CRDS
    )
    _adopt_cluster_objects(sandbox, release, namespace)
    values = _install_values(
        tmp_path,
        bridge={
            "url": "https://slurm-bridge.example.internal:8443",
            "token": {"value": "sandbox-token-0123456789"},
        },
    )
    out = sandbox_helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "-f",
        str(values),
        "--wait",
        "--timeout=3m",
    )
    assert "STATUS: deployed" in out.stdout
    assert "kubectl get noderemediations -w" in out.stdout  # NOTES.txt
    # The trial's simulated XID is node-problem-detector's, not trusted by default: said so.
    assert "the node gets a Warning UntrustedSignal naming the reporter" in out.stdout
    assert "is not reserved by an admission policy" not in out.stdout
    try:
        for crd in GPUHEAL_CRDS:
            sandbox.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        manifest = sandbox_helm("get", "manifest", release, "-n", namespace).stdout
        for doc in (d for d in yaml.safe_load_all(manifest) if d):
            meta = doc["metadata"]
            ns_args = ["-n", meta["namespace"]] if "namespace" in meta else []
            got = sandbox.kubectl("get", doc["kind"], meta["name"], *ns_args, check=False)
            assert got.returncode == 0, f"{doc['kind']}/{meta['name']} missing: {got.stderr}"
        values_doc = yaml.safe_load(values.read_text())
        pool_name = values_doc["defaultReservePool"]["name"]
        policy_name = values_doc["defaultPolicy"]["name"]
        sandbox.kubectl("get", "remediationpolicy", policy_name)
        sandbox.kubectl("get", "reservepool", pool_name)
        hook_made = "created after the CRDs, by a post-install hook" in out.stdout  # NOTES.txt
        assert hook_made != served, out.stdout
        # kwok runs the pod: scheduled on the system node, never on a GPU node.
        pods = json.loads(
            sandbox.kubectl(
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                "app.kubernetes.io/component=operator",
                "-o",
                "json",
            ).stdout
        )["items"]
        assert [p["spec"]["nodeName"] for p in pods] == [system_node]
        rollout = _live_rollout(sandbox, namespace, fullname)

        out = sandbox_helm(
            "upgrade",
            release,
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values),
            "--set",
            "operator.sources.dcgm=true",
            "--set",
            "monitoring.grafanaDashboard.enabled=true",
            "--wait",
            "--timeout=3m",
        )
        assert "STATUS: deployed" in out.stdout
        assert "REVISION: 2" in out.stdout
        # The default objects are patched in place (or taken over from the install's hook).
        sandbox.kubectl("get", "reservepool", pool_name)
        policy = json.loads(
            sandbox.kubectl("get", "remediationpolicy", policy_name, "-o", "json").stdout
        )
        assert policy["spec"]["safety"]["dryRun"] is True  # a safe first install
        assert {r["name"] for r in policy["spec"]["rules"]} >= {"fell-off-bus", "gpu-reset"}
        sandbox.kubectl("get", "configmap", f"{fullname}-dashboard", "-n", namespace)
        dep = json.loads(
            sandbox.kubectl("get", "deploy", fullname, "-n", namespace, "-o", "json").stdout
        )
        assert "--sources=conditions,events,dcgm" in _container(dep)["args"]
        # The same token: the same rollout value, read back from the Secret (no needless roll).
        assert _live_rollout(sandbox, namespace, fullname) == rollout
        sandbox_helm(
            "upgrade", release, str(CHART), "-n", namespace, "-f", str(values), "--reuse-values",
            "--set", "bridge.token.value=sandbox-token-rotated-98765", "--wait", "--timeout=3m",
        )  # fmt: skip
        assert _live_rollout(sandbox, namespace, fullname) != rollout  # a new token rolls them
    finally:
        out = sandbox_helm("uninstall", release, "-n", namespace, "--wait", check=False)
    assert out.returncode == 0, out.stderr
    assert "These resources were kept due to the resource policy" in out.stdout
    for crd in GPUHEAL_CRDS:
        sandbox.kubectl("get", "crd", crd)  # kept
    for kind, name in (
        ("clusterrole", f"{fullname}-operator"),
        ("clusterrole", f"{fullname}-kopf"),
    ):
        assert sandbox.kubectl("get", kind, name, check=False).returncode != 0
    assert sandbox.kubectl("get", "deploy", fullname, "-n", namespace, check=False).returncode != 0
    for kind in ("reservepool", "remediationpolicy"):
        sandbox.kubectl(
            "delete", kind, "-l", f"app.kubernetes.io/instance={release}", "--ignore-not-found"
        )


def _live_rollout(sandbox: Sandbox, namespace: str, fullname: str) -> str:
    """The bridge token's rollout value on the installed Secret, checked to be the operator
    Deployment's pod annotation too."""

    def get(*what: str) -> dict[str, Any]:
        out = sandbox.kubectl("get", *what, "-n", namespace, "-o", "json").stdout
        return dict(json.loads(out))

    secret = get("secret", f"{fullname}-bridge-token")["metadata"]["annotations"]
    dep = get("deploy", fullname)["spec"]["template"]["metadata"]["annotations"]
    assert secret["gpuheal.io/token-rollout"] == dep["gpuheal.io/bridge-token-rollout"]
    return str(secret["gpuheal.io/token-rollout"])


# --- RBAC with the ServiceAccount's own token -----------------------------------------------------


@pytest.fixture
def installed(sandbox: Sandbox, sandbox_helm: Helm, namespace: str) -> Iterator[tuple[str, str]]:
    """The chart installed (no --wait: RBAC does not need the pod) -> (release, namespace)."""
    release = f"rb-{uuid.uuid4().hex[:6]}"
    _adopt_cluster_objects(sandbox, release, namespace)
    sandbox_helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--set",
        f"rbac.jobHookNamespaces={{{namespace}}}",
        "--set",
        "operator.sources.dcgm=true",
    )
    try:
        yield release, namespace
    finally:
        sandbox_helm("uninstall", release, "-n", namespace, check=False)


# (verb, resource, namespace or None for cluster-wide/all namespaces)
OPERATOR_NEEDS = [
    ("get", "nodes", None),
    ("list", "nodes", None),
    ("watch", "nodes", None),
    ("patch", "nodes", None),
    ("list", "pods", None),
    ("create", "pods/eviction", "team-a"),
    ("list", "events", "default"),  # --event-namespace only
    ("watch", "events", "default"),
    ("create", "events", "$ns"),  # kopf's own Events
    ("create", "events", "default"),  # gpuheal's Events about Nodes and NodeRemediations
    ("create", "jobs.batch", "$ns"),  # rbac.jobHookNamespaces
    ("create", "noderemediations.gpuheal.io", None),
    ("patch", "noderemediations.gpuheal.io", None),
    ("get", "noderemediations.gpuheal.io", None),
    ("patch", "noderemediations.gpuheal.io/status", None),
    ("watch", "remediationpolicies.gpuheal.io", None),
    ("patch", "remediationpolicies.gpuheal.io/status", None),
    ("patch", "reservepools.gpuheal.io/status", None),
    ("create", "faulthistories.gpuheal.io", None),
    ("watch", "faulthistories.gpuheal.io", None),
    ("patch", "faulthistories.gpuheal.io/status", None),
    ("get", "configmaps/gpuheal-node-jobs", "$release-node-jobs"),  # nodeJobs: the templates
    ("create", "jobs.batch", "$release-node-jobs"),  # nodeJobs: the Jobs, in their namespace
    ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", None),
]
OPERATOR_MUST_NOT = [
    # Granted once, used by no code path (issue 23; test_helm_rbac_usage.py keeps it so):
    ("watch", "pods", None),
    ("get", "pods", "team-a"),
    ("list", "poddisruptionbudgets.policy", None),
    ("watch", "events.events.k8s.io", None),
    ("get", "jobs.batch/status", "$ns"),
    ("delete", "noderemediations.gpuheal.io", None),
    ("update", "noderemediations.gpuheal.io/status", None),
    ("update", "reservepools.gpuheal.io", None),
    ("patch", "remediationpolicies.gpuheal.io", None),
    ("list", "namespaces", None),
    ("delete", "pods", "team-a"),  # only with rbac.forceDrain (off by default)
    ("get", "secrets", "kube-system"),
    ("list", "secrets", None),
    ("get", "secrets", "$ns"),
    ("list", "configmaps", "kube-system"),
    ("get", "configmaps/kube-root-ca.crt", "$release-node-jobs"),  # only gpuheal-node-jobs
    ("delete", "nodes", None),
    ("update", "nodes", None),
    ("create", "nodes", None),
    ("create", "pods", "team-a"),
    ("patch", "pods", "team-a"),
    ("create", "jobs.batch", "team-a"),
    ("delete", "jobs.batch", "$ns"),
    ("create", "events", "team-a"),
    ("list", "events", "team-a"),  # Events elsewhere start nothing: not read at all
    ("get", "events", "default"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
    ("patch", "clusterkopfpeerings.kopf.dev", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
    ("create", "serviceaccounts/token", "$ns"),
    ("impersonate", "users", None),
    ("create", "deployments.apps", "$ns"),
]


def _can_i(
    sandbox: Sandbox, kubeconfig: Path, verb: str, resource: str, namespace: str | None
) -> bool:
    """`kubectl auth can-i` as the ServiceAccount. `res/status` and `res/eviction` name
    subresources; any other `res/x` names one object."""
    args = [verb]
    base, _, rest = resource.partition("/")
    if rest in ("status", "eviction"):
        args += [base, f"--subresource={rest}"]
    else:
        args.append(resource)
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    result = sandbox.control_plane.kubectl(
        "auth", "can-i", *args, check=False, kubeconfig=kubeconfig
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {' '.join(args)}: {result.stdout}{result.stderr}"
    return answer == "yes"


def test_service_account_can_do_what_the_operator_needs_and_nothing_more(
    sandbox: Sandbox, installed: tuple[str, str]
) -> None:
    release, namespace = installed
    kubeconfig = sandbox.control_plane.kubeconfig_for_service_account(
        namespace, f"{release}-gpuheal"
    )

    def subst(value: str | None) -> str | None:
        return (
            None if value is None else value.replace("$ns", namespace).replace("$release", release)
        )

    missing = [
        (verb, res, ns)
        for verb, res, ns in OPERATOR_NEEDS
        if not _can_i(sandbox, kubeconfig, verb, subst(res) or res, subst(ns))
    ]
    assert not missing, f"the chart's ServiceAccount lacks: {missing}"
    excess = [
        (verb, res, ns)
        for verb, res, ns in OPERATOR_MUST_NOT
        if _can_i(sandbox, kubeconfig, verb, subst(res) or res, subst(ns))
    ]
    assert not excess, f"the chart's ServiceAccount may do too much: {excess}"

    # The full list, as kubectl reports it, for the record (and a last check for wildcards).
    listing = sandbox.control_plane.kubectl(
        "auth", "can-i", "--list", "-n", namespace, kubeconfig=kubeconfig
    ).stdout
    assert "secrets" not in listing
    assert not re.search(r"^\*\.\*\s", listing, re.MULTILINE)
