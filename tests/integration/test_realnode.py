"""The sandbox's real node (``sandbox up --real-node``): a kubelet + containerd + runc + CNI
bridge node beside the kwok GPU nodes, where pods really run from locally imported images.

Its own sandbox (module-scoped; with Slurm, since the real node is a Slurm node too): the
session's sandbox has no real node, so pods of other tests never land on it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuheal_dev.sandbox import Sandbox, SandboxConfig
from gpuheal_dev.sandbox.localimage import busybox_image
from gpuheal_dev.sandbox.realnode import REAL_NODE_NAME
from tests.integration.operator_harness import wait_for
from tests.integration.test_helm_agent import daemonset, render

# the real-node modules ask for one worker (--dist loadgroup): the host's kernel log is every
# sandbox's, and an XID line one module wrote reached another's agent pod (every real node is
# gpu-real-0). A small trial with xdist 3.8 still split a group, so nothing relies on it: only
# the e2e module writes an XID line (test_realnode's is a plain line)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("host-kmsg")]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("rn")
    sb = Sandbox.up(
        SandboxConfig(root=root, gpu_nodes=2, spare_nodes=1, slurm=True, real_node=True)
    )
    try:
        yield sb
    finally:
        sb.down()


@pytest.fixture
def ns(real: Sandbox) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:8]}"
    real.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        real.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _image(sb: Sandbox, tmp: Path) -> str:
    """A busybox image of its own tag, imported now with ``load_image``."""
    ref = f"gpuheal.local/rn-test-{uuid.uuid4().hex[:6]}:1"
    sb.load_image(busybox_image(tmp / "image.tar", ref))
    return ref


def _run_to_end(sb: Sandbox, ns: str, pod: dict[str, Any], timeout: float = 90) -> str:
    """Create ``pod``, wait until it has Succeeded, return its ``kubectl logs``."""
    name = pod["metadata"]["name"]
    core = sb.core_v1()
    core.create_namespaced_pod(ns, pod)

    def ended() -> str | None:
        phase = core.read_namespaced_pod(name, ns).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(ended, f"pod {name} to end", timeout=timeout)
    logs = sb.kubectl("logs", name, "-n", ns).stdout
    assert phase == "Succeeded", (phase, logs, sb.kubectl("describe", "pod", name, "-n", ns).stdout)
    return logs


def test_real_node_is_ready_beside_kwok_nodes_as_a_gpu_and_slurm_node(real: Sandbox) -> None:
    core = real.core_v1()
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {"gpu-node-0", "gpu-node-1", "gpu-spare-0", REAL_NODE_NAME}
    for node in nodes.values():
        ready = [c.status for c in node.status.conditions if c.type == "Ready"]
        assert ready == ["True"], node.metadata.name
    node = nodes[REAL_NODE_NAME]
    # a real kubelet, the pinned one, with a real runtime
    assert node.status.node_info.kubelet_version == "v1.36.3"
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    # labelled as the kwok GPU nodes are (kwok's own `type` mark aside), with their GPUs
    kwok = dict(nodes["gpu-node-0"].metadata.labels)
    del kwok["type"], kwok["kubernetes.io/hostname"]
    assert kwok.items() <= node.metadata.labels.items()
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    # and a Slurm node, with a slurmd of its own
    assert real.slurm.node_states()[REAL_NODE_NAME] == "idle"


def test_pod_runs_from_an_imported_image_hardened_with_its_token_and_logs(
    real: Sandbox, ns: str, tmp_path: Path
) -> None:
    image = _image(real, tmp_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hardened"},
        "spec": {
            "nodeName": REAL_NODE_NAME,
            "restartPolicy": "Never",
            "automountServiceAccountToken": True,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "c",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": [
                        "/bin/sh",
                        "-c",
                        "echo uid=$(id -u);"
                        " sa=/var/run/secrets/kubernetes.io/serviceaccount;"
                        " echo ns=$(cat $sa/namespace);"
                        " echo token-bytes=$(wc -c < $sa/token);"
                        " touch /probe 2>&1 || true",
                    ],
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    logs = _run_to_end(real, ns, pod)
    assert "uid=1000" in logs
    assert f"ns={ns}" in logs
    token_bytes = re.search(r"token-bytes=(\d+)", logs)
    assert token_bytes, logs
    assert int(token_bytes.group(1)) > 100, logs
    assert "Read-only file system" in logs


def test_privileged_pod_with_the_agents_mounts_reads_a_kmsg_line(
    real: Sandbox, ns: str, tmp_path: Path
) -> None:
    """The chart's agent DaemonSet's privileges and mounts (rendered by helm, the state
    directory moved under the sandbox), with busybox in place of the agent."""
    ds = daemonset(render(tmp_path, f"agent.stateHostPath={real.root / 'agent-state'}"))
    spec = ds["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    marker = f"gpuheal-realnode-{uuid.uuid4().hex}"
    # not an XID line: the host's kernel log is every sandbox's, and another sandbox's agent
    # pod (its real node is gpu-real-0 too) would open an incident on it
    Path("/dev/kmsg").write_text(f"gpuheal test line, not a fault: {marker}\n")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kmsg-reader"},
        "spec": {
            "nodeName": REAL_NODE_NAME,
            "restartPolicy": "Never",
            "securityContext": spec["securityContext"],
            "volumes": spec["volumes"],
            "containers": [
                {
                    "name": "agent",
                    "image": _image(real, tmp_path),
                    "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "grep", "-m1", marker, "/dev/kmsg"],
                    "securityContext": agent["securityContext"],
                    "volumeMounts": agent["volumeMounts"],
                }
            ],
        },
    }
    logs = _run_to_end(real, ns, pod)
    assert f"not a fault: {marker}" in logs


def test_down_leaves_no_process_mount_cgroup_or_bridge(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Its own sandbox (beside the module's: two real nodes side by side), with a pod running,
    then ``down``."""
    sb = Sandbox.up(
        SandboxConfig(
            root=tmp_path_factory.mktemp("rn-down"),
            gpu_nodes=1,
            spare_nodes=0,
            slurm=False,
            real_node=True,
        )
    )
    node = sb.real_node
    try:
        ns = "default"
        ref = _image(sb, sb.root)
        sb.core_v1().create_namespaced_pod(
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "sleeper"},
                "spec": {
                    "nodeName": REAL_NODE_NAME,
                    "containers": [
                        {
                            "name": "c",
                            "image": ref,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/busybox", "sleep", "3600"],
                        }
                    ],
                },
            },
        )
        wait_for(
            lambda: sb.core_v1().read_namespaced_pod("sleeper", ns).status.phase == "Running",
            "sleeper Running",
            timeout=90,
        )
        # nothing host-wide: the kubelet's iptables chains would outlive the sandbox
        if shutil.which("iptables-save"):
            rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True)
            assert "KUBE-" not in rules.stdout
        before = node.processes()
        # containerd, its shim, the kubelet, the pause and sleep processes
        assert len(before) >= 5, before
        assert node.mounts_left()
        assert node.cgroups_left()
    finally:
        sb.down()
    time.sleep(0.5)  # let init reap what it inherited
    assert node.processes() == []
    socket = str(node.socket)
    by_cmdline = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if socket in cmdline or str(node.layout.root) in cmdline:
                by_cmdline.append((pid, cmdline))
    assert by_cmdline == []
    assert node.mounts_left() == []
    assert node.cgroups_left() == []
    links = subprocess.run(
        ["ip", "link", "show", node.layout.bridge], capture_output=True, check=False
    )
    assert links.returncode != 0
    assert not node.layout.run_dir.exists()
