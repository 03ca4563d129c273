"""Misconfiguration on the real-kubelet node (issue 24 step 4), as pods from the operator
image with the chart's specs:

- the agent DaemonSet with `agent.securityContext.privileged=false` (what a site that forbids
  privileged pods might set): /dev/kmsg is mounted but the device cgroup refuses to open it;
- the operator Deployment with a bridge token the bridge (a real one, on the host) never
  issued.

Each pod must stay Running (no restart: no crash loop), not Ready, and say why once: in
`kubectl describe pod` (the readiness probe's output), its log, and a Warning Event (the
agent's on its Node, the operator's on its Pod).

Its own sandbox with a real node (module-scoped), run serially. Stand-ins for what the
sandbox lacks, outside what the test judges: no kube-proxy and no cluster DNS here, so the
pods use the host network, the agent is pointed at the API server's address
(KUBERNETES_SERVICE_HOST/PORT) and the operator (kopf logs in at kubernetes.default.svc) gets
its ServiceAccount's token in a kubeconfig naming that address. With
``GPUHEAL_TEST_SOURCE_OVERLAY=1`` the tree's ``operator/`` and ``slurm-bridge/`` go before the
image's packages on the Python path (for a worktree whose shared image cache was built from
another tree; `make test` builds the image from this tree and leaves it unset).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox.realnode import REAL_NODE_NAME
from tests.integration.bridge_harness import start_bridge, stop
from tests.integration.operator_harness import REPO, free_port, wait_for
from tests.integration.test_helm_agent import AGENT_NS, agent_objects, daemonset, render

# the real-node modules ask for one worker (--dist loadgroup): the host's kernel log is every
# sandbox's, and an XID line one module wrote reached another's agent pod (every real node is
# gpu-real-0). A small trial with xdist 3.8 still split a group, so nothing relies on it: only
# the e2e module writes an XID line (test_realnode's is a plain line)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("host-kmsg")]

IMAGE_TAR = Path.home() / ".cache" / "gpuheal" / "images" / "gpuheal.tar"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if not IMAGE_TAR.exists():
        pytest.fail(f"{IMAGE_TAR} missing: `make images` builds it")
    sb = Sandbox.up(
        SandboxConfig(
            root=tmp_path_factory.mktemp("mc-rn"),
            gpu_nodes=1,
            spare_nodes=0,
            slurm=True,  # the bridge's Slurm
            real_node=True,
        )
    )
    try:
        sb.load_image(IMAGE_TAR)
        yield sb
    finally:
        sb.down()


def _on_the_real_node(sb: Sandbox, workload: dict[str, Any]) -> dict[str, Any]:
    """The workload's pods on the real node only, with the module docstring's stand-ins."""
    pod = workload["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE_NAME}
    pod.pop("affinity", None)
    pod.pop("topologySpreadConstraints", None)
    pod["hostNetwork"] = True
    (container,) = pod["containers"]
    container["imagePullPolicy"] = "Never"
    api = urlparse(sb.control_plane.server)
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
    ]
    if os.environ.get("GPUHEAL_TEST_SOURCE_OVERLAY") == "1":  # the operator and its client
        for src in ("operator", "slurm-bridge"):
            pod.setdefault("volumes", []).append(
                {"name": src, "hostPath": {"path": str(REPO / src), "type": "Directory"}}
            )
            container.setdefault("volumeMounts", []).append(
                {"name": src, "mountPath": f"/src/{src}", "readOnly": True}
            )
        container["env"].append({"name": "PYTHONPATH", "value": "/src/operator:/src/slurm-bridge"})
    return workload


def _with_sa_kubeconfig(sb: Sandbox, dep: dict[str, Any]) -> dict[str, Any]:
    """kopf logs in at https://kubernetes.default.svc, a name no DNS here resolves: the
    operator gets its ServiceAccount's token in a kubeconfig (a Secret) naming the API
    server's address instead, the same identity and RBAC."""
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    path = sb.control_plane.kubeconfig_for_service_account(OPERATOR_NS, sa)
    config = yaml.safe_load(path.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = OPERATOR_NS
    for cluster in config["clusters"]:  # the cluster's CA, as the pod has it
        cluster["cluster"]["certificate-authority"] = f"{SA_DIR}/ca.crt"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sa-kubeconfig", "namespace": OPERATOR_NS},
        "stringData": {"config": yaml.safe_dump(config)},
    }
    sb.kubectl("apply", "-f", "-", input=yaml.safe_dump(secret))
    pod = dep["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "sa-kubeconfig", "secret": {"secretName": "sa-kubeconfig"}})
    (container,) = pod["containers"]
    container["volumeMounts"].append(
        {"name": "sa-kubeconfig", "mountPath": "/var/run/sa-kubeconfig", "readOnly": True}
    )
    container["env"].append({"name": "KUBECONFIG", "value": "/var/run/sa-kubeconfig/config"})
    return dep


def _agent_on_the_real_node(sb: Sandbox, tmp: Path, *sets: str) -> list[dict[str, Any]]:
    """The chart's agent objects (its namespace, ServiceAccount, RBAC, DaemonSet)."""
    port = free_port()  # the host network: a port of its own
    docs = agent_objects(render(tmp, f"agent.readyPort={port}", *sets))
    _on_the_real_node(sb, daemonset(docs))
    return docs


def _pod(sb: Sandbox, namespace: str = AGENT_NS) -> dict[str, Any] | None:
    out = sb.kubectl("get", "pods", "-n", namespace, "-o", "json")
    items = json.loads(out.stdout)["items"]
    return items[0] if items else None


def _ready(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return str(c["status"])
    return None


def test_agent_that_cannot_open_kmsg_stays_running_not_ready_and_says_why(
    real: Sandbox, tmp_path: Path
) -> None:
    docs = _agent_on_the_real_node(real, tmp_path, "agent.securityContext.privileged=false")
    real.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        running = wait_for(
            lambda: (p := _pod(real)) and p["status"].get("phase") == "Running" and p,
            "the agent pod Running on the real node",
            timeout=120,
        )
        name = running["metadata"]["name"]
        why = "not ready: cannot read the kernel log /dev/kmsg (Operation not permitted)"

        def described() -> str | None:
            out = str(real.kubectl("describe", "pod", name, "-n", AGENT_NS).stdout)
            return out if f"Readiness probe failed: {why}" in out else None

        wait_for(described, "the readiness probe's reason in kubectl describe", timeout=90)
        # Stays up, never Ready, never restarted: no crash loop.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pod = _pod(real)
            assert pod is not None
            assert pod["status"]["phase"] == "Running"
            assert _ready(pod) == "False"
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
            time.sleep(2)
        logs = str(real.kubectl("logs", name, "-n", AGENT_NS).stdout)
        assert logs.count("not ready: ") == 1, logs
        assert "Traceback" not in logs, logs
        selector = f"involvedObject.kind=Node,involvedObject.name={REAL_NODE_NAME}"
        out = real.kubectl(
            "get", "events", "-n", "default", "-o", "json", f"--field-selector={selector}"
        )
        events = json.loads(out.stdout)["items"]
        warned = [e for e in events if e["reason"] == "KernelLogUnreadable"]
        assert len(warned) == 1, warned
        assert (
            "cannot read the kernel log /dev/kmsg (Operation not permitted)"
            in (warned[0]["message"])
        )
    finally:
        real.kubectl("delete", "daemonset", "--all", "-n", AGENT_NS, "--wait=false", check=False)


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
OPERATOR_NS = "gpuheal"  # where `render` puts the release


def test_operator_with_a_token_the_bridge_refuses_stays_running_not_ready_and_says_why(
    real: Sandbox, tmp_path: Path
) -> None:
    assert real.slurm is not None
    bridge = start_bridge(real.slurm, tmp_path, token="the-right-token-0123456789abcdef")
    metrics, health, ready = free_port(), free_port(), free_port()
    rendered = render(
        tmp_path,
        "agent.enabled=false",
        f"bridge.url={bridge.url}",
        "bridge.token.value=a-token-the-bridge-never-issued",
        f"operator.metricsPort={metrics}",
        f"operator.healthPort={health}",
        f"operator.readyPort={ready}",
    )
    (dep,) = [d for d in rendered if d["kind"] == "Deployment"]
    docs = rendered
    docs = [d for d in docs if d["kind"] not in ("Pod", "Deployment")]  # Pods: helm test's
    real.kubectl("create", "namespace", OPERATOR_NS, check=False)
    manifest = yaml.safe_dump_all(docs)
    # twice: the first may reach an object before its namespace or CRD exists
    real.kubectl("apply", "--server-side", "-f", "-", input=manifest, check=False)
    real.kubectl("apply", "--server-side", "-f", "-", input=manifest)
    real.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(
        _with_sa_kubeconfig(real, _on_the_real_node(real, dep))))  # fmt: skip
    try:
        running = wait_for(
            lambda: (p := _pod(real, OPERATOR_NS)) and p["status"].get("phase") == "Running" and p,
            "the operator pod Running on the real node",
            timeout=120,
        )
        name = running["metadata"]["name"]
        why = f"not ready: Slurm cluster default: the Slurm bridge at {bridge.url} refused"

        seen = [""]

        def described() -> str | None:
            seen[0] = str(real.kubectl("describe", "pod", name, "-n", OPERATOR_NS).stdout)
            ok = f"Readiness probe failed: {why}" in seen[0] and "BridgeTokenRefused" in seen[0]
            return seen[0] if ok else None

        try:
            wait_for(described, "the probe's reason and the Event in kubectl describe", timeout=120)
        except AssertionError as exc:
            logs = real.kubectl("logs", name, "-n", OPERATOR_NS, check=False).stdout
            raise AssertionError(f"{exc}\n{seen[0][-3000:]}\n{logs[-5000:]}") from None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pod = _pod(real, OPERATOR_NS)
            assert pod is not None
            assert pod["status"]["phase"] == "Running"
            assert _ready(pod) == "False"
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
            time.sleep(2)
        logs = str(real.kubectl("logs", name, "-n", OPERATOR_NS).stdout)
        assert logs.count("not ready: ") == 1, logs
        assert "Traceback" not in logs, logs
    finally:
        stop(bridge.proc)
        real.kubectl("delete", "deployment", "--all", "-n", OPERATOR_NS, "--wait=false",
                     check=False)  # fmt: skip
